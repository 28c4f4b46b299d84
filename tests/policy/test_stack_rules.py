"""Rules over the whole stack: capacity, autoscalers, RWO claims, Ingress."""

from __future__ import annotations

import copy

import pytest
from policy_factory import check, good, good_objects, policies

from policy.rules import check_resources


def node_patch(name, product, count):
    return {"type": "kubernetes:core/v1:NodePatch", "name": name,
            "inputs": {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product,
                                                               "nvidia.com/gpu.count": str(count)}}}}


def test_good_set_passes():
    assert check(*good_objects()) == []


@pytest.mark.parametrize(
    ("nodes", "max_replicas", "fragment"),
    [
        ([("n1", "NVIDIA-A100-SXM4-80GB", 2)], 2, "declare only 2"),
        ([("n1", "NVIDIA-A100-SXM4-80GB", 2), ("n2", "NVIDIA-A100-SXM4-80GB", 1)], 2, "declare only 3"),
        ([("n1", "NVIDIA-RTX-3090", 8)], 1, "no node in the stack carries"),
    ],
)
def test_gpu_capacity_violations(nodes, max_replicas, fragment):
    hpa = good("HorizontalPodAutoscaler")
    hpa["spec"]["maxReplicas"] = max_replicas
    resources = [node_patch(*n) for n in nodes]
    found = [v for v in check(good("Deployment"), hpa, *resources) if v.policy == "gpu-capacity"]
    assert len(found) == 1 and fragment in found[0].message
    assert (found[0].kind, found[0].level) == ("Deployment", "mandatory")


def test_gpu_capacity_fits_and_counts_all_products_for_unpinned_pods():
    deployment = good("Deployment")
    deployment["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "any"}
    nodes = [node_patch("n1", "A", 1), node_patch("n2", "B", 1)]
    assert "gpu-capacity" not in policies(check(deployment, *nodes))  # 1 pod x 2 GPUs <= 1 + 1
    deployment["spec"]["replicas"] = 2
    assert "gpu-capacity" in policies(check(deployment, *nodes))


def test_gpu_capacity_label_keys_are_configurable():
    nodes = [{"type": "kubernetes:core/v1:NodePatch", "name": "n1",
              "inputs": {"metadata": {"labels": {"gpu": "NVIDIA-A100-SXM4-80GB", "gpus": "1"}}}}]
    config = {"gpu-capacity": {"gpuProductLabel": "gpu", "gpuCountLabel": "gpus"}}
    deployment = good("Deployment")
    deployment["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "NVIDIA-A100-SXM4-80GB"}
    assert "gpu-capacity" in policies(check(deployment, *nodes, config=config))
    assert "gpu-capacity" not in policies(check(deployment, *nodes))  # default labels: no declared nodes


def test_keda_max_replicas_count_towards_demand():
    keda = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "q", "namespace": "ai"},
            "spec": {"scaleTargetRef": {"name": "vllm-qwen3"}, "maxReplicaCount": 3}}
    found = check(good("Deployment"), keda, node_patch("n1", "NVIDIA-A100-SXM4-80GB", 4))
    assert "gpu-capacity" in policies(found)


@pytest.mark.parametrize(
    ("metrics", "window", "fragments"),
    [
        (None, 600, ["no metrics"]),
        ([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}], 600,
         ["CPU/memory only"]),
        ("keep", 60, ["window is 60s"]),
        ("keep", None, []),  # Kubernetes default 300 s is enough
    ],
)
def test_gpu_hpa_scaling(metrics, window, fragments):
    hpa = good("HorizontalPodAutoscaler")
    if metrics != "keep":
        hpa["spec"].pop("metrics")
        if metrics:
            hpa["spec"]["metrics"] = metrics
    hpa["spec"]["behavior"]["scaleDown"].pop("stabilizationWindowSeconds")
    if window is not None:
        hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] = window
    found = [v for v in check(good("Deployment"), hpa) if v.policy == "gpu-hpa-scaling"]
    assert [any(f in v.message for v in found) for f in fragments] == [True] * len(fragments)
    assert len(found) == len(fragments)


def test_gpu_hpa_window_is_configurable_and_cpu_hpa_on_cpu_workload_is_fine():
    config = {"gpu-hpa-scaling": {"minScaleDownWindowSeconds": 900}}
    assert "gpu-hpa-scaling" in policies(check(good("Deployment"), good("HorizontalPodAutoscaler"), config=config))
    web = good("Deployment")
    web["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    hpa = good("HorizontalPodAutoscaler")
    hpa["spec"].pop("metrics")
    assert "gpu-hpa-scaling" not in policies(check(web, hpa))


def test_hpa_and_keda_on_the_same_target():
    keda = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "q", "namespace": "ai"},
            "spec": {"scaleTargetRef": {"name": "vllm-qwen3"}}}
    found = [v for v in check(good("HorizontalPodAutoscaler"), keda) if v.policy == "single-autoscaler"]
    assert len(found) == 1 and "keda-hpa-q" in found[0].message
    other = copy.deepcopy(keda)
    other["spec"]["scaleTargetRef"]["name"] = "something-else"
    assert "single-autoscaler" not in policies(check(good("HorizontalPodAutoscaler"), other))


def rwo_claim():
    pvc = good("PersistentVolumeClaim")
    pvc["spec"]["accessModes"] = ["ReadWriteOnce"]
    return pvc


def test_rwo_claim_with_hpa_max_above_one():
    found = [v for v in check(good("Deployment"), rwo_claim(), good("HorizontalPodAutoscaler"))
             if v.policy == "rwo-claim-single-replica"]
    assert len(found) == 1 and "Multi-Attach" in found[0].message and "2 replicas" in found[0].message


def test_rwo_claim_with_replicas_above_one_and_single_replica_fine():
    deployment = good("Deployment")
    assert "rwo-claim-single-replica" not in policies(check(deployment, rwo_claim()))
    deployment["spec"]["replicas"] = 3
    assert "rwo-claim-single-replica" in policies(check(deployment, rwo_claim()))


def local_volume(name: str, nodes: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "912Gi"}, "accessModes": ["ReadWriteOnce"], "local": {"path": "/mnt/models"},
                     "persistentVolumeReclaimPolicy": "Retain",
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}}}


def test_rwo_claim_on_a_single_node_volume_may_serve_several_replicas():
    """ReadWriteOnce is per node: a PV pinned to one node keeps every replica there, so nothing multi-attaches."""
    deployment = good("Deployment")
    deployment["spec"]["replicas"] = 2
    claim = rwo_claim()
    claim["spec"]["volumeName"] = "ai-models"
    assert "rwo-claim-single-replica" not in policies(check(deployment, claim, local_volume("ai-models", ["k8s-worker-02"])))
    assert "rwo-claim-single-replica" in policies(check(deployment, claim, csi_volume("ai-models", ["n1", "n2"])))
    assert "rwo-claim-single-replica" in policies(check(deployment, claim, local_volume("other", ["k8s-worker-02"])))
    claim["spec"]["accessModes"] = ["ReadWriteOncePod"]
    assert "rwo-claim-single-replica" in policies(check(deployment, claim, local_volume("ai-models", ["k8s-worker-02"])))


def csi_volume(name: str, nodes: list[str]) -> dict:
    """An attachable volume (a CSI block device) that two nodes may attach: ReadWriteOnce is enforced there."""
    pv = local_volume(name, nodes)
    pv["spec"].pop("local")
    pv["spec"]["csi"] = {"driver": "rbd.csi.ceph.com", "volumeHandle": "models"}
    return pv


@pytest.mark.parametrize("affinity", [["n1", "n2"], "label"])
def test_rwo_claim_on_a_local_volume_of_several_nodes_may_serve_several_replicas(affinity):
    """A `local` PV is never attached, so nothing enforces ReadWriteOnce across nodes: each pod's kubelet mounts the
    path on its own node (KServe's model cache runs N replicas on one; so does modelStorage.type nodeCache)."""
    deployment = good("Deployment")
    deployment["spec"]["replicas"] = 3
    claim = rwo_claim()
    claim["spec"]["volumeName"] = "ai-model-cache"
    pv = local_volume("ai-model-cache", ["n1", "n2"])
    if affinity == "label":
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"] = [
            {"key": "cache.gpu-serving.io/ai", "operator": "In", "values": ["ready"]}]
    assert "rwo-claim-single-replica" not in policies(check(deployment, claim, pv))
    claim["spec"]["accessModes"] = ["ReadWriteOncePod"]
    assert "rwo-claim-single-replica" in policies(check(deployment, claim, pv))


@pytest.mark.parametrize(
    ("annotations", "fragments"),
    [
        ({}, ["proxy-buffering", "proxy-read-timeout is 60s (nginx default)"]),
        ({"nginx.ingress.kubernetes.io/proxy-buffering": "on"}, ["proxy-buffering"]),
        ({"nginx.ingress.kubernetes.io/proxy-read-timeout": "120"}, ["proxy-read-timeout is 120s"]),
        ({"nginx.ingress.kubernetes.io/proxy-send-timeout": "10m"}, ["not a number"]),
    ],
)
def test_ingress_vllm_streaming(annotations, fragments):
    ingress = good("Ingress")
    base = {"kubernetes.io/ingress.class": "nginx",
            "nginx.ingress.kubernetes.io/proxy-read-timeout": "600",
            "nginx.ingress.kubernetes.io/proxy-send-timeout": "600",
            "nginx.ingress.kubernetes.io/proxy-buffering": "off"}
    if not annotations:
        base = {"kubernetes.io/ingress.class": "nginx"}
    ingress["metadata"]["annotations"] = {**base, **annotations}
    found = [v for v in check(good("Deployment"), good("Service"), ingress) if v.policy == "ingress-vllm-streaming"]
    text = " | ".join(v.message for v in found)
    assert all(f in text for f in fragments), text


def test_ingress_rule_scope():
    bare = good("Ingress")
    bare["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "nginx"}
    # Backend Service unknown to the stack: assumed to be vLLM.
    assert "ingress-vllm-streaming" in policies(check(bare))
    # Backend Service in the stack that selects no GPU/vLLM pod: clearly not vLLM.
    web = good("Service")
    web["spec"]["selector"] = {"app": "grafana"}
    assert "ingress-vllm-streaming" not in policies(check(good("Deployment"), web, bare))
    # Another ingress class is not nginx.
    traefik = good("Ingress")
    traefik["metadata"]["annotations"] = {}
    traefik["spec"]["ingressClassName"] = "traefik"
    assert "ingress-vllm-streaming" not in policies(check(traefik))


def test_ingress_timeout_minimum_is_configurable():
    config = {"ingress-vllm-streaming": {"minProxyTimeoutSeconds": 7200}}
    found = check(*good_objects(), config=config)
    assert policies(found) == {"ingress-vllm-streaming"}


def test_stack_rules_report_on_the_offending_resource_urn():
    dep = {"type": "kubernetes:apps/v1:Deployment", "name": "vllm", "urn": "urn:pulumi:prod::gs::k:D::vllm",
           "inputs": good("Deployment")}
    dep["inputs"]["spec"]["replicas"] = 5
    (found,) = [v for v in check_resources([dep, node_patch("n", "NVIDIA-A100-SXM4-80GB", 2)])
                if v.policy == "gpu-capacity"]
    assert found.urn == "urn:pulumi:prod::gs::k:D::vllm"
