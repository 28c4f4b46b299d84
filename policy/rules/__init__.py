"""gpu-serving policy rules as plain functions over Kubernetes-shaped dicts.

`check_resources` is the entry point for anything that is not the Pulumi
engine (the YAML checker, the offline renderer); `pack.build_policies` wraps
the same rules for pulumi_policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import (
    autoscaling,
    cache,
    capacity,
    coldstart,
    commands,
    edge,
    endpoint,
    groups,
    k8s,
    mig,
    monitoring,
    network,
    podsecurity,
    reproducible,
    servers,
    storage,
    workloads,
)
from .core import ADVISORY, MANDATORY, Resource, Rule, Violation, evaluate, format_line

ALL_RULES: list[Rule] = [
    *workloads.RULES, *servers.RULES, *reproducible.RULES, *storage.RULES, *cache.RULES, *commands.RULES, *capacity.RULES,
    *mig.RULES, *autoscaling.RULES, *groups.RULES,
    *edge.RULES, *endpoint.RULES, *network.RULES, *podsecurity.RULES, *monitoring.RULES, *coldstart.RULES,
]


# Pulumi's wire marker for a secret (pulumi.runtime.rpc; tests/test_sdk_adapter.py checks it), as an in-memory
# render may still carry it before redaction.
_SIG_KEY, _SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"


def normalise(value: Any) -> Any:
    """Secret envelopes become the renderer's "[secret]" and pulumi's
    in-process Unknown objects an unknown sentinel, so that resources.json and
    an in-memory render read the same."""
    if isinstance(value, Mapping):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            return commands.SECRET_PLACEHOLDER
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    if type(value).__name__ == "Unknown" and type(value).__module__.startswith("pulumi"):
        return "[unknown]"
    return value


def to_resource(entry: Mapping[str, Any], source: str = "-") -> Resource:
    """A renderer/resources.json entry: type, name, urn, inputs|props, options."""
    props = entry.get("props", entry.get("inputs")) or {}
    return Resource(
        type=str(entry["type"]),
        name=str(entry.get("name", "")),
        props=normalise(props),
        options=entry.get("options") or {},
        urn=str(entry.get("urn") or ""),
        source=str(entry.get("source") or source),
    )


def check_resources(
    resources: Iterable[Mapping[str, Any] | Resource],
    config: Mapping[str, Mapping[str, Any]] | None = None,
    source: str = "-",
) -> list[Violation]:
    """Run every rule (per-resource and stack) over `resources`.

    `config` has the shape of Pulumi's policy pack config:
    {"gpu-startup-probe": {"minStartupSeconds": 900}, ...}.
    """
    items = [r if isinstance(r, Resource) else to_resource(r, source) for r in resources]
    return evaluate(ALL_RULES, [member for r in items for member in k8s.members(r)], config)


def has_mandatory(violations: Iterable[Violation]) -> bool:
    return any(v.level == MANDATORY for v in violations)


__all__ = [
    "ADVISORY", "ALL_RULES", "MANDATORY", "Resource", "Rule", "Violation",
    "check_resources", "format_line", "has_mandatory", "to_resource",
]
