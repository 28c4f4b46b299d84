"""Shared fixtures: render a stack in-process under Pulumi's mock engine, as `make render` does."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tools.render import Render, run_program


def _encode(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@pytest.fixture
def render() -> Callable[..., Render]:
    """`render(stack="prod", **overrides)`: overrides replace top-level keys, e.g. models=[...]."""

    def _render(stack: str = "prod", secrets: dict[str, str] | None = None, **overrides: Any) -> Render:
        values = {f"gpu-serving:{key}": _encode(value) for key, value in overrides.items()}
        return run_program(stack, overrides=values, secret_values=secrets)

    return _render


@pytest.fixture(scope="session")
def prod() -> Render:
    return run_program("prod")
