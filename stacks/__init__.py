"""Reads the stack's Pulumi config into a validated `StackConfig`, or stops with one clear line."""

from __future__ import annotations

import json
from typing import Any

import pulumi

from stacks.config import PROJECT, TOP_LEVEL_KEYS, ConfigError, StackConfig, parse, refuse_shrinking
from stacks.config.checks.secret_keys import check_secret_values
from stacks.config.load import check_namespaces

__all__ = ["ConfigError", "StackConfig", "deployed_outputs", "load", "parse", "read_raw", "secret"]

# The engine's built-in function behind StackReference: a stack's outputs from its last update.
READ_STACK_OUTPUTS = "pulumi:pulumi:readStackOutputs"


def read_raw(config: pulumi.Config | None = None) -> dict[str, Any]:
    """The stack's non-secret values, JSON-decoded, including unknown keys of our namespace."""
    from pulumi.runtime import config as runtime_config

    config = config or pulumi.Config(PROJECT)
    raw: dict[str, Any] = {}
    for key in sorted(set(TOP_LEVEL_KEYS) | _namespace_keys()):
        if runtime_config.is_config_secret(f"{PROJECT}:{key}"):
            continue  # secrets are read one by one with `secret()`, never as structured config
        text = config.get(key)
        if text is None:
            continue
        try:
            raw[key] = json.loads(text)
        except json.JSONDecodeError:
            raw[key] = text
    return raw


def load(config: pulumi.Config | None = None) -> StackConfig:
    """Validate the stack config before any resource is declared.

    A bad config ends the program with `pulumi.RunError`, which Pulumi prints as a single
    line without a Python traceback.
    """
    from pulumi.runtime import config as runtime_config

    try:
        foreign = check_namespaces(_config_names())
        if foreign:
            pulumi.log.warn(f"config keys this program does not read (another program's or provider's?): {', '.join(foreign)}")
        stack = parse(read_raw(config))
        for warning in stack.warnings():
            pulumi.log.warn(warning)
        for key in stack.secret_keys():
            if runtime_config.get_config(f"{PROJECT}:{key}") is None:
                raise ConfigError(f"{key}: secret is not set; run `pulumi config set --secret {key}` (value from stdin)")
        check_secret_values(stack, lambda key: runtime_config.get_config(f"{PROJECT}:{key}") or "")
        refuse_shrinking(stack, deployed_outputs().get("nodes") or {})
        return stack
    except ConfigError as exc:
        raise pulumi.RunError(f"config error: {exc}") from None


def deployed_outputs() -> dict[str, Any]:
    """This stack's outputs from its last `pulumi up` ({} before the first one).

    Read synchronously, like a StackReference to the stack itself, so that config checks that
    need the deployed state (a partition cannot shrink) run before any resource is declared.
    When the backend cannot answer, the checks are skipped with a warning: the node steps
    refuse a shrink on their own, before any write.
    """
    stack, organization = pulumi.get_stack(), pulumi.get_organization()
    # Fully qualified first; DIY backends made before Pulumi 3.61 only know the bare stack name.
    names = [f"{organization}/{pulumi.get_project()}/{stack}"] if organization else []
    names.append(stack)
    failures = []
    for name in names:
        try:
            result = pulumi.runtime.invoke(READ_STACK_OUTPUTS, {"name": name})
        except Exception as exc:  # any backend failure means "unknown", never a failed run
            failures.append(f"{name}: {' '.join(str(exc).split())}")
            continue
        outputs = (result.value or {}).get("outputs")
        return dict(outputs) if isinstance(outputs, dict) else {}
    pulumi.log.warn(
        "cannot read this stack's outputs from its last update (" + "; ".join(failures) + "); a smaller "
        "nodes[].storage.sizeGb is then refused by the node steps, before any write, instead of at config load"
    )
    return {}


def secret(name: str) -> pulumi.Output[str]:
    """A secret config value (`pulumi config set --secret <name>`), kept secret end to end."""
    return pulumi.Config(PROJECT).require_secret(name)


def _namespace_keys() -> set[str]:
    prefix = f"{PROJECT}:"
    return {name[len(prefix):] for name in _config_names() if name.startswith(prefix)}


def _config_names() -> set[str]:
    # Pulumi has no public way to list config keys; unknown keys (of our namespace, or under a
    # mistyped one) are typos worth reporting, so look at the same two places `Config.get` reads from.
    from pulumi.runtime import config as runtime_config

    return set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())

