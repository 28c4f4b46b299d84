"""Reading the request hold of KEDA's HTTP add-on: HTTPScaledObjects (v0.12), InterceptorRoutes (v0.14+), and the
`external-push` triggers that name them.

Either makes the add-on's interceptor hold the requests for some hosts (and path prefixes) while its target has no
ready endpoint, and count them for the add-on's external scaler. An HTTPScaledObject names the workload it wakes
(`scaleTargetRef`) and, without the `skip-scaledobject-creation` annotation, the add-on also creates a ScaledObject of
the same name for it (min 0 and max 100 when `replicas` leaves them out); with it, a ScaledObject of one's own wakes
the workload through an `external-push` trigger naming the HTTPScaledObject. An InterceptorRoute names only the
Service it forwards to: the add-on makes no ScaledObject for it, and the workload it wakes is the one of the
ScaledObject whose `external-push` trigger names it (`interceptorRoute`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import k8s
from .core import Resource, attempt
from .k8s import as_list, as_map, dig, namespace, to_int

HTTP_SCALED_OBJECT = "kubernetes:http.keda.sh/v1alpha1:HTTPScaledObject"
INTERCEPTOR_ROUTE = "kubernetes:http.keda.sh/v1beta1:InterceptorRoute"
HOLD_KINDS = frozenset({HTTP_SCALED_OBJECT, INTERCEPTOR_ROUTE})
SKIP_SCALED_OBJECT = "httpscaledobject.keda.sh/skip-scaledobject-creation"
WAKE_TRIGGER = "external-push"
TRIGGER_KEYS = {"httpScaledObject": "HTTPScaledObject", "interceptorRoute": "InterceptorRoute"}
"""The external scaler's metadata key for each kind of hold (scaler/handlers.go)."""
WAIT_FIELD = {"HTTPScaledObject": "conditionWait", "InterceptorRoute": "readiness"}
"""Each kind's field for how long a request waits for a ready endpoint."""
# The CRD's defaults for `replicas` (the add-on's ScaledObject gets them).
HTTPSO_DEFAULT_MIN = 0
HTTPSO_DEFAULT_MAX = 100


@dataclass(frozen=True)
class Hold:
    resource: Resource
    kind: str
    """HTTPScaledObject or InterceptorRoute."""
    namespace: str
    name: str
    target_kind: str
    target_name: str
    """The workload it wakes; for an InterceptorRoute that no ScaledObject in view names, both empty."""
    service: str
    port: int | None
    port_name: str | None
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

    @property
    def target_field(self) -> str:
        """Where it names its Service and port, as the operator writes it."""
        return "scaleTargetRef" if self.kind == "HTTPScaledObject" else "target"


def _read_scaled_object(r: Resource) -> Hold:
    spec = as_map(r.view.get("spec"))
    ref = as_map(spec.get("scaleTargetRef"))
    annotations = as_map(dig(r.view, "metadata", "annotations"))
    port_name = ref.get("portName")
    return Hold(
        resource=r, kind="HTTPScaledObject", namespace=namespace(r.view), name=str(dig(r.view, "metadata", "name")),
        target_kind=str(ref.get("kind") or "Deployment"), target_name=str(ref.get("name")),
        service=str(ref.get("service")), port=to_int(ref.get("port")), port_name=None if port_name is None else str(port_name),
        hosts=tuple(str(h) for h in as_list(spec.get("hosts"))),
        makes_scaled_object=str(annotations.get(SKIP_SCALED_OBJECT, "")).lower() != "true",
    )


def _read_route(r: Resource, woken: Mapping[tuple[str, str], tuple[str, str]]) -> Hold:
    spec = as_map(r.view.get("spec"))
    target = as_map(spec.get("target"))
    ns, name = namespace(r.view), str(dig(r.view, "metadata", "name"))
    rules = [as_map(rule) for rule in as_list(spec.get("rules"))]
    # A rule without hosts matches any host: the whole route then does.
    hosts = () if not rules or any(not as_list(rule.get("hosts")) for rule in rules) else \
        tuple(str(h) for rule in rules for h in as_list(rule.get("hosts")))
    target_kind, target_name = woken.get((ns, name), ("", ""))
    port_name = target.get("portName")
    return Hold(
        resource=r, kind="InterceptorRoute", namespace=ns, name=name, target_kind=target_kind, target_name=target_name,
        service=str(target.get("service")), port=to_int(target.get("port")), port_name=None if port_name is None else str(port_name),
        hosts=hosts, makes_scaled_object=False,
    )


def holds(resources: Sequence[Resource]) -> list[Hold]:
    """The HTTPScaledObjects and InterceptorRoutes whose shape is known (unknown ones are skipped)."""
    woken: dict[tuple[str, str], tuple[str, str]] = {}
    for scaled_object in k8s.kinds_in(resources, frozenset({k8s.SCALED_OBJECT})):
        ref = as_map(dig(scaled_object.view, "spec", "scaleTargetRef"))
        for kind, name in attempt(woken_by, scaled_object, default=[]):
            if kind == "InterceptorRoute":
                woken[(namespace(scaled_object.view), name)] = (str(ref.get("kind") or "Deployment"), str(ref.get("name")))
    found = [attempt(_read_scaled_object, r) for r in k8s.kinds_in(resources, frozenset({HTTP_SCALED_OBJECT}))]
    found += [attempt(_read_route, r, woken) for r in k8s.kinds_in(resources, frozenset({INTERCEPTOR_ROUTE}))]
    return [h for h in found if h is not None]


def hold_named(all_holds: Sequence[Hold], ns: str, kind: str, name: str) -> Hold | None:
    return next((h for h in all_holds if (h.namespace, h.kind, h.name) == (ns, kind, name)), None)


def replicas(hold: Resource) -> tuple[int | None, int | None]:
    """(min, max) of the ScaledObject the add-on makes from an HTTPScaledObject."""
    spec = as_map(dig(hold.view, "spec", "replicas"))
    return to_int(spec.get("min", HTTPSO_DEFAULT_MIN)), to_int(spec.get("max", HTTPSO_DEFAULT_MAX))


def woken_by(scaled_object: Resource) -> list[tuple[str, str]]:
    """(kind, name) of the holds whose requests wake this ScaledObject's target (its `external-push` triggers)."""
    named = []
    for trigger in as_list(dig(scaled_object.view, "spec", "triggers")):
        trigger = as_map(trigger)
        if trigger.get("type") != WAKE_TRIGGER:
            continue
        metadata = as_map(trigger.get("metadata"))
        named += [(kind, str(metadata[key])) for key, kind in TRIGGER_KEYS.items() if metadata.get(key)]
    return named


def hold_timeouts(hold: Hold) -> Mapping[str, float | None]:
    """`wait` (conditionWait or readiness) and `responseHeader` in seconds; None where unset (the interceptor's own
    default applies) or malformed."""
    timeouts = as_map(dig(hold.resource.view, "spec", "timeouts"))
    out: dict[str, float | None] = {}
    for key, field in (("wait", WAIT_FIELD[hold.kind]), ("responseHeader", "responseHeader")):
        raw = timeouts.get(field)
        out[key] = k8s.duration_seconds(str(raw)) if raw is not None else None
    return out
