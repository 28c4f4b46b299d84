"""The node cache in the pack (`modelStorage.type: nodeCache`, issue #38), on a stack built by hand in the shape
docs/node-cache-plan.md §3 and docs/models.md "Every node serves" describe: one `local` PV placed by the label
`cache.gpu-serving.io/ai In [ready]`, its claim `model-cache`, a download Job per (node, model) pinned by hostname, a
weights label per (node, model) set by a NodePatch of its own, and the model's Deployment gated on that label and
spread over hostnames. It passes; one change per rule makes that rule fire; over a preview and over plain YAML."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_factory import check, good, good_objects, pod_spec

from policy.check_yaml import main as check_yaml

NS = "ai"
PRODUCT = "NVIDIA-A100-SXM4-80GB"
DIGEST = "1a2b3c4d"
WEIGHTS = f"qwen3.{NS}.weights.gpu-serving.io/{DIGEST}"
CACHE_LABEL = f"cache.gpu-serving.io/{NS}"
NODES = {"gpu-a": 4, "gpu-b": 2}
Objects = list[dict[str, Any]]


def node_patch(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    """A NodePatch as resources.json holds it (the props are a Node's)."""
    return {"type": "kubernetes:core/v1:NodePatch", "name": name,
            "inputs": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}}}


def gpu_patch(node: str, cards: int) -> dict[str, Any]:
    return node_patch(f"{node}-gpu", node, {"nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.count": str(cards), CACHE_LABEL: "ready"})


def weights_patch(node: str) -> dict[str, Any]:
    return node_patch(f"{node}-qwen3-weights-{DIGEST}", node, {WEIGHTS: "verified"})


def cache_volume() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{NS}-model-cache"},
            "spec": {"capacity": {"storage": "140Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": NS, "name": "model-cache"}, "local": {"path": "/mnt/models"}, "volumeMode": "Filesystem",
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": CACHE_LABEL, "operator": "In", "values": ["ready"]}]}]}}}}


def cache_claim() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "model-cache", "namespace": NS},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": f"{NS}-model-cache",
                     "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem"}}


def download_job(node: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": "model-download", "app.kubernetes.io/instance": "qwen3", "gpu-serving.io/node": node}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": f"vllm-qwen3-dl-{DIGEST}-{hashlib.sha256(node.encode()).hexdigest()[:5]}", "namespace": NS, "labels": labels},
        "spec": {"backoffLimit": 3, "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "download", "operator": "In", "values": [10, 11, 12]}}]},
            "template": {"metadata": {"labels": labels}, "spec": {
                "restartPolicy": "Never", "automountServiceAccountToken": False,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "download", "image": "vllm/vllm-openai:v0.11.0",
                                "command": ["python3", "-c", "from huggingface_hub import snapshot_download"],
                                "env": [{"name": "HF_HUB_CACHE", "value": "/models/hub"}],
                                "volumeMounts": [{"name": "models", "mountPath": "/models"}]}],
                "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "model-cache"}}]}}}}


def server() -> dict[str, Any]:
    deployment = good("Deployment")
    deployment["spec"]["replicas"] = 2
    spec = pod_spec(deployment)
    spec["nodeSelector"][WEIGHTS] = "verified"
    spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                                          "labelSelector": {"matchLabels": {"app": "vllm-qwen3"}}, "matchLabelKeys": ["pod-template-hash"]}]
    spec["tolerations"] += [{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
                            for k in ("unreachable", "not-ready")]
    next(v for v in spec["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"] = "model-cache"
    return deployment


def stack() -> Objects:
    """The good set with its node, volume and claim replaced by a two-node cache; HPA 2..3 (2 GPUs a pod: 6, as many as held)."""
    keep = [o for o in good_objects() if o["kind"] not in ("Node", "PersistentVolume", "PersistentVolumeClaim", "Deployment")]
    hpa = next(o for o in keep if o["kind"] == "HorizontalPodAutoscaler")
    hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"] = 2, 3
    return [*(gpu_patch(n, c) for n, c in NODES.items()), *(weights_patch(n) for n in NODES), cache_volume(), cache_claim(),
            *(download_job(n) for n in NODES), server(), *keep]


def inputs(o: dict[str, Any]) -> dict[str, Any]:
    return o["inputs"] if "type" in o else o


def of(objects: Objects, kind: str, name: str | None = None) -> dict[str, Any]:
    return next(inputs(o) for o in objects if inputs(o)["kind"] == kind and (name is None or inputs(o)["metadata"]["name"] == name))


def deployment(objects: Objects) -> dict[str, Any]:
    return of(objects, "Deployment")


def mandatory(objects: Objects) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for v in check(*objects):
        if v.level == "mandatory":
            found.setdefault(v.policy, []).append(f"{v.kind}/{v.name}: {v.message}")
    return found


def test_the_cache_stack_passes() -> None:
    assert mandatory(stack()) == {}


# ---------------------------------------------------------------------------- one change per rule


def drop_weights_patch(node: str) -> Callable[[Objects], None]:
    def mutate(objects: Objects) -> None:
        objects.remove(next(o for o in objects if o.get("name") == f"{node}-qwen3-weights-{DIGEST}"))
    return mutate


def more_replicas(objects: Objects) -> None:
    of(objects, "HorizontalPodAutoscaler")["spec"]["maxReplicas"] = 4  # 8 GPUs, the holders declare 6


def bigger_pods(objects: Objects) -> None:
    drop_weights_patch("gpu-a")(objects)
    for section in ("limits", "requests"):
        pod_spec(deployment(objects))["containers"][0]["resources"][section]["nvidia.com/gpu"] = 3
    pod_spec(deployment(objects))["containers"][0]["args"][4] = "3"


def no_holder(objects: Objects) -> None:
    drop_weights_patch("gpu-a")(objects)
    drop_weights_patch("gpu-b")(objects)


def ungated(objects: Objects) -> None:
    del pod_spec(deployment(objects))["nodeSelector"][WEIGHTS]


def gated_on_another_value(objects: Objects) -> None:
    pod_spec(deployment(objects))["nodeSelector"][WEIGHTS] = "downloading"


def nfs_claim(objects: Objects) -> None:
    """The server switched to a claim bound to an NFS volume, the cache still in the namespace."""
    objects += [{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "ai-models"},
                 "spec": {"accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": "Retain",
                          "nfs": {"server": "nas.lan", "path": "/export/models"}}},
                {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models", "namespace": NS},
                 "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "ai-models",
                          "resources": {"requests": {"storage": "1Gi"}}}}]
    next(v for v in pod_spec(deployment(objects))["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"] = "models"


def class_claim(objects: Objects) -> None:
    objects.append(good("PersistentVolumeClaim"))  # `models`, storageClassName nfs
    next(v for v in pod_spec(deployment(objects))["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"] = "models"


def no_spread(objects: Objects) -> None:
    del pod_spec(deployment(objects))["topologySpreadConstraints"]


def spread_over_zones(objects: Objects) -> None:
    pod_spec(deployment(objects))["topologySpreadConstraints"][0]["topologyKey"] = "topology.kubernetes.io/zone"


def spread_of_other_pods(objects: Objects) -> None:
    pod_spec(deployment(objects))["topologySpreadConstraints"][0]["labelSelector"] = {"matchLabels": {"app": "vllm-llama"}}


def node_name(objects: Objects) -> None:
    spec = of(objects, "Job", f"vllm-qwen3-dl-{DIGEST}-{hashlib.sha256(b'gpu-b').hexdigest()[:5]}")["spec"]["template"]["spec"]
    spec["nodeName"] = spec.pop("nodeSelector")["kubernetes.io/hostname"]


def unpinned(objects: Objects) -> None:
    spec = of(objects, "Job")["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"nvidia.com/gpu.product": PRODUCT}


MUTATIONS: list[tuple[str, Callable[[Objects], None], str]] = [
    ("cache-holders-fit", drop_weights_patch("gpu-b"), "set on gpu-a (4) nvidia.com/gpu: up to 3 pod(s) x 2 nvidia.com/gpu = 6"),
    ("cache-holders-fit", drop_weights_patch("gpu-a"), "but the holding nodes declare only 2"),
    ("cache-holders-fit", more_replicas, "set on gpu-a (4), gpu-b (2) nvidia.com/gpu: up to 4 pod(s) x 2 nvidia.com/gpu = 8"),
    ("cache-holders-fit", bigger_pods, "one pod asks for 3 nvidia.com/gpu and no holding node has that many"),
    ("cache-holders-fit", no_holder, "which no node in the stack carries"),
    ("cache-pods-gated", ungated, "mounts node-cache claim model-cache but requires no weights label"),
    ("cache-pods-gated", gated_on_another_value, "requires no weights label"),
    ("cache-read-local", nfs_claim, "reads its model from claim models (NFS volume from nas.lan) though node-cache claim model-cache"),
    ("cache-read-local", class_claim, "claim models (volume provisioned by StorageClass nfs)"),
    ("cache-spread", no_spread, "keeps at least 2 replicas on node-cache claim model-cache"),
    ("cache-spread", spread_over_zones, "no topologySpreadConstraints over kubernetes.io/hostname"),
    ("cache-spread", spread_of_other_pods, "selecting its pods"),
    ("cache-download-pinned", node_name, "sets nodeName gpu-b: that bypasses the scheduler"),
    ("cache-download-pinned", unpinned, "is not pinned to one node"),
]


@pytest.mark.parametrize(("rule", "mutate", "says"), MUTATIONS, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(MUTATIONS)])
def test_one_change_makes_the_rule_fire(rule: str, mutate: Callable[[Objects], None], says: str) -> None:
    objects = stack()
    mutate(objects)
    found = mandatory(objects)
    assert rule in found, found
    assert any(says in m for m in found[rule]), found[rule]
    assert all("\n" not in m for m in found[rule])


def test_the_rules_say_nothing_without_a_node_cache() -> None:
    """The good set (an NFS-class claim, one node, one replica) and a two-replica Deployment on it: no cache rule."""
    objects: Objects = good_objects()
    deployment(objects)["spec"]["replicas"] = 2
    assert not {p for p in mandatory(objects) if p.startswith("cache-")}


def test_holders_need_nodes_in_view() -> None:
    """A gated Deployment checked without any node in view (plain manifests of the model alone): nothing to count."""
    assert "cache-holders-fit" not in mandatory([server(), cache_volume(), cache_claim()])


def test_holders_count_only_nodes_of_the_pods_product() -> None:
    objects = stack()
    of(objects, "Node", "gpu-a")["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    found = mandatory(objects)
    assert any("set on gpu-a (0), gpu-b (2) nvidia.com/gpu" in m for m in found["cache-holders-fit"]), found


def test_holders_fit_reads_a_keda_maximum() -> None:
    objects = [o for o in stack() if inputs(o)["kind"] != "HorizontalPodAutoscaler"]
    objects.append({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "vllm-qwen3", "namespace": NS},
                    "spec": {"scaleTargetRef": {"name": "vllm-qwen3"}, "minReplicaCount": 2, "maxReplicaCount": 3,
                             "triggers": [{"type": "prometheus", "metadata": {"query": "q", "threshold": "3"}}]}})
    assert "cache-holders-fit" not in mandatory(objects)
    of(objects, "ScaledObject")["spec"]["maxReplicaCount"] = 4
    assert any("up to 4 pod(s)" in m for m in mandatory(objects)["cache-holders-fit"])


def test_the_gate_may_be_a_required_node_affinity() -> None:
    objects = stack()
    spec = pod_spec(deployment(objects))
    del spec["nodeSelector"][WEIGHTS]
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": WEIGHTS, "operator": "In", "values": ["verified"]}]}]}}}
    assert mandatory(objects) == {}


@pytest.mark.parametrize(("minimum", "fires"), [(1, False), (2, True)])
def test_spread_is_asked_for_by_the_minimum_only(minimum: int, fires: bool) -> None:
    objects = stack()
    no_spread(objects)
    of(objects, "HorizontalPodAutoscaler")["spec"]["minReplicas"] = minimum
    assert ("cache-spread" in mandatory(objects)) is fires


def test_spread_by_a_hostname_anti_affinity_counts() -> None:
    objects = stack()
    spec = pod_spec(deployment(objects))
    del spec["topologySpreadConstraints"]
    selector = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["vllm-qwen3"]}]}
    spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector}}]}}
    assert "cache-spread" not in mandatory(objects)


def test_a_download_job_pinned_by_required_affinity_passes() -> None:
    objects = stack()
    spec = of(objects, "Job")["spec"]["template"]["spec"]
    host = spec.pop("nodeSelector")["kubernetes.io/hostname"]
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}}
    assert mandatory(objects) == {}
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0][
        "values"] = [host, "gpu-b"]
    assert "cache-download-pinned" in mandatory(objects)


def test_unknown_values_at_preview_report_nothing() -> None:
    objects = stack()
    ungated(objects)
    no_spread(objects)
    node_name(objects)
    for o in objects:
        if o.get("name", "").endswith("-gpu"):
            o["inputs"]["metadata"]["labels"] = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's unknown sentinel
    deployment(objects)["spec"]["template"]["spec"]["volumes"] = "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2"
    of(objects, "Job")["spec"]["template"]["spec"] = "dd056dcd-154b-4c76-9bd3-c8f88648b5ff"
    found = mandatory(objects)
    assert not {p for p in found if p.startswith("cache-")} - {"cache-download-pinned"}, found
    assert len(found.get("cache-download-pinned", [])) == 1  # gpu-b's Job, known, still sets nodeName


def test_plain_yaml_of_the_stack_is_judged_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each NodePatch is a Node document there (several of one name: their labels add up)."""
    objects = [copy.deepcopy(inputs(o)) for o in stack()]
    path = tmp_path / "cache.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    assert check_yaml([str(path)]) == 0
    drop_weights_patch_yaml = [o for o in objects if not (o["kind"] == "Node" and o["metadata"]["name"] == "gpu-b"
                                                          and WEIGHTS in o["metadata"]["labels"])]
    path.write_text(yaml.safe_dump_all(drop_weights_patch_yaml))
    capsys.readouterr()
    assert check_yaml([str(path)]) == 1
    assert "mandatory cache-holders-fit" in capsys.readouterr().out
