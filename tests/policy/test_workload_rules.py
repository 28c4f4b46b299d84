"""Per-resource rules on pod templates: one failing and one passing case each."""

from __future__ import annotations

import pytest
from policy_factory import check, container, good, pod_spec, policies

from policy.rules.workloads import probe_budget


def test_good_deployment_passes_every_rule():
    assert check(good("Node"), good("Deployment")) == []
    # Without the nodes the pack cannot count its GPUs, and says so (advisory) instead of passing in silence.
    assert {(v.policy, v.level) for v in check(good("Deployment"))} == {("gpu-nodes-declared", "advisory")}


@pytest.mark.parametrize(
    ("resources", "fragment"),
    [
        ({"requests": {"nvidia.com/gpu": 1}}, "only under requests"),
        ({"limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 1}}, "requests 1 but limits 2"),
        ({"limits": {"nvidia.com/gpu": "0.5"}}, "indivisible"),
    ],
)
def test_gpu_limit_only(resources, fragment):
    d = good("Deployment")
    container(d)["resources"] = resources
    found = [v for v in check(d) if v.policy == "gpu-limit-only"]
    assert len(found) == 1 and fragment in found[0].message


def test_probe_budget_uses_kubernetes_defaults():
    assert probe_budget({}) == 30
    assert probe_budget({"failureThreshold": 60}) == 600
    assert probe_budget({"failureThreshold": 60.0, "periodSeconds": 5}) == 300


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda c: c.pop("startupProbe"), "no startupProbe"),
        (lambda c: c["startupProbe"].update(failureThreshold=3), "allows only 30s"),
        (lambda c: c.pop("livenessProbe"), "no livenessProbe"),
        (lambda c: c.pop("readinessProbe"), "no readinessProbe"),
    ],
)
def test_gpu_startup_probe(change, fragment):
    d = good("Deployment")
    change(container(d))
    found = [v for v in check(d) if v.policy == "gpu-startup-probe"]
    assert len(found) == 1 and fragment in found[0].message


def test_startup_budget_minimum_is_configurable():
    d = good("Deployment")  # 90 x 10 = 900 s
    assert "gpu-startup-probe" not in policies(check(d, config={"gpu-startup-probe": {"minStartupSeconds": 900}}))
    assert "gpu-startup-probe" in policies(check(d, config={"gpu-startup-probe": {"minStartupSeconds": 901}}))


def test_probes_not_required_without_gpu():
    d = good("Deployment")
    c = container(d)
    c["resources"] = {"limits": {"cpu": "1"}}
    c.pop("startupProbe")
    assert "gpu-startup-probe" not in policies(check(d))


@pytest.mark.parametrize("change", [
    lambda spec: spec["volumes"].__setitem__(1, {"name": "shm", "emptyDir": {}}),
    lambda spec: spec["containers"][0]["volumeMounts"].pop(),
])
def test_gpu_shm_volume(change):
    d = good("Deployment")
    change(pod_spec(d))
    assert "gpu-shm-volume" in policies(check(d))


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (["--model=m", "--download-dir=/cache"], [], "--download-dir /cache is not on a mounted volume"),
        (["--model", "m", "--download-dir", "/cache"], [], "--download-dir /cache"),
        (["--model", "m"], [], "default Hugging Face cache"),
        (["--download-dir=/models/x"], [{"name": "HF_HOME", "value": "/root/.cache/hf"}], "HF_HOME"),
    ],
)
def test_vllm_download_dir_not_on_volume(args, env, fragment):
    d = good("Deployment")
    c = container(d)
    c["args"], c["env"] = args, env
    found = [v for v in check(d) if v.policy == "vllm-download-dir-on-volume"]
    assert len(found) == 1 and fragment in found[0].message


def test_vllm_download_dir_in_shell_command_and_emptydir():
    d = good("Deployment")
    c = container(d)
    c.pop("args")
    c["image"] = "python:3.11.9"
    c["command"] = ["sh", "-c", "python -m vllm.entrypoints.openai.api_server --download-dir /scratch/hf"]
    c["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})
    pod_spec(d)["volumes"].append({"name": "scratch", "emptyDir": {}})
    found = [v for v in check(d) if v.policy == "vllm-download-dir-on-volume"]
    assert len(found) == 1 and "emptyDir 'scratch'" in found[0].message


def test_local_model_path_on_volume_passes():
    d = good("Deployment")
    container(d)["args"] = ["/models/qwen", "--tensor-parallel-size=2"]
    container(d)["env"] = []
    assert "vllm-download-dir-on-volume" not in policies(check(d))


@pytest.mark.parametrize(
    ("env", "violates"),
    [
        ([{"name": "HF_TOKEN", "value": "hf_abc"}], True),
        ([{"name": "VLLM_API_KEY", "value": "k"}], True),
        ([{"name": "dbPassword", "value": "p"}], True),
        ([{"name": "HF_TOKEN", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "t"}}}], True),
        ([{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}], False),
        ([{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
          {"name": "MAX_TOKENS", "value": "512"}, {"name": "HF_TOKEN_PATH", "value": "/secrets/t"},
          {"name": "MONKEY", "value": "x"}], False),
    ],
)
def test_env_secret_from_secret_ref(env, violates):
    d = good("Deployment")
    container(d)["env"] = env
    assert ("env-secret-from-secret-ref" in policies(check(d))) is violates


@pytest.mark.parametrize(
    ("args", "gpus", "violates"),
    [
        (["m", "--tensor-parallel-size=2"], 2, False),
        (["m", "-tp", "2"], 2, False),
        (["m", "--tensor_parallel_size", "2"], 2, False),
        (["m", "-tp=2", "--pipeline-parallel-size=2"], 4, False),
        (["m"], 1, False),
        (["m"], 2, True),
        (["m", "--tensor-parallel-size=4"], 2, True),
        (["m", "-tp", "2"], 1, True),
    ],
)
def test_tensor_parallel_matches_gpus(args, gpus, violates):
    d = good("Deployment")
    c = container(d)
    c["args"] = [*args, "--download-dir=/models"]
    c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    assert ("vllm-tensor-parallel-matches-gpus" in policies(check(d))) is violates


def test_gpu_node_selector():
    d = good("Deployment")
    pod_spec(d)["nodeSelector"] = {"kubernetes.io/os": "linux"}
    assert "gpu-node-selector" in policies(check(d))
    pod_spec(d).pop("nodeSelector")
    pod_spec(d)["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}]}]}}}
    assert "gpu-node-selector" not in policies(check(d))


@pytest.mark.parametrize(
    ("tolerations", "violates"),
    [
        ([], True),
        ([{"key": "gpu", "operator": "Exists"}], True),
        ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], True),
        ([{"operator": "Exists"}], False),
        ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}], False),
    ],
)
def test_gpu_taint_toleration(tolerations, violates):
    d = good("Deployment")
    pod_spec(d)["tolerations"] = tolerations
    assert ("gpu-taint-toleration" in policies(check(d))) is violates


def test_gpu_taint_key_is_configurable():
    d = good("Deployment")
    pod_spec(d)["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    assert "gpu-taint-toleration" not in policies(check(d, config={"gpu-taint-toleration": {"gpuTaintKey": "gpu"}}))


@pytest.mark.parametrize(
    ("strategy", "violates"),
    [
        (None, True),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}, True),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}}, True),
        ({"type": "Recreate"}, False),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "0%", "maxUnavailable": 1}}, False),
    ],
)
def test_gpu_rollout_without_spare_gpu(strategy, violates):
    d = good("Deployment")
    d["spec"].pop("strategy")
    if strategy:
        d["spec"]["strategy"] = strategy
    assert ("gpu-rollout-without-spare-gpu" in policies(check(d))) is violates


IMAGES = [
    ("vllm/vllm-openai:latest", True),
    ("vllm/vllm-openai", True),
    ("registry.local:5000/vllm", True),
    ("vllm/vllm-openai:nightly", True),
    ("vllm/vllm-openai:v0", True),
    ("vllm/vllm-openai:v0.11", True),
    ("vllm/vllm-openai:main", True),
    ("vllm/vllm-openai:stable", True),
    ("vllm/vllm-openai:nightly-0123456789abcdef0123456789abcdef01234567", True),
    ("vllm/vllm-openai:v0.11.0-nightly", True),
    ("vllm/vllm-openai:v0.11.0", False),
    ("vllm/vllm-openai:v0.10.1.1", False),
    ("vllm/vllm-openai:v0.11.0-cu126", False),
    ("curlimages/curl:8.11.1", False),
    ("registry.local:5000/vllm@sha256:" + "a" * 64, False),
    ("registry.local:5000/vllm:latest@sha256:" + "a" * 64, False),
]


@pytest.mark.parametrize(("image", "violates"), IMAGES)
def test_image_pinned(image, violates):
    # Every image is mandatory: the config refuses a moving tag on every image the stack deploys.
    d = good("Deployment")
    container(d)["image"] = image
    found = [v for v in check(d) if v.policy in ("image-pinned", "vllm-image-pinned")]
    assert bool(found) is violates
    assert all((v.policy, v.level) == ("vllm-image-pinned", "mandatory") for v in found)
    sidecar = {"name": "proxy", "image": image.replace("vllm", "envoy")}
    pod_spec(d)["containers"].append(sidecar)
    found = [v for v in check(d) if v.policy == "image-pinned"]
    assert bool(found) is violates
    assert all(v.level == "mandatory" for v in found)


@pytest.mark.parametrize(("image", "violates"), IMAGES)
def test_the_device_plugin_daemonset_image_is_checked(image, violates):
    plugin = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "nvidia-device-plugin", "namespace": "kube-system"},
              "spec": {"template": {"spec": {"containers": [
                  {"name": "plugin", "image": image.replace("vllm/vllm-openai", "nvcr.io/nvidia/k8s-device-plugin")}]}}}}
    refused = {v.policy for v in check(plugin) if v.level == "mandatory"} & {"image-pinned", "vllm-image-pinned"}
    assert bool(refused) is violates


def test_pod_job_and_statefulset_are_checked_too():
    d = good("Deployment")
    container(d)["image"] = "vllm/vllm-openai:latest"
    template = d["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ai"}, "spec": template["spec"]}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": template}}
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"},
           "spec": {"template": template, "serviceName": "s", "selector": d["spec"]["selector"]}}
    found = check(pod, job, sts)
    assert {(v.kind, v.policy) for v in found} == {(kind, policy) for kind in ("Pod", "Job", "StatefulSet")
                                                   for policy in ("vllm-image-pinned", "gpu-nodes-declared")}


# ---------------------------------------------------------------------------- issue 24: reproducible models


def _revision_findings(deployment, config=None):  # type: ignore[no-untyped-def]
    return [v for v in check(deployment, config=config) if v.policy == "vllm-revision-pinned"]


def test_a_served_branch_is_refused_unless_the_stack_is_a_lab() -> None:
    assert _revision_findings(good("Deployment")) == []
    for args in (["--revision=main"], ["--revision", "v1.0"], []):
        deployment = good("Deployment")
        c = container(deployment)
        c["args"] = [a for a in c["args"] if not a.startswith("--revision")] + args
        (finding,) = _revision_findings(deployment)
        assert finding.level == "mandatory" and "40-hex commit" in finding.message
        assert _revision_findings(deployment, config={"vllm-revision-pinned": {"requireCommit": False}}) == []


def test_a_digest_pinned_vllm_image_passes() -> None:
    deployment = good("Deployment")
    container(deployment)["image"] = "vllm/vllm-openai@sha256:" + "0f" * 32
    assert not {v.policy for v in check(deployment)} & {"vllm-image-pinned", "image-pinned"}


def test_a_download_job_without_a_fail_fast_policy_is_flagged() -> None:
    job = good("Job")
    assert not [v for v in check(job) if v.policy == "model-download-fails-fast"]
    for mutate in (lambda j: j["spec"].pop("podFailurePolicy"),
                   lambda j: j["spec"]["podFailurePolicy"]["rules"][0].update(action="Ignore"),
                   lambda j: j["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"].update(containerName="other")):
        job = good("Job")
        mutate(job)
        (finding,) = [v for v in check(job) if v.policy == "model-download-fails-fast"]
        assert finding.level == "advisory" and "podFailurePolicy" in finding.message
