"""Values unknown during preview never produce a violation."""

from __future__ import annotations

from policy_factory import check, container, good, pod_spec
from pulumi_policy import proxy
from pulumi_policy.policy import PolicyCustomTimeouts, PolicyResourceOptions, ResourceValidationArgs

from policy.rules import ALL_RULES
from policy.rules.core import UNKNOWN_SENTINELS
from policy.rules.pack import build_policies, plain

UNKNOWN_STRING = proxy.UNKNOWN_STRING_VALUE


def test_sentinels_match_the_sdk():
    sdk = {getattr(proxy, n) for n in dir(proxy) if n.startswith("UNKNOWN_") and n.endswith("_VALUE")}
    assert sdk <= UNKNOWN_SENTINELS


def bad_deployment():
    d = good("Deployment")
    d["spec"].pop("strategy")
    container(d)["image"] = "vllm/vllm-openai:latest"
    return d


def test_unknown_values_silence_only_the_rules_that_read_them():
    d = bad_deployment()
    container(d)["image"] = UNKNOWN_STRING
    d["spec"]["strategy"] = proxy.UNKNOWN_OBJECT_VALUE
    assert check(good("Node"), d) == []


def test_unknown_gpu_limit_skips_gpu_rules():
    d = good("Deployment")
    container(d)["resources"]["limits"]["nvidia.com/gpu"] = proxy.UNKNOWN_NUMBER_VALUE
    container(d).pop("startupProbe")
    pod_spec(d).pop("tolerations")
    assert check(d) == []


def test_unknown_namespace_and_names_skip_stack_matching():
    d = good("Deployment")
    d["spec"]["replicas"] = 3
    pvc = good("PersistentVolumeClaim")
    pvc["spec"]["accessModes"] = ["ReadWriteOnce"]
    pvc["metadata"]["name"] = UNKNOWN_STRING
    assert "rwo-claim-single-replica" not in {v.policy for v in check(d, pvc)}


def test_pulumi_proxy_props_are_read_without_sdk_unknown_errors():
    d = bad_deployment()
    pod_spec(d)["tolerations"] = proxy.UNKNOWN_ARRAY_VALUE
    props = proxy.unknown_checking_proxy(d)
    assert plain(props)["spec"]["template"]["spec"]["tolerations"] == proxy.UNKNOWN_ARRAY_VALUE
    opts = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    args = ResourceValidationArgs("kubernetes:apps/v1:Deployment", props, "urn:x", "vllm", opts, None)
    reported = {}
    for policy, rule in zip(build_policies(), ALL_RULES, strict=True):
        if not rule.is_stack:
            policy.validate(args, lambda message, urn=None, name=rule.name: reported.setdefault(name, message))
    # The toleration rule read an unknown and stays silent; the others still judge.
    assert set(reported) == {"vllm-image-pinned", "gpu-rollout-without-spare-gpu"}
