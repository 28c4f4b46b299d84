"""vllm-graceful-drain over plain YAML: grace ≥ preStop + drain time."""

from __future__ import annotations

import pytest
from policy_factory import check, container, good, pod_spec

from policy.rules.servers import prestop_seconds


def drain_messages(deployment) -> list[str]:  # type: ignore[no-untyped-def]
    return [v.message for v in check(deployment) if v.policy == "vllm-graceful-drain"]


def test_good_deployment_drains() -> None:
    assert drain_messages(good("Deployment")) == []


@pytest.mark.parametrize(
    ("hook", "seconds"),
    [
        ({"sleep": {"seconds": 15}}, 15),
        ({"exec": {"command": ["sleep", "20"]}}, 20),
        ({"exec": {"command": ["/bin/sh", "-c", "sleep 10; kill -TERM 1"]}}, 10),
        ({"httpGet": {"path": "/drain", "port": 8000}}, 0),
    ],
)
def test_prestop_seconds(hook, seconds) -> None:  # type: ignore[no-untyped-def]
    assert prestop_seconds({"lifecycle": {"preStop": hook}}) == seconds


def test_missing_prestop_is_refused() -> None:
    deployment = good("Deployment")
    del container(deployment)["lifecycle"]
    (message,) = drain_messages(deployment)
    assert "no preStop" in message


def test_default_grace_cuts_streams() -> None:
    deployment = good("Deployment")
    del pod_spec(deployment)["terminationGracePeriodSeconds"]
    (message,) = drain_messages(deployment)
    assert message.startswith("terminationGracePeriodSeconds is 30 (default) but container 'vllm' needs preStop 15s + drain 600s")


def test_shutdown_timeout_sets_the_drain_time() -> None:
    deployment = good("Deployment")
    pod_spec(deployment)["terminationGracePeriodSeconds"] = 200
    container(deployment)["args"].append("--shutdown-timeout=120")
    assert drain_messages(deployment) == []
    container(deployment)["args"].append("--shutdown_timeout=300")  # the last one wins, as in argparse
    (message,) = drain_messages(deployment)
    assert "drain 300s (--shutdown-timeout) = 315s" in message


def test_drain_time_is_configurable() -> None:
    deployment = good("Deployment")
    pod_spec(deployment)["terminationGracePeriodSeconds"] = 100
    assert drain_messages(deployment)
    assert not [v for v in check(deployment, config={"vllm-graceful-drain": {"drainSeconds": 60}}) if v.policy == "vllm-graceful-drain"]


def test_a_served_vllm_deployment_without_a_pdb_is_flagged() -> None:
    found = [(v.policy, v.level) for v in check(good("Deployment"), good("Service")) if v.policy == "vllm-disruption-budget"]
    assert found == [("vllm-disruption-budget", "advisory")]
    assert not [v for v in check(good("Deployment"), good("Service"), good("PodDisruptionBudget")) if v.policy == "vllm-disruption-budget"]
    # alone, its PDB may live in another file: not judged
    assert not [v for v in check(good("Deployment")) if v.policy == "vllm-disruption-budget"]
