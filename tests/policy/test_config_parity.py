"""Issue 15 item 9: the pack is at least as strict as the config on everything both see, and
recognises a vLLM server however its container is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from policy_factory import check, container, good, pod_spec

from policy.rules import k8s

Mutation = Callable[[dict[str, Any]], None]


def mandatory(*objects: dict[str, Any]) -> set[str]:
    return {v.policy for v in check(*objects) if v.level == "mandatory"}


def no_gpu(d: dict[str, Any]) -> None:
    c = container(d)
    for section in ("limits", "requests"):
        c["resources"][section].pop("nvidia.com/gpu")
    c["args"] = [a for a in c["args"] if a not in ("--tensor-parallel-size", "2")]


def env(name: str, value: str) -> Mutation:
    return lambda d: container(d)["env"].append({"name": name, "value": value})


def arg(*values: str) -> Mutation:
    return lambda d: container(d)["args"].extend(values)


def image(ref: str) -> Mutation:
    return lambda d: container(d).update(image=ref)


# (what the config refuses, the same thing written in YAML, the rule that refuses it there)
CASES = [
    ("models[].image ':latest'", image("vllm/vllm-openai:latest"), "vllm-image-pinned"),
    ("models[].image without tag", image("vllm/vllm-openai"), "vllm-image-pinned"),
    ("models[].image ':nightly'", image("vllm/vllm-openai:nightly"), "vllm-image-pinned"),
    ("models[].image ':v0.11' (a release line)", image("vllm/vllm-openai:v0.11"), "vllm-image-pinned"),
    ("gpusPerReplica >= 1", no_gpu, "vllm-server-gpu"),
    ("extraArgs --tensor-parallel-size", arg("--tensor-parallel-size=4"), "vllm-tensor-parallel-matches-gpus"),
    ("extraArgs --api-key", arg("--api-key=sk-123"), "vllm-server-flags"),
    ("extraArgs --hf-token", arg("--hf-token", "hf_abc"), "vllm-server-flags"),
    ("extraArgs --disable-log-stats", arg("--disable-log-stats"), "vllm-server-flags"),
    ("env CUDA_VISIBLE_DEVICES", env("CUDA_VISIBLE_DEVICES", "0,1"), "vllm-server-flags"),
    ("env NVIDIA_VISIBLE_DEVICES", env("NVIDIA_VISIBLE_DEVICES", "all"), "vllm-server-flags"),
    ("gpuMemoryUtilization in (0, 1]", arg("--gpu-memory-utilization=1.5"), "vllm-server-flags"),
    ("env with a secret-like name", env("HF_TOKEN", "hf_abc"), "env-secret-from-secret-ref"),
]


@pytest.mark.parametrize(("refused", "mutate", "rule"), CASES, ids=[c[0] for c in CASES])
def test_what_the_config_refuses_the_pack_refuses(refused: str, mutate: Mutation, rule: str) -> None:
    d = good("Deployment")
    assert rule not in mandatory(d)
    mutate(d)
    assert rule in mandatory(d), refused


def test_api_key_from_env_expansion_is_fine() -> None:
    d = good("Deployment")
    container(d)["args"].append("--api-key=$(VLLM_API_KEY)")
    assert "vllm-server-flags" not in mandatory(d)


@pytest.mark.parametrize(
    ("scaler", "minimum"),
    [
        ({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "s", "namespace": "ai"},
          "spec": {"scaleTargetRef": {"name": "vllm-qwen3"}, "maxReplicaCount": 2, "triggers": []}}, "KEDA's default"),
        ({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "s", "namespace": "ai"},
          "spec": {"scaleTargetRef": {"name": "vllm-qwen3"}, "minReplicaCount": 0, "maxReplicaCount": 2, "triggers": []}}, "is 0"),
    ],
)
def test_replicas_min_zero_is_refused(scaler: dict[str, Any], minimum: str) -> None:
    (v,) = [v for v in check(good("Deployment"), scaler) if v.policy == "vllm-scale-to-zero"]
    assert minimum in v.message
    scaler["spec"]["minReplicaCount"] = 1
    assert not [v for v in check(good("Deployment"), scaler) if v.policy == "vllm-scale-to-zero"]
    hpa = good("HorizontalPodAutoscaler")
    hpa["spec"]["minReplicas"] = 0
    assert "vllm-scale-to-zero" in mandatory(good("Deployment"), hpa)


# ---------------------------------------------------------------------------- recognising a server

def server(**fields: Any) -> dict[str, Any]:
    return {"name": "x", **fields}


@pytest.mark.parametrize(
    ("c", "is_server"),
    [
        (server(image="vllm/vllm-openai:v0.11.0", args=["Qwen/Qwen3-8B"]), True),  # the image's entrypoint
        (server(image="registry.lan:5000/ml/VLLM-custom:1.2"), True),
        (server(image="vllm/vllm-openai@sha256:" + "a" * 64), True),
        (server(image="nvcr.io/nvidia/pytorch:24.01", command=["vllm", "serve", "m"]), True),
        (server(image="python:3.12", command=["/usr/local/bin/vllm"], args=["serve", "m"]), True),
        (server(image="python:3.12", command=["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]), True),
        (server(image="python:3.12", command=["python3", "-m", "vllm.entrypoints.cli.main", "serve", "m"]), True),
        (server(image="ubuntu:24.04", command=["/bin/bash", "-c", "pip install vllm && exec vllm serve m --port 8000"]), True),
        (server(image="ubuntu:24.04", command=["sh", "-c"], args=["vllm serve m"]), True),
        (server(image="vllm/vllm-openai:v0.11.0", command=["python3", "-c", "import huggingface_hub"]), False),  # a download Job
        (server(image="vllm-registry.lan/tools/curl:8", command=["curl", "x"]), False),
        (server(image="nginx:1.27"), False),
    ],
)
def test_a_vllm_server_is_recognised_however_written(c: dict[str, Any], is_server: bool) -> None:
    assert k8s.is_vllm_server(c) is is_server


def test_a_gpu_less_vllm_deployment_written_any_way_is_refused() -> None:
    d = good("Deployment")
    no_gpu(d)
    c = container(d)
    c.update(image="nvcr.io/nvidia/pytorch:24.01", command=["/bin/bash", "-c", "exec python3 -m vllm.entrypoints.openai.api_server"])
    assert "vllm-server-gpu" in mandatory(d)
    pod_spec(d)["containers"] = [c, {"name": "sidecar", "image": "nginx:1.27"}]
    messages = [v.message.split(":")[0] for v in check(d) if v.policy == "vllm-server-gpu"]
    assert messages == ["container 'vllm' runs the vLLM server with no nvidia.com/gpu limit"]


@pytest.mark.parametrize(
    ("ref", "vllm"),
    [("vllm/vllm-openai:v0.11.0", True), ("registry.lan:5000/vllm:1", True), ("vllm-registry.lan/tools/curl:8", False),
     ("localhost/vllm", True), ("ghcr.io/org/vllm-tpu@sha256:" + "b" * 64, True), ("docker.io/library/nginx:vllm", False)],
)
def test_vllm_image_by_repository_not_registry_or_tag(ref: str, vllm: bool) -> None:
    assert k8s.vllm_image({"image": ref}) is vllm
