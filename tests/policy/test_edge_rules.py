"""Edge rules over plain YAML: only /v1 reaches vLLM, and never without authentication."""

from __future__ import annotations

from typing import Any

import pytest
from policy_factory import check, container, good, policies

from policy.rules.edge import under_openai_prefix


def stack(ingress: dict[str, Any] | None = None, deployment: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [deployment or good("Deployment"), good("Service"), ingress or good("Ingress")]


def edge_findings(*objects: dict[str, Any]) -> set[str]:
    return {p for p in policies(check(*objects)) if p.startswith("edge-")}


def test_good_edge_passes() -> None:
    assert edge_findings(*stack()) == set()


@pytest.mark.parametrize(
    ("path", "ok"),
    [("/v1", True), ("/v1/", True), ("/v1(/|$)(.*)", True), ("/v1/$2", True),
     ("/", False), ("/qwen3", False), ("/v1beta", False), ("/v10", False), ("/$2", False), ("/tokenize", False)],
)
def test_openai_prefix(path: str, ok: bool) -> None:
    assert under_openai_prefix(path) is ok


@pytest.mark.parametrize("path", ["/", "/tokenize", "/metrics"])
def test_ingress_forwarding_more_than_v1_is_refused(path: str) -> None:
    ingress = good("Ingress")
    ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] = path
    assert edge_findings(*stack(ingress)) == {"edge-vllm-openai-only"}


def test_a_rewrite_decides_what_vllm_receives() -> None:
    ingress = good("Ingress")
    annotations = ingress["metadata"]["annotations"]
    ingress["spec"]["rules"][0]["http"]["paths"][0].update(path="/qwen3(/|$)(.*)", pathType="ImplementationSpecific")
    annotations["nginx.ingress.kubernetes.io/rewrite-target"] = "/$2"
    assert edge_findings(*stack(ingress)) == {"edge-vllm-openai-only"}
    ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] = "/qwen3/v1(/|$)(.*)"
    annotations["nginx.ingress.kubernetes.io/rewrite-target"] = "/v1/$2"
    assert edge_findings(*stack(ingress)) == set()


def test_default_backend_forwards_everything() -> None:
    ingress = good("Ingress")
    ingress["spec"]["defaultBackend"] = {"service": {"name": "vllm-qwen3", "port": {"number": 8000}}}
    assert edge_findings(*stack(ingress)) == {"edge-vllm-openai-only"}


def test_vllm_without_a_key_behind_an_ingress_is_refused() -> None:
    deployment = good("Deployment")
    c = container(deployment)
    c["env"] = [e for e in c["env"] if e["name"] != "VLLM_API_KEY"]
    (violation,) = [v for v in check(*stack(deployment=deployment)) if v.policy == "edge-vllm-auth"]
    assert violation.level == "mandatory" and violation.kind == "Ingress"
    assert "Deployment/vllm-qwen3 on ai.example.internal with no authentication" in violation.message


@pytest.mark.parametrize(
    "fix",
    [
        lambda d, i: container(d)["args"].append("--api-key=$(KEY)"),
        lambda d, i: container(d).setdefault("envFrom", []).append({"secretRef": {"name": "vllm-env"}}),
        lambda d, i: i["metadata"]["annotations"].update({"nginx.ingress.kubernetes.io/auth-url": "http://auth.svc/check"}),
        lambda d, i: i["metadata"]["annotations"].update({"nginx.ingress.kubernetes.io/auth-type": "basic"}),
    ],
)
def test_a_key_or_edge_auth_satisfies_the_rule(fix) -> None:  # type: ignore[no-untyped-def]
    deployment, ingress = good("Deployment"), good("Ingress")
    c = container(deployment)
    c["env"] = [e for e in c["env"] if e["name"] != "VLLM_API_KEY"]
    fix(deployment, ingress)
    assert "edge-vllm-auth" not in edge_findings(*stack(ingress, deployment))


def test_an_edge_to_a_service_it_cannot_see_is_not_judged() -> None:
    ingress = good("Ingress")
    ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] = "/"
    assert edge_findings(ingress) == set()
    # nor one whose Service selects no vLLM pod
    web = good("Service")
    web["spec"]["selector"] = {"app": "web"}
    assert edge_findings(good("Deployment"), web, ingress) == set()


# ---------------------------------------------------------------------------- HTTPRoute

def route(**rule: Any) -> dict[str, Any]:
    base = {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
            "backendRefs": [{"name": "vllm-qwen3", "port": 8000}],
            "timeouts": {"request": "600s"}}
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "qwen3", "namespace": "ai"},
            "spec": {"parentRefs": [{"name": "public", "namespace": "gw"}], "hostnames": ["ai.example.internal"],
                     "rules": [{**base, **rule}]}}


def route_findings(r: dict[str, Any], deployment: dict[str, Any] | None = None) -> set[str]:
    return {v.policy for v in check(deployment or good("Deployment"), good("Service"), r) if v.kind == "HTTPRoute"}


def test_good_route_passes() -> None:
    assert route_findings(route()) == set()


@pytest.mark.parametrize(
    "rule",
    [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]},
        {"matches": []},  # no matches: every path
        {"matches": [{"path": {"type": "PathPrefix", "value": "/qwen3"}}],
         "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}]},
    ],
)
def test_route_forwarding_more_than_v1_is_refused(rule: dict[str, Any]) -> None:
    assert route_findings(route(**rule)) == {"edge-vllm-openai-only"}


def test_route_rewrite_into_v1_is_fine() -> None:
    rewrite = {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}}}
    assert route_findings(route(matches=[{"path": {"type": "PathPrefix", "value": "/qwen3/v1"}}], filters=[rewrite])) == set()


def test_route_to_vllm_without_a_key_is_refused() -> None:
    deployment = good("Deployment")
    c = container(deployment)
    c["env"] = [e for e in c["env"] if e["name"] != "VLLM_API_KEY"]
    assert route_findings(route(), deployment) == {"edge-vllm-auth"}


@pytest.mark.parametrize(
    ("timeouts", "ok"),
    [({"request": "600s"}, True), ({"request": "1h"}, True), ({"request": "0s"}, True),
     ({"request": "10m", "backendRequest": "15s"}, False), ({}, False), ({"request": "30s"}, False), ({"request": "9m59s"}, False)],
)
def test_route_timeouts_fit_streaming(timeouts: dict[str, str], ok: bool) -> None:
    assert ("httproute-vllm-streaming" not in route_findings(route(timeouts=timeouts))) is ok


# ---------------------------------------------------------------------------- offline serving

@pytest.mark.parametrize(
    ("env", "messages"),
    [
        ([{"name": "VLLM_NO_USAGE_STATS", "value": "1"}], []),
        ([{"name": "DO_NOT_TRACK", "value": "1"}], []),
        ([], ["reports usage statistics"]),
        ([{"name": "VLLM_NO_USAGE_STATS", "value": "1"}, {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}],
         ["runs offline (HF_HUB_OFFLINE) yet holds HF_TOKEN"]),
    ],
)
def test_offline_server_holds_no_token_and_sends_no_stats(env: list[dict[str, Any]], messages: list[str]) -> None:
    d = good("Deployment")
    c = container(d)
    c["env"] = [e for e in c["env"] if e["name"] not in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")] + env
    found = [v for v in check(d) if v.policy == "vllm-server-offline"]
    assert all(v.level == "advisory" for v in found)
    assert len(found) == len(messages) and all(m in v.message for v, m in zip(found, messages, strict=True))
