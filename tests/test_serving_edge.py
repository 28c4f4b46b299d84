"""Issue 15: a closed edge (only /v1, authenticated), offline serving pods (no token, no
telemetry, no egress), the model as the positional argument."""

from __future__ import annotations

from typing import Any

import pytest

from components.serving.names import instance_labels
from policy.rules import check_resources
from tests.test_serving import DEPLOYMENT, INGRESS, JOB, container, env_of, error_of, one, prod_model, prod_raw, with_models
from tools.render import Render

NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def policies(render: Render) -> set[tuple[str, str]]:
    entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in render.resources if r.custom]
    return {(v.policy, v.name) for v in check_resources(entries)}


# ---------------------------------------------------------------------------- item 1: the edge


def test_prod_ingress_forwards_only_v1(prod: Render) -> None:
    (path,) = one(prod, INGRESS)["spec"]["rules"][0]["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/v1", "Prefix")
    assert "nginx.ingress.kubernetes.io/rewrite-target" not in one(prod, INGRESS)["metadata"]["annotations"]


def test_prod_model_has_an_api_key(prod: Render) -> None:
    env = env_of(container(one(prod, DEPLOYMENT)))
    assert env["VLLM_API_KEY"] == {"secretKeyRef": {"name": "vllm-qwen3-secrets", "key": "api-key"}}
    assert prod.config.models[0].api_key_secret == "vllmApiKey"


def test_sub_path_rewrites_into_v1_only(render) -> None:  # type: ignore[no-untyped-def]
    result = render(models=[prod_model(ingress={"host": "ai.primer.rs", "path": "/qwen3", "tlsSecret": "ai-tls"})])
    ingress = one(result, INGRESS)
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["path"] == "/qwen3/v1(/|$)(.*)"
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/rewrite-target"] == "/v1/$2"
    assert not {p for p, _ in policies(result) if p.startswith("edge-")}


def test_public_model_without_authentication_is_refused() -> None:
    message = error_of(with_models(prod_model(apiKeySecret=None)))
    assert message.startswith("models[0].apiKeySecret: models[0].ingress makes the model public but nothing authenticates it"), message


def test_edge_auth_instead_of_a_key(render) -> None:  # type: ignore[no-untyped-def]
    auth = "http://oauth2-proxy.auth.svc:4180/oauth2/auth"
    model = prod_model(apiKeySecret=None, ingress={"host": "ai.primer.rs", "tlsSecret": "ai-tls", "authUrl": auth})
    result = render(models=[model])
    assert one(result, INGRESS)["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"] == auth
    assert "VLLM_API_KEY" not in env_of(container(one(result, DEPLOYMENT)))
    assert not {p for p, _ in policies(result) if p.startswith("edge-")}


def test_the_pack_catches_an_open_edge_in_the_render(render) -> None:  # type: ignore[no-untyped-def]
    result = render(models=[prod_model()])
    entries = []
    for r in result.resources:
        if not r.custom:
            continue
        inputs = r.inputs
        if r.type == DEPLOYMENT:  # drop the key, as a hand edit of the YAML would
            inputs = {**inputs, "spec": {**inputs["spec"], "template": {**inputs["spec"]["template"]}}}
            pod = dict(inputs["spec"]["template"]["spec"])
            pod["containers"] = [{**c, "env": [e for e in c["env"] if e["name"] != "VLLM_API_KEY"]} for c in pod["containers"]]
            inputs["spec"]["template"]["spec"] = pod
        entries.append({"type": r.type, "name": r.name, "inputs": inputs})
    found = {(v.policy, v.kind) for v in check_resources(entries)}
    assert ("edge-vllm-auth", "Ingress") in found


# ---------------------------------------------------------------------------- item 4: offline pods


def test_serving_pods_never_phone_home_and_hold_no_hub_token(prod: Render) -> None:
    env = env_of(container(one(prod, DEPLOYMENT)))
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert not {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"} & set(env)
    job_env = env_of(one(prod, JOB)["spec"]["template"]["spec"]["containers"][0])
    assert {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"} <= set(job_env)


def egress_policies(render: Render) -> list[dict[str, Any]]:
    return [p.inputs for p in render.of_type(NETWORK_POLICY) if "Egress" in p.inputs["spec"]["policyTypes"]]


def allowed_egress(render: Render, pod_labels: dict[str, str]) -> list[dict[str, Any]] | None:
    """What a pod with `pod_labels` may reach, as Kubernetes reads the policies: the union of the egress rules of every
    policy that selects it; None when none selects it (egress open)."""
    selecting = [p for p in egress_policies(render)
                 if all(pod_labels.get(k) == v for k, v in p["spec"]["podSelector"].get("matchLabels", {}).items())]
    return [rule for p in selecting for rule in p["spec"]["egress"]] if selecting else None


def server_labels(render: Render, model: str = "qwen3") -> dict[str, str]:
    (deployment,) = [d for d in render.of_type(DEPLOYMENT) if d.inputs["metadata"]["name"] == f"vllm-{model}"]
    return dict(deployment.inputs["spec"]["template"]["metadata"]["labels"])


DNS_ONLY = [{
    "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
    "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
}]


def test_serving_pods_reach_dns_and_nothing_else(prod: Render) -> None:
    # Issue 24: DNS only to the cluster DNS pods, not to any resolver on port 53 (a tunnel out).
    assert allowed_egress(prod, server_labels(prod)) == DNS_ONLY
    # The serving pods only: the download Job must still reach the hub.
    job_labels = one(prod, JOB)["spec"]["template"]["metadata"]["labels"]
    assert allowed_egress(prod, job_labels) is None
    (policy,) = egress_policies(prod)
    assert policy["metadata"]["name"] == "gpu-serving-servers-egress" and policy["metadata"]["namespace"] == "ai"


def test_one_dns_policy_serves_every_model_of_the_namespace(render) -> None:  # type: ignore[no-untyped-def]
    """Issue 40: what was one egress policy per model is one per namespace, with the same effect on every pod."""
    one_each = {"replicas": {"min": 1, "max": 1}}
    models = [prod_model(**one_each), {**prod_model(**one_each), "name": "mistral", "ingress": {"host": "mistral.example.com"}}]
    result = render(models=models)
    assert len(egress_policies(result)) == 1
    for model in ("qwen3", "mistral"):
        assert allowed_egress(result, server_labels(result, model)) == DNS_ONLY
    for job in result.of_type(JOB):
        assert allowed_egress(result, job.inputs["spec"]["template"]["metadata"]["labels"]) is None
    assert render(models=[]).of_type(NETWORK_POLICY) == []


def ingress_policy(render: Render) -> dict[str, Any]:
    (policy,) = [p for p in render.of_type(NETWORK_POLICY) if p.inputs["spec"]["policyTypes"] == ["Ingress"]]
    return policy.inputs


def peer(namespace: str, labels: dict[str, str] | None) -> dict[str, Any]:
    found: dict[str, Any] = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    if labels:
        found["podSelector"] = {"matchLabels": labels}
    return found


def test_the_api_port_admits_only_the_edge_prometheus_and_the_smoke_test(prod: Render) -> None:
    # Issue 24: without `from`, every pod of every namespace reached /metrics, /tokenize, /invocations.
    (rule,) = ingress_policy(prod)["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    smoke_labels = next(j for j in prod.of_type(JOB) if "-smoke-" in j.inputs["metadata"]["name"]).inputs[
        "spec"]["template"]["metadata"]["labels"]
    assert rule["from"] == [
        peer("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
        peer("monitoring", {"app.kubernetes.io/name": "prometheus"}),
        peer("ai", {**instance_labels(prod.config.models[0]), "app.kubernetes.io/component": "smoke-test"}),
    ]
    assert all(smoke_labels[k] == v for k, v in rule["from"][2]["podSelector"]["matchLabels"].items())


def test_peers_are_configurable(render) -> None:  # type: ignore[no-untyped-def]
    network = {"ingressNamespace": "envoy-gateway-system", "ingressPodLabels": {"gateway.envoyproxy.io/owning-gateway-name": "edge"},
               "monitoringNamespace": "observability", "monitoringPodLabels": {"app": "prom"},
               "clientNamespaces": ["apps"], "dnsNamespace": "dns", "dnsPodLabels": {"app": "unbound"}}
    result = render(cluster=prod_raw()["cluster"] | {"network": network})
    peers = ingress_policy(result)["spec"]["ingress"][0]["from"]
    assert peers[0] == peer("envoy-gateway-system", {"gateway.envoyproxy.io/owning-gateway-name": "edge"})
    assert peers[1] == peer("observability", {"app": "prom"})
    assert peers[-1] == peer("apps", None)
    assert allowed_egress(result, server_labels(result))[0]["to"] == [peer("dns", {"app": "unbound"})]


def test_a_model_without_ingress_admits_no_edge(render) -> None:  # type: ignore[no-untyped-def]
    model = prod_model()
    model.pop("ingress")
    result = render(models=[model])
    namespaces = [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for p in ingress_policy(result)["spec"]["ingress"][0]["from"]]
    assert "ingress-nginx" not in namespaces


def test_egress_cidrs_open_only_those_networks(render) -> None:  # type: ignore[no-untyped-def]
    one_each = {"replicas": {"min": 1, "max": 1}}
    other = {**prod_model(**one_each), "name": "mistral", "ingress": {"host": "mistral.example.com"}}
    result = render(models=[prod_model(egressCidrs=["10.20.0.0/16"], **one_each), other])
    assert allowed_egress(result, server_labels(result, "qwen3")) == [*DNS_ONLY, {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]}]
    assert allowed_egress(result, server_labels(result, "mistral")) == DNS_ONLY  # another model's networks are not its own


@pytest.mark.parametrize(
    ("change", "starts"),
    [
        ({"env": {"VLLM_NO_USAGE_STATS": "0"}}, "models[0].env: VLLM_NO_USAGE_STATS is set by the bundle"),
        ({"env": {"DO_NOT_TRACK": "0"}}, "models[0].env: DO_NOT_TRACK is set by the bundle"),
        ({"egressCidrs": ["0.0.0.0"]}, "models[0].egressCidrs[0]: must be a network in CIDR notation"),
    ],
)
def test_offline_settings_cannot_be_overridden(change: dict[str, Any], starts: str) -> None:
    message = error_of(with_models(prod_model(**change)))
    assert message.startswith(starts), message


# ---------------------------------------------------------------------------- item 6: positional model


def test_model_is_the_positional_argument(prod: Render) -> None:
    args = container(one(prod, DEPLOYMENT))["args"]
    assert args[0] == prod_raw()["models"][0]["huggingFaceId"]
    assert not any(a == "--model" or a.startswith("--model=") for a in args)
