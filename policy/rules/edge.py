"""Rules for the edge in front of vLLM: Ingresses and Gateway API HTTPRoutes.

vLLM's API key guards `/v1` only; `/invocations`, `/tokenize`, `/metrics`, `/pooling` and the
admin endpoints answer anyone who reaches the pod. So an edge forwards `/v1` and nothing else,
and whatever it forwards to is authenticated: by the server's key or by the edge itself.
These rules judge an edge only when they can see the vLLM workload behind it (a Service of the
same stack selecting it): a rule may only fail on what it saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

from . import k8s
from .core import MANDATORY, Resource, Rule, Unknown, attempt
from .holds import Hold, holds
from .k8s import Workload, as_list, as_map, container_name, dig, duration_seconds, namespace, object_key, to_int, workloads

OPENAI_PREFIX = "/v1"
HTTPROUTE = "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute"
EDGES = frozenset({k8s.INGRESS, HTTPROUTE})
# Ingress annotations by which the controller authenticates before forwarding (ingress-nginx:
# external auth, basic/digest auth, client certificates).
DEFAULT_AUTH_ANNOTATIONS = [
    "nginx.ingress.kubernetes.io/auth-url",
    "nginx.ingress.kubernetes.io/auth-type",
    "nginx.ingress.kubernetes.io/auth-tls-verify-client",
]


def under_openai_prefix(path: str) -> bool:
    """`/v1`, `/v1/...`, or a regex/rewrite that starts with the literal `/v1` segment."""
    return path == OPENAI_PREFIX or bool(re.match(rf"^{OPENAI_PREFIX}([/$(]|\\?/)", path))


# --- what an edge forwards, and to which Services ----------------------------------------------

def ingress_forwards(ingress: Resource) -> list[tuple[str, str]]:
    """(service name, path vLLM receives) per backend. With a rewrite-target the target is what
    arrives; a defaultBackend receives every path."""
    props = ingress.view
    rewrite = as_map(dig(props, "metadata", "annotations")).get("nginx.ingress.kubernetes.io/rewrite-target")
    spec = as_map(props.get("spec"))
    found = []
    default = dig(spec, "defaultBackend", "service", "name")
    if default:
        found.append((str(default), "/"))
    for rule in as_list(spec.get("rules")):
        for entry in as_list(dig(rule, "http", "paths")):
            entry = as_map(entry)
            service = dig(entry, "backend", "service", "name")
            if service:
                path = rewrite if isinstance(rewrite, str) else str(entry.get("path") or "/")
                found.append((str(service), path))
    return found


def route_forwards(route: Resource) -> list[tuple[str, str]]:
    """(service name, path vLLM receives) per backendRef of each rule. A rule without matches
    matches every path; a URLRewrite filter decides what arrives."""
    found = []
    for rule in as_list(dig(route.view, "spec", "rules")):
        rule = as_map(rule)
        rewritten = None
        for f in as_list(rule.get("filters")):
            path = as_map(dig(f, "urlRewrite", "path"))
            rewritten = path.get("replacePrefixMatch") or path.get("replaceFullPath") or rewritten
        matches = [as_map(m) for m in as_list(rule.get("matches"))] or [{}]
        paths = [str(dig(m, "path", "value") or "/") for m in matches]
        for ref in as_list(rule.get("backendRefs")):
            ref = as_map(ref)
            if (ref.get("kind") or "Service") != "Service" or not ref.get("name"):
                continue
            found += [(str(ref["name"]), str(rewritten) if rewritten else p) for p in paths]
    return found


def forwards(edge: Resource) -> list[tuple[str, str]]:
    return route_forwards(edge) if edge.type == HTTPROUTE else ingress_forwards(edge)


def sent_hosts(edge: Resource) -> dict[str, set[str]]:
    """Service name -> the Host headers the edge sends it: ingress-nginx's `upstream-vhost` or the rule's host; an
    HTTPRoute rule's URLRewrite hostname or the route's hostnames."""
    props = edge.view
    found: dict[str, set[str]] = {}
    if edge.type == HTTPROUTE:
        names = {str(h) for h in as_list(dig(props, "spec", "hostnames"))}
        for rule in as_list(dig(props, "spec", "rules")):
            rewritten = {str(dig(f, "urlRewrite", "hostname")) for f in as_list(as_map(rule).get("filters"))
                         if dig(f, "urlRewrite", "hostname")}
            for ref in as_list(as_map(rule).get("backendRefs")):
                found.setdefault(str(as_map(ref).get("name")), set()).update(rewritten or names)
        return found
    vhost = as_map(dig(props, "metadata", "annotations")).get("nginx.ingress.kubernetes.io/upstream-vhost")
    for rule in as_list(dig(props, "spec", "rules")):
        host = {str(vhost)} if vhost else ({str(as_map(rule)["host"])} if as_map(rule).get("host") else set())
        for entry in as_list(dig(rule, "http", "paths")):
            found.setdefault(str(dig(entry, "backend", "service", "name")), set()).update(host)
    return found


def _selected(service: Resource | None, ns: str, servers: Sequence[Workload]) -> list[Workload]:
    if service is None:
        return []
    selector = as_map(dig(service.view, "spec", "selector"))
    return [w for w in servers if w.namespace == ns and k8s.selects(selector, k8s.pod_labels(w.resource))]


def vllm_behind(
    edge: Resource, services: Mapping, servers: Sequence[Workload], all_holds: Sequence[Hold] = ()
) -> dict[str, list[Workload]]:
    """Service name -> the vLLM workloads of the stack it selects (only Services that select one). A backend that selects
    no pods (the HTTP add-on's interceptor, or an ExternalName Service for it) reaches the workloads of the
    HTTPScaledObjects and InterceptorRoutes that route the Host the edge sends it: the request hold is a way in like any other."""
    ns = namespace(edge.view)
    behind: dict[str, list[Workload]] = {}
    hosts = sent_hosts(edge) if all_holds else {}
    for name, _ in forwards(edge):
        service = services.get((ns, name))
        selected = _selected(service, ns, servers)
        if not selected and (service is None or not as_map(dig(service.view, "spec", "selector"))):
            for hold in (h for h in all_holds if any(h.routes(host) for host in hosts.get(name, ()))):
                selected += _selected(services.get((hold.namespace, hold.service)), hold.namespace, servers)
        if selected:
            behind[name] = selected
    return behind


def _edges(resources: Sequence[Resource]) -> Iterator[tuple[Resource, dict[str, list[Workload]]]]:
    services = stack_services(resources)
    servers = [w for w in workloads(resources) if w.vllm]
    all_holds = holds(resources)
    for edge in k8s.kinds_in(resources, EDGES):
        behind = attempt(vllm_behind, edge, services, servers, all_holds, default={})
        if behind:
            yield edge, behind


# --- only /v1 ------------------------------------------------------------------------------------

def check_openai_only(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    for edge, behind in _edges(resources):
        try:
            open_paths = sorted({p for s, p in forwards(edge) if s in behind and not under_openai_prefix(p)})
        except Unknown:
            continue
        if open_paths:
            yield edge, (
                f"forwards {', '.join(open_paths)} to vLLM ({', '.join(sorted(behind))}): vLLM's API key guards only "
                f"/v1, so /invocations, /tokenize, /metrics and the admin endpoints answer anyone. Route only "
                f"{OPENAI_PREFIX} (pathType Prefix {OPENAI_PREFIX}, or a rewrite whose target starts with {OPENAI_PREFIX}/).")


# --- authenticated -------------------------------------------------------------------------------

def has_api_key(container: Mapping) -> bool:
    if k8s.flag_value(k8s.argv(container), "--api-key") is not None:
        return True
    if any(as_map(e).get("name") == "VLLM_API_KEY" for e in as_list(container.get("env"))):
        return True
    # A Secret passed whole may hold VLLM_API_KEY: the rule cannot see inside, so it trusts it.
    return any("secretRef" in as_map(e) for e in as_list(container.get("envFrom")))


def unkeyed(workload: Workload) -> list[str]:
    return [container_name(c) for c in k8s.containers(workload.spec) if k8s.is_vllm_server(c) and not has_api_key(c)]


def check_edge_auth(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    auth_keys = list(cfg["authAnnotations"])
    for edge, behind in _edges(resources):
        try:
            annotations = as_map(dig(edge.view, "metadata", "annotations"))
            if edge.type == k8s.INGRESS and any(annotations.get(k) for k in auth_keys):
                continue
            open_servers = sorted({f"{w.resource.kind}/{w.name}" for ws in behind.values() for w in ws if unkeyed(w)})
        except Unknown:
            continue
        if open_servers:
            hosts = [str(h) for h in as_list(dig(edge.view, "spec", "hostnames"))]
            hosts += [str(as_map(r).get("host")) for r in as_list(dig(edge.view, "spec", "rules")) if as_map(r).get("host")]
            where = ", ".join(sorted(set(hosts))) or "every host"
            yield edge, (
                f"exposes {', '.join(open_servers)} on {where} with no authentication: anyone who reaches the host "
                f"uses the GPUs. Give the vLLM container an API key (env VLLM_API_KEY from a secretKeyRef) or, on "
                f"an Ingress, authenticate at the edge ({auth_keys[0] if auth_keys else 'auth annotations'}).")


# --- no runtime LoRA loading at the edge -----------------------------------------------------------

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def loads_adapters_at_runtime(container: Mapping) -> bool:
    """vLLM turns the load/unload endpoints on for `1` or `true`, in any case."""
    return (k8s.env_literal(container, RUNTIME_LORA_ENV) or "").strip().lower() in ("1", "true")


def check_edge_runtime_lora(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    for edge, behind in _edges(resources):
        try:
            updating = sorted({f"{w.resource.kind}/{w.name}" for ws in behind.values() for w in ws
                               if any(k8s.is_vllm_server(c) and loads_adapters_at_runtime(c) for c in k8s.containers(w.spec))})
        except Unknown:
            continue
        if updating:
            yield edge, (
                f"exposes {', '.join(updating)}, which load LoRA adapters at runtime ({RUNTIME_LORA_ENV}): "
                f"/v1/load_lora_adapter and /v1/unload_lora_adapter sit under the /v1 the edge forwards, behind the same key "
                f"as inference, so any client can change what the model answers, and what it loads is lost on restart. "
                f"Remove {RUNTIME_LORA_ENV} and list the adapters with --lora-modules.")


# --- streaming through a Gateway -----------------------------------------------------------------

def check_route_streaming(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    minimum = int(cfg["minTimeoutSeconds"])
    for edge, behind in _edges(resources):
        if edge.type != HTTPROUTE:
            continue
        try:
            problems = []
            for rule in as_list(dig(edge.view, "spec", "rules")):
                services = {str(as_map(r).get("name")) for r in as_list(as_map(rule).get("backendRefs"))}
                if not services & set(behind):
                    continue
                for key in ("request", "backendRequest"):
                    raw = dig(rule, "timeouts", key)
                    if raw is None:
                        if key == "request":
                            problems.append("timeouts.request is unset (the implementation's default, often 15s)")
                        continue
                    seconds = duration_seconds(str(raw))
                    if seconds is None:
                        problems.append(f"timeouts.{key} {raw!r} is not a duration")
                    elif 0 < seconds < minimum:  # 0s disables the timeout
                        problems.append(f"timeouts.{key} is {raw}")
        except Unknown:
            continue
        if problems:
            yield edge, (
                f"{'; '.join(sorted(set(problems)))} (< {minimum}s) on a route to vLLM: a slow first token or a long "
                f"streamed answer is cut off with 504. Set timeouts.request (and backendRequest) to \"{minimum}s\" or more.")


# --- nginx Ingresses in front of vLLM ------------------------------------------------------------

# ingress-nginx's default proxy timeouts.
NGINX_DEFAULT_TIMEOUT = 60
# The config key of every rule that judges nginx Ingresses.
INGRESS_CLASS_NAMES = {"ingressClassNames": {"type": "array", "items": {"type": "string"}, "default": ["nginx"],
                                             "description": "Ingress classes served by ingress-nginx."}}


def nginx_class(props: Mapping, class_names: Sequence[str]) -> bool:
    name = dig(props, "spec", "ingressClassName")
    if name is None:
        name = as_map(dig(props, "metadata", "annotations")).get("kubernetes.io/ingress.class")
    return name in class_names


def backend_services(props: Mapping) -> set[str]:
    spec = as_map(props.get("spec"))
    backends = [spec.get("defaultBackend")]
    for rule in as_list(spec.get("rules")):
        backends += [as_map(p).get("backend") for p in as_list(dig(rule, "http", "paths"))]
    return {str(dig(b, "service", "name")) for b in backends if dig(b, "service", "name")}


def _serves_vllm(service: Resource, candidates: Sequence[Workload]) -> bool:
    if dig(service.view, "spec", "type") == "ExternalName":
        return True  # a name for something elsewhere (the HTTP add-on's interceptor, say): it may be vLLM
    selector = as_map(dig(service.view, "spec", "selector"))
    ns = namespace(service.view)
    return any(w.namespace == ns and k8s.selects(selector, k8s.pod_labels(w.resource)) for w in candidates)


def stack_services(resources: Sequence[Resource]) -> dict[tuple[str, str], Resource]:
    services = {}
    for service in k8s.kinds_in(resources, frozenset({k8s.SERVICE})):
        key = attempt(object_key, service)
        if key:
            services[key] = service
    return services


def fronts_vllm(ingress: Resource, services: Mapping[tuple[str, str], Resource], model_pods: Sequence[Workload]) -> bool:
    """An Ingress counts as "in front of vLLM" unless every backend is a Service
    of this stack that selects no GPU/vLLM pod: the policy cannot see pods that
    live elsewhere, and a streaming API behind buffering is the costly mistake."""
    ns = namespace(ingress.view)
    for name in backend_services(ingress.view):
        service = services.get((ns, name))
        if service is None or attempt(_serves_vllm, service, model_pods, default=True):
            return True
    return False


def _timeout_problem(annotations: Mapping, key: str, minimum: int) -> str | None:
    raw = annotations.get(f"nginx.ingress.kubernetes.io/{key}")
    value = NGINX_DEFAULT_TIMEOUT if raw is None else to_int(raw)
    if value is None:
        return f"{key} {raw!r} is not a number of seconds"
    if value < minimum:
        return f"{key} is {value}s{' (nginx default)' if raw is None else ''}"
    return None


def check_ingress_streaming(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    minimum, classes = int(cfg["minProxyTimeoutSeconds"]), list(cfg["ingressClassNames"])
    # Read once for all Ingresses: per Ingress it made the rule quadratic in the stack's size.
    services = stack_services(resources)
    model_pods = [w for w in workloads(resources) if w.gpus_per_pod or w.vllm]
    for ingress in k8s.kinds_in(resources, frozenset({k8s.INGRESS})):
        try:
            if not nginx_class(ingress.view, classes) or not fronts_vllm(ingress, services, model_pods):
                continue
            annotations = as_map(dig(ingress.view, "metadata", "annotations"))
            buffering = annotations.get("nginx.ingress.kubernetes.io/proxy-buffering")
            timeouts = [_timeout_problem(annotations, k, minimum) for k in ("proxy-read-timeout",
                                                                         "proxy-send-timeout")]
        except Unknown:
            continue
        if buffering != "off":
            yield ingress, (
                "nginx buffers the upstream response (proxy-buffering is not \"off\"): streamed tokens "
                "arrive all at once at the end, so streaming looks broken. Add annotation "
                "nginx.ingress.kubernetes.io/proxy-buffering: \"off\".")
        problems = [t for t in timeouts if t]
        if problems:
            yield ingress, (
                f"{'; '.join(problems)} (< {minimum}s): long generations and a slow first token are cut "
                f"off with 504 Gateway Time-out. Set nginx.ingress.kubernetes.io/proxy-read-timeout and "
                f"proxy-send-timeout to \"{minimum}\" or more.")


RULES = [
    Rule("edge-vllm-openai-only",
         "Ingresses and HTTPRoutes in front of vLLM forward only /v1 (the paths vLLM's API key guards).",
         MANDATORY, check_openai_only),
    Rule("edge-vllm-auth",
         "Ingresses and HTTPRoutes in front of vLLM reach only servers with an API key, or authenticate at the edge.",
         MANDATORY, check_edge_auth,
         config={"authAnnotations": {"type": "array", "items": {"type": "string"}, "default": DEFAULT_AUTH_ANNOTATIONS,
                                     "description": "Ingress annotations that make the controller authenticate requests."}}),
    Rule("edge-vllm-no-runtime-lora",
         "Ingresses and HTTPRoutes in front of vLLM reach no server that loads LoRA adapters at runtime.",
         MANDATORY, check_edge_runtime_lora),
    Rule("httproute-vllm-streaming",
         "HTTPRoutes to vLLM set request timeouts long enough for streamed answers.",
         MANDATORY, check_route_streaming,
         config={"minTimeoutSeconds": {"type": "integer", "minimum": 0, "default": 600,
                                       "description": "Minimum timeouts.request / backendRequest."}}),
    Rule("ingress-vllm-streaming",
         "nginx Ingresses in front of vLLM disable proxy buffering and allow long proxy timeouts.",
         MANDATORY, check_ingress_streaming,
         config={"minProxyTimeoutSeconds": {"type": "integer", "minimum": 0, "default": 600,
                                            "description": "Minimum proxy-read/send-timeout."},
                 **INGRESS_CLASS_NAMES}),
]
