"""What the pack tests on a rendered example stack share: its resources as a preview sees them (resources.json
entries), the mandatory findings by rule, and one resource's inputs by its Pulumi name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from policy.rules import MANDATORY, check_resources
from tools.render import Render, policy_config

Entries = list[dict[str, Any]]


def mandatory(rendered: Render, entries: Entries) -> dict[str, list[str]]:
    """`kind/name: message` of every mandatory finding over `entries`, by rule, with the render's pack config."""
    found: dict[str, list[str]] = {}
    for v in check_resources(entries, config=policy_config(rendered)):
        if v.level == MANDATORY:
            found.setdefault(v.policy, []).append(f"{v.kind}/{v.name}: {v.message}")
    return found


def named(entries: Entries, name: str) -> dict[str, Any]:
    """The inputs of the resource of that Pulumi name."""
    return next(e["inputs"] for e in entries if e["name"] == name)


def fires_on(rendered: Render, entries: Entries, rule: str, mutate: Callable[[Entries], None], says: str) -> None:
    """`rule` finds nothing on `entries`, and after `mutate` a mandatory finding that says `says`."""
    assert rule not in mandatory(rendered, entries)
    mutate(entries)
    found = mandatory(rendered, entries)
    assert rule in found, found
    assert any(says in m for m in found[rule]), found[rule]
