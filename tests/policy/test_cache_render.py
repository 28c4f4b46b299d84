"""The node cache in the pack, on the rendered example stack (docs/examples/Pulumi.cache.yaml: two servers of two L40S
each, both holding qwen3, replicas 1..4): it passes every rule, and one change per rule makes it fire, over the
render's resources (as a preview sees them) and over its plain YAML. The same mutations on hand-built objects:
test_cache_rules.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from policy.check_yaml import main as check_yaml
from policy.rules import check_resources
from tests.policy.rendered_example import Entries, fires_on, mandatory, named
from tools.render import ROOT, Render, manifests_yaml, policy_config, resources_json, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.cache.yaml"
WEIGHTS = "qwen3.ai.weights.gpu-serving.io/"


@pytest.fixture(scope="module")
def rendered() -> Render:
    return run_program("cache", stack_file=EXAMPLE)


@pytest.fixture(scope="module")
def rendered_min_two() -> Render:
    """The example with replicas.min 2: two replicas always up, so spreading them over nodes matters."""
    models = yaml.safe_load(EXAMPLE.read_text())["config"]["gpu-serving:models"]
    models[0]["replicas"]["min"] = 2
    return run_program("cache", stack_file=EXAMPLE, overrides={"gpu-serving:models": json.dumps(models)})


@pytest.fixture
def entries(rendered: Render) -> Entries:
    return copy.deepcopy(resources_json(rendered))




def pod(entries: Entries, name: str) -> dict[str, Any]:
    return named(entries, name)["spec"]["template"]["spec"]


def weights_key(entries: Entries) -> str:
    return next(k for k in pod(entries, "qwen3-deployment")["nodeSelector"] if k.startswith(WEIGHTS))


def test_the_example_is_what_the_rules_read(entries: Entries) -> None:
    """The shapes the cache rules look for, as the program renders them (cache-design.md)."""
    pv = named(entries, "model-storage-pv")
    assert "local" in pv["spec"] and pv["metadata"]["name"] == "ai-model-cache"
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "cache.gpu-serving.io/ai", "operator": "In", "values": ["ready"]}]}]
    assert named(entries, "model-storage-pvc")["spec"]["volumeName"] == "ai-model-cache"
    key = weights_key(entries)
    patches = [e for e in entries if e["type"].endswith(":NodePatch") and key in e["inputs"]["metadata"].get("labels", {})]
    assert sorted(e["name"] for e in patches) == [f"gpu-a-qwen3-weights-{key[len(WEIGHTS):]}", f"gpu-b-qwen3-weights-{key[len(WEIGHTS):]}"]
    for node in ("gpu-a", "gpu-b"):
        assert pod(entries, f"qwen3-download-{node}")["nodeSelector"] == {"kubernetes.io/hostname": node}


def test_the_example_passes_every_rule(rendered: Render, entries: Entries) -> None:
    """Four replicas at most on one ReadWriteOnce claim (bound to a `local` PV: never attached) and a PV placed by a
    label: neither rwo-claim-single-replica nor local-pv-node-affinity objects."""
    assert mandatory(rendered, entries) == {}
    assert [v for v in check_resources(entries, config=policy_config(rendered))] == []


# ---------------------------------------------------------------------------- one change per rule


def drop_weights_patch(e: Entries) -> None:
    """gpu-b's weights label is gone (its Job failed, or the node left models[].nodes) but replicas.max stays 4."""
    e.remove(next(x for x in e if x["name"].startswith("gpu-b-qwen3-weights-")))


def ungated(e: Entries) -> None:
    del pod(e, "qwen3-deployment")["nodeSelector"][weights_key(e)]


def nfs_claim(e: Entries) -> None:
    e += [{"type": "kubernetes:core/v1:PersistentVolume", "name": "nas-pv", "inputs": {
              "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "ai-models"},
              "spec": {"accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Ti"}, "persistentVolumeReclaimPolicy": "Retain",
                       "claimRef": {"namespace": "ai", "name": "models"}, "nfs": {"server": "nas.lan", "path": "/export/models"}}}},
          {"type": "kubernetes:core/v1:PersistentVolumeClaim", "name": "nas-pvc", "inputs": {
              "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models", "namespace": "ai"},
              "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "ai-models",
                       "resources": {"requests": {"storage": "1Gi"}}}}}]
    next(v for v in pod(e, "qwen3-deployment")["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"] = "models"


def node_name(e: Entries) -> None:
    spec = pod(e, "qwen3-download-gpu-b")
    spec["nodeName"] = spec.pop("nodeSelector")["kubernetes.io/hostname"]


def attachable_volume(e: Entries) -> None:
    """The cache PV made an attachable one (a CSI block device): ReadWriteOnce is enforced across nodes there."""
    spec = named(e, "model-storage-pv")["spec"]
    spec.pop("local")
    spec["csi"] = {"driver": "rbd.csi.ceph.com", "volumeHandle": "models"}


def no_affinity(e: Entries) -> None:
    del named(e, "model-storage-pv")["spec"]["nodeAffinity"]


MUTATIONS: list[tuple[str, Callable[[Entries], None], str]] = [
    ("cache-holders-fit", drop_weights_patch,
     "set on gpu-a (2) nvidia.com/gpu: up to 4 pod(s) x 1 nvidia.com/gpu = 4, but the holding nodes declare only 2"),
    ("cache-pods-gated", ungated, "Deployment/vllm-qwen3: mounts node-cache claim model-cache but requires no weights label"),
    ("cache-read-local", nfs_claim, "reads its model from claim models (NFS volume from nas.lan) though node-cache claim model-cache"),
    ("cache-download-pinned", node_name, "sets nodeName gpu-b: that bypasses the scheduler"),
    ("rwo-claim-single-replica", attachable_volume, "mounts claim model-cache (ReadWriteOnce) but may run 4 replicas"),
    ("local-pv-node-affinity", no_affinity, "kubernetes.io/hostname or a label only the nodes holding the directory carry"),
]


@pytest.mark.parametrize(("rule", "mutate", "says"), MUTATIONS, ids=[f"{m[0]}-{m[1].__name__}" for m in MUTATIONS])
def test_each_rule_fires_on_one_change_to_the_example(rendered: Render, entries: Entries, rule: str,
                                                       mutate: Callable[[Entries], None], says: str) -> None:
    fires_on(rendered, entries, rule, mutate, says)


def test_two_replicas_always_up_are_spread_over_nodes(rendered_min_two: Render) -> None:
    entries = copy.deepcopy(resources_json(rendered_min_two))
    assert named(entries, "qwen3-scaled-object")["spec"]["minReplicaCount"] == 2
    assert mandatory(rendered_min_two, entries) == {}
    del pod(entries, "qwen3-deployment")["topologySpreadConstraints"]
    (message,) = mandatory(rendered_min_two, entries)["cache-spread"]
    assert "Deployment/vllm-qwen3: keeps at least 2 replicas on node-cache claim model-cache with no topologySpreadConstraints" in message


def test_the_policy_config_names_the_stacks_count_label(rendered: Render) -> None:
    assert policy_config(rendered)["cache-holders-fit"] == {"gpuProductLabel": "gpu-serving/gpu.product",
                                                            "gpuCountLabel": "gpu-serving/gpu.count"}


def test_plain_yaml_of_the_example_is_judged_the_same(rendered: Render, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """There every NodePatch is a Node document, two of each name: their labels add up."""
    manifests = tmp_path / "manifests.yaml"
    manifests.write_text(manifests_yaml(rendered))
    config = tmp_path / "policy-config.json"
    config.write_text(json.dumps(policy_config(rendered)))
    assert check_yaml([str(manifests), "--config", str(config)]) == 0
    documents = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    names = [(d["kind"], d["metadata"]["name"]) for d in documents]
    assert names.count(("Node", "gpu-b")) == 2
    documents = [d for d in documents if not (d["kind"] == "Node" and d["metadata"]["name"] == "gpu-b"
                                              and any(k.startswith(WEIGHTS) for k in d["metadata"].get("labels", {})))]
    manifests.write_text(yaml.safe_dump_all(documents))
    capsys.readouterr()
    assert check_yaml([str(manifests), "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "mandatory cache-holders-fit" in out and "Deployment/vllm-qwen3" in out
