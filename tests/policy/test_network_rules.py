"""Issue 24 item 2 over plain YAML: a vLLM server is reachable only from named peers, and asks
only the cluster DNS."""

from __future__ import annotations

from typing import Any

import pytest
from policy_factory import check, good, good_objects


def findings(*objects: dict[str, Any]) -> list[Any]:
    return [v for v in check(*objects) if v.policy in ("vllm-ingress-from", "vllm-dns-egress")]


def policy(name: str) -> dict[str, Any]:
    return next(o for o in good_objects() if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == name)


def test_good_policies_pass() -> None:
    assert findings(*good_objects()) == []


@pytest.mark.parametrize("mutate", [
    lambda p: p["spec"]["ingress"][0].pop("from"),                                    # no from: everyone
    lambda p: p["spec"]["ingress"][0].update({"from": [{}]}),                         # an empty peer
    lambda p: p["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}}),      # every namespace
    lambda p: p["spec"]["ingress"].append({"ports": [{"port": 8000}]}),               # a second, open rule
    lambda p: (p["spec"].pop("policyTypes"), p["spec"]["ingress"][0].pop("from")),    # Ingress by default, open
])
def test_an_ingress_policy_open_to_every_pod_is_refused(mutate) -> None:  # type: ignore[no-untyped-def]
    ingress = policy("vllm-qwen3")
    mutate(ingress)
    (finding,) = findings(good("Deployment"), ingress)
    assert finding.policy == "vllm-ingress-from" and finding.level == "mandatory"
    assert "Deployment/vllm-qwen3" in finding.message


def test_a_policy_for_other_pods_is_not_judged() -> None:
    ingress = policy("vllm-qwen3")
    ingress["spec"]["podSelector"]["matchLabels"] = {"app": "something-else"}
    ingress["spec"]["ingress"][0].pop("from")
    assert findings(good("Deployment"), ingress) == []


@pytest.mark.parametrize("mutate", [
    lambda p: p["spec"]["egress"][0].pop("to"),                                       # port 53 anywhere
    lambda p: p["spec"]["egress"][0].update({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}),
    lambda p: p["spec"]["egress"][0].update({"to": [{"namespaceSelector": {}}]}),
])
def test_dns_to_any_address_is_refused(mutate) -> None:  # type: ignore[no-untyped-def]
    egress = policy("vllm-qwen3-egress")
    mutate(egress)
    (finding,) = findings(good("Deployment"), egress)
    assert finding.policy == "vllm-dns-egress" and finding.level == "mandatory"


def test_a_named_resolver_outside_the_cluster_dns_is_allowed() -> None:
    # NodeLocal DNSCache listens on a link-local address: a /32, not the whole internet.
    egress = policy("vllm-qwen3-egress")
    egress["spec"]["egress"][0]["to"] = [{"ipBlock": {"cidr": "169.254.20.10/32"}}]
    assert findings(good("Deployment"), egress) == []
