"""The picker proof's pieces that need no cluster (testbed/e2e/real_picker.py): the stack's pool and picker objects it
applies, the one change it makes to them, its simulator pods, and the parser the picker-rbac check reads
`kubectl auth can-i --list` with."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from testbed import CLUSTER_VERSIONS
from testbed.e2e.real_picker import MODEL, PICKER_KINDS, can_i_rows, model_simulators, on_the_lab_node, percentiles, stack_picker_objects
from testbed.node.images import picker_names

IMAGE = "gs-testbed/epp:v1.5.0@sha256:" + "0" * 64


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    rendered = stack_picker_objects("ns", IMAGE, tmp_path_factory.mktemp("picker"))
    assert sorted(o["kind"] for o in rendered) == sorted(PICKER_KINDS)
    return {o["kind"]: o for o in rendered}


def test_the_stacks_pool_names_its_picker_in_the_namespace(objects: dict[str, dict[str, Any]]) -> None:
    pool = objects["InferencePool"]
    assert pool["metadata"] == {**pool["metadata"], "name": f"vllm-{MODEL}", "namespace": "ns"}
    assert pool["spec"]["endpointPickerRef"] == {"name": f"vllm-{MODEL}-epp", "port": {"number": 9002}, "failureMode": "FailClose"}
    assert {o["metadata"]["namespace"] for o in objects.values()} == {"ns"}
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    args = container["args"]
    assert args[args.index("--pool-name") + 1] == f"vllm-{MODEL}" and args[args.index("--pool-namespace") + 1] == "ns"


def test_the_stacks_role_reads_what_the_picker_watches(objects: dict[str, dict[str, Any]]) -> None:
    granted = {(g, r, v) for rule in objects["Role"]["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    read = {(g, r, v) for g, r in (("", "pods"), ("inference.networking.k8s.io", "inferencepools"),
                                   ("inference.networking.x-k8s.io", "inferenceobjectives"),
                                   ("inference.networking.x-k8s.io", "inferencemodelrewrites")) for v in ("get", "list", "watch")}
    assert granted == read
    assert objects["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": f"vllm-{MODEL}-epp", "namespace": "ns"}]


def test_the_lab_changes_only_the_pickers_tolerations(objects: dict[str, dict[str, Any]]) -> None:
    before = copy.deepcopy(list(objects.values()))
    after = on_the_lab_node(copy.deepcopy(before))
    changed = [(b["kind"], a) for b, a in zip(before, after, strict=True) if a != b]
    assert [kind for kind, _ in changed] == ["Deployment"]
    spec = changed[0][1]["spec"]["template"]["spec"]
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    del spec["tolerations"]
    assert changed[0][1] == objects["Deployment"]


def test_the_simulators_take_the_pools_selector(objects: dict[str, dict[str, Any]]) -> None:
    selector = objects["InferencePool"]["spec"]["selector"]["matchLabels"]
    simulators = model_simulators("ns", MODEL, selector, "s@sha256:1", "g@sha256:2")
    assert simulators["spec"]["replicas"] == 2 and model_simulators("ns", MODEL, selector, "s", "g", replicas=1)["spec"]["replicas"] == 1
    assert simulators["spec"]["selector"]["matchLabels"] == simulators["spec"]["template"]["metadata"]["labels"] == selector
    args = simulators["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--model={MODEL}" in args and "--port=8000" in args
    assert objects["InferencePool"]["spec"]["targetPorts"] == [{"number": 8000}]


def test_image_tags_follow_the_pins() -> None:
    pins = dict(re.findall(r"^([A-Z0-9_]+)=(\S+)$", CLUSTER_VERSIONS.read_text(), re.M))
    assert picker_names() == {"epp": f"gs-testbed/epp:{pins['INFERENCE_EXTENSION_VERSION']}",
                              "llm-d-inference-sim": f"gs-testbed/llm-d-inference-sim:{pins['INFERENCE_SIM_VERSION']}"}


def test_can_i_rows_keeps_resource_rows_only() -> None:
    table = """selfsubjectreviews.authentication.k8s.io   []   []   [create]
pods   []   []   [get list watch]
inferencepools.inference.networking.k8s.io   []   []   [get list watch]
configmaps   []   [gs-config]   [get]
   [/api/*]   []   [get]
   [/version]   []   [get]
"""
    assert can_i_rows(table) == {("selfsubjectreviews.authentication.k8s.io", "create"), *(
        (r, v) for r in ("pods", "inferencepools.inference.networking.k8s.io") for v in ("get", "list", "watch"))}



def test_percentiles_by_nearest_rank() -> None:
    assert percentiles([float(v) for v in range(100, 0, -1)]) == {"p50": 50.0, "p99": 99.0}
    assert percentiles([3.0]) == {"p50": 3.0, "p99": 3.0}
    assert percentiles([1.0, 2.0, 30.0]) == {"p50": 2.0, "p99": 30.0}
