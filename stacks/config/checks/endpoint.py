"""The teams' endpoint (`cluster.endpoint`, `tenants`): every team names served models, one way into a model, and no
model on the endpoint that no team may call goes unnoticed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacks.config.base import _at, _unique

if TYPE_CHECKING:
    from stacks.config.models import Model
    from stacks.config.stack import StackConfig


def served_names(model: Model) -> list[str]:
    """What a client may put in `model` to reach this model: its name and its adapters'."""
    return [model.name, *(a.name for a in model.lora.adapters)] if model.lora else [model.name]


def check_tenants(stack: StackConfig) -> None:
    cluster = stack.cluster
    if stack.tenants and cluster.endpoint is None:
        raise _at("tenants", "needs cluster.endpoint (the domain of the teams' hosts and the endpoint picker's image)")
    if cluster.endpoint is None:
        for i, model in enumerate(stack.models):
            if model.endpoint:
                raise _at(f"models[{i}].endpoint", "true needs cluster.endpoint")
        return
    if not stack.tenants:
        raise _at("tenants", "cluster.endpoint is set but no team is: add tenants[] (name, apiKeySecrets, models), "
                             "or remove cluster.endpoint")
    _unique(stack.tenants, "name", "tenants")
    on_endpoint = {name: model for model in stack.models if stack.on_endpoint(model) for name in served_names(model)}
    off = {name for model in stack.models if not stack.on_endpoint(model) for name in served_names(model)}
    for i, tenant in enumerate(stack.tenants):
        if len(set(tenant.api_key_secrets)) < len(tenant.api_key_secrets):
            raise _at(f"tenants[{i}].apiKeySecrets", "names one key twice; during a rotation list the old key and the new one")
        for j, name in enumerate(tenant.models):
            if name in off:
                raise _at(f"tenants[{i}].models[{j}]", f"{name} is not on the endpoint (its models[].endpoint is false); "
                                                      "remove it here or put the model on the endpoint")
            if name not in on_endpoint:
                known = ", ".join(on_endpoint) or "none"
                raise _at(f"tenants[{i}].models[{j}]", f"{name} is not served by this stack (served on the endpoint: {known})")
    for i, model in enumerate(stack.models):
        if not stack.on_endpoint(model):
            continue
        # One way in: a route of the model's own would pass by the teams' keys.
        if model.ingress is not None:
            raise _at(f"models[{i}].ingress", "not for a model on the endpoint: a route of its own would pass by the teams' "
                                              "keys; remove it, or set models[].endpoint: false")
        if model.scales_to_zero:
            # The gateway sends a held model's requests to the interceptor, which every pod of the cluster can reach:
            # the model's own key, which the gateway presents (components/endpoint.py), keeps that from being a way
            # past the teams' keys.
            if model.api_key_secret is None:
                raise _at(f"models[{i}].apiKeySecret", "required for a model at replicas.min 0 on the endpoint: its "
                                                       "requests are held by the interceptor, which every pod can reach, "
                                                       "so the model checks a key of its own that only the gateway "
                                                       "presents (`pulumi config set --secret <name> <key>`)")
        elif model.api_key_secret is not None:
            raise _at(f"models[{i}].apiKeySecret", "not for a model on the endpoint: the gateway checks the teams' keys "
                                                   "(tenants[].apiKeySecrets), and the model's pods admit only the gateway; "
                                                   "remove it, or set models[].endpoint: false (a model at replicas.min 0 "
                                                   "is the exception: it needs one)")
    if cluster.network.client_namespaces:
        raise _at("cluster.network.clientNamespaces", "not with cluster.endpoint: in-cluster clients would reach the models "
                                                      "without a team's key; give them a tenant and the team's URL")


def endpoint_warnings(stack: StackConfig) -> list[str]:
    """A model on the endpoint that no team may call: it holds GPUs for nobody."""
    if stack.cluster.endpoint is None:
        return []
    granted = {name for tenant in stack.tenants for name in tenant.models}
    return [f"models[{i}].endpoint: {model.name} is on the endpoint but no tenant may call it; add it to a team's "
            "tenants[].models, or set models[].endpoint: false"
            for i, model in enumerate(stack.models)
            if stack.on_endpoint(model) and not granted & set(served_names(model))]
