"""Scale to zero with the requests held (`replicas.min: 0`): KEDA's HTTP add-on (v0.15) in front of the model.

At zero replicas nothing exports the queue gauge, so nothing else could see a request or wake the model.
The add-on's interceptor receives the requests of a held model, holds each one while the model starts
(`timeouts.conditionWait`, the cold start timeout), counts it, and forwards it to the model's own Service
once an endpoint is ready; its external scaler reports those counts to KEDA.

The add-on is used for that and nothing more. Its InterceptorRoute (v0.14+) only routes and counts; the add-on
makes no ScaledObject for it: the model keeps the stack's own ScaledObject, with the queue trigger and the slow
scaling behaviour every GPU model has, plus the add-on's `external-push` trigger naming the route for 0 ↔ 1.
Scaling on the interceptor's in-flight count alone would tell nothing of a batching server's load (like CPU). The
count stays a wake-up signal: its per-pod target is far above what one server runs at once.

The route has the name the HTTPScaledObject of v0.12 had. The v0.15 interceptor builds one routing table from both
kinds, an InterceptorRoute replacing an HTTPScaledObject of the same namespace and name under the same request
counter (`pkg/routing/table.go`), so the `up` that moves a stack from the one to the other (creating the route
before it deletes the HTTPScaledObject) never leaves a held model's hosts unrouted.

Requests reach the interceptor through a Service of the model's namespace, `vllm-<name>-hold`: an
ExternalName for the interceptor's proxy Service (an Ingress can only name a Service of its own namespace).
The interceptor routes by Host, so every way in sends that Service's own DNS name: the Ingress rewrites
the Host to it (`upstream-vhost`), the HTTPRoute too (`URLRewrite` hostname; it reaches the interceptor
across namespaces under a ReferenceGrant), and an in-cluster client calls the name. Paths stay `/v1`.
"""

from __future__ import annotations

from typing import Any

import pulumi_kubernetes as k8s

from components.cluster import PART_OF, applied_annotations
from components.serving.edge import OPENAI_PREFIX, PROXY_TIMEOUT_S
from components.serving.names import PORT, hold_host, hold_name, object_name
from stacks.config import ClusterConfig, Model
from stacks.config.cluster import RequestHold

WAKE_TARGET_IN_FLIGHT = 10_000
"""The interceptor trigger's target per pod: far above the requests one vLLM server runs at once, so the
trigger only ever asks for one pod (waking the model) and the queue trigger decides beyond it."""


def interceptor_address(hold: RequestHold) -> str:
    """The interceptor's full DNS name: an ExternalName is a CNAME, which no search domain completes."""
    return f"{hold.interceptor_service}.{hold.namespace}.svc.{hold.cluster_domain}"


def hold_service_spec(hold: RequestHold) -> k8s.core.v1.ServiceSpecArgs:
    """`vllm-<name>-hold`: the interceptor under a name of the model's namespace. The port is the interceptor's, as
    a number: ingress controllers take an ExternalName's target port as the port to connect to."""
    port = hold.interceptor_port
    return k8s.core.v1.ServiceSpecArgs(
        type="ExternalName",
        external_name=interceptor_address(hold),
        ports=[k8s.core.v1.ServicePortArgs(name="http", port=port, target_port=port, protocol="TCP")],
    )


def hold_hosts(model: Model, namespace: str, hold: RequestHold) -> list[str]:
    """Every name a client in the cluster may call the hold Service by (the interceptor compares the Host without port)."""
    name = hold_name(model)
    return [name, f"{name}.{namespace}", hold_host(model, namespace), f"{hold_host(model, namespace)}.{hold.cluster_domain}"]


def held_base_url(model: Model, namespace: str, hold: RequestHold) -> str:
    return f"http://{hold_host(model, namespace)}:{hold.interceptor_port}"


def held_url(model: Model, namespace: str, hold: RequestHold) -> str:
    """The OpenAI base URL in the cluster through the hold: a request there wakes the model, one to the model's
    Service fails while it is at zero and is never counted as activity."""
    return held_base_url(model, namespace, hold) + OPENAI_PREFIX


def interceptor_route(model: Model, namespace: str, hold: RequestHold) -> dict[str, Any]:
    """Routing and holding: the hold Service's names and `/v1` to the model's own Service. `readiness` covers the cold
    start; `responseHeader` the longest answer, since vLLM sends the headers of a non-streamed answer when it is
    complete. Both set here, not left to the interceptor's defaults (which changed in v0.14)."""
    return {
        "target": {"service": object_name(model), "port": PORT},
        "rules": [{"hosts": hold_hosts(model, namespace, hold), "paths": [{"value": OPENAI_PREFIX}]}],
        "scalingMetric": {"concurrency": {"targetValue": WAKE_TARGET_IN_FLIGHT}},
        "timeouts": {"readiness": f"{model.cold_start_seconds}s", "responseHeader": f"{PROXY_TIMEOUT_S}s"},
    }


def wake_trigger(model: Model, hold: RequestHold) -> dict[str, Any]:
    """The ScaledObject trigger the add-on's external scaler serves: active while the interceptor holds or forwards
    a request of this model."""
    return {
        "type": "external-push",
        "metadata": {"scalerAddress": f"{hold.scaler_service}.{hold.namespace}:{hold.scaler_port}", "interceptorRoute": hold_name(model)},
    }


def reference_grant(cluster: ClusterConfig, models: list[Model]) -> dict[str, Any] | None:
    """With `edge: gateway`, the ReferenceGrant in the add-on's namespace that lets the stack's HTTPRoutes name the
    interceptor's proxy Service (and nothing else there); one per stack namespace, as several stacks may share one
    add-on. None when no held model has a route."""
    hold = cluster.request_hold
    if hold is None or cluster.edge != "gateway" or not any(m.scales_to_zero and m.ingress is not None for m in models):
        return None
    return dict(
        api_version="gateway.networking.k8s.io/v1beta1",  # served by every Gateway API release (v1 only from v1.5)
        kind="ReferenceGrant",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=f"gpu-serving-{cluster.namespace}", namespace=hold.namespace, labels=PART_OF, annotations=applied_annotations(cluster)
        ),
        spec={
            "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": cluster.namespace}],
            "to": [{"group": "", "kind": "Service", "name": hold.interceptor_service}],
        },
    )
