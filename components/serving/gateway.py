"""The Gateway API edge (`cluster.edge: gateway`): one HTTPRoute per model to the configured Gateway.

ingress-nginx is retired; a Gateway (Envoy Gateway, Istio, Cilium, NGINX Gateway Fabric, …) takes
its place. The route forwards only `<path>/v1` (vLLM's key guards /v1 alone) and lets a request
run as long as the Ingress would: implementations' defaults (often 15 s) cut long streams.
"""

from __future__ import annotations

from typing import Any

from components.serving.edge import OPENAI_PREFIX, proxy_timeout_seconds
from components.serving.names import PORT, hold_host, object_name
from stacks.config import ClusterConfig, Model

GATEWAY_GROUP = "gateway.networking.k8s.io"


def route_timeouts(model: Model) -> dict[str, str]:
    # Both: `request` bounds the whole exchange at the Gateway, `backendRequest` one try to vLLM
    # (for a held model, to the interceptor, which waits out the cold start first).
    timeout = f"{proxy_timeout_seconds(model)}s"
    return {"request": timeout, "backendRequest": timeout}


def httproute_spec(model: Model, cluster: ClusterConfig) -> dict[str, Any]:
    assert model.ingress is not None and cluster.gateway is not None
    gateway = cluster.gateway
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway.name, "namespace": gateway.namespace}
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    prefix = model.ingress.path.rstrip("/") + OPENAI_PREFIX
    rule: dict[str, Any] = {"matches": [{"path": {"type": "PathPrefix", "value": prefix}}]}
    rewrite: dict[str, Any] = {}
    if model.scales_to_zero:
        # The interceptor routes by Host: the hold Service's name (components/serving/hold.py).
        rewrite["hostname"] = hold_host(model, cluster.namespace)
    if prefix != OPENAI_PREFIX:
        # vLLM serves /v1 at its root: strip the model's sub-path, keep /v1.
        rewrite["path"] = {"type": "ReplacePrefixMatch", "replacePrefixMatch": OPENAI_PREFIX}
    if rewrite:
        rule["filters"] = [{"type": "URLRewrite", "urlRewrite": rewrite}]
    rule["backendRefs"] = [backend_ref(model, cluster)]
    rule["timeouts"] = route_timeouts(model)
    return {"parentRefs": [parent], "hostnames": [model.ingress.host], "rules": [rule]}


def backend_ref(model: Model, cluster: ClusterConfig) -> dict[str, Any]:
    """The model's Service, or for a held model the interceptor in its own namespace (under the stack's ReferenceGrant
    there): Gateway implementations need not follow an ExternalName Service, and many refuse to."""
    hold = cluster.request_hold
    if not model.scales_to_zero or hold is None:
        return {"name": object_name(model), "port": PORT}
    return {"name": hold.interceptor_service, "namespace": hold.namespace, "port": hold.interceptor_port}
