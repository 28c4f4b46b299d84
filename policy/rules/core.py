"""Rule model shared by the Pulumi analyzer and the plain-YAML checker.

Rules read resource properties through a thin read-only view that raises
`Unknown` the moment they touch a value Pulumi cannot know during preview.
The runner catches it and reports nothing: a rule may only fail on values
it actually saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MANDATORY = "mandatory"
ADVISORY = "advisory"

# The engine sends unknowns as these strings (pulumi_policy/proxy.py mirrors
# them); copied so the rules import nothing from pulumi_policy and the YAML
# checker and renderer work without it. "[unknown]" is the offline
# renderer's placeholder for an output that mocks cannot resolve.
UNKNOWN_SENTINELS = frozenset(
    {
        "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",  # boolean
        "3eeb2bf0-c639-47a8-9e75-3b44932eb421",  # number
        "04da6b54-80e4-46f7-96ec-b56ff0331ba9",  # string
        "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",  # array
        "030794c1-ac77-496b-92df-f27374a8bd58",  # asset
        "e48ece36-62e2-4504-bad9-02848725956a",  # archive
        "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",  # object
        "[unknown]",
    }
)


class Unknown(Exception):  # noqa: N818 - a state, not an error
    """A rule touched a value that is not known yet (preview)."""


def is_unknown(value: Any) -> bool:
    return isinstance(value, str) and value in UNKNOWN_SENTINELS


def watch(value: Any) -> Any:
    """Wrap plain data so that reading an unknown raises `Unknown`."""
    if is_unknown(value):
        raise Unknown
    if isinstance(value, (KnownMap, KnownList)):
        return value
    if isinstance(value, Mapping):
        return KnownMap(value)
    if isinstance(value, (list, tuple)):
        return KnownList(value)
    return value


class KnownMap(Mapping):
    """Read-only mapping view; `get`, `items` and `values` all go through
    `__getitem__`, so no read path can see an unknown by accident."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping) -> None:
        self._data = data

    def __getitem__(self, key: Any) -> Any:
        return watch(self._data[key])

    def __iter__(self) -> Iterator:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        # Presence alone is known even when the value is not.
        return key in self._data


class KnownList(Sequence):
    __slots__ = ("_data",)

    def __init__(self, data: Sequence) -> None:
        self._data = data

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return KnownList(self._data[index])
        return watch(self._data[index])

    def __len__(self) -> int:
        return len(self._data)


EMPTY = KnownMap({})


def attempt(fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    """Call fn; an unknown value makes the answer `default` instead."""
    try:
        return fn(*args)
    except Unknown:
        return default


@dataclass(frozen=True)
class Resource:
    """One resource as the rules see it, whatever it came from."""

    type: str
    name: str
    props: Mapping[str, Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    urn: str = ""
    source: str = "-"
    member: str = ""
    """For one of the pod templates of a resource that has several (a LeaderWorkerSet's `leader` and `workers`): which;
    `props` then hold that template as `spec.template` (rules.k8s.members)."""

    @property
    def view(self) -> KnownMap:
        return KnownMap(self.props)

    @property
    def kind(self) -> str:
        return self.type.rsplit(":", 1)[-1]

    @property
    def display_name(self) -> str:
        """metadata.name when known, else the Pulumi logical name."""
        meta = self.props.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        shown = name if isinstance(name, str) and name and not is_unknown(name) else self.name
        return f"{shown} ({self.member})" if self.member else shown


@dataclass(frozen=True, order=True)
class Violation:
    source: str
    kind: str
    name: str
    policy: str
    level: str
    message: str
    urn: str = ""


ResourceCheck = Callable[[Resource, Mapping[str, Any]], Iterable[str]]
StackCheck = Callable[[list[Resource], Mapping[str, Any]], Iterable[tuple[Resource, str]]]


@dataclass(frozen=True)
class Rule:
    """A policy. `types` set means a per-resource rule, empty a stack rule.
    `config` is JSON schema per key; its "default" is the value used when
    the pack config does not set one."""

    name: str
    description: str
    level: str
    check: Callable[..., Iterable[Any]]
    types: frozenset[str] = frozenset()
    config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def is_stack(self) -> bool:
        return not self.types

    def settings(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        values = {key: schema["default"] for key, schema in self.config.items()}
        for key, value in (overrides or {}).items():
            if key in values:
                values[key] = value
        return values

    def run_on(self, resource: Resource, cfg: Mapping[str, Any]) -> list[str]:
        if resource.type not in self.types:
            return []
        try:
            return [one_line(m) for m in self.check(resource, cfg)]
        except Unknown:
            return []

    def run_on_stack(self, resources: list[Resource], cfg: Mapping[str, Any]) -> list[tuple[Resource, str]]:
        try:
            return [(r, one_line(m)) for r, m in self.check(resources, cfg)]
        except Unknown:
            return []


def one_line(message: str) -> str:
    return " ".join(message.split())


def evaluate(
    rules: Sequence[Rule],
    resources: list[Resource],
    config: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Violation]:
    """All violations of all rules, per-resource and stack, sorted."""
    config = config or {}
    found: list[Violation] = []

    def record(rule: Rule, resource: Resource, message: str) -> None:
        found.append(
            Violation(
                source=resource.source,
                kind=resource.kind,
                name=resource.display_name,
                policy=rule.name,
                level=rule.level,
                message=message,
                urn=resource.urn,
            )
        )

    for rule in rules:
        cfg = rule.settings(config.get(rule.name))
        if rule.is_stack:
            for resource, message in rule.run_on_stack(resources, cfg):
                record(rule, resource, message)
            continue
        for resource in resources:
            for message in rule.run_on(resource, cfg):
                record(rule, resource, message)
    return sorted(set(found))


def format_line(violation: Violation) -> str:
    """`<level> <policy-name> <file> <Kind>/<name>: <message>` (policy.txt)."""
    v = violation
    return f"{v.level} {v.policy} {v.source} {v.kind}/{v.name}: {v.message}"
