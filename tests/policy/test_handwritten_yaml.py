"""Issue 44 item 5, second half: the policy pack over hand-written YAML that never went through a stack file.

A held-out bundle of plausible mistakes on GPU sharing, MIG, scale to zero, LoRA, monitoring, autoscaling and pod
security, each one change to the good manifests (tests/policy/data/good) as a person would write them: without
the Node objects, which only a stack (or `kubectl get nodes -o yaml`) supplies. Each must be flagged by its rule:
mandatory where the YAML alone shows the fault, advisory where the pack cannot know without the nodes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from policy_factory import DATA, GOOD, entry

from policy.rules import ADVISORY, MANDATORY, check_resources

Docs = list[dict[str, Any]]
HELD = DATA / "good" / "vllm-held.yaml"


def handwritten(path: Any = GOOD) -> Docs:
    """The good manifests as a person writes them: no Node objects."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] != "Node"]


def findings(docs: Docs) -> set[tuple[str, str, str]]:
    return {(v.policy, v.level, v.message) for v in check_resources([entry(d) for d in docs])}


def first(docs: Docs, kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def server(docs: Docs) -> dict[str, Any]:
    return first(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def pod(docs: Docs) -> dict[str, Any]:
    return first(docs, "Deployment")["spec"]["template"]["spec"]


def _one_share(resource: str, replicas: int = 1, *args: str) -> Callable[[Docs], None]:
    """The server on one `resource` instead of two whole cards (so tensor parallelism goes too)."""
    def change(docs: Docs) -> None:
        container = server(docs)
        for where in ("limits", "requests"):
            container["resources"][where].pop("nvidia.com/gpu")
            container["resources"][where][resource] = 1
        argv = container["args"]
        k = argv.index("--tensor-parallel-size")
        del argv[k:k + 2]
        argv += list(args)
        first(docs, "Deployment")["spec"]["replicas"] = replicas
    return change


def _args(*more: str) -> Callable[[Docs], None]:
    def change(docs: Docs) -> None:
        server(docs)["args"] += list(more)
    return change


BASE_SNAPSHOT = "/models/hub/models--Qwen--Qwen3-8B-AWQ/snapshots/4da05a8edb55c6046cce958586c33b61da07bb79"
ADAPTER = "/models/hub/models--acme--qwen3-sql-lora/snapshots/5f3c0d0e9b1a2c4d6e8f0a1b3c5d7e9f1a2b3c4d"


def _keda(query: str, server_address: str = "http://prometheus-operated.monitoring.svc:9090") -> Callable[[Docs], None]:
    """The HPA replaced by a KEDA ScaledObject on Prometheus, as its docs show one."""
    def change(docs: Docs) -> None:
        docs.remove(first(docs, "HorizontalPodAutoscaler"))
        docs.append({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "vllm-qwen3", "namespace": "ai"},
                     "spec": {"scaleTargetRef": {"name": "vllm-qwen3"}, "minReplicaCount": 1, "maxReplicaCount": 2,
                              "triggers": [{"type": "prometheus", "metadata": {
                                  "serverAddress": server_address, "query": query, "threshold": "3"}}]}})
    return change


def _alert(expr: str) -> Callable[[Docs], None]:
    def change(docs: Docs) -> None:
        docs.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                     "metadata": {"name": "vllm-qwen3", "namespace": "ai"},
                     "spec": {"groups": [{"name": "vllm", "rules": [{"alert": "VllmIdle", "expr": expr, "for": "10m"}]}]}})
    return change


def _monitor_port(port: str) -> Callable[[Docs], None]:
    def change(docs: Docs) -> None:
        first(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] = port
    return change


def _pod(**fields: Any) -> Callable[[Docs], None]:
    def change(docs: Docs) -> None:
        pod(docs).update(copy.deepcopy(fields))
    return change


def _privileged(docs: Docs) -> None:
    server(docs)["securityContext"] = {"privileged": True}


def _host_path_models(docs: Docs) -> None:
    volumes = pod(docs)["volumes"]
    volumes[0] = {"name": "models", "hostPath": {"path": "/mnt/models", "type": "Directory"}}


def _hold_port(docs: Docs) -> None:
    first(docs, "HTTPScaledObject")["spec"]["scaleTargetRef"]["port"] = 80


def _hold_service(docs: Docs) -> None:
    """A second model's Service, copied from the first, and the hold pointed at it."""
    other = copy.deepcopy(next(d for d in docs if d["kind"] == "Service" and d["spec"].get("type") == "ClusterIP"))
    other["metadata"]["name"] = "vllm-qwen3-big"
    other["spec"]["selector"]["app.kubernetes.io/instance"] = "qwen3-big"
    docs.append(other)
    first(docs, "HTTPScaledObject")["spec"]["scaleTargetRef"]["service"] = "vllm-qwen3-big"


def _held_to_zero_without_hold(docs: Docs) -> None:
    docs.remove(first(docs, "HTTPScaledObject"))
    so = first(docs, "ScaledObject")
    so["spec"]["triggers"] = so["spec"]["triggers"][:1]


def _slices_two(docs: Docs) -> None:
    _one_share("nvidia.com/gpu.shared")(docs)
    for where in ("limits", "requests"):
        server(docs)["resources"][where]["nvidia.com/gpu.shared"] = 2


def _cpu_hpa(docs: Docs) -> None:
    first(docs, "HorizontalPodAutoscaler")["spec"]["metrics"] = [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]


def _no_pod_security(docs: Docs) -> None:
    first(docs, "Namespace")["metadata"]["labels"] = {}


# (id, base file, change, the rule that must flag it, its level)
HELD_OUT: list[tuple[str, Any, Callable[[Docs], None], str, str]] = [
    # GPU sharing and MIG without the nodes
    ("time-slice-at-vllm-default-share", GOOD, _one_share("nvidia.com/gpu.shared", 2), "gpu-nodes-declared", ADVISORY),
    ("mig-instance-without-nodes", GOOD, _one_share("nvidia.com/mig-3g.40gb", 2), "gpu-nodes-declared", ADVISORY),
    ("mig-profile-no-card-has", GOOD, _one_share("nvidia.com/mig-3g.45gb"), "gpu-mig-profile", MANDATORY),
    ("mig-profile-in-gib", GOOD, _one_share("nvidia.com/mig-3g.37gib"), "gpu-mig-profile", MANDATORY),
    ("two-time-slices-per-pod", GOOD, _slices_two, "gpu-one-slice", MANDATORY),
    # LoRA
    ("lora-adapter-named-as-the-model", GOOD, _args("--enable-lora", "--lora-modules", f"qwen3={ADAPTER}"), "vllm-lora-flags", MANDATORY),
    ("lora-adapter-is-the-base", GOOD, _args("--enable-lora", "--lora-modules", f"sql={BASE_SNAPSHOT}"), "vllm-lora-flags", MANDATORY),
    ("lora-cpu-cache-below-batch", GOOD, _args("--enable-lora", "--max-loras=4", "--max-cpu-loras=2", "--lora-modules", f"sql={ADAPTER}"),
     "vllm-lora-flags", MANDATORY),
    ("lora-flags-without-enable", GOOD, _args("--max-loras=4", "--max-lora-rank=64"), "vllm-lora-flags", MANDATORY),
    # monitoring and autoscaling
    ("keda-query-underscore-name", GOOD, _keda('sum(vllm_num_requests_waiting{namespace="ai"})'), "vllm-metric-queries", MANDATORY),
    ("keda-server-with-api-path", GOOD, _keda('sum(vllm:num_requests_waiting{namespace="ai"})',
                                              "http://prometheus-operated.monitoring.svc:9090/api/v1"), "vllm-metric-queries", MANDATORY),
    ("keda-server-on-loopback", GOOD, _keda('sum(vllm:num_requests_waiting{namespace="ai"})', "http://localhost:9090"),
     "vllm-metric-queries", MANDATORY),
    ("alert-underscore-name", GOOD, _alert("sum(vllm_num_requests_running) == 0"), "vllm-metric-queries", MANDATORY),
    ("podmonitor-port-not-on-the-pods", GOOD, _monitor_port("metrics"), "vllm-podmonitor-port", MANDATORY),
    ("hpa-on-cpu", GOOD, _cpu_hpa, "gpu-hpa-scaling", MANDATORY),
    # scale to zero
    ("hold-at-a-port-the-service-lacks", HELD, _hold_port, "vllm-hold-target", MANDATORY),
    ("hold-at-a-service-of-another-model", HELD, _hold_service, "vllm-hold-target", MANDATORY),
    ("zero-without-a-hold", HELD, _held_to_zero_without_hold, "vllm-scale-to-zero", MANDATORY),
    # pod security
    ("privileged-server-in-baseline", GOOD, _privileged, "pod-security-admitted", MANDATORY),
    ("host-path-models-in-baseline", GOOD, _host_path_models, "pod-security-admitted", MANDATORY),
    ("host-network-in-baseline", GOOD, _pod(hostNetwork=True), "pod-security-admitted", MANDATORY),
    ("namespace-without-pod-security", GOOD, _no_pod_security, "namespace-pod-security", ADVISORY),
]


@pytest.mark.parametrize("path", [GOOD, HELD], ids=["vllm", "vllm-held"])
def test_the_handwritten_bases_break_no_mandatory_rule(path: Any) -> None:
    assert [f for f in findings(handwritten(path)) if f[1] == MANDATORY] == []


@pytest.mark.parametrize(("case", "path", "change", "rule", "level"), HELD_OUT, ids=[c[0] for c in HELD_OUT])
def test_each_handwritten_mistake_is_flagged_by_its_rule(case: str, path: Any, change: Callable[[Docs], None],
                                                        rule: str, level: str) -> None:
    docs = handwritten(path)
    before = findings(docs)
    change(docs)
    new = findings(docs) - before
    assert new, f"{case} passes silently"
    assert any(policy == rule and found == level for policy, found, _ in new), new
