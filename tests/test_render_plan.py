"""The plan `make render` prints (issue 39, item 3): per node its array, runtime, labels, taint and GPUs, per model
the nodes it may run on, its GPUs, replicas, URLs and startup budget, the policy pack's verdict; short for a small
stack, grouped for a fleet; nothing but errors with --quiet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.bench import generated_stack
from tools.render import ROOT, Render, run_program
from tools.render.files import resources_json
from tools.render.findings import policy_lines
from tools.render.plan import FIRST_FINDINGS, plan

CACHE = ROOT / "docs" / "examples" / "Pulumi.cache.yaml"


def plan_of(render: Render) -> str:
    return plan(render, policy_lines(render, resources_json(render)), "rendered/x/policy.txt")


def render_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.render", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


PROD_PLAN = """\
nodes (1):
  k8s-worker-02: 2 × nvidia-a100, whole cards (nvidia.com/gpu: 2); runtime containerd; holds the model volume (local)
    array: /dev/md/models (RAID1 of 2 × 1000 GB partitions, 912 GiB usable) mounted at /mnt/ollama-models
    disks: /dev/disk/by-id/wwn-0x5000c500a1b2c3d4 + /dev/disk/by-id/wwn-0x5000c500a1b2c3d5
    labels: gpu-serving/gpu.count=2, gpu-serving/gpu.product=nvidia-a100, nvidia.com/gpu.present=true
    taint: nvidia.com/gpu=true:NoSchedule
models (1):
  qwen3: 1 × nvidia.com/gpu (nvidia-a100) per replica; replicas 1–2 (keda); startup ≤ 600 s
    runs on: k8s-worker-02
    url: http://vllm-qwen3.ai.svc:8000/v1 (in cluster), https://ai.primer.rs/v1 (ingress)
policy: passed (0 mandatory, 0 advisory findings)
"""


def test_the_prod_plan_names_its_node_its_model_and_the_verdict() -> None:
    assert plan_of(run_program("prod")) == PROD_PLAN


def test_the_cli_prints_the_plan_between_the_count_and_the_secrets(tmp_path: Path) -> None:
    result = render_cli("prod", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("rendered prod: 33 resources, 19 Kubernetes objects, 13 files in ")
    assert "\n".join(lines[1:-1]) + "\n" == PROD_PLAN
    assert lines[-1].startswith("needs: hfToken, ")


def test_the_cache_example_shows_both_holders_and_their_labels() -> None:
    text = plan_of(run_program("cache", stack_file=CACHE))
    for node, disk in (("gpu-a", "a1"), ("gpu-b", "b1")):
        assert f"  {node}: 2 × nvidia-l40s, whole cards (nvidia.com/gpu: 2); runtime containerd; caches models (nodeCache)\n" in text
        assert f"/dev/disk/by-id/nvme-eui.0025388b91b2a0{disk}" in text
    assert text.count("    array: /dev/md/models (RAID1 of 2 × 500 GB partitions, 456 GiB usable) mounted at /mnt/models\n") == 2
    # The labels the render patches onto each node: the cache's, and the verified weights of the model it holds.
    assert text.count("cache.gpu-serving.io/ai=ready") == 2
    assert text.count("qwen3.ai.weights.gpu-serving.io/") == 2
    assert ("  qwen3: 1 × nvidia.com/gpu (nvidia-l40s) per replica; replicas 1–4 (keda); startup ≤ 600 s\n"
            "    runs on: gpu-a, gpu-b\n"
            "    url: http://vllm-qwen3.ai.svc:8000/v1 (in cluster)\n") in text
    assert text.endswith("policy: passed (0 mandatory, 0 advisory findings)\n")


def test_the_endpoint_example_shows_each_teams_url_models_keys_and_limit() -> None:
    text = plan_of(run_program("endpoint", stack_file=ROOT / "docs" / "examples" / "Pulumi.endpoint.yaml"))
    assert ("teams (2), one URL each, routed by the request's model:\n"
            "  apps: https://apps.ai.example.com/v1 → qwen3, mistral; 1 key; 600 requests/min per gateway replica\n"
            "  data: https://data.ai.example.com/v1 → qwen3-sql, embed; 1 key\n"
            "policy: passed") in text
    # Without tenants the plan has no teams' section: each model is reached on its own URL.
    assert "teams" not in plan_of(run_program("prod"))


def test_a_scale_to_zero_model_shows_its_cold_start_budget() -> None:
    render = run_program("zero", stack_file=ROOT / "docs" / "examples" / "scale-to-zero.yaml")
    model = next(m for m in render.config.models if m.scales_to_zero)
    assert f"startup ≤ {model.startup_budget_seconds} s, a cold start held ≤ {model.cold_start_seconds} s" in plan_of(render)


def test_a_fleet_is_summarised_by_groups(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.fleet.yaml"
    stack.write_text(yaml.safe_dump(generated_stack(12, 10)))
    text = plan_of(run_program("fleet", stack_file=stack))
    lines = text.splitlines()
    assert len(lines) <= 12 + FIRST_FINDINGS, text
    assert lines[0] == "nodes (10):"
    assert lines[1].startswith("  10 nodes of 2 × nvidia-a100, whole cards (nvidia.com/gpu: 2); runtime containerd; "
                               "reads models from the nfs volume: gpu-00, gpu-01, gpu-02, gpu-03, … gpu-09")
    assert "models (12):" in lines
    assert ("  12 models, 1 × nvidia.com/gpu (nvidia-a100) per replica; replicas 1–1 (no autoscaler); startup ≤ 600 s: "
            "model-000, model-001, model-002, model-003, … model-011") in lines
    assert "    run on: gpu-00, gpu-01, gpu-02, gpu-03, … gpu-09" in lines
    assert "  urls: 12 in cluster (http://vllm-model-000.bench.svc:8000/v1, …), 12 through the ingress (every one in outputs.json)" in lines
    assert "model-005" not in text and "gpu-05" not in text  # counts and groups, not a line each
    # Its nodes pin no host key: the pack's advisories, counted by rule, the first few quoted.
    verdict = next(line for line in lines if line.startswith("policy: "))
    assert verdict.startswith("policy: passed with advisories (0 mandatory, ") and verdict.endswith(" in rendered/x/policy.txt)")
    assert any(line.startswith("  by rule: advisory command-host-key-pinned × ") for line in lines), text


def test_the_verdict_counts_and_quotes_the_first_findings() -> None:
    policy = [f"advisory rule-a resources.json Deployment/m{i}: a finding" for i in range(4)] + \
             ["mandatory rule-b resources.json Service/s: must not"]
    text = plan(Render(stack="x"), policy, "rendered/x/policy.txt")
    assert text.splitlines() == [
        "policy: failed (1 mandatory, 4 advisory findings, in rendered/x/policy.txt)",
        "  by rule: mandatory rule-b × 1, advisory rule-a × 4",
        "  mandatory rule-b resources.json Service/s: must not",
        "  advisory rule-a resources.json Deployment/m0: a finding",
        "  advisory rule-a resources.json Deployment/m1: a finding",
        "  … 2 more in rendered/x/policy.txt",
    ]


@pytest.mark.parametrize("flag", ["--quiet", "-q"])
def test_quiet_prints_only_errors_with_the_same_exit_code(tmp_path: Path, flag: str) -> None:
    stack = tmp_path / "Pulumi.warned.yaml"
    prod = (ROOT / "Pulumi.prod.yaml").read_text()
    stack.write_text(prod.replace("/dev/disk/by-id/wwn-0x5000c500a1b2c3d5", "/dev/sdb"))  # a warning, not an error
    result = render_cli("warned", "--stack-file", str(stack), "--out", str(tmp_path / "out"), flag)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert (tmp_path / "out" / "manifests.yaml").is_file()
    stack.write_text(prod.replace("sizeGb: 1000", "sizeGb: -5"))
    result = render_cli("warned", "--stack-file", str(stack), "--out", str(tmp_path / "out"), flag)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("render warned: config error: nodes[0].storage.sizeGb: Input should be greater than or equal to 1 "
                             "(got -5)\n")


def test_the_rendering_page_quotes_the_prod_plan() -> None:
    page = (ROOT / "docs" / "rendering.md").read_text()
    assert "rendered prod: 33 resources, 19 Kubernetes objects, 13 files in rendered/prod\n" + PROD_PLAN + "needs: " in page


def test_with_local_storage_another_node_runs_no_model(render) -> None:  # type: ignore[no-untyped-def]
    from tests.test_config import prod_raw

    nodes = prod_raw()["nodes"]
    nodes.append({"name": "k8s-worker-03", "ssh": {"host": "10.0.0.3"}, "gpu": {"product": "nvidia-l40s", "count": 1},
                  "storage": {"disks": []}, "containerRuntime": "none"})
    text = plan_of(render(nodes=nodes))
    assert ("  k8s-worker-03: 1 × nvidia-l40s, whole cards (nvidia.com/gpu: 1); runtime none; runs no model (the volume is on "
            "k8s-worker-02)\n    array: no disk work\n    labels: ") in text
    assert "    runs on: k8s-worker-02\n" in text
