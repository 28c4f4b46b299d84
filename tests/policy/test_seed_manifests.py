"""The blog's manifests (tests/policy/data/seed) and the YAML checker CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from policy_factory import DATA, GOOD, seed

from policy.check_yaml import main, type_token
from policy.rules import check_resources, format_line

ROOT = Path(__file__).resolve().parents[2]
BLOG_SET = ("pvc.yaml", "deployment.yaml", "service.yaml", "ingress.yaml", "hpa.yaml")


def found(*files, config=None):
    return {(v.name, v.policy) for v in check_resources(seed(*files), config)}


def test_blog_set_breaks_exactly_these_rules():
    assert found(*BLOG_SET) == {
        ("vllm-qwen3", "vllm-image-pinned"),              # vllm/vllm-openai:latest (the config refuses it too)
        ("vllm-qwen3", "gpu-node-selector"),              # no nodeSelector in the main manifest
        ("vllm-qwen3", "gpu-taint-toleration"),           # no toleration for the GPU taint
        ("vllm-qwen3", "gpu-rollout-without-spare-gpu"),  # default RollingUpdate surges a second GPU pod
        ("vllm-qwen3", "vllm-graceful-drain"),            # no preStop, grace 30 s against 600 s streams
        ("vllm-qwen3", "vllm-server-offline"),            # advisory: sends vLLM usage statistics
        ("vllm-qwen3", "vllm-disruption-budget"),         # advisory: a drain evicts every replica at once
        ("vllm-qwen3", "vllm-revision-pinned"),           # no --revision: the moving branch main
        ("vllm-qwen3", "vllm-guaranteed-qos"),            # advisory: Burstable, evicted before Guaranteed pods
        ("vllm-qwen3", "vllm-priority-class"),            # advisory: default priority, preemptible for batch
        ("vllm-qwen3", "gpu-nodes-declared"),             # advisory: no nodes, so the GPUs go uncounted
        ("ai", "edge-vllm-openai-only"),                  # path / forwards /tokenize, /metrics, ... too
        ("ai", "edge-vllm-auth"),                         # a public host, and vLLM has no API key
    }
    # Fine as written: limits-only GPU, 600 s startupProbe (60 x 10) with readiness and liveness,
    # /dev/shm emptyDir Memory, --download-dir=/modeli on the PVC, HF_TOKEN from secretKeyRef,
    # RWX claim with HPA max 3, HPA on vllm_num_requests_waiting with a 600 s window,
    # Ingress buffering off with 600 s timeouts in front of the vLLM Service.


def test_folded_snippets_deployment():
    # nodeSelector gpu=nvidia-a100 selects GPU nodes; --tensor-parallel-size=2 matches 2 GPUs; the
    # toleration is for the blog's taint key `gpu`, not the default nvidia.com/gpu.
    assert found("deployment-a100-tp2.yaml") == {
        ("vllm-qwen3-a100", "vllm-image-pinned"),
        ("vllm-qwen3-a100", "gpu-taint-toleration"),
        ("vllm-qwen3-a100", "gpu-rollout-without-spare-gpu"),
        ("vllm-qwen3-a100", "vllm-graceful-drain"),
        ("vllm-qwen3-a100", "vllm-server-offline"),
        ("vllm-qwen3-a100", "vllm-revision-pinned"),
        ("vllm-qwen3-a100", "vllm-guaranteed-qos"),
        ("vllm-qwen3-a100", "vllm-priority-class"),
        ("vllm-qwen3-a100", "gpu-nodes-declared"),
    }
    config = {"gpu-taint-toleration": {"gpuTaintKey": "gpu"}}
    assert ("vllm-qwen3-a100", "gpu-taint-toleration") not in found("deployment-a100-tp2.yaml", config=config)


def test_blog_ingress_without_its_annotations_breaks_streaming():
    resources = seed(*BLOG_SET)
    ingress = next(r for r in resources if r.kind == "Ingress")
    ingress.props["metadata"]["annotations"].pop("nginx.ingress.kubernetes.io/proxy-buffering")
    assert {v.policy for v in check_resources(resources) if v.kind == "Ingress"} == {
        "ingress-vllm-streaming", "edge-vllm-openai-only", "edge-vllm-auth"}


def test_type_tokens():
    assert type_token("apps/v1", "Deployment") == "kubernetes:apps/v1:Deployment"
    assert type_token("v1", "PersistentVolume") == "kubernetes:core/v1:PersistentVolume"
    assert type_token("keda.sh/v1alpha1", "ScaledObject") == "kubernetes:keda.sh/v1alpha1:ScaledObject"


def test_cli_output_and_exit_codes(capsys):
    files = [str(DATA / "seed" / f) for f in BLOG_SET]
    assert main(files) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 14
    assert lines[0].startswith(f"mandatory gpu-node-selector {files[1]} Deployment/vllm-qwen3: ")
    assert lines == [format_line(v) for v in check_resources(seed(*BLOG_SET))]
    assert main([str(GOOD)]) == 0
    assert capsys.readouterr().out == ""


def test_cli_advisory_only_exits_zero(tmp_path, capsys):
    manifest = tmp_path / "no-pdb.yaml"
    documents = GOOD.read_text().split("\n---\n")
    manifest.write_text("\n---\n".join(d for d in documents if "kind: PodDisruptionBudget" not in d))
    assert main([str(manifest)]) == 0
    assert capsys.readouterr().out.startswith(f"advisory vllm-disruption-budget {manifest} Deployment/")


def test_cli_a_moving_image_tag_is_mandatory_for_any_image(tmp_path, capsys):
    manifest = tmp_path / "web.yaml"
    manifest.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n"
                        "  containers: [{name: web, image: nginx}]\n")
    assert main([str(manifest)]) == 1
    assert capsys.readouterr().out.startswith(f"mandatory image-pinned {manifest} Pod/web: ")


@pytest.mark.parametrize("text", ["kind: [unclosed\n", "- just\n- a list\n", "apiVersion: v1\nmetadata: {}\n"])
def test_cli_invalid_yaml_exits_2(tmp_path, capsys, text):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}") and err.count("\n") == 1


def test_cli_missing_file_exits_2(capsys):
    assert main(["/nonexistent.yaml"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_as_module_from_repo_root():
    result = subprocess.run([sys.executable, "-m", "policy.check_yaml", str(GOOD)], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout) == (0, "")
