"""Rules for the teams' endpoint (issue #43): Envoy AI Gateway routes to InferencePools, each pool with its endpoint
picker, every route behind a key check, model pods that only the gateway and the picker reach, and pickers that read
no more than they watch.

What the rules read: `AIGatewayRoute` (aigateway.envoyproxy.io) and the `HTTPRoute` of the same name AI Gateway
generates from it, which Envoy Gateway's `SecurityPolicy` attaches to; `InferencePool` (inference.networking.k8s.io/v1)
whose `endpointPickerRef` names a Service; that Service's Deployment and its ServiceAccount's Roles."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from . import k8s
from .core import MANDATORY, Resource, Rule, attempt
from .k8s import as_list, as_map, dig, workloads

AI_ROUTE = "kubernetes:aigateway.envoyproxy.io/v1beta1:AIGatewayRoute"
HTTP_ROUTE = "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute"
POOL = "kubernetes:inference.networking.k8s.io/v1:InferencePool"
SECURITY_POLICY = "kubernetes:gateway.envoyproxy.io/v1alpha1:SecurityPolicy"
BACKEND_SECURITY_POLICY = "kubernetes:aigateway.envoyproxy.io/v1beta1:BackendSecurityPolicy"
# A BackendSecurityPolicy's type and the block that holds its credential (AI Gateway v1.0 api/v1beta1).
BACKEND_CREDENTIALS = {"APIKey": "apiKey", "AzureAPIKey": "azureAPIKey", "AnthropicAPIKey": "anthropicAPIKey",
                       "AWSCredentials": "awsCredentials", "AzureCredentials": "azureCredentials", "GCPCredentials": "gcpCredentials"}
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
# The ways Envoy Gateway authenticates a client; any one of them guards a route.
AUTH_KINDS = ("apiKeyAuth", "jwt", "extAuth", "basicAuth", "oidc")
# What the picker watches (its Helm chart's Role); leases only for leader election, with more than one replica.
PICKER_READS = {("", "pods"), ("inference.networking.k8s.io", "inferencepools"),
                ("inference.networking.x-k8s.io", "inferenceobjectives"), ("inference.networking.x-k8s.io", "inferencemodelrewrites")}
LEASES = ("coordination.k8s.io", "leases")
READ_VERBS = {"get", "list", "watch"}


def _name(r: Resource) -> str:
    return str(dig(r.view, "metadata", "name"))


def _matches(selector: Mapping, labels: Mapping) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _pod_labels(w: k8s.Workload) -> Mapping:
    return as_map(dig(w.resource.view, "spec", "template", "metadata", "labels"))


def _pool_deployments(pool: Resource, resources: Sequence[Resource]) -> list[k8s.Workload]:
    """The Deployments whose pods the pool selects (its model servers)."""
    ns, selector = k8s.namespace(pool.view), as_map(dig(pool.view, "spec", "selector", "matchLabels"))
    return [w for w in workloads(resources) if w.resource.type == k8s.DEPLOYMENT and w.namespace == ns
            and _matches(selector, _pod_labels(w))]


def _guarded(resources: Sequence[Resource]) -> set[tuple[str, str, str]]:
    """(namespace, kind, name) of every route or Gateway a SecurityPolicy with client authentication targets."""
    found: set[tuple[str, str, str]] = set()
    for policy in k8s.kinds_in(resources, frozenset({SECURITY_POLICY})):
        spec = as_map(dig(policy.view, "spec"))
        if not any(spec.get(kind) for kind in AUTH_KINDS):
            continue
        for ref in [*as_list(spec.get("targetRefs")), *([spec["targetRef"]] if spec.get("targetRef") else [])]:
            ref = as_map(ref)
            found.add((k8s.namespace(policy.view), str(ref.get("kind")), str(ref.get("name"))))
    return found


def check_auth_required(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    guarded = _guarded(resources)
    for route in k8s.kinds_in(resources, frozenset({AI_ROUTE, HTTP_ROUTE})):
        if route.type == HTTP_ROUTE and not _to_pool(route):
            continue  # a per-model route (cluster.edge gateway): the edge rules judge it
        ns, name = k8s.namespace(route.view), _name(route)
        gateways = {str(as_map(p).get("name")) for p in as_list(dig(route.view, "spec", "parentRefs"))}
        if (ns, "HTTPRoute", name) in guarded or any((ns, "Gateway", g) in guarded for g in gateways):
            continue
        yield route, (f"{route.kind} {name} reaches the models' pools but no SecurityPolicy with client authentication "
                      f"({', '.join(AUTH_KINDS)}) targets HTTPRoute {name} (the route AI Gateway generates from it) or its "
                      "Gateway: anyone who resolves its host can use the GPUs. Add a SecurityPolicy with apiKeyAuth "
                      f"targeting HTTPRoute {name}.")


def _to_pool(route: Resource) -> bool:
    return any(as_map(ref).get("kind") == "InferencePool"
               for rule in as_list(dig(route.view, "spec", "rules")) for ref in as_list(as_map(rule).get("backendRefs")))


def check_pool_has_picker(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    services = {k8s.object_key(s): s for s in k8s.kinds_in(resources, frozenset({k8s.SERVICE}))}
    for pool in k8s.kinds_in(resources, frozenset({POOL})):
        ref = as_map(dig(pool.view, "spec", "endpointPickerRef"))
        if ref.get("failureMode") == "FailOpen":
            yield pool, (f"InferencePool {_name(pool)}: endpointPickerRef.failureMode FailOpen sends requests to any pod when "
                         "the picker is down, a loading or draining one included; use FailClose")
        service = services.get((k8s.namespace(pool.view), str(ref.get("name"))))
        if service is None:
            yield pool, (f"InferencePool {_name(pool)}: its endpointPickerRef names Service {ref.get('name')}, which the stack "
                         "does not declare: with FailClose every request to the pool fails. Declare the picker's Service and "
                         "Deployment, or correct the name.")
            continue
        selector = as_map(dig(service.view, "spec", "selector"))
        if not any(w.namespace == k8s.namespace(pool.view) and _matches(selector, _pod_labels(w))
                   for w in workloads(resources) if w.resource.type == k8s.DEPLOYMENT):
            yield pool, (f"InferencePool {_name(pool)}: its picker Service {ref.get('name')} selects no Deployment of the stack: "
                         "nothing answers the gateway's ext_proc call")
        if not _pool_deployments(pool, resources):
            yield pool, f"InferencePool {_name(pool)}: its selector matches no Deployment of the stack: the pool is empty"


def check_routes_to_pool(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    """A rule of an AIGatewayRoute whose backend is a model's Service rather than the pool that selects its pods:
    round-robin past the picker, to pods that may not be Ready for the picker's reasons."""
    pooled: dict[tuple[str, str], str] = {}
    services = list(k8s.kinds_in(resources, frozenset({k8s.SERVICE})))
    for pool in k8s.kinds_in(resources, frozenset({POOL})):
        labels = [_pod_labels(w) for w in _pool_deployments(pool, resources)]
        for service in services:
            selector = as_map(dig(service.view, "spec", "selector"))
            if k8s.namespace(service.view) == k8s.namespace(pool.view) and any(_matches(selector, lab) for lab in labels):
                pooled[k8s.object_key(service)] = _name(pool)
    for route in k8s.kinds_in(resources, frozenset({AI_ROUTE})):
        ns = k8s.namespace(route.view)
        for rule in as_list(dig(route.view, "spec", "rules")):
            for ref in as_list(as_map(rule).get("backendRefs")):
                ref = as_map(ref)
                # Without a kind, AI Gateway takes the name for an AIServiceBackend's (endpoint-backend-key).
                if ref.get("kind") != "Service":
                    continue
                pool = pooled.get((str(ref.get("namespace") or ns), str(ref.get("name"))))
                if pool:
                    yield route, (f"AIGatewayRoute {_name(route)} sends to Service {ref.get('name')}, whose pods are "
                                  f"InferencePool {pool}'s: the picker is bypassed (no queue- or cache-aware choice). Use "
                                  f"backendRefs [{{group: inference.networking.k8s.io, kind: InferencePool, name: {pool}}}].")


def _peer_problem(peer: Mapping) -> str | None:
    if "ipBlock" in peer:
        return f"an ipBlock ({dig(peer, 'ipBlock', 'cidr')})"
    if "namespaceSelector" in peer and not as_map(dig(peer, "podSelector", "matchLabels")):
        names = as_map(dig(peer, "namespaceSelector", "matchLabels"))
        return f"every pod of namespace {names.get('kubernetes.io/metadata.name') or dict(names) or '(any)'}"
    if not peer:
        return "every pod"
    return None


def check_pods_closed(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    """The pods of a pool have no key of their own: only selected pods (the gateway's Envoy, the picker, Prometheus,
    the smoke test) may reach them, never a whole namespace or an address range."""
    policies = list(k8s.kinds_in(resources, frozenset({NETWORK_POLICY})))
    for pool in k8s.kinds_in(resources, frozenset({POOL})):
        for w in _pool_deployments(pool, resources):
            labels = _pod_labels(w)
            covering = [p for p in policies if k8s.namespace(p.view) == w.namespace
                        and _matches(as_map(dig(p.view, "spec", "podSelector", "matchLabels")), labels)
                        and "Ingress" in as_list(dig(p.view, "spec", "policyTypes"))]
            if not covering:
                yield w.resource, (f"Deployment {w.name} serves InferencePool {_name(pool)} without a key of its own, but no "
                                   "NetworkPolicy limits who reaches it: any pod could bypass the gateway's key check")
                continue
            for policy in covering:
                for rule in as_list(dig(policy.view, "spec", "ingress")):
                    rule = as_map(rule)
                    peers = as_list(rule.get("from"))
                    problems = [p for p in (attempt(_peer_problem, as_map(peer)) for peer in peers) if p] if peers else ["every pod"]
                    for problem in problems:
                        yield policy, (f"NetworkPolicy {_name(policy)} admits {problem} to Deployment {w.name}, which serves "
                                       f"InferencePool {_name(pool)} without a key of its own: they bypass the teams' keys. "
                                       "Admit only the gateway's Envoy pods, the picker, Prometheus and the smoke test.")


def check_picker_rbac(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    services = {k8s.object_key(s): s for s in k8s.kinds_in(resources, frozenset({k8s.SERVICE}))}
    roles = {k8s.object_key(r): r for r in k8s.kinds_in(resources, frozenset({ROLE}))}
    bindings = list(k8s.kinds_in(resources, frozenset({ROLE_BINDING})))
    for pool in k8s.kinds_in(resources, frozenset({POOL})):
        ns = k8s.namespace(pool.view)
        service = services.get((ns, str(dig(pool.view, "spec", "endpointPickerRef", "name"))))
        if service is None:
            continue
        selector = as_map(dig(service.view, "spec", "selector"))
        for w in workloads(resources):
            if w.resource.type != k8s.DEPLOYMENT or w.namespace != ns or not _matches(selector, _pod_labels(w)):
                continue
            account = str(as_map(w.spec).get("serviceAccountName") or "default")
            allowed = PICKER_READS | ({LEASES} if (attempt(lambda r: dig(r.view, "spec", "replicas"), w.resource) or 1) > 1 else set())
            for binding in bindings:
                subjects = [as_map(s) for s in as_list(dig(binding.view, "subjects"))]
                if k8s.namespace(binding.view) != ns or not any(
                        s.get("kind") == "ServiceAccount" and s.get("name") == account for s in subjects):
                    continue
                role = roles.get((ns, str(dig(binding.view, "roleRef", "name"))))
                if role is None:
                    continue
                for rule in as_list(dig(role.view, "rules")):
                    rule = as_map(rule)
                    extra_verbs = set(map(str, as_list(rule.get("verbs")))) - READ_VERBS
                    extra = {(str(g), str(r)) for g in as_list(rule.get("apiGroups")) for r in as_list(rule.get("resources"))} - allowed
                    if extra_verbs or extra:
                        what = ", ".join(sorted(extra_verbs) + [f"{g or 'core'}/{r}" for g, r in sorted(extra)])
                        yield role, (f"Role {_name(role)} of picker {w.name} ({account}) grants {what}: the picker only "
                                     "reads pods, inferencepools, inferenceobjectives and inferencemodelrewrites (get, list, "
                                     "watch); a compromised picker could do the rest")
            for binding in k8s.kinds_in(resources, frozenset({CLUSTER_ROLE_BINDING})):
                if any(as_map(s).get("kind") == "ServiceAccount" and as_map(s).get("name") == account
                       and as_map(s).get("namespace") == ns for s in as_list(dig(binding.view, "subjects"))):
                    yield binding, (f"ClusterRoleBinding {_name(binding)} gives picker {w.name}'s ServiceAccount {account} "
                                    "cluster-wide rights; it needs only its namespace's pods and pools")


def check_backend_key(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    """A rule to an AIServiceBackend (a held model's way to its interceptor) with no BackendSecurityPolicy giving the
    backend a credential: the interceptor is reachable by every pod, so the model must check a key of its own, and
    the gateway must present it."""
    keyed = {(k8s.namespace(p.view), str(as_map(ref).get("name")))
             for p in k8s.kinds_in(resources, frozenset({BACKEND_SECURITY_POLICY}))
             if as_map(dig(p.view, "spec", BACKEND_CREDENTIALS.get(str(dig(p.view, "spec", "type")), "")))
             for ref in as_list(dig(p.view, "spec", "targetRefs")) if as_map(ref).get("kind") == "AIServiceBackend"}
    for route in k8s.kinds_in(resources, frozenset({AI_ROUTE})):
        ns = k8s.namespace(route.view)
        for rule in as_list(dig(route.view, "spec", "rules")):
            for ref in as_list(as_map(rule).get("backendRefs")):
                ref = as_map(ref)
                if ref.get("kind", "AIServiceBackend") != "AIServiceBackend":
                    continue
                if (str(ref.get("namespace") or ns), str(ref.get("name"))) not in keyed:
                    yield route, (f"AIGatewayRoute {_name(route)} sends to AIServiceBackend {ref.get('name')}, which no "
                                  "BackendSecurityPolicy gives a credential: the requests reach the model (through the "
                                  "interceptor, for a held one) with no key, so anything else that reaches it does too. Add "
                                  f"a BackendSecurityPolicy of type APIKey targeting AIServiceBackend {ref.get('name')}, "
                                  "with the key the model checks.")


def check_tenant_keys(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    for policy in k8s.kinds_in(resources, frozenset({SECURITY_POLICY})):
        ns = k8s.namespace(policy.view)
        for ref in as_list(dig(policy.view, "spec", "apiKeyAuth", "credentialRefs")):
            ref = as_map(ref)
            other = ref.get("namespace")
            if other and other != ns:
                yield policy, (f"SecurityPolicy {_name(policy)} takes API keys from Secret {other}/{ref.get('name')}: whoever "
                               f"writes Secrets in {other} can add a key to this route. Keep the keys in {ns}.")
            if ref.get("kind", "Secret") != "Secret":
                yield policy, f"SecurityPolicy {_name(policy)}: credentialRefs {ref.get('name')} is a {ref.get('kind')}, not a Secret"


RULES = [
    Rule("endpoint-auth-required",
         "An AIGatewayRoute (or an HTTPRoute to an InferencePool) is targeted, through the HTTPRoute of its name or its "
         "Gateway, by a SecurityPolicy with client authentication.",
         MANDATORY, check_auth_required),
    Rule("endpoint-pool-has-picker",
         "An InferencePool's endpointPickerRef names a Service of the stack that selects a Deployment; FailClose, and "
         "a selector that matches model servers.",
         MANDATORY, check_pool_has_picker),
    Rule("endpoint-routes-to-pool",
         "An AIGatewayRoute sends to a model's InferencePool, never to the Service of the pods a pool selects.",
         MANDATORY, check_routes_to_pool),
    Rule("endpoint-pods-closed",
         "The pods an InferencePool selects are limited by a NetworkPolicy admitting selected pods only: no whole "
         "namespace, no address range.",
         MANDATORY, check_pods_closed),
    Rule("picker-rbac-minimal",
         "An endpoint picker's Roles read only pods, inferencepools, inferenceobjectives, inferencemodelrewrites "
         "(get, list, watch; leases with more than one replica); no ClusterRoleBinding.",
         MANDATORY, check_picker_rbac),
    Rule("endpoint-backend-key",
         "An AIGatewayRoute's AIServiceBackend (a held model's way through the interceptor) is given the model's key by "
         "a BackendSecurityPolicy.",
         MANDATORY, check_backend_key),
    Rule("tenant-keys-in-secrets",
         "A SecurityPolicy's apiKeyAuth reads keys from Secrets in its own namespace.",
         MANDATORY, check_tenant_keys),
]
