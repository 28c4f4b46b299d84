"""What clients reach: one served name per model or adapter, one route per host and path, one certificate
per host, and nothing public without authentication."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacks.config.base import _at

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_served_names(stack: StackConfig) -> None:
    # A client picks a model or an adapter by the same `"model"` field, and a shared edge or
    # router lists them side by side: one name must mean one thing across the stack.
    served = {model.name: f"models[{i}].name" for i, model in enumerate(stack.models)}
    for i, model in enumerate(stack.models):
        for j, adapter in enumerate(model.lora.adapters if model.lora else []):
            path = f"models[{i}].lora.adapters[{j}].name"
            other = served.setdefault(adapter.name, path)
            if other != path:
                raise _at(path, f"{adapter.name!r} is already served as {other}; clients choose a model or an adapter "
                                "by this name, so it must be unique across the stack")


# What the edge keys default to: ingress-nginx's class and its chart's pod labels.
NGINX_CLASS = "nginx"
NGINX_NAMESPACE = "ingress-nginx"
NGINX_POD_LABELS = {"app.kubernetes.io/name": "ingress-nginx"}


def check_edge_kind(stack: StackConfig) -> None:
    """The keys of the edge the stack does not use: each would be ignored, and the operator would believe it applied."""
    cluster = stack.cluster
    if cluster.edge == "ingress":
        if cluster.gateway is not None and cluster.endpoint is None:
            raise _at("cluster.gateway", "set, but cluster.edge is ingress and there is no cluster.endpoint: the models get "
                                         "Ingresses and no route attaches to this Gateway; set edge: gateway, or remove it")
        return
    if cluster.ingress_class != NGINX_CLASS:
        raise _at("cluster.ingressClass", f"{cluster.ingress_class!r}, but cluster.edge is gateway: the stack makes HTTPRoutes "
                                          "to cluster.gateway and no Ingress, so no class is read; remove it")
    if cluster.cluster_issuer is not None:
        # cert-manager's Ingress annotation has no HTTPRoute counterpart: the Gateway's listener holds the certificate.
        raise _at("cluster.clusterIssuer", f"{cluster.cluster_issuer!r}, but cluster.edge is gateway: HTTPRoutes carry no "
                                           "certificate, the Gateway's listener does (cert-manager issues it from an annotation "
                                           "on the Gateway); remove it")
    if not any(m.ingress is not None and not m.scales_to_zero for m in stack.models):
        return
    # The NetworkPolicy admits these pods to the model port: left at ingress-nginx's, the Gateway's data plane is
    # refused and every routed request times out.
    network = cluster.network
    if network.ingress_namespace == NGINX_NAMESPACE:
        raise _at("cluster.network.ingressNamespace", f"{NGINX_NAMESPACE}, ingress-nginx's namespace, but cluster.edge is gateway: the "
                  "models' NetworkPolicy would admit ingress-nginx and refuse the Gateway's proxy pods, so routed requests "
                  "time out; set the namespace of the Gateway implementation's data plane")
    if any(network.ingress_pod_labels.get(k) == v for k, v in NGINX_POD_LABELS.items()):
        raise _at("cluster.network.ingressPodLabels", "ingress-nginx's pod labels, but cluster.edge is gateway: the models' "
                  "NetworkPolicy would refuse the Gateway's proxy pods, so routed requests time out; set the labels of the "
                  "Gateway implementation's data-plane pods")


def check_ingress(stack: StackConfig, i: int) -> None:
    """`models[i].ingress` against the cluster's edge and the ingresses of the models before it."""
    model, cluster = stack.models[i], stack.cluster
    if model.ingress is None:
        return
    if model.lora and model.lora.runtime_updates:
        # vLLM's load/unload endpoints sit under /v1, which the edge forwards, behind the same
        # key as inference: every client could swap what the model answers with.
        raise _at(f"models[{i}].lora.runtimeUpdates",
                  "not for a model with ingress: /v1/load_lora_adapter sits under the /v1 the edge forwards, behind "
                  "the same key as inference, and what it loads is lost on restart; list the adapters in lora.adapters")
    if cluster.edge == "gateway":
        for key in ("auth_url", "tls_secret"):
            if getattr(model.ingress, key) is not None:
                camel = "authUrl" if key == "auth_url" else "tlsSecret"
                why = ("an HTTPRoute has no standard external auth: use apiKeySecret" if key == "auth_url"
                       else "the Gateway's listener holds the certificate")
                raise _at(f"models[{i}].ingress.{camel}", f"not with cluster.edge gateway: {why}")
    if model.api_key_secret is None and model.ingress.auth_url is None:
        # vLLM's key guards /v1 only, and the edge forwards only /v1: with neither, anyone
        # who can resolve the host can use the GPUs.
        raise _at(
            f"models[{i}].apiKeySecret",
            f"models[{i}].ingress makes the model public but nothing authenticates it: set apiKeySecret "
            "(vLLM's API key, a secret config key) or ingress.authUrl (ingress-nginx external auth)",
        )
    earlier = [(j, m.ingress) for j, m in enumerate(stack.models[:i]) if m.ingress is not None]
    host, path = model.ingress.host, _route_path(model.ingress.path)
    other = next((j for j, ingress in earlier if (ingress.host, _route_path(ingress.path)) == (host, path)), None)
    if other is not None:
        raise _at(f"models[{i}].ingress.path", f"{host}{path} is already routed to models[{other}]; give each model its own path")
    secret_name = model.ingress.tls_secret
    if secret_name and cluster.cluster_issuer and cluster.edge == "ingress":
        # cert-manager makes one Certificate per secret, from the one Ingress that owns it:
        # a second host on the same secret would be served a certificate without its name.
        owner, owner_host = next(((j, ingress.host) for j, ingress in earlier if ingress.tls_secret == secret_name), (i, host))
        if owner_host != host:
            raise _at(f"models[{i}].ingress.tlsSecret",
                      f"{secret_name!r} already holds the certificate cert-manager issues for {owner_host} "
                      f"(models[{owner}]); {host} needs its own secret, e.g. {secret_name}-{host.split('.')[0]}")
    first, secret = next(((j, ingress.tls_secret) for j, ingress in earlier if ingress.host == host), (i, secret_name))
    if secret != secret_name:
        # nginx serves one certificate per host; two secrets for one host means one is ignored.
        raise _at(
            f"models[{i}].ingress.tlsSecret",
            f"{host} already uses tlsSecret {secret!r} in models[{first}]; one host has one certificate",
        )


def _route_path(path: str) -> str:
    return path.rstrip("/") or "/"
