"""Models larger than one node (`models[].nodesPerReplica`, issue #41): the load checks that refuse a group that
cannot run, and what the program declares for one that can, on the example stack (docs/examples/Pulumi.multinode.yaml:
four 8-GPU servers, a model of two servers per replica, two replicas at most)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from components.prerequisites import needs
from policy.rules.k8s import matches_label_selector, selects
from stacks.config import ConfigError, parse
from tools.render import ROOT, Render, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.multinode.yaml"
MODEL = "llama-405b"


def example_raw() -> dict[str, Any]:
    document = yaml.safe_load(EXAMPLE.read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in document.items()}


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    return str(caught.value)


@pytest.fixture(scope="module")
def example() -> Render:
    return run_program("multinode", stack_file=EXAMPLE)


def objects(out: Render, kind: str) -> list[dict[str, Any]]:
    return [o for o in out.kubernetes_objects() if o["kind"] == kind]


def one(out: Render, kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects(out, kind) if o["metadata"]["name"] == name]
    return found


# ---- refused at load, one line naming the key ------------------------------------------------------------------


def with_model(**changes: Any) -> dict[str, Any]:
    raw = example_raw()
    raw["models"][0].update(changes)
    return raw


def test_the_example_is_accepted_and_counts_groups_as_their_pods() -> None:
    stack = parse(example_raw())
    model = stack.models[0]
    assert model.spans_nodes and model.pods(model.replicas.max) == 4
    two_groups_of_four = with_model(replicas={"min": 1, "max": 3})  # 6 whole nodes, 4 exist
    assert "models[0].nodesPerReplica: 2 nodes per replica × replicas.max 3 = 6 whole nodes, but 4 hold its weights" \
        in error_of(two_groups_of_four)


@pytest.mark.parametrize(("changes", "says"), [
    ({"gpuResource": "gpu.shared", "gpusPerReplica": 1}, "models[0].nodesPerReplica: 2 with gpuResource gpu.shared"),
    ({"replicas": {"min": 0, "max": 1}}, "models[0].replicas.min: 0 with nodesPerReplica 2: a model spanning nodes does not scale"),
    ({"gpusPerReplica": 4}, "models[0].gpusPerReplica: 4, but a group's members take whole nodes"),
    ({"extraArgs": ["--nnodes=4"]}, "--nnodes is set by the bundle from nodesPerReplica"),
    ({"extraArgs": ["--headless"]}, "--headless is set by the bundle"),
    ({"extraArgs": ["-pp", "4"]}, "-pp is set by the bundle from nodesPerReplica"),
])
def test_a_group_that_cannot_run_is_refused(changes: dict[str, Any], says: str) -> None:
    assert says in error_of(with_model(**changes))


def test_every_node_of_the_product_must_be_whole_for_a_member() -> None:
    raw = example_raw()
    raw["nodes"][3]["gpu"]["count"] = 4
    message = error_of(raw)
    assert "models[0].gpusPerReplica: 8" in message and "gpu-d (4)" in message


def test_one_nodes_array_cannot_serve_a_group() -> None:
    raw = example_raw()
    raw["modelStorage"] = {"type": "local", "node": "gpu-a"}
    raw["cluster"].pop("surviveNodeLoss")
    assert "models[0].nodesPerReplica: 2, but modelStorage.type local keeps the weights on gpu-a alone" in error_of(raw)


def test_surviving_a_node_counts_whole_groups() -> None:
    """Two groups always up need all four servers: without any one of them a group cannot form."""
    message = error_of(with_model(replicas={"min": 2, "max": 2}))
    assert message.startswith("cluster.surviveNodeLoss: without gpu-a")
    raw = with_model(replicas={"min": 2, "max": 2})
    raw["cluster"]["surviveNodeLoss"] = False
    parse(raw)  # the same stack without the promise


# ---- what the program declares -----------------------------------------------------------------------------------


def test_a_group_is_a_leader_worker_set_not_a_deployment(example: Render) -> None:
    assert not [d for d in objects(example, "Deployment") if d["metadata"]["name"] == f"vllm-{MODEL}"]
    # Not the Service's name: the set's controller makes the headless Service of its pods' DNS names under its own.
    lws = one(example, "LeaderWorkerSet", f"vllm-{MODEL}-group")
    assert one(example, "Service", f"vllm-{MODEL}")["spec"].get("clusterIP") != "None"
    spec = lws["spec"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["metadata"]["annotations"]["pulumi.com/waitFor"] == "condition=Available"
    assert "replicas" not in spec  # KEDA owns the group count (min 1 < max 2)
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 0}
    assert spec["startupPolicy"] == "LeaderCreated"


def members(out: Render) -> tuple[dict[str, Any], dict[str, Any]]:
    template = one(out, "LeaderWorkerSet", f"vllm-{MODEL}-group")["spec"]["leaderWorkerTemplate"]
    return template["leaderTemplate"], template["workerTemplate"]


def test_the_leader_serves_and_the_workers_join_it(example: Render) -> None:
    leader, worker = members(example)
    (lead,), (work,) = leader["spec"]["containers"], worker["spec"]["containers"]
    for container in (lead, work):
        args = container["args"]
        assert {"--tensor-parallel-size=8", "--pipeline-parallel-size=2", "--nnodes=2", "--distributed-executor-backend=mp",
                "--master-addr=$(LWS_LEADER_ADDRESS)", "--master-port=29501"} <= set(args)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--node-rank=0" in lead["args"] and "--headless" not in lead["args"]
    assert "--node-rank=$(LWS_WORKER_INDEX)" in work["args"] and "--headless" in work["args"]
    assert {"startupProbe", "readinessProbe", "livenessProbe", "ports", "lifecycle"} <= set(lead)
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports", "lifecycle"} & set(work)
    assert leader["metadata"]["labels"]["app.kubernetes.io/component"] == "inference-server"
    assert worker["metadata"]["labels"]["app.kubernetes.io/component"] == "inference-worker"


def test_every_member_reads_its_own_nodes_verified_copy(example: Render) -> None:
    key = next(k for k in members(example)[0]["spec"]["nodeSelector"] if ".weights.gpu-serving.io/" in k)
    for template in members(example):
        assert template["spec"]["nodeSelector"][key] == "verified"
        assert [c["name"] for c in template["spec"]["initContainers"]] == ["verify-weights"]
        assert "topologySpreadConstraints" not in template["spec"]  # whole nodes: the GPUs spread them
    jobs = [j for j in objects(example, "Job") if j["metadata"]["labels"]["app.kubernetes.io/component"] == "model-download"]
    assert sorted(j["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] for j in jobs) == \
        ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]


def test_what_selects_the_model_selects_the_leaders_or_every_member(example: Render) -> None:
    leader, worker = (t["metadata"]["labels"] for t in members(example))
    name = f"vllm-{MODEL}"
    service = one(example, "Service", name)["spec"]["selector"]
    assert selects(service, leader) and not selects(service, worker)
    (monitor,) = objects(example, "PodMonitor")
    assert matches_label_selector(monitor["spec"]["selector"], leader) and not matches_label_selector(monitor["spec"]["selector"], worker)
    pdb = one(example, "PodDisruptionBudget", name)["spec"]
    assert pdb["maxUnavailable"] == 1 and all(matches_label_selector(pdb["selector"], m) for m in (leader, worker))
    group = one(example, "NetworkPolicy", f"{name}-group")["spec"]
    assert all(matches_label_selector(group["podSelector"], m) for m in (leader, worker))
    members_only = [{"podSelector": group["podSelector"]}]
    assert group["ingress"] == [{"from": members_only}] and group["egress"] == [{"to": members_only}]
    dns = one(example, "NetworkPolicy", "gpu-serving-servers-egress")["spec"]["podSelector"]
    assert all(matches_label_selector(dns, m) for m in (leader, worker))
    scaled = one(example, "ScaledObject", name)["spec"]["scaleTargetRef"]
    assert scaled == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": f"{name}-group"}
    (rule,) = objects(example, "PrometheusRule")
    down = next(r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "VllmNoPodReady")
    assert f'kube_statefulset_status_replicas_available{{namespace="ai",statefulset="{name}-group"}}' in down["expr"]


def test_a_model_on_one_node_keeps_its_deployment_and_selectors() -> None:
    """The same stack with a one-node model beside the group: its objects are what they were before groups existed."""
    raw = example_raw()
    small = copy.deepcopy(raw["models"][0])
    small.update(name="small", huggingFaceId="Qwen/Qwen3-8B-AWQ", weightsGb=6, gpusPerReplica=8, nodesPerReplica=1,
                 replicas={"min": 1, "max": 1})
    raw["models"] = [small]
    out = run_program("multinode", stack_file=EXAMPLE, overrides={f"gpu-serving:{k}": json.dumps(v) for k, v in raw.items()})
    assert one(out, "Deployment", "vllm-small")
    assert not objects(out, "LeaderWorkerSet")
    assert not [p for p in objects(out, "NetworkPolicy") if p["metadata"]["name"].endswith("-group")]
    assert one(out, "NetworkPolicy", "gpu-serving-servers-egress")["spec"]["podSelector"] == \
        {"matchLabels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/component": "inference-server"}}


def test_preview_looks_for_leader_worker_set_only_when_a_model_spans_nodes() -> None:
    stack = parse(example_raw())
    wanted = {n.path: n for n in needs(stack)}
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/leaderworkersets.leaderworkerset.x-k8s.io"
    webhook = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/lws-mutating-webhook-configuration"
    assert "kubectl apply --server-side" in wanted[crd].missing and wanted[webhook].unless_missing == crd
    raw = example_raw()
    raw["models"][0].update(nodesPerReplica=1, replicas={"min": 1, "max": 4}, weightsGb=80)
    assert not {crd, webhook} & {n.path for n in needs(parse(raw))}


def test_behind_the_endpoint_the_pool_picks_among_the_leaders() -> None:
    raw = example_raw()
    picker = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    raw["cluster"].update(gateway={"name": "ai-gateway", "namespace": "envoy-gateway-system"},
                          endpoint={"domain": "ai.example.com", "pickerImage": picker}, network={"apiServerCidrs": ["10.0.0.1/32"]})
    raw["tenants"] = [{"name": "apps", "apiKeySecrets": ["appsApiKey"], "models": [MODEL]}]
    out = run_program("multinode", stack_file=EXAMPLE, overrides={f"gpu-serving:{k}": json.dumps(v) for k, v in raw.items()})
    leader, worker = (t["metadata"]["labels"] for t in members(out))
    pool = one(out, "InferencePool", f"vllm-{MODEL}")["spec"]["selector"]
    assert matches_label_selector(pool, leader) and not matches_label_selector(pool, worker)
