"""Rules for a vLLM workload whose requests KEDA's HTTP add-on holds while it starts from zero.

A held request waits at the interceptor until the workload has a ready endpoint (an HTTPScaledObject's
`conditionWait`, an InterceptorRoute's `readiness`), then for vLLM's response headers (`responseHeader`), which a
non-streamed answer sends only when complete. Up to v0.13 each wait has a default far below what a model takes (the
add-on's chart: 20 s and 500 ms); from v0.14 the wait for an endpoint is unbounded by default and the one for the
headers 300 s. Every proxy in front of the interceptor waits for the first byte as long as both together.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from . import k8s
from .core import MANDATORY, Resource, Rule, attempt
from .edge import HTTPROUTE, INGRESS_CLASS_NAMES, NGINX_DEFAULT_TIMEOUT, _edges, nginx_class, sent_hosts
from .holds import WAIT_FIELD, Hold, hold_timeouts, holds
from .k8s import Workload, as_list, as_map, dig, duration_seconds, to_int, workloads
from .workloads import probe_budget

CHART_CONDITION_WAIT = "KEDA_CONDITION_WAIT_TIMEOUT, 20s in the add-on's chart"
CHART_RESPONSE_HEADER = "KEDA_RESPONSE_HEADER_TIMEOUT, 500ms in the add-on's chart"
ROUTE_RESPONSE_HEADER = 300
"""KEDA_HTTP_RESPONSE_HEADER_TIMEOUT's default from v0.14, which an InterceptorRoute without the timeout gets."""


def startup_budget(workload: Workload) -> int:
    """The longest startup probe among the workload's vLLM containers: how long a start may take."""
    return max(probe_budget(as_map(c.get("startupProbe"))) for c in k8s.containers(workload.spec) if k8s.is_vllm_server(c))


def _held(resources: Sequence[Resource]) -> list[tuple[Hold, Workload]]:
    servers = [w for w in workloads(resources) if w.vllm]
    return [(h, w) for h in holds(resources) for w in servers if h.holds_for(w.namespace, w.resource.kind, str(w.name))]


def _hold_problems(hold: Hold, workload: Workload, scaled_objects: set[tuple[str, str]], min_header: int) -> list[str]:
    timeouts = hold_timeouts(hold)
    wait, header = timeouts["wait"], timeouts["responseHeader"]
    field = WAIT_FIELD[hold.kind]
    # The interceptor answers a timeout with 502 up to v0.13 (the HTTPScaledObject's add-on), 504 from v0.14.
    status = "502" if hold.kind == "HTTPScaledObject" else "504"
    budget = startup_budget(workload)
    problems = []
    # An InterceptorRoute without `readiness` waits as long as the request lasts (v0.14's default): nothing to flag.
    if (wait is None and hold.kind == "HTTPScaledObject") or (wait is not None and wait < budget):
        shown = f"timeouts.{field} is {dig(hold.resource.view, 'spec', 'timeouts', field)}" if wait is not None \
            else f"timeouts.{field} is unset ({CHART_CONDITION_WAIT})"
        problems.append(
            f"{shown}, below the {budget}s the startup probe of {workload.resource.kind} {workload.name} allows for a start: "
            f"the first request after idling gets {status} while the model still loads. Set {field} to \"{budget}s\" or more.")
    if header is None and hold.kind == "InterceptorRoute":
        header, unset = ROUTE_RESPONSE_HEADER, f"unset (KEDA_HTTP_RESPONSE_HEADER_TIMEOUT, {ROUTE_RESPONSE_HEADER}s by default)"
    else:
        unset = f"unset ({CHART_RESPONSE_HEADER})"
    if header is None or header < min_header:
        raw = dig(hold.resource.view, 'spec', 'timeouts', 'responseHeader')
        shown = f"timeouts.responseHeader is {raw if raw is not None else unset}"
        problems.append(
            f"{shown} (< {min_header}s): vLLM sends the headers of a non-streamed answer when it is complete, and of a "
            f"streamed one after the queue, so longer answers get {status} (kedacore/http-add-on#432). Set responseHeader to "
            f"\"{min_header}s\" or more.")
    if hold.kind == "HTTPScaledObject" and not hold.makes_scaled_object and (hold.namespace, hold.name) in scaled_objects:
        problems.append(
            f"skips the add-on's ScaledObject, and the add-on deletes the ScaledObject named {hold.name} it would have made: "
            f"the stack's own ScaledObject of that name is removed behind its back. Give that ScaledObject another name.")
    return problems


def _edge_wait(edge: Resource, held_services: set[str]) -> list[tuple[str, float]]:
    """(setting, seconds) of the edge's timeouts in front of the hold (0: no timeout)."""
    if edge.type == HTTPROUTE:
        found = []
        for rule in as_list(dig(edge.view, "spec", "rules")):
            if not {str(as_map(r).get("name")) for r in as_list(as_map(rule).get("backendRefs"))} & held_services:
                continue
            for key in ("request", "backendRequest"):
                raw = dig(rule, "timeouts", key)
                seconds = duration_seconds(str(raw)) if raw is not None else None
                if seconds is not None and seconds > 0:
                    found.append((f"timeouts.{key}", seconds))
        return found
    annotations = as_map(dig(edge.view, "metadata", "annotations"))
    found = []
    for key in ("proxy-read-timeout", "proxy-send-timeout"):
        raw = annotations.get(f"nginx.ingress.kubernetes.io/{key}")
        seconds = NGINX_DEFAULT_TIMEOUT if raw is None else to_int(raw)
        if seconds is not None:
            found.append((key, seconds))
    return found


def _edge_problems(edge: Resource, behind: Mapping[str, list[Workload]], all_holds: Sequence[Hold]) -> list[str]:
    hosts = sent_hosts(edge)
    problems = []
    for name in sorted(behind):
        for hold in (h for h in all_holds if any(h.routes(host) for host in hosts.get(name, ()))):
            timeouts = hold_timeouts(hold)
            if timeouts["wait"] is None or timeouts["responseHeader"] is None:
                continue  # the interceptor's own defaults, which this rule cannot see (the hold's own problem above)
            needed = timeouts["wait"] + timeouts["responseHeader"]
            short = [f"{key} is {seconds:g}s" for key, seconds in _edge_wait(edge, {name}) if seconds < needed]
            if short:
                problems.append(
                    f"{', '.join(short)} in front of the request hold {hold.name}, which waits up to {WAIT_FIELD[hold.kind]} for the "
                    f"model to start and responseHeader for vLLM's first byte ({needed:g}s together): a request that woke "
                    f"the model is cut with 504 before it is answered. Set it to {needed:g}s or more.")
    return problems


def check_request_hold(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    min_header, classes = int(cfg["minResponseHeaderSeconds"]), list(cfg["ingressClassNames"])
    scaled_objects = {(k8s.namespace(r.view), str(dig(r.view, "metadata", "name")))
                      for r in k8s.kinds_in(resources, frozenset({k8s.SCALED_OBJECT}))}
    for hold, workload in _held(resources):
        for problem in attempt(_hold_problems, hold, workload, scaled_objects, min_header, default=[]):
            yield hold.resource, problem
    all_holds = holds(resources)
    for edge, behind in _edges(resources):
        # Only nginx reads these annotations; another Ingress controller has timeouts of its own.
        if edge.type == HTTPROUTE or attempt(nginx_class, edge.view, classes, default=False):
            for problem in attempt(_edge_problems, edge, behind, all_holds, default=[]):
                yield edge, problem


def check_hold_target(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    """The interceptor forwards a held request to the Service and port the hold names (an HTTPScaledObject's
    scaleTargetRef, an InterceptorRoute's target): they must lead to the workload it wakes."""
    services = {(k8s.namespace(r.view), str(dig(r.view, "metadata", "name"))): r for r in k8s.kinds_in(resources, frozenset({k8s.SERVICE}))}
    by_name = {(w.namespace, w.resource.kind, str(w.name)): w for w in workloads(resources)}
    for hold in holds(resources):
        service = services.get((hold.namespace, hold.service))
        if service is None:
            continue  # defined elsewhere: nothing to compare
        ports = [as_map(p) for p in as_list(dig(service.view, "spec", "ports"))]
        port, port_name = hold.port, hold.port_name
        if (port is not None and port not in {to_int(p.get("port")) for p in ports}) or \
                (port_name is not None and port_name not in {p.get("name") for p in ports}):
            offered = ", ".join(f"{p.get('name')}:{p.get('port')}" for p in ports)
            yield hold.resource, (
                f"{hold.target_field} sends held requests to port {port if port is not None else port_name} of Service "
                f"{hold.service}, which serves {offered or 'no port'}: the interceptor wakes the model and then cannot "
                f"reach it, so every held request fails. Give the Service's port (its `port`, not the targetPort).")
        workload = by_name.get((hold.namespace, hold.target_kind, hold.target_name))
        selector = as_map(dig(service.view, "spec", "selector"))
        if workload is not None and not k8s.selects(selector, k8s.pod_labels(workload.resource)):
            yield hold.resource, (
                f"{_waker(hold)} {hold.target_kind} {hold.target_name} but {hold.target_field} sends the requests to Service "
                f"{hold.service}, "
                f"which does not select its pods: the model that starts is not the one that answers (or nothing answers). "
                f"Name the Service of {hold.target_name}.")


def _waker(hold: Hold) -> str:
    return "scaleTargetRef wakes" if hold.kind == "HTTPScaledObject" else "the ScaledObject naming it wakes"


RULES = [
    Rule("vllm-hold-target",
         "An HTTPScaledObject or InterceptorRoute forwards held requests to a port its Service serves, and that Service "
         "selects the workload it wakes.", MANDATORY, check_hold_target),
    Rule("vllm-request-hold",
         "An HTTPScaledObject or InterceptorRoute holding the requests of a vLLM workload waits out its startup probe and "
         "its longest answer, and the edge in front of it waits as long.",
         MANDATORY, check_request_hold,
         config={"minResponseHeaderSeconds": {"type": "integer", "minimum": 0, "default": 600,
                                              "description": "Minimum timeouts.responseHeader of the hold."},
                 **INGRESS_CLASS_NAMES}),
]
