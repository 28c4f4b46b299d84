"""The Gateway API edge (`cluster.edge: gateway`): one HTTPRoute per model to the configured Gateway.

ingress-nginx is retired; a Gateway (Envoy Gateway, Istio, Cilium, NGINX Gateway Fabric, …) takes
its place. The route forwards only `<path>/v1` (vLLM's key guards /v1 alone) and lets a request
run as long as the Ingress would: implementations' defaults (often 15 s) cut long streams.
"""

from __future__ import annotations

from typing import Any

from components.serving.edge import OPENAI_PREFIX, PROXY_TIMEOUT_S
from components.serving.names import PORT, object_name
from stacks.config import Cluster as ClusterConfig
from stacks.config import Model

GATEWAY_GROUP = "gateway.networking.k8s.io"


def route_timeouts() -> dict[str, str]:
    # Both: `request` bounds the whole exchange at the Gateway, `backendRequest` one try to vLLM.
    return {"request": f"{PROXY_TIMEOUT_S}s", "backendRequest": f"{PROXY_TIMEOUT_S}s"}


def httproute_spec(model: Model, cluster: ClusterConfig) -> dict[str, Any]:
    assert model.ingress is not None and cluster.gateway is not None
    gateway = cluster.gateway
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway.name, "namespace": gateway.namespace}
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    prefix = model.ingress.path.rstrip("/") + OPENAI_PREFIX
    rule: dict[str, Any] = {"matches": [{"path": {"type": "PathPrefix", "value": prefix}}]}
    if prefix != OPENAI_PREFIX:
        # vLLM serves /v1 at its root: strip the model's sub-path, keep /v1.
        rewrite = {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": OPENAI_PREFIX}}
        rule["filters"] = [{"type": "URLRewrite", "urlRewrite": rewrite}]
    rule["backendRefs"] = [{"name": object_name(model), "port": PORT}]
    rule["timeouts"] = route_timeouts()
    return {"parentRefs": [parent], "hostnames": [model.ingress.host], "rules": [rule]}
