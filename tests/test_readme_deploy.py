"""docs/deploying.md as a new operator follows it: commands in an order that works, and the
kubeconfig step producing the context the stack names."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.prerequisites import context_error
from tools.render import ROOT


def deploy_block() -> list[str]:
    """The commands of "Step by step" in order: every `bash` block of its list, the e2e check block aside."""
    page = (ROOT / "docs/deploying.md").read_text()
    section = page[page.index("## Step by step"):page.index("### With NVIDIA's GPU Operator")]
    blocks = [match.group(2) for match in re.finditer(r"^([ \t]*)```bash\n(.*?)^\1```", section, re.S | re.M)
              if "<!-- e2e:" not in section[:match.start()].rstrip().splitlines()[-1]]
    assert len(blocks) >= 4
    return [line.strip() for body in blocks for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]


def kubeconfig_step() -> list[str]:
    """The lines of the kubeconfig step, as the test below runs them."""
    lines = deploy_block()
    return lines[first(lines, "mkdir -p .kube"):first(lines, "chmod 600 .kube/prod.yaml") + 1]


def first(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines) if needle in line)


def test_every_step_comes_after_what_it_needs() -> None:
    lines = deploy_block()
    passphrase = first(lines, "export PULUMI_CONFIG_PASSPHRASE=")
    assert passphrase < first(lines, "pulumi login") < first(lines, "pulumi stack init")
    assert passphrase < first(lines, "pulumi config set --secret")
    preview = first(lines, "pulumi preview")
    assert first(lines, "python3 -m venv policy/venv") < preview
    assert first(lines, "make render STACK=prod") < preview
    assert first(lines, "> .kube/prod.yaml") < preview
    assert "cp ~/.kube/config" not in "\n".join(lines)
    # The stack file is committed after `stack init` and the secrets: the workflows need its encryptionsalt.
    commit = first(lines, "git add Pulumi.prod.yaml")
    assert first(lines, "pulumi stack init") < commit and max(i for i, line in enumerate(lines) if "config set --secret" in line) < commit


def test_the_kubeconfig_step_names_the_context_as_the_stack_does(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is needed to run the kubeconfig step of docs/deploying.md")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    # A user's own config: two clusters, context names of their own choosing, the GPU one current.
    (home / ".kube/config").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kind-gpu",
        "clusters": [{"name": "kind-gpu", "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E="}},
                     {"name": "other", "cluster": {"server": "https://10.0.0.1:6443"}}],
        "users": [{"name": "kind-gpu", "user": {"token": "t"}}, {"name": "other", "user": {"token": "o"}}],
        "contexts": [{"name": "kind-gpu", "context": {"cluster": "kind-gpu", "user": "kind-gpu"}},
                     {"name": "other", "context": {"cluster": "other", "user": "other"}}],
    }))
    step = kubeconfig_step()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"HOME": str(home)}
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(step)], cwd=project, env=env, check=True, capture_output=True,
                   timeout=60)
    written = project / ".kube/prod.yaml"
    document = yaml.safe_load(written.read_text())
    assert [c["name"] for c in document["contexts"]] == ["prod"]
    assert document["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert written.stat().st_mode & 0o777 == 0o600
    stack = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]["kubeconfig"]
    assert context_error(written.read_text(), stack["context"], stack["path"]) is None
    # What the old step (a plain copy) left: the stack's context missing, and the fix named.
    copied = (home / ".kube/config").read_text()
    assert "config rename-context" not in (context_error(copied, "prod", ".kube/prod.yaml") or "")
    assert context_error(copied, "prod", ".kube/prod.yaml").startswith("cluster.kubeconfig.context 'prod' is not in")  # type: ignore[union-attr]
