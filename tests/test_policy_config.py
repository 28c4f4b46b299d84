"""The policy pack at `pulumi preview` judges the stack by the stack's own settings: the render
writes them to rendered/<stack>/policy-config.json, and every documented preview passes that file."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from policy.rules import ALL_RULES, MANDATORY, check_resources
from tools.render import ROOT, write


def custom_cluster() -> dict:
    cluster = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]
    return {**cluster, "gpuTaint": {"key": "gpu", "value": "true", "effect": "NoSchedule"},
            "gpuProductLabel": "example.com/accelerator", "ingressClass": "internal-nginx"}


def test_render_writes_the_stack_settings_for_the_pack(render, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = render(cluster=custom_cluster())
    write(out, tmp_path)
    config = json.loads((tmp_path / "policy-config.json").read_text())
    assert config["gpu-taint-toleration"] == {"gpuTaintKey": "gpu"}
    assert config["gpu-node-selector"] == {"gpuProductLabel": "example.com/accelerator"}
    assert config["gpu-capacity"] == {"gpuProductLabel": "example.com/accelerator", "gpuCountLabel": "gpu-serving/gpu.count"}
    assert config["ingress-vllm-streaming"] == {"ingressClassNames": ["internal-nginx"]}
    resources = json.loads((tmp_path / "resources.json").read_text())
    # With the file the pack passes the stack the render passed; without it (the old preview) it refuses it.
    assert [v for v in check_resources(resources, config=config) if v.level == MANDATORY] == []
    refused = {v.policy for v in check_resources(resources, config={}) if v.level == MANDATORY}
    assert "gpu-taint-toleration" in refused


def test_a_custom_product_label_still_has_its_capacity_checked(render, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The pack reads the stack's nodes by its product label and the stack's own count label: paired with GFD's
    count label instead it found no node and checked nothing (the capacity rule stayed silent)."""
    out = render(cluster=custom_cluster())
    write(out, tmp_path)
    config = json.loads((tmp_path / "policy-config.json").read_text())
    resources = json.loads((tmp_path / "resources.json").read_text())
    for resource in resources:
        if resource["type"] == "keda.sh/v1alpha1:ScaledObject" or resource["type"].endswith(":ScaledObject"):
            resource["inputs"]["spec"]["maxReplicaCount"] = 9  # more pods than the node's two GPUs
    flagged = {v.policy for v in check_resources(resources, config=config) if v.level == MANDATORY}
    assert "gpu-capacity" in flagged


def test_the_file_fits_the_pack_schema(prod, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write(prod, tmp_path)
    config = json.loads((tmp_path / "policy-config.json").read_text())
    rules = {rule.name: rule for rule in ALL_RULES}
    for policy, settings in config.items():
        assert policy in rules, policy
        assert set(settings) <= set(rules[policy].config), (policy, settings)
        for key, value in settings.items():
            expected = {"string": str, "array": list, "integer": int, "boolean": bool}[rules[policy].config[key]["type"]]
            assert isinstance(value, expected), (policy, key, value)


def test_every_documented_preview_passes_the_file() -> None:
    from testbed.e2e.runbook import documents

    previews = [line for path in documents() for line in path.read_text().splitlines() if "pulumi preview --policy-pack policy" in line]
    assert previews
    assert all("--policy-pack-config rendered/" in line for line in previews), previews
    for name in ("preview.yml", "deploy.yml"):
        workflow = yaml.safe_load((ROOT / ".github/workflows" / name).read_text())
        steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
        pulumi = next(s for s in steps if s.get("uses", "").startswith("pulumi/actions@"))
        assert pulumi["with"]["policyPackConfigs"] == "rendered/prod/policy-config.json", name
        before = steps[: steps.index(pulumi)]
        assert any("make render STACK=prod" in s.get("run", "") for s in before), name
