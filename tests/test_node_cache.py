"""`modelStorage.type: nodeCache`: every node serves from its own array (issue #38). The load checks (which nodes hold
which models, each array's capacity, the survive-one-node promise, placement over the holders) and what the
program declares (one volume selecting nodes by label, a download and a weights label per node, gated and
spread pods)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.config import ConfigError, parse, usable_gib
from stacks.placement import stranded_pod, stranded_pod_among
from tools.render import ROOT, Render, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.cache.yaml"
NAMESPACE = "ai"


def example_raw() -> dict[str, Any]:
    document = yaml.safe_load(EXAMPLE.read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in document.items()}


def three_nodes() -> dict[str, Any]:
    """The example with a third server (gpu-c), its own disks."""
    raw = example_raw()
    third = copy.deepcopy(raw["nodes"][1])
    third["name"], third["ssh"]["host"] = "gpu-c", "10.0.0.23"
    third["ssh"]["hostKeySecret"] = "sshHostKeyGpuC"
    third["storage"]["disks"] = [d.replace("a0b", "a0c") for d in third["storage"]["disks"]]
    raw["nodes"].append(third)
    return raw


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    return str(caught.value)


def render(raw: dict[str, Any]) -> Render:
    overrides = {f"gpu-serving:{key}": json.dumps(value) for key, value in raw.items()}
    return run_program("cache", stack_file=EXAMPLE, overrides=overrides)


@pytest.fixture(scope="module")
def example() -> Render:
    return run_program("cache", stack_file=EXAMPLE)


def objects(out: Render, kind: str) -> list[dict[str, Any]]:
    return [o for o in out.kubernetes_objects() if o["kind"] == kind]


# ---- the newcomer's two servers ----------------------------------------------------------------------------


def test_two_servers_both_hold_and_serve_the_model(example: Render) -> None:
    stack = parse(example_raw())
    assert [n.name for n in stack.cache_nodes()] == ["gpu-a", "gpu-b"]
    assert [n.name for n in stack.holders(stack.models[0])] == ["gpu-a", "gpu-b"]
    assert stack.models[0].replicas.max == 4  # 4 ≤ 2 + 2 GPUs: accepted
    assert not [w for w in stack.warnings() if "nothing uses that array" in w]

    jobs = {o["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]: o
            for o in objects(example, "Job") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "model-download"}
    assert sorted(jobs) == ["gpu-a", "gpu-b"]
    assert len({j["metadata"]["name"] for j in jobs.values()}) == 2
    assert all(len(j["metadata"]["name"]) <= 63 and "nodeName" not in j["spec"]["template"]["spec"] for j in jobs.values())

    labels = {}
    for patch in objects(example, "Node"):
        labels.setdefault(patch["metadata"]["name"], {}).update(patch["metadata"]["labels"])
    (deployment,) = objects(example, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    weights = [k for k in pod["nodeSelector"] if ".weights.gpu-serving.io/" in k]
    assert weights and pod["nodeSelector"][weights[0]] == "verified"
    for node in ("gpu-a", "gpu-b"):
        assert labels[node][f"cache.gpu-serving.io/{NAMESPACE}"] == "ready"
        assert labels[node][weights[0]] == "verified"
    # Each pod reads its own node's copy: one local volume, on whichever node carries the cache label.
    (volume,) = objects(example, "PersistentVolume")
    assert volume["spec"]["local"] == {"path": "/mnt/models"}
    term = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": f"cache.gpu-serving.io/{NAMESPACE}", "operator": "In", "values": ["ready"]}]}]
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert volume["spec"]["capacity"]["storage"] == f"{usable_gib(500)}Gi"
    assert [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v] == ["model-cache"]
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    (constraint,) = pod["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "kubernetes.io/hostname" and constraint["whenUnsatisfiable"] == "ScheduleAnyway"
    assert constraint["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    lost = {t["key"]: t["tolerationSeconds"] for t in pod["tolerations"] if t.get("effect") == "NoExecute"}
    assert lost == {"node.kubernetes.io/unreachable": 60, "node.kubernetes.io/not-ready": 60}


def test_pods_wait_for_every_holders_copy_and_label(example: Render) -> None:
    (deployment,) = example.of_type("kubernetes:apps/v1:Deployment")
    waits = deployment.options["dependsOn"]
    jobs = [r for r in example.of_type("kubernetes:batch/v1:Job") if "-download-" in r.urn]
    weights = [r for r in example.of_type("kubernetes:core/v1:NodePatch") if "-weights-" in r.urn]
    assert len(jobs) == 2 and len(weights) == 2
    assert all(r.urn in waits for r in jobs + weights)
    # A weights label only after its node's Job completed; a Job only once its node is labelled a cache node.
    for patch in weights:
        node = patch.inputs["metadata"]["name"]
        (job,) = [j for j in jobs if j.urn.endswith(f"-download-{node}")]
        assert job.urn in patch.options["dependsOn"]
        (cache_label,) = [r for r in example.of_type("kubernetes:core/v1:NodePatch") if r.urn.endswith(f"::{node}-gpu")]
        assert cache_label.urn in job.options["dependsOn"]
        assert any("60-grow" in urn for urn in cache_label.options["dependsOn"]), "labelled before its array is mounted"


def test_a_new_revision_is_a_new_label_and_new_jobs() -> None:
    raw = example_raw()
    before = render(raw)
    raw["models"][0]["revision"] = "0" * 40
    after = render(raw)

    def names(out: Render, kind: str) -> set[str]:
        return {r.urn.rsplit("::", 1)[1] for r in out.of_type(kind) if "-weights-" in r.urn or "-download-" in r.urn}

    assert names(before, "kubernetes:core/v1:NodePatch").isdisjoint(names(after, "kubernetes:core/v1:NodePatch"))
    old = {o["metadata"]["name"] for o in objects(before, "Job")}
    new = {o["metadata"]["name"] for o in objects(after, "Job")}
    assert len(new - old) == 3  # two downloads and the smoke test


def test_models_nodes_narrows_the_holders() -> None:
    raw = three_nodes()
    raw["models"][0]["nodes"] = ["gpu-a", "gpu-c"]
    raw["models"][0]["replicas"] = {"min": 1, "max": 3}
    raw["cluster"]["surviveNodeLoss"] = False
    out = render(raw)
    pinned = sorted(o["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] for o in objects(out, "Job")
                    if o["metadata"]["labels"]["app.kubernetes.io/component"] == "model-download")
    assert pinned == ["gpu-a", "gpu-c"]
    warnings = parse(raw).warnings()
    assert any(w.startswith("modelStorage.nodes: gpu-b caches no model") for w in warnings), warnings


# ---- refusals -------------------------------------------------------------------------------------------------


def test_capacity_per_node_names_the_node_and_the_models() -> None:
    raw = three_nodes()
    raw["models"][0]["nodes"] = ["gpu-a", "gpu-b"]
    raw["models"][0]["replicas"] = {"min": 1, "max": 2}
    raw["models"].append({**raw["models"][0], "name": "big", "weightsGb": 480, "nodes": ["gpu-b", "gpu-c"]})
    raw["cluster"]["surviveNodeLoss"] = False
    message = error_of(raw)
    assert message.startswith("nodes[1].storage.sizeGb: 500: gpu-b holds qwen3 (7 GB) + big (489.6 GB)"), message
    assert "its array holds 490 GB (456 GiB)" in message and "\n" not in message


def test_survive_node_loss_refuses_a_model_held_on_one_node() -> None:
    raw = three_nodes()
    raw["models"][0]["nodes"] = ["gpu-a"]
    raw["models"][0]["replicas"] = {"min": 1, "max": 2}
    message = error_of(raw)
    assert message.startswith("cluster.surviveNodeLoss: without gpu-a, models[0] (qwen3) has no node left"), message


def test_survive_node_loss_counts_the_gpus_left() -> None:
    raw = example_raw()
    raw["models"][0]["replicas"] = {"min": 3, "max": 4}
    message = error_of(raw)
    assert message.startswith("cluster.surviveNodeLoss: without gpu-a, the models' replicas.min need 3 nvidia-l40s GPUs but 2 are left")
    raw["cluster"]["surviveNodeLoss"] = False
    assert parse(raw).models[0].replicas.min == 3


def test_survive_node_loss_with_local_storage_is_refused() -> None:
    raw = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    raw = {key.split(":", 1)[1]: value for key, value in raw.items()}
    raw["cluster"]["surviveNodeLoss"] = True
    assert error_of(raw).startswith("cluster.surviveNodeLoss: modelStorage.type local keeps every model on k8s-worker-02")


@pytest.mark.parametrize(("change", "expected"), [
    (lambda r: r["models"][0].update(nodes=["gpu-x"]), "models[0].nodes[0]: 'gpu-x' is not a cache node (cache nodes: gpu-a, gpu-b)"),
    (lambda r: r["models"][0].update(nodes=["gpu-a", "gpu-a"]), "models[0].nodes[1]: 'gpu-a' is listed twice"),
    (lambda r: r["modelStorage"].update(nodes=["gpu-z"]), "modelStorage.nodes[0]: 'gpu-z' is not a configured node"),
    # gpu-b no longer a cache node (no disks) or of another product: gpu-a alone holds the model.
    (lambda r: r["nodes"][1]["storage"].update(disks=[]), "cluster.surviveNodeLoss: without gpu-a, models[0] (qwen3) has no node left"),
    (lambda r: r["nodes"][1]["storage"].update(mountpoint="/data/models"),
     "nodes[1].storage.mountpoint: gpu-b mounts its array at /data/models, gpu-a at /mnt/models"),
    (lambda r: r["nodes"][1]["gpu"].update(product="nvidia-a100"),
     "cluster.surviveNodeLoss: without gpu-a, models[0] (qwen3) has no node left"),
])
def test_refusals_name_the_key(change: Any, expected: str) -> None:
    raw = example_raw()
    raw["models"][0]["replicas"] = {"min": 1, "max": 2}
    change(raw)
    assert error_of(raw).startswith(expected)


def test_models_nodes_only_with_a_node_cache() -> None:
    raw = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    raw = {key.split(":", 1)[1]: value for key, value in raw.items()}
    raw["models"][0]["nodes"] = ["k8s-worker-02"]
    assert error_of(raw).startswith("models[0].nodes: only with modelStorage.type nodeCache (it is local)")


def test_a_node_without_disks_is_no_cache() -> None:
    raw = example_raw()
    raw["modelStorage"]["nodes"] = ["gpu-a", "gpu-b"]
    raw["nodes"][1]["storage"]["disks"] = []
    assert error_of(raw) == "modelStorage.nodes[1]: gpu-b has no `storage.disks`, so there is no array to cache models on"


def test_max_replicas_must_fit_the_holders() -> None:
    raw = three_nodes()
    raw["cluster"]["surviveNodeLoss"] = False
    raw["models"][0]["nodes"] = ["gpu-a"]
    message = error_of(raw)
    assert message.startswith("models[0].nodes: at max replicas it needs 4 nvidia.com/gpu but the nodes that hold its weights "
                              "(gpu-a) have 2")


def test_per_node_fit_counts_only_the_holders() -> None:
    # Two 2-GPU nodes; a 2-GPU model on gpu-b only, and two 1-GPU pods allowed anywhere: they may take one GPU of
    # each node, and the 2-GPU pod is stranded although 4 GPUs add up to its 2 and their 2.
    raw = example_raw()
    raw["cluster"]["surviveNodeLoss"] = False
    raw["models"][0]["replicas"] = {"min": 2, "max": 2}
    raw["models"].append({**raw["models"][0], "name": "large", "gpusPerReplica": 2, "replicas": {"min": 1, "max": 1},
                          "nodes": ["gpu-b"]})
    message = error_of(raw)
    assert message.startswith("models[1].gpusPerReplica: its 2-GPU pods can be left Pending"), message


# ---- the placement search --------------------------------------------------------------------------------------


def test_stranding_with_allowed_nodes() -> None:
    every, only_b = frozenset({0, 1}), frozenset({1})
    # A 2-GPU pod allowed on node 1 only; one 1-GPU pod allowed anywhere fills it past use.
    found = stranded_pod_among([2, 2], [(2, only_b), (1, every)])
    assert found is not None and found.size == 2 and found.allowed == only_b and found.free[1] == 1
    # Allowed on both nodes, one 1-GPU pod cannot block both.
    assert stranded_pod_among([2, 2], [(2, every), (1, every)]) is None
    # The 1-GPU pod may not use node 1: nothing can block it.
    assert stranded_pod_among([2, 2], [(2, only_b), (1, frozenset({0}))]) is None


@pytest.mark.parametrize(("nodes", "pods"), [([2, 2], [1, 1, 2]), ([4, 2], [2, 2, 2]), ([1, 1, 1], [1, 1]), ([8], [4, 2, 2])])
def test_every_node_allowed_is_the_old_search(nodes: list[int], pods: list[int]) -> None:
    every = frozenset(range(len(nodes)))
    assert stranded_pod_among(nodes, [(p, every) for p in pods]) == stranded_pod(nodes, pods)


# ---- the tripwire before the server ---------------------------------------------------------------------------


def run_verifier(tmp_path: Path, repos: list[list[str]]) -> subprocess.CompletedProcess[str]:
    from components.serving.server import VERIFY_WEIGHTS

    env = {"GS_MARKER_DIR": str(tmp_path / "downloads"), "GS_NODE": "gpu-b", "GS_REPOS": json.dumps(repos), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", VERIFY_WEIGHTS], env=env, capture_output=True, text=True, timeout=30)


def test_the_verifier_passes_a_complete_copy_and_names_a_missing_one(tmp_path: Path) -> None:
    commit = "4da05a8edb55c6046cce958586c33b61da07bb79"
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B-AWQ" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (tmp_path / "downloads").mkdir()
    marker = tmp_path / "downloads" / f"Qwen--Qwen3-8B-AWQ@{commit}.done"
    marker.write_text(f"{snapshot}\n")
    ok = run_verifier(tmp_path, [["Qwen/Qwen3-8B-AWQ", commit]])
    assert ok.returncode == 0, ok.stderr
    assert run_verifier(tmp_path, [["Qwen/Qwen3-8B-AWQ", "main"]]).returncode == 0  # a lab's branch: any commit of it
    other = run_verifier(tmp_path, [["Qwen/Qwen3-8B-AWQ", "0" * 40]])
    assert other.returncode == 1
    assert other.stderr.count("\n") == 1 and other.stderr.startswith(f"ERROR: gpu-b is labelled as holding Qwen/Qwen3-8B-AWQ@{'0' * 40}")
    # The marker outlived its files (a replaced disk restored from somewhere, a half-wiped cache).
    snapshot.rmdir()
    assert run_verifier(tmp_path, [["Qwen/Qwen3-8B-AWQ", commit]]).returncode == 1


def test_the_pods_run_the_verifier_first_and_only_on_a_node_cache(example: Render) -> None:
    (deployment,) = objects(example, "Deployment")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["name"] == "verify-weights" and init["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert init["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True}]
    assert init["resources"]["requests"] == init["resources"]["limits"]
    prod = run_program("prod")
    (local,) = objects(prod, "Deployment")
    assert "initContainers" not in local["spec"]["template"]["spec"]
