"""Validating a decoded stack file into a `StackConfig`, with one line per error that names the key."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from stacks.config.base import PATTERN_HELP, ConfigError, _KeyPathError
from stacks.config.stack import StackConfig

TOP_LEVEL_KEYS = ("cluster", "nodes", "modelStorage", "models", "hfTokenSecret")


def parse(raw: dict[str, Any]) -> StackConfig:
    """Validate the stack's non-secret top-level values (already decoded from YAML/JSON).

    Raises ConfigError with a one-line message naming the key path.
    """
    known = {key: value for key, value in raw.items() if key in TOP_LEVEL_KEYS}
    try:
        stack = StackConfig.model_validate(known)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    for key in sorted(set(raw) - set(TOP_LEVEL_KEYS)):
        if key in stack.secret_keys():
            raise ConfigError(f"{key}: holds a secret but is stored in plain text; set it with `pulumi config set --secret {key}`")
        raise ConfigError(f"{_key_name(key)}: unknown config key; allowed: {', '.join(TOP_LEVEL_KEYS)} and the stack's secret keys")
    return stack


def _describe(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    ctx_error = (error.get("ctx") or {}).get("error")
    if isinstance(ctx_error, _KeyPathError):
        return f"{ctx_error.path}: {ctx_error}"
    path = _key_path(error["loc"])
    given = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        return f"{path}: required key is missing"
    if error["type"] == "string_pattern_mismatch":
        allowed = PATTERN_HELP.get((error.get("ctx") or {}).get("pattern", ""), "the documented format")
        return f"{path}: must be {allowed} (got {_short(given)})"
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key (check the spelling; keys are camelCase)"
    return f"{path}: {message} (got {_short(given)})"


def _key_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("local", "nfs", "storageClass") and path.endswith("modelStorage"):
            continue  # the discriminated union's tag is not a key the user wrote
        else:
            path += f".{_key_name(part)}" if path else _key_name(part)
    return path or "(stack)"


def _key_name(key: Any) -> str:
    """A key as the user can find it again: quoted when it is empty or holds odd characters."""
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else json.dumps(text)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
