"""`cluster.endpoint` and `tenants`: one OpenAI base URL per team for every model it may use.

Each team (`tenants[]`) gets `https://<name>.<cluster.endpoint.domain>/v1`, routed by the request body's `model` to
that model's InferencePool, whose endpoint picker chooses the pod (docs/endpoint.md). A host per team, not one host
for all: Envoy's `api_key_auth` filter sets the client header after the route was chosen and does not clear the route
cache, and Envoy AI Gateway answers `GET /v1/models` per host; so the host is what both the key check and the model
list can be keyed on without code of our own in the data plane.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from stacks.config.base import DNS_DOMAIN, ImageRef, K8sName, PodLabels, SecretKeyName, _Model

ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"
OWNING_GATEWAY_LABEL = "gateway.envoyproxy.io/owning-gateway-name"
OWNING_GATEWAY_NAMESPACE_LABEL = "gateway.envoyproxy.io/owning-gateway-namespace"
"""Envoy Gateway labels each Gateway's proxy pods with the Gateway's name and namespace."""


class Endpoint(_Model):
    """Envoy AI Gateway (v1.0) on Envoy Gateway (≥ v1.8.1): the Gateway `cluster.gateway` names; an InferencePool and
    an endpoint picker per model on it."""

    domain: str = Field(pattern=DNS_DOMAIN, max_length=200)
    """Each team's base URL is `https://<tenant>.<domain>/v1`: give the Gateway's listener `*.<domain>` and a wildcard
    certificate."""
    picker_image: ImageRef
    """The endpoint picker (EPP) of the Gateway API Inference Extension v1.5.0, by tag or digest, e.g.
    `registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0`."""
    data_plane_namespace: K8sName = ENVOY_GATEWAY_NAMESPACE
    """Namespace of the Gateway's Envoy pods (Envoy Gateway's own, unless its `EnvoyProxy` deploys them elsewhere)."""
    data_plane_pod_labels: PodLabels = {}
    """Labels of those pods; unset: Envoy Gateway's `gateway.envoyproxy.io/owning-gateway-name: <cluster.gateway.name>`."""

    @field_validator("domain")
    @classmethod
    def _not_a_wildcard(cls, domain: str) -> str:
        if "." not in domain:
            raise ValueError(f"{domain}: a DNS domain with a dot, e.g. ai.example.com (the teams' hosts are <tenant>.<domain>)")
        return domain


class Tenant(_Model):
    """A team: its keys, and the models (or adapters) it may list and call."""

    name: K8sName
    """The team's name: its host `<name>.<cluster.endpoint.domain>`, its Secret `gs-tenant-<name>`, and the client id
    the gateway forwards to the model (`x-gs-tenant`)."""
    api_key_secrets: list[SecretKeyName] = Field(min_length=1, max_length=2)
    """Secret config keys of its API keys: one, or two while a key is rotated (both work; then drop the old one).
    A rotation changes one Secret: no model pod restarts."""
    models: list[K8sName] = Field(min_length=1)
    """Served names it may use: a model's name (with its LoRA adapters) or one adapter's name."""
    requests_per_minute: int | None = Field(None, ge=1, le=1_000_000)
    """Requests per minute the team may send, per gateway replica (Envoy's local rate limit); unset: no limit."""
