"""Issue 15 item 8: `edge: gateway` renders an HTTPRoute, validated against the Gateway API CRD
and held to the same edge rules as an Ingress."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policy.rules import check_resources
from tests import checkers
from tests.test_serving import INGRESS, error_of, one, prod_model, prod_raw, with_models
from tools.render import Render

HTTPROUTE = "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute"
GATEWAY = {"name": "public", "namespace": "gateway-system", "sectionName": "https"}
GATEWAY_PEERS = {"ingressNamespace": "gateway-system", "ingressPodLabels": {"gateway.envoyproxy.io/owning-gateway-name": "public"}}


def behind_gateway(cluster: dict[str, Any], gateway: dict[str, Any] = GATEWAY) -> dict[str, Any]:
    """A cluster block moved to the Gateway edge as it must be: no cert-manager issuer (the Gateway's listener holds
    the certificate) and the Gateway's data-plane pods, not ingress-nginx's, admitted to the model port."""
    return {k: v for k, v in cluster.items() if k != "clusterIssuer"} | {"edge": "gateway", "gateway": gateway,
                                                                         "network": copy.deepcopy(GATEWAY_PEERS)}


def gateway_cluster(**extra: Any) -> dict[str, Any]:
    return behind_gateway(prod_raw()["cluster"]) | extra


def gateway_model(**ingress: Any) -> dict[str, Any]:
    return prod_model(ingress={"host": "ai.primer.rs", **ingress})


def findings(render: Render) -> set[tuple[str, str]]:
    entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in render.resources if r.custom]
    return {(v.policy, v.level) for v in check_resources(entries)}


def test_gateway_edge_renders_an_httproute_and_no_ingress(render) -> None:  # type: ignore[no-untyped-def]
    result = render(cluster=gateway_cluster(), models=[gateway_model()])
    assert result.of_type(INGRESS) == []
    route = one(result, HTTPROUTE)
    assert route["metadata"]["name"] == "vllm-qwen3" and route["metadata"]["namespace"] == "ai"
    spec = route["spec"]
    assert spec["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public",
                                   "namespace": "gateway-system", "sectionName": "https"}]
    assert spec["hostnames"] == ["ai.primer.rs"]
    (rule,) = spec["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert "filters" not in rule
    assert rule["backendRefs"] == [{"name": "vllm-qwen3", "port": 8000}]
    assert rule["timeouts"] == {"request": "600s", "backendRequest": "600s"}
    checkers.validate(route)
    assert result.outputs["models"]["qwen3"]["ingressUrl"] == "https://ai.primer.rs/v1"
    assert not {p for p, level in findings(result) if level == "mandatory"}


def test_sub_path_is_rewritten_to_v1(render) -> None:  # type: ignore[no-untyped-def]
    result = render(cluster=gateway_cluster(), models=[gateway_model(path="/qwen3")])
    route = one(result, HTTPROUTE)
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/qwen3/v1"}}]
    rewrite = {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}}
    assert rule["filters"] == [{"type": "URLRewrite", "urlRewrite": rewrite}]
    checkers.validate(route)
    assert result.outputs["models"]["qwen3"]["ingressUrl"] == "https://ai.primer.rs/qwen3/v1"
    assert not {p for p, level in findings(result) if level == "mandatory"}


@pytest.mark.parametrize(
    ("raw", "starts"),
    [
        (with_models(gateway_model(), cluster=prod_raw()["cluster"] | {"edge": "gateway"}),
         "cluster.gateway: required with `edge: gateway`"),
        (with_models(gateway_model(tlsSecret="ai-tls"), cluster=gateway_cluster()),
         "models[0].ingress.tlsSecret: not with cluster.edge gateway: the Gateway's listener holds the certificate"),
        (with_models(gateway_model(authUrl="http://auth.svc/check"), cluster=gateway_cluster()),
         "models[0].ingress.authUrl: not with cluster.edge gateway"),
        (with_models(prod_model(apiKeySecret=None, ingress={"host": "ai.primer.rs"}), cluster=gateway_cluster()),
         "models[0].apiKeySecret: models[0].ingress makes the model public but nothing authenticates it"),
    ],
)
def test_gateway_config_errors_name_the_key(raw: dict[str, Any], starts: str) -> None:
    message = error_of(raw)
    assert message.startswith(starts), message


def test_the_crd_schema_refuses_a_bad_route(render) -> None:  # type: ignore[no-untyped-def]
    import jsonschema

    route = one(render(cluster=gateway_cluster(), models=[gateway_model()]), HTTPROUTE)
    route["spec"]["rules"][0]["timeouts"]["request"] = "ten minutes"
    with pytest.raises(jsonschema.ValidationError):
        checkers.validate(route)
