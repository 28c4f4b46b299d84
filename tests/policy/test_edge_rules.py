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
