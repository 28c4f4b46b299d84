"""Reading the request hold of KEDA's HTTP add-on: HTTPScaledObjects, and the `external-push` triggers that name them.

An HTTPScaledObject makes the add-on's interceptor hold the requests for some hosts (and path prefixes)
while the workload it names has no ready endpoint, and count them for the add-on's external scaler.
Without the `skip-scaledobject-creation` annotation the add-on also creates a ScaledObject of the same
name for that workload (min 0 and max 100 when `replicas` leaves them out); with it, a ScaledObject of
one's own wakes the workload through an `external-push` trigger naming the HTTPScaledObject.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import k8s
from .core import Resource, attempt
from .k8s import as_list, as_map, dig, namespace, to_int

HTTP_SCALED_OBJECT = "kubernetes:http.keda.sh/v1alpha1:HTTPScaledObject"
SKIP_SCALED_OBJECT = "httpscaledobject.keda.sh/skip-scaledobject-creation"
WAKE_TRIGGER = "external-push"
# The CRD's defaults for `replicas` (the add-on's ScaledObject gets them).
HTTPSO_DEFAULT_MIN = 0
HTTPSO_DEFAULT_MAX = 100


@dataclass(frozen=True)
class Hold:
    resource: Resource
    namespace: str
    name: str
    target_kind: str
    target_name: str
    service: str
    hosts: tuple[str, ...]
    makes_scaled_object: bool
    """The add-on creates (and owns) a ScaledObject of this name for the target."""

    def holds_for(self, ns: str, kind: str, name: str) -> bool:
        return (self.namespace, self.target_kind, self.target_name) == (ns, kind, name)

    def routes(self, host: str) -> bool:
        """Whether the interceptor sends a request with this Host here: no hosts or a catch-all, the name
        (compared without port), or a `*.` wildcard."""
        name = host.split(":", 1)[0]
        return not self.hosts or any(h in ("", "*") or h == name or (h.startswith("*.") and name.endswith(h[1:]))
                                     for h in self.hosts)


def _read(r: Resource) -> Hold:
    spec = as_map(r.view.get("spec"))
    ref = as_map(spec.get("scaleTargetRef"))
    annotations = as_map(dig(r.view, "metadata", "annotations"))
    return Hold(
        resource=r,
        namespace=namespace(r.view),
        name=str(dig(r.view, "metadata", "name")),
        target_kind=str(ref.get("kind") or "Deployment"),
        target_name=str(ref.get("name")),
        service=str(ref.get("service")),
        hosts=tuple(str(h) for h in as_list(spec.get("hosts"))),
        makes_scaled_object=str(annotations.get(SKIP_SCALED_OBJECT, "")).lower() != "true",
    )


def holds(resources: Sequence[Resource]) -> list[Hold]:
    """The HTTPScaledObjects whose shape is known (unknown ones are skipped)."""
    found = (attempt(_read, r) for r in k8s.kinds_in(resources, frozenset({HTTP_SCALED_OBJECT})))
    return [h for h in found if h is not None]


def hold_named(all_holds: Sequence[Hold], ns: str, name: str) -> Hold | None:
    return next((h for h in all_holds if (h.namespace, h.name) == (ns, name)), None)


def replicas(hold: Resource) -> tuple[int | None, int | None]:
    """(min, max) of the ScaledObject the add-on makes from an HTTPScaledObject."""
    spec = as_map(dig(hold.view, "spec", "replicas"))
    return to_int(spec.get("min", HTTPSO_DEFAULT_MIN)), to_int(spec.get("max", HTTPSO_DEFAULT_MAX))


def woken_by(scaled_object: Resource) -> list[str]:
    """Names of the HTTPScaledObjects whose holds wake this ScaledObject's target (its `external-push` triggers)."""
    names = []
    for trigger in as_list(dig(scaled_object.view, "spec", "triggers")):
        trigger = as_map(trigger)
        named = dig(trigger, "metadata", "httpScaledObject")
        if trigger.get("type") == WAKE_TRIGGER and named:
            names.append(str(named))
    return names


def hold_timeouts(hold: Resource) -> Mapping[str, float | None]:
    """`conditionWait` and `responseHeader` in seconds; None where unset (the interceptor's own default applies)
    or malformed."""
    timeouts = as_map(dig(hold.view, "spec", "timeouts"))
    out: dict[str, float | None] = {}
    for key in ("conditionWait", "responseHeader"):
        raw = timeouts.get(key)
        out[key] = k8s.duration_seconds(str(raw)) if raw is not None else None
    return out
