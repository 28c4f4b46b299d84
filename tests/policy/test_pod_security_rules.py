"""Issue 24 item 3 over plain YAML: Pod Security labels, Guaranteed QoS, a PriorityClass, and a
non-root identity the libraries can resolve."""

from __future__ import annotations

from typing import Any

import pytest
from policy_factory import check, container, good, good_objects, pod_spec

RULES = ("namespace-pod-security", "vllm-guaranteed-qos", "vllm-priority-class", "vllm-non-root-identity")


def findings(*objects: dict[str, Any]) -> set[str]:
    return {v.policy for v in check(*objects) if v.policy in RULES}


def test_good_manifest_passes() -> None:
    assert findings(*good_objects()) == set()


@pytest.mark.parametrize("labels", [
    {},                                                                      # no Pod Security at all
    {"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "restricted"},
    {"pod-security.kubernetes.io/enforce": "baseline"},                      # nothing warns
])
def test_namespace_without_pod_security_is_flagged(labels: dict[str, str]) -> None:
    namespace = good("Namespace")
    namespace["metadata"]["labels"] = labels
    assert findings(namespace) == {"namespace-pod-security"}


@pytest.mark.parametrize("mutate", [
    lambda r: r["requests"].update(memory="16Gi"),      # Burstable: request < limit
    lambda r: r["limits"].pop("cpu"),                   # no CPU limit
])
def test_burstable_server_is_flagged(mutate) -> None:  # type: ignore[no-untyped-def]
    deployment = good("Deployment")
    mutate(container(deployment)["resources"])
    assert findings(deployment) == {"vllm-guaranteed-qos"}


def test_server_without_priority_class_is_flagged() -> None:
    deployment = good("Deployment")
    pod_spec(deployment).pop("priorityClassName")
    assert findings(deployment) == {"vllm-priority-class"}


def test_non_root_server_without_identity_is_flagged() -> None:
    deployment = good("Deployment")
    pod_spec(deployment)["securityContext"] = {"runAsNonRoot": True, "runAsUser": 2000}
    assert findings(deployment) == {"vllm-non-root-identity"}
    container(deployment)["env"] += [{"name": k, "value": v} for k, v in
                                     (("HOME", "/home/vllm"), ("USER", "nobody"), ("LOGNAME", "nobody"))]
    assert findings(deployment) == set()
