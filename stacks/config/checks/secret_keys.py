"""Secret config keys across the stack: one key holds one credential, and a secret's value is the kind
of credential the key that reads it expects. Never says a value."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from stacks.config.base import ConfigError, _at
from stacks.config.secrets import value_problem

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_roles(stack: StackConfig) -> None:
    first: dict[str, tuple[str, str, str]] = {}
    for key, role, path, what in stack.secret_roles():
        role0, path0, what0 = first.setdefault(key, (role, path, what))
        if role0 != role:
            raise _at(path, f"{key!r} is already {path0} ({what0}); one secret config key holds one credential, "
                            f"so one of the two readers gets the wrong one: give {path} a key of its own")


def check_secret_values(stack: StackConfig, value_of: Callable[[str], str]) -> None:
    """Raise ConfigError when a secret holds another kind of credential than the key that reads it
    expects, or the same credential as a secret of another role. Never says the value."""
    seen: dict[str, tuple[str, str, str]] = {}
    for key, role, path, what in stack.secret_roles():
        value = value_of(key)
        problem = value_problem(role, value, what)
        if problem:
            raise ConfigError(f"{path}: the secret {key} {problem}")
        kind = role.split()[0]  # two machines' host keys are one kind (cloned images share theirs)
        other = seen.setdefault(value, (key, kind, path)) if value else (key, kind, path)
        if other[0] != key and other[1] != kind:
            raise ConfigError(f"{path}: the secret {key} holds the same value as {other[0]} ({other[2]}); "
                              f"one credential for two roles reaches the wrong audience: set {key} to {what} of its own")
