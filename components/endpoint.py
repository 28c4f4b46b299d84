"""The teams' endpoint: per team (`tenants[]`) one OpenAI base URL, `https://<team>.<cluster.endpoint.domain>/v1`, for
every model it may use, on Envoy AI Gateway v1.0 over Envoy Gateway.

Per team: a Secret of its keys (each data key a client id), an `AIGatewayRoute` whose rules send the body's `model`
(AI Gateway copies it into `x-ai-eg-model`) to that model's InferencePool, a `SecurityPolicy` that admits only the
team's keys on the route AI Gateway generates from it (same name), and a `BackendTrafficPolicy` that turns the
gateway's own refusals into OpenAI error bodies (and holds `requestsPerMinute`). A model the team may not use matches
no rule: AI Gateway's not-found answer, the same as for a model that does not exist, so a key cannot probe another
team's names. `GET /v1/models` is answered by AI
Gateway per host: the team's models and adapters. A key rotation changes the Secret alone: Envoy Gateway pushes the
credentials to Envoy, and no model pod restarts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.cluster import applied_annotations
from components.serving.gateway import GATEWAY_GROUP, route_timeouts
from components.serving.names import hold_host, hold_name, object_name
from components.serving.picker import INFERENCE_GROUP
from stacks.config import ClusterConfig, Model
from stacks.config.checks.endpoint import served_names
from stacks.config.endpoint import Tenant

MODEL_HEADER = "x-ai-eg-model"
"""Where AI Gateway's ext_proc puts the request body's `model` before the route is chosen again."""
TENANT_HEADER = "x-gs-tenant"
"""The team's client id, which Envoy's api_key_auth sets (over anything the client sent) after the key matched."""
ENVOY_GATEWAY_GROUP = "gateway.envoyproxy.io"
AI_GATEWAY_GROUP = "aigateway.envoyproxy.io"
AI_GATEWAY_API = f"{AI_GATEWAY_GROUP}/v1beta1"


def route_name(tenant: Tenant) -> str:
    return f"gs-{tenant.name}"


def tenant_secret_name(tenant: Tenant) -> str:
    return f"gs-tenant-{tenant.name}"


def client_ids(tenant: Tenant) -> list[str]:
    """One client id per key: the team's name, and during a rotation `<name>.2` for its second key."""
    return [tenant.name, *(f"{tenant.name}.{n}" for n in range(2, len(tenant.api_key_secrets) + 1))]


def tenant_host(tenant: Tenant, cluster: ClusterConfig) -> str:
    assert cluster.endpoint is not None
    return f"{tenant.name}.{cluster.endpoint.domain}"


def tenant_url(tenant: Tenant, cluster: ClusterConfig) -> str:
    assert cluster.gateway is not None
    return f"{'https' if cluster.gateway.https else 'http'}://{tenant_host(tenant, cluster)}/v1"


def granted(tenant: Tenant, models: list[Model]) -> list[tuple[str, Model]]:
    """(served name, model) for everything the team may call, in the stack's order: a model's name grants its
    adapters too; an adapter's name grants that adapter alone."""
    names = set(tenant.models)
    return [(served, model) for model in models for served in served_names(model)
            if served in names or model.name in names]


def backend_ref(model: Model) -> dict[str, str]:
    """Where a rule sends the model's requests: its InferencePool, or for a held model (`replicas.min: 0`) the
    AIServiceBackend of its hold, since a picker has no pod to pick while the model is at zero and cannot wake it."""
    if model.scales_to_zero:
        return {"name": hold_name(model)}
    return {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": object_name(model)}


def hold_backend_spec(model: Model, cluster: ClusterConfig) -> dict[str, Any]:
    """Envoy Gateway's `Backend` for a held model: the hold Service's full DNS name on the interceptor's port. AI
    Gateway rewrites the Host to the backend's hostname, which is one of the hosts the model's InterceptorRoute
    routes by (hold.py `hold_hosts`), so the request reaches the model's own route, counter and wake-up."""
    hold = cluster.request_hold
    assert hold is not None
    fqdn = f"{hold_host(model, cluster.namespace)}.{hold.cluster_domain}"
    return {"endpoints": [{"fqdn": {"hostname": fqdn, "port": hold.interceptor_port}}]}


def hold_service_backend_spec(model: Model) -> dict[str, Any]:
    return {"schema": {"name": "OpenAI"},
            "backendRef": {"group": ENVOY_GATEWAY_GROUP, "kind": "Backend", "name": hold_name(model)}}


def hold_key_policy_spec(model: Model) -> dict[str, Any]:
    """The model's own key, which AI Gateway sets as `Authorization: Bearer` on what it sends to the interceptor: the
    interceptor is reachable by every pod, and without the key the model answers nobody who came past the teams."""
    return {"type": "APIKey", "apiKey": {"secretRef": {"name": hold_key_secret_name(model)}},
            "targetRefs": [{"group": AI_GATEWAY_GROUP, "kind": "AIServiceBackend", "name": hold_name(model)}]}


def hold_key_secret_name(model: Model) -> str:
    return f"{hold_name(model)}-key"


def ai_route_spec(tenant: Tenant, cluster: ClusterConfig, models: list[Model]) -> dict[str, Any]:
    gateway = cluster.gateway
    assert gateway is not None
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway.name, "namespace": gateway.namespace}
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    rules = [{
        "matches": [{"headers": [{"type": "Exact", "name": MODEL_HEADER, "value": served}]}],
        # An adapter is served by its base model's pods, under its own name.
        "backendRefs": [backend_ref(model)],
        "timeouts": route_timeouts(model),
    } for served, model in granted(tenant, models)]
    return {"parentRefs": [parent], "hostnames": [tenant_host(tenant, cluster)], "rules": rules}


def _generated_route(tenant: Tenant) -> list[dict[str, str]]:
    # AI Gateway writes an HTTPRoute of the AIGatewayRoute's name: Envoy Gateway's policies attach to that.
    return [{"group": GATEWAY_GROUP, "kind": "HTTPRoute", "name": route_name(tenant)}]


def security_policy_spec(tenant: Tenant) -> dict[str, Any]:
    return {
        "targetRefs": _generated_route(tenant),
        "apiKeyAuth": {
            "credentialRefs": [{"group": "", "kind": "Secret", "name": tenant_secret_name(tenant)}],
            "extractFrom": [{"headers": ["authorization"]}],
            "forwardClientIDHeader": TENANT_HEADER,
            # The key goes no further than the gateway.
            "sanitize": True,
        },
    }


LOCAL_ERRORS = {
    401: ("invalid_api_key", "Incorrect API key provided."),
    404: ("model_not_found", "The model does not exist or you do not have access to it."),
    429: ("rate_limit_exceeded", "Rate limit reached for requests."),
}
"""What the gateway itself answers (api_key_auth, AI Gateway's no-matching-route rule, the local rate limit), each
turned into the error object OpenAI clients parse (`error.code`) rather than Envoy's plain text."""


def openai_error(status: int) -> str:
    code, message = LOCAL_ERRORS[status]
    kind = "invalid_request_error" if status != 429 else "requests"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}, separators=(",", ":"))


def traffic_policy_spec(tenant: Tenant) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "targetRefs": _generated_route(tenant),
        # `Local` only: a model server's own errors (vLLM's are OpenAI's already) pass as they are.
        "responseOverride": [{
            "match": {"statusCodes": [{"type": "Value", "value": status}]},
            "source": "Local",
            "response": {"contentType": "application/json", "body": {"type": "Inline", "inline": openai_error(status)}},
        } for status in LOCAL_ERRORS],
    }
    if tenant.requests_per_minute is not None:
        spec["rateLimit"] = {"type": "Local", "local": {"rules": [{"limit": {"requests": tenant.requests_per_minute, "unit": "Minute"}}]}}
    return spec


def hold_key_note(model: Model, namespace: str) -> str:
    return (f"renderYamlTo: Secret {namespace}/{hold_key_secret_name(model)} (the key the gateway presents to held model "
            f"{model.name}) is not written, its value would be plain text in the YAML; create it in the cluster with data "
            f"key apiKey (`kubectl -n {namespace} create secret generic {hold_key_secret_name(model)} "
            f"--from-file=apiKey=api-key.txt`)")


def keys_note(tenant: Tenant, namespace: str) -> str:
    """What to create by hand when the stack renders YAML (the keys would be plain text in the files)."""
    files = " ".join(f"--from-file={cid}={cid}.txt" for cid in client_ids(tenant))
    return (f"renderYamlTo: Secret {namespace}/{tenant_secret_name(tenant)} (team {tenant.name}'s keys) is not written, its "
            f"values would be plain text in the YAML; create it in the cluster (sealed-secrets, external-secrets, or "
            f"`kubectl -n {namespace} create secret generic {tenant_secret_name(tenant)} {files}`)")


@dataclass(frozen=True)
class TeamEndpointArgs:
    cluster: ClusterConfig
    tenants: tuple[Tenant, ...]
    models: tuple[Model, ...]
    """The models on the endpoint."""
    keys: dict[str, tuple[pulumi.Input[str], ...]] | None
    """Each team's keys (Pulumi secrets), in `apiKeySecrets` order; None when the stack renders YAML."""
    namespace: pulumi.Input[str]
    after: tuple[pulumi.Resource, ...] = ()
    """The models' InferencePools (their VllmServices)."""
    held_keys: dict[str, pulumi.Input[str]] | None = None
    """Each held model's own key (`models[].apiKeySecret`), which the gateway presents to it; None when the stack
    renders YAML."""


class TeamEndpoint(pulumi.ComponentResource):
    """Every team's route, key check and rate limit."""

    urls: pulumi.Output[dict[str, str]]
    """Each team's OpenAI base URL."""

    def __init__(self, name: str, args: TeamEndpointArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-serving:endpoint:TeamEndpoint", name, None, opts)
        cluster, models = args.cluster, list(args.models)

        def meta(object_name: str) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(
                name=object_name, namespace=args.namespace, annotations=applied_annotations(cluster),
                labels={"app.kubernetes.io/component": "endpoint", "app.kubernetes.io/part-of": "gpu-serving",
                        "app.kubernetes.io/managed-by": "pulumi"},
            )

        held: list[pulumi.Resource] = []
        for model in (m for m in models if m.scales_to_zero):
            held += self._hold_backend(model, args, meta)
        for tenant in args.tenants:
            secrets: list[pulumi.Resource] = []
            if args.keys is None:
                pulumi.log.warn(keys_note(tenant, cluster.namespace), resource=self)
            else:
                data = dict(zip(client_ids(tenant), args.keys[tenant.name], strict=True))
                secrets.append(k8s.core.v1.Secret(f"{tenant.name}-keys", metadata=meta(tenant_secret_name(tenant)),
                                                  type="Opaque", string_data=data, opts=pulumi.ResourceOptions(parent=self)))
            # The key check first: the route never answers without it.
            policy = k8s.apiextensions.CustomResource(
                f"{tenant.name}-keys-policy", api_version=f"{ENVOY_GATEWAY_GROUP}/v1alpha1", kind="SecurityPolicy",
                metadata=meta(route_name(tenant)), spec=security_policy_spec(tenant),
                opts=pulumi.ResourceOptions(parent=self, depends_on=secrets),
            )
            route = k8s.apiextensions.CustomResource(
                f"{tenant.name}-route", api_version=AI_GATEWAY_API, kind="AIGatewayRoute", metadata=meta(route_name(tenant)),
                spec=ai_route_spec(tenant, cluster, models),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[policy, *held, *args.after]),
            )
            k8s.apiextensions.CustomResource(
                f"{tenant.name}-traffic", api_version=f"{ENVOY_GATEWAY_GROUP}/v1alpha1", kind="BackendTrafficPolicy",
                metadata=meta(route_name(tenant)), spec=traffic_policy_spec(tenant),
                # Its name when it held the rate limit alone: a stack that had one keeps the object.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[route], aliases=[pulumi.Alias(name=f"{tenant.name}-rate-limit")]),
            )

        self.urls = pulumi.Output.from_input({t.name: tenant_url(t, cluster) for t in args.tenants})
        self.register_outputs({"urls": self.urls})

    def _hold_backend(self, model: Model, args: TeamEndpointArgs, meta: Any) -> list[pulumi.Resource]:
        """A held model's way from the teams' routes to its interceptor route, with its own key presented on the way."""
        child, name = pulumi.ResourceOptions(parent=self), model.name
        made: list[pulumi.Resource] = []
        if args.held_keys is None:
            pulumi.log.warn(hold_key_note(model, args.cluster.namespace), resource=self)
        else:
            made.append(k8s.core.v1.Secret(f"{name}-hold-key", metadata=meta(hold_key_secret_name(model)), type="Opaque",
                                           string_data={"apiKey": args.held_keys[name]}, opts=child))
        made.append(k8s.apiextensions.CustomResource(
            f"{name}-hold-backend", api_version=f"{ENVOY_GATEWAY_GROUP}/v1alpha1", kind="Backend",
            metadata=meta(hold_name(model)), spec=hold_backend_spec(model, args.cluster), opts=child))
        made.append(k8s.apiextensions.CustomResource(
            f"{name}-hold-service-backend", api_version=AI_GATEWAY_API, kind="AIServiceBackend",
            metadata=meta(hold_name(model)), spec=hold_service_backend_spec(model), opts=child))
        # Before any route names the backend: a request never leaves without the model's key.
        made.append(k8s.apiextensions.CustomResource(
            f"{name}-hold-key-policy", api_version=AI_GATEWAY_API, kind="BackendSecurityPolicy",
            metadata=meta(hold_name(model)), spec=hold_key_policy_spec(model),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(made))))
        return made
