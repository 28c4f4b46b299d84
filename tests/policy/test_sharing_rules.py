"""GPU sharing in the pack: time-slices (`nvidia.com/gpu.shared`) and MIG instances (`nvidia.com/mig-*`) are GPUs
to every rule, capacity is counted per resource from the nodes' labels (the stack's or GPU Feature Discovery's),
and the pods that may meet on one time-sliced card must fit its memory. Mutation tests on the rendered example
stack (docs/examples/Pulumi.sharing.yaml): it passes, one change makes the rule fire; also over plain YAML."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from policy.check_yaml import main as check_yaml
from policy.rules import MANDATORY, check_resources
from tools.render import ROOT, Render, manifests_yaml, policy_config, resources_json, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.sharing.yaml"
Entries = list[dict[str, Any]]


@pytest.fixture(scope="module")
def rendered() -> Render:
    return run_program("sharing", stack_file=EXAMPLE)


@pytest.fixture
def entries(rendered: Render) -> Entries:
    return copy.deepcopy(resources_json(rendered))


def fired(rendered: Render, entries: Entries, rule: str) -> list[str]:
    return [v.message for v in check_resources(entries, config=policy_config(rendered)) if v.policy == rule and v.level == MANDATORY]


def deployment(entries: Entries, name: str) -> dict[str, Any]:
    return next(e["inputs"] for e in entries if e["type"].endswith(":Deployment") and e["inputs"]["metadata"]["name"] == name)


def server(entries: Entries, name: str) -> dict[str, Any]:
    return deployment(entries, name)["spec"]["template"]["spec"]["containers"][0]


def node_labels(entries: Entries, name: str) -> dict[str, str]:
    patches = [e["inputs"]["metadata"] for e in entries if e["type"].endswith(":NodePatch")]
    return next(meta["labels"] for meta in patches if meta["name"] == name)


def set_utilization(container: dict[str, Any], share: float) -> None:
    container["args"] = [a if not a.startswith("--gpu-memory-utilization=") else f"--gpu-memory-utilization={share}"
                         for a in container["args"]]


def two_slices(e: Entries) -> None:
    server(e, "vllm-qwen3-a")["resources"]["limits"]["nvidia.com/gpu.shared"] = "2"


def two_mig_instances(e: Entries) -> None:
    server(e, "vllm-qwen3-mig")["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"


def slice_only_requested(e: Entries) -> None:
    resources = server(e, "vllm-qwen3-a")["resources"]
    resources["requests"]["nvidia.com/gpu.shared"] = resources["limits"].pop("nvidia.com/gpu.shared")


def no_time_slicing(e: Entries) -> None:
    node_labels(e, "gpu-l40s-1")["gpu-serving/gpu.replicas"] = "1"


def fewer_mig_instances(e: Entries) -> None:
    node_labels(e, "gpu-a100-1")["gpu-serving/mig-3g.40gb.count"] = "1"


def more_mig_replicas(e: Entries) -> None:
    deployment(e, "vllm-qwen3-small")["spec"]["replicas"] = 3  # 2 cards × 1 × 2g.20gb


def greedy(e: Entries) -> None:
    set_utilization(server(e, "vllm-qwen3-b"), 0.6)


def default_utilization(e: Entries) -> None:
    container = server(e, "vllm-qwen3-b")
    container["args"] = [a for a in container["args"] if not a.startswith("--gpu-memory-utilization=")]  # vLLM's 0.9


def no_gpu(e: Entries) -> None:
    server(e, "vllm-qwen3-mig")["resources"]["limits"].pop("nvidia.com/mig-3g.40gb")


MUTATIONS: list[tuple[str, Callable[[Entries], None], str, str]] = [
    ("gpu-one-slice", two_slices, "asks for 2 nvidia.com/gpu.shared", "a time-slice is access to a shared card"),
    ("gpu-one-slice", two_mig_instances, "asks for 1 nvidia.com/mig-1g.10gb + 1 nvidia.com/mig-3g.40gb", "one MIG instance"),
    ("gpu-limit-only", slice_only_requested, "puts nvidia.com/gpu.shared only under requests", "need a limit"),
    ("gpu-capacity", no_time_slicing, "x 1 nvidia.com/gpu.shared", "'Insufficient nvidia.com/gpu.shared'"),
    # qwen3-mig selects on GFD's product label, which the stack's nodes do not carry: counted against all nodes.
    ("gpu-capacity", fewer_mig_instances, "x 1 nvidia.com/mig-3g.40gb = 2; all GPU workloads together want 2", "declare only 1"),
    ("gpu-capacity", more_mig_replicas, "3 pod(s) x 1 nvidia.com/mig-2g.20gb", "declare only 2"),
    ("gpu-shared-memory", greedy, "0.6 (vllm-qwen3-b) + 0.45 (vllm-qwen3-a) = 1.05", "2 per card"),
    ("gpu-shared-memory", default_utilization, "0.9 (vllm-qwen3-b)", "the later pod fails to start"),
    ("vllm-server-gpu", no_gpu, "runs the vLLM server with no nvidia.com/gpu limit", "tensor-parallel size"),
]


@pytest.mark.parametrize(("rule", "mutate", "says", "why"), MUTATIONS, ids=[f"{m[0]}-{m[1].__name__}" for m in MUTATIONS])
def test_each_rule_fires_on_one_change_to_the_example(rendered: Render, entries: Entries, rule: str,
                                                       mutate: Callable[[Entries], None], says: str, why: str) -> None:
    assert fired(rendered, entries, rule) == []
    mutate(entries)
    messages = fired(rendered, entries, rule)
    assert messages and all(why in m for m in messages), messages
    assert any(says in m for m in messages), messages


def test_the_example_passes_every_rule_that_knows_gpus(rendered: Render, entries: Entries) -> None:
    """A MIG instance or a time-slice makes a pod a GPU pod: probes, /dev/shm, taint, selector and tensor
    parallelism are judged, and all pass (the render refuses a mandatory violation anyway)."""
    violations = check_resources(entries, config=policy_config(rendered))
    assert [v for v in violations if v.level == MANDATORY] == []
    spec = deployment(entries, "vllm-qwen3-mig")["spec"]["template"]["spec"]
    del spec["containers"][0]["startupProbe"]
    assert "gpu-startup-probe" in {v.policy for v in check_resources(entries, config=policy_config(rendered))}


def test_plain_yaml_of_the_example_is_judged_the_same(rendered: Render, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifests = tmp_path / "manifests.yaml"
    manifests.write_text(manifests_yaml(rendered))
    assert check_yaml([str(manifests)]) == 0
    documents = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    qwen = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "vllm-qwen3-b")
    set_utilization(qwen["spec"]["template"]["spec"]["containers"][0], 0.9)
    manifests.write_text(yaml.safe_dump_all(documents))
    capsys.readouterr()
    assert check_yaml([str(manifests), "--config", str(_config(rendered, tmp_path))]) == 1
    assert "mandatory gpu-shared-memory" in capsys.readouterr().out


def _config(rendered: Render, tmp_path: Path) -> Path:
    path = tmp_path / "policy-config.json"
    path.write_text(json.dumps(policy_config(rendered)))
    return path


# ---------------------------------------------------------------------------- GPU Feature Discovery's labels


def gfd_node(name: str, product: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "1", **labels}}}


def workload(resource: str, replicas: int, product: str, share: float = 0.2) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "namespace": "ai"}, "spec": {
        "replicas": replicas, "strategy": {"type": "Recreate"}, "template": {"spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                            "args": ["m", f"--gpu-memory-utilization={share}"],
                            "resources": {"limits": {resource: 1}}}]}}}}


def capacity_fires(*objects: dict[str, Any]) -> list[str]:
    entries = [{"type": f"kubernetes:{'core/v1' if o['apiVersion'] == 'v1' else o['apiVersion']}:{o['kind']}",
                "name": o["metadata"]["name"], "inputs": o} for o in objects]
    return [v.message for v in check_resources(entries) if v.policy in ("gpu-capacity", "gpu-shared-memory")]


@pytest.mark.parametrize(("product", "resource"), [("Tesla-T4-SHARED", "nvidia.com/gpu"), ("Tesla-T4", "nvidia.com/gpu.shared")])
def test_gfd_time_slicing_labels_give_the_slices(product: str, resource: str) -> None:
    """GFD marks the product -SHARED when the slices keep the name nvidia.com/gpu (renameByDefault false)."""
    node = gfd_node("t4", product, **{"nvidia.com/gpu.replicas": "4"})
    assert capacity_fires(node, workload(resource, 4, product)) == []
    assert any("'Insufficient " + resource + "'" in m for m in capacity_fires(node, workload(resource, 5, product)))


def test_gfd_mig_labels_give_the_instances_and_no_whole_card() -> None:
    node = gfd_node("a100", "NVIDIA-A100-SXM4-80GB", **{"nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig.strategy": "mixed"})
    assert capacity_fires(node, workload("nvidia.com/mig-1g.10gb", 7, "NVIDIA-A100-SXM4-80GB")) == []
    assert capacity_fires(node, workload("nvidia.com/mig-1g.10gb", 8, "NVIDIA-A100-SXM4-80GB"))
    assert capacity_fires(node, workload("nvidia.com/gpu", 1, "NVIDIA-A100-SXM4-80GB"))


def test_gfd_labelled_shared_pods_must_fit_one_cards_memory() -> None:
    node = gfd_node("t4", "Tesla-T4", **{"nvidia.com/gpu.replicas": "4"})
    assert capacity_fires(node, workload("nvidia.com/gpu.shared", 4, "Tesla-T4", share=0.25)) == []
    (message,) = capacity_fires(node, workload("nvidia.com/gpu.shared", 4, "Tesla-T4", share=0.3))
    assert "= 1.2 of its memory" in message
