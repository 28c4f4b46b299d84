"""How clients reach a model: Service, Ingress, NetworkPolicy and the URLs the stack exports."""

from __future__ import annotations

from typing import Any

import pulumi_kubernetes as k8s

from components.cluster import PART_OF, applied_annotations
from components.serving.names import (
    MEMBERS,
    PORT,
    SERVER_LABELS,
    hold_host,
    hold_name,
    instance_labels,
    members_selector,
    object_name,
    selector_labels,
)
from stacks.config import ClusterConfig, Model

PROXY_TIMEOUT_S = 600
"""The Gateway's total request timeout (`timeouts.request`), and ingress-nginx's read/send timeouts,
which are idle timeouts between two reads and bound no stream; the drain on shutdown is sized from it."""


OPENAI_PREFIX = "/v1"
"""The only paths the edge forwards. vLLM's API key guards `/v1` alone: `/invocations`,
`/tokenize`, `/metrics`, `/pooling` and the admin endpoints answer anyone who reaches the pod."""


DNS_PORT = 53


def proxy_timeout_seconds(model: Model) -> int:
    """The edge's timeouts for this model: PROXY_TIMEOUT_S, and for a model at `replicas.min: 0` also the cold start,
    which a held request spends waiting at the interceptor before its first byte."""
    return PROXY_TIMEOUT_S + (model.cold_start_seconds if model.scales_to_zero else 0)


def service_spec(model: Model) -> k8s.core.v1.ServiceSpecArgs:
    return k8s.core.v1.ServiceSpecArgs(
        type="ClusterIP",
        selector=selector_labels(model),
        ports=[k8s.core.v1.ServicePortArgs(name="http", port=PORT, target_port="http", protocol="TCP")],
    )


def ingress_route(path: str) -> tuple[str, str, str | None]:
    """(path, pathType, rewrite target) that forward `<path>/v1/...` and nothing else. vLLM
    serves /v1/... at its root, so a model under a sub-path needs the prefix stripped;
    ImplementationSpecific because the path is then a regex. The rewrite target starts with
    the literal `/v1/`, so what reaches vLLM is visibly under /v1 whatever the request was."""
    path = path.rstrip("/")
    if not path:
        return OPENAI_PREFIX, "Prefix", None
    return f"{path}{OPENAI_PREFIX}(/|$)(.*)", "ImplementationSpecific", f"{OPENAI_PREFIX}/$2"


def ingress_annotations(model: Model, cluster: ClusterConfig) -> dict[str, str]:
    assert model.ingress is not None
    timeout = str(proxy_timeout_seconds(model))
    annotations = {
        # Without these, tokens arrive in one lump at the end (seed scenario 6).
        "nginx.ingress.kubernetes.io/proxy-buffering": "off",
        "nginx.ingress.kubernetes.io/proxy-request-buffering": "off",
        "nginx.ingress.kubernetes.io/proxy-http-version": "1.1",
        # Time to first token on a long queue, and long non-streamed answers.
        "nginx.ingress.kubernetes.io/proxy-read-timeout": timeout,
        "nginx.ingress.kubernetes.io/proxy-send-timeout": timeout,
        # nginx's 1m default rejects long prompts with 413.
        "nginx.ingress.kubernetes.io/proxy-body-size": "32m",
    }
    _, _, rewrite = ingress_route(model.ingress.path)
    if rewrite:
        annotations["nginx.ingress.kubernetes.io/use-regex"] = "true"
        annotations["nginx.ingress.kubernetes.io/rewrite-target"] = rewrite
    if model.scales_to_zero:
        # The interceptor routes by Host: send the hold Service's name, not the public host (models sharing a host
        # under different paths all arrive as /v1/...).
        annotations["nginx.ingress.kubernetes.io/upstream-vhost"] = hold_host(model, cluster.namespace)
    if model.ingress.tls_secret and cluster.cluster_issuer:
        annotations["cert-manager.io/cluster-issuer"] = cluster.cluster_issuer
    if model.ingress.auth_url:
        # ingress-nginx asks this service first; anything but 2xx is refused at the edge.
        annotations["nginx.ingress.kubernetes.io/auth-url"] = model.ingress.auth_url
    return annotations


def ingress_spec(model: Model, cluster: ClusterConfig) -> k8s.networking.v1.IngressSpecArgs:
    assert model.ingress is not None
    path, path_type, _ = ingress_route(model.ingress.path)
    port = k8s.networking.v1.ServiceBackendPortArgs(name="http")
    name = object_name(model)
    if model.scales_to_zero:
        assert cluster.request_hold is not None
        # The interceptor, through the model's ExternalName Service (components/serving/hold.py).
        name, port = hold_name(model), k8s.networking.v1.ServiceBackendPortArgs(number=cluster.request_hold.interceptor_port)
    backend = k8s.networking.v1.IngressBackendArgs(service=k8s.networking.v1.IngressServiceBackendArgs(name=name, port=port))
    tls = None
    if model.ingress.tls_secret:
        tls = [k8s.networking.v1.IngressTLSArgs(hosts=[model.ingress.host], secret_name=model.ingress.tls_secret)]
    return k8s.networking.v1.IngressSpecArgs(
        ingress_class_name=cluster.ingress_class,
        tls=tls,
        rules=[
            k8s.networking.v1.IngressRuleArgs(
                host=model.ingress.host,
                http=k8s.networking.v1.HTTPIngressRuleValueArgs(
                    paths=[k8s.networking.v1.HTTPIngressPathArgs(path=path, path_type=path_type, backend=backend)]
                ),
            )
        ],
    )


NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace (Kubernetes ≥ 1.22): selects a namespace by name."""


def _peer(namespace: str, pod_labels: dict[str, str] | None) -> k8s.networking.v1.NetworkPolicyPeerArgs:
    """Pods with `pod_labels` in `namespace` (every pod there when None): both selectors in one peer, so both must match."""
    return k8s.networking.v1.NetworkPolicyPeerArgs(
        namespace_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={NAMESPACE_LABEL: namespace}),
        pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(pod_labels)) if pod_labels else None,
    )


def network_policy_spec(
    model: Model, cluster: ClusterConfig, namespace: str, endpoint_peers: tuple[k8s.networking.v1.NetworkPolicyPeerArgs, ...] = (),
) -> k8s.networking.v1.NetworkPolicySpecArgs:
    """Only the API port, and only from: the edge's proxy pods (when the model has `ingress`), the
    Prometheus pods (vLLM serves `/metrics` on the API port, so they reach the port, not only the
    path), the model's own smoke-test pods, and `network.clientNamespaces`. The download Job's
    pods match too and listen on nothing.

    A model at `replicas.min: 0` admits the interceptor instead of the edge, the smoke test and the
    clients, who all call it through the hold: a request that went straight to the pods would not
    count as activity, so the model could be stopped under it (and at zero it would fail).

    A model on the teams' endpoint admits `endpoint_peers` (the Gateway's Envoy pods and its picker) in the edge's
    place: it has no key of its own, so nothing else may reach it (the config refuses `clientNamespaces` then)."""
    net, config = k8s.networking.v1, cluster.network
    peers = list(endpoint_peers)
    if model.scales_to_zero:
        assert cluster.request_hold is not None
        peers.append(_peer(cluster.request_hold.namespace, cluster.request_hold.interceptor_pod_labels))
    elif model.ingress is not None:
        peers.append(_peer(config.ingress_namespace, config.ingress_pod_labels))
    peers.append(_peer(config.monitoring_namespace, config.monitoring_pod_labels))
    if not model.scales_to_zero:
        peers.append(_peer(namespace, {**instance_labels(model), "app.kubernetes.io/component": "smoke-test"}))
        peers += [_peer(client, None) for client in config.client_namespaces]
    return net.NetworkPolicySpecArgs(
        pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=instance_labels(model)),
        policy_types=["Ingress"],
        ingress=[net.NetworkPolicyIngressRuleArgs(from_=peers, ports=[net.NetworkPolicyPortArgs(port=PORT, protocol="TCP")])],
    )


SERVERS_EGRESS = "gpu-serving-servers-egress"
"""The namespace's one DNS egress policy for every serving pod (`gpu-serving-`: no model's objects can take it)."""


def servers_egress_policy(cluster: ClusterConfig, models: list[Model]) -> dict[str, Any] | None:
    """Serving pods reach the cluster DNS pods, nothing else: they load from the volume (HF_HUB_OFFLINE) and have no
    business calling out, so a stray usage report, a hub look-up or an exfiltration attempt fails instead of leaving
    the cluster. DNS goes to the cluster's resolver only: port 53 anywhere would be a tunnel out. One policy for every
    model of the namespace: a pod's allowed egress is the union of the policies that select it, so a model's
    `egressCidrs` are a policy of its own (`egress_policy_spec`), and a fleet of models has one object here, not one
    each. None without models."""
    if not models:
        return None
    net, config = k8s.networking.v1, cluster.network
    dns = [net.NetworkPolicyPortArgs(port=DNS_PORT, protocol=p) for p in ("UDP", "TCP")]
    return dict(
        metadata=k8s.meta.v1.ObjectMetaArgs(name=SERVERS_EGRESS, namespace=cluster.namespace, labels=PART_OF,
                                            annotations=applied_annotations(cluster)),
        spec=net.NetworkPolicySpecArgs(
            pod_selector=servers_selector(models), policy_types=["Egress"],
            egress=[net.NetworkPolicyEgressRuleArgs(to=[_peer(config.dns_namespace, config.dns_pod_labels)], ports=dns)],
        ),
    )


def servers_selector(models: list[Model]) -> Any:
    """Every model's serving pods; with a model spanning nodes, also its groups' workers (they resolve the leader's name)."""
    if any(m.spans_nodes for m in models):
        return {"matchLabels": {"app.kubernetes.io/name": SERVER_LABELS["app.kubernetes.io/name"]}, "matchExpressions": [MEMBERS]}
    return k8s.meta.v1.LabelSelectorArgs(match_labels=dict(SERVER_LABELS))


def group_policy_spec(model: Model) -> dict[str, Any]:
    """A model spanning nodes: its group members reach each other on any port (torch.distributed's store on the
    leader, NCCL's sockets and vLLM's own queues between the stages pick theirs at run time), and nothing else does.
    Members of another group of the same model are admitted too: a selector cannot name "my group"."""
    members = {"podSelector": members_selector(model)}
    return {"podSelector": members_selector(model), "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [members]}], "egress": [{"to": [members]}]}


def egress_policy_spec(model: Model) -> k8s.networking.v1.NetworkPolicySpecArgs | None:
    """The networks of `models[].egressCidrs` for this model's serving pods, on top of the namespace's DNS policy
    (`servers_egress_policy`); None without any."""
    if not model.egress_cidrs:
        return None
    net = k8s.networking.v1
    peers = [net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr=cidr)) for cidr in model.egress_cidrs]
    return net.NetworkPolicySpecArgs(
        pod_selector=members_selector(model) if model.spans_nodes else k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(model)),
        policy_types=["Egress"], egress=[net.NetworkPolicyEgressRuleArgs(to=peers)],
    )


def in_cluster_url(model: Model, namespace: str) -> str:
    """OpenAI base URL inside the cluster."""
    return f"http://{object_name(model)}.{namespace}.svc:{PORT}/v1"


def ingress_url(model: Model, cluster: ClusterConfig | None = None) -> str | None:
    if model.ingress is None:
        return None
    if cluster is not None and cluster.edge == "gateway":
        assert cluster.gateway is not None
        scheme = "https" if cluster.gateway.https else "http"
    else:
        scheme = "https" if model.ingress.tls_secret else "http"
    return f"{scheme}://{model.ingress.host}{model.ingress.path.rstrip('/')}/v1"
