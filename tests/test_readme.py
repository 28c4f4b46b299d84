"""The README and the pages of docs/ as an operator reads them: every shell command in their fenced blocks
is run by a test, by `make e2e`, or listed below with the reason no test here can run it, so none goes
stale unseen; a new command that is none of these fails. Their links lead somewhere. The README is a front
door: short, narrow, and its stack file renders."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.e2e import runbook
from tests.test_readme_deploy import kubeconfig_step
from tests.test_runbook import E2E_BLOCKS
from tools.render import ROOT

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
# Pages whose commands this module does not check, and why (every other page of docs/ is checked).
COMMANDS_NOT_CHECKED = {
    "docs/failure-modes.md": "its one block wipes a node's model storage by hand, as root: destructive by design, never run "
                             "by a test (the VM tests run the delete scripts, which keep it)",
}
DOCUMENTS = tuple(p.relative_to(ROOT).as_posix() for p in runbook.documents()
                  if p.relative_to(ROOT).as_posix() not in COMMANDS_NOT_CHECKED)
SHELL = {"bash", "sh", "shell"}
NOT_SHELL = {"text", "yaml", "json"}

# Commands this module runs itself, in a clone of the repository, in this order (see the test below).
RUN_HERE = (
    "make render STACK=prod",
    "make policy-check FILES=rendered/prod/manifests.yaml",
)

# Commands another test or e2e runs in the form given: (file, the text in it that runs the command).
# The file must still hold that text, so a test that stops running it shows up here.
RUN_ELSEWHERE = {
    # In each example of the component package, after `pulumi package add` of its folder (below).
    "pulumi preview": ("testbed/e2e/package_checks.py", '"preview", "--json", stack="lab", cwd=folder'),
    "make diff BASE=origin/main STACK=prod":
        ("tests/test_diff.py", '"diff", "BASE=HEAD", "STACK=prod"'),  # through make on a clone; BASE=HEAD there
    "pulumi stack init prod --secrets-provider passphrase":
        ("testbed/e2e/run.py", '"stack", "init", name, "--secrets-provider", "passphrase"'),
    "pulumi config set --secret hfToken < hf-token.txt":
        ("testbed/e2e/run.py", '"config", "set", "--secret", key, stack=name, stdin=value'),
    "pulumi config set --secret sshPrivateKey < ~/.ssh/gpu-nodes-ed25519":
        ("testbed/e2e/run.py", '"config", "set", "--secret", key, stack=name, stdin=value'),
    "pulumi config set --secret vllmApiKey < vllm-api-key.txt":
        ("testbed/e2e/run.py", '"config", "set", "--secret", key, stack=name, stdin=value'),
    "pulumi preview --policy-pack policy --policy-pack-config rendered/prod/policy-config.json":
        ("testbed/e2e/engine_checks.py", '"preview", "--policy-pack", "policy", "--policy-pack-config"'),
    "make test": (".ci/run", "stage test make test"),  # the suite itself: CI's `test` stage
    # docs/few-gpus.md "GPU sharing": the example stack, rendered by the CLI (into a temporary folder there).
    "venv/bin/python -m tools.render sharing --stack-file docs/examples/Pulumi.sharing.yaml":
        ("tests/test_sharing.py", '"tools.render", "sharing", "--stack-file", "docs/examples/Pulumi.sharing.yaml"'),
    # docs/testbed.md: e2e drives the loopback cluster through the script `make cluster` runs.
    "eval \"$(bash testbed/cluster/cluster.sh env | sed 's/^/export /')\"":
        ("testbed/e2e/cluster_checks.py", 'self.cluster_sh("env")'),
    "make cluster-stop": ("testbed/e2e/__main__.py", 'run.cluster_sh("stop"'),
}

# Commands no test can run here, and why. Keep the reason true; a command leaving the docs must
# leave this list too (checked below).
NEEDS_A_REAL_SETUP = {
    "pulumi package add https://github.com/<org>/gpu-serving.git/package@v0.1.0":
        "a git host with the repository and its tag: none is reachable here; e2e (package-preview) runs `pulumi package add` "
        "with the package's folder, which is what the clone gives",
    'curl https://apps.ai.example.com/v1/models -H "Authorization: Bearer $APPS_KEY"':
        "needs Envoy Gateway with Envoy AI Gateway in front of the pools: no Envoy can be had here (docs/endpoint.md)",
    'curl https://apps.ai.example.com/v1/chat/completions -H "Authorization: Bearer $APPS_KEY" -H \'Content-Type: '
    'application/json\' -d \'{"model": "mistral", "stream": true, "messages": [{"role": "user", "content": "hi"}]}\'':
        "needs Envoy Gateway with Envoy AI Gateway in front of the pools: no Envoy can be had here (docs/endpoint.md)",
    "export PULUMI_CONFIG_PASSPHRASE=...":
        "a placeholder for the operator's passphrase; e2e exports a random one",
    "pulumi login file:///srv/pulumi-state":
        "the operator's shared backend; e2e logs in to a file backend in a temporary folder",
    "ssh-keyscan -t ed25519 k8s-worker-02 | cut -d' ' -f2- | pulumi config set --secret sshHostKeyWorker02":
        "reads the host key of a real node's sshd; e2e sets the lab VM's host key through stdin",
    "openssl rand -hex 32 | pulumi config set --secret rolloutSalt":
        "needs a stack to set into; e2e sets rolloutSalt through stdin as it sets every secret",
    "pulumi config set --secret kubeconfig < ~/.kube/prod.yaml":
        "the operator's own cluster credentials",
    "git add Pulumi.prod.yaml && git commit -m \"prod: stack config and encrypted secrets\"":
        "commits in the operator's clone; tests/test_readme_deploy.py checks it comes after init and secrets",
    "python3 -m venv policy/venv && policy/venv/bin/pip install -r policy/requirements.txt":
        "downloads the pack's SDK from PyPI into the clone; the suite imports the pack from ./venv instead",
    "pulumi up --policy-pack policy --policy-pack-config rendered/prod/policy-config.json":
        "runs the node steps on real GPU nodes; e2e's up-lab and up-cluster run `pulumi up` on a VM and a loopback "
        "cluster, and preview-prod the pack with this config",
    "make cluster STACK=prod":
        "builds Kubernetes from Go modules (up to an hour cold); e2e's cluster-up starts the same cluster with cluster.sh",
    "\"$GS_CLUSTER_BIN/kubectl\" get nodes":
        "needs the running loopback cluster; e2e's cluster-up checks its nodes are Ready",
}


@dataclass(frozen=True)
class Block:
    lang: str
    heading: str
    e2e: str | None
    body: str


def readme() -> str:
    return (ROOT / "README.md").read_text()


def all_documents() -> str:
    return "\n".join((ROOT / name).read_text() for name in DOCUMENTS)


def fenced_blocks(text: str) -> list[Block]:
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()]
        headings = re.findall(r"^#+ (.+)$", before, re.M)
        previous = before.rstrip().splitlines()[-1] if before.strip() else ""
        marker = re.fullmatch(r"[ \t]*<!-- e2e: ([a-z0-9-]+) -->[ \t]*", previous)
        found.append(Block(match.group("lang").strip(), headings[-1] if headings else "", marker and marker.group(1),
                           match.group("body")))
    return found


def shell_commands(body: str) -> list[str]:
    """One entry per command as a shell reads the block: comments dropped, `\\` continuations joined."""
    commands, pending = [], ""
    for raw in body.splitlines():
        line = runbook.strip_comment(raw).strip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            commands.append(line)
    return commands


def documented_blocks() -> list[tuple[str, Block]]:
    return [(name, block) for name in DOCUMENTS for block in fenced_blocks((ROOT / name).read_text())]


def test_every_fence_says_its_language() -> None:
    unknown = [(name, b.heading, b.lang) for name, b in documented_blocks() if b.lang not in SHELL | NOT_SHELL]
    assert not unknown, f"fenced blocks without a known language (bash for commands, text otherwise): {unknown}"


def test_every_command_is_run_by_a_test_or_e2e_or_says_why_not() -> None:
    e2e_run, other = set(), []
    for name, block in documented_blocks():
        if block.lang not in SHELL:
            continue
        if block.e2e is not None:
            assert block.e2e in E2E_BLOCKS, f"block e2e: {block.e2e} ({name}, {block.heading}) is marked but e2e never runs it"
            e2e_run.update(shell_commands(block.body))
            continue
        other += [(f"{name}, {block.heading}", command) for command in shell_commands(block.body)]
    assert e2e_run and other
    tested = set(RUN_HERE) | set(RUN_ELSEWHERE) | set(kubeconfig_step())
    untested = [f"{where}: {command}" for where, command in other
                if command not in tested and command not in NEEDS_A_REAL_SETUP]
    assert not untested, ("commands no test runs: run each in a test (RUN_HERE, RUN_ELSEWHERE) or list it "
                          f"in NEEDS_A_REAL_SETUP with the reason: {untested}")
    listed = set(RUN_HERE) | set(RUN_ELSEWHERE) | set(NEEDS_A_REAL_SETUP)
    gone = listed - {command for _, command in other}
    assert not gone, f"listed here but no longer documented: {sorted(gone)}"


def test_a_new_untested_command_fails_the_check() -> None:
    text = "## Somewhere\n\n```bash\nmake render STACK=prod\nrm -rf /mnt/models/hub \\\n  --one-file-system   # new\n```\n"
    (block,) = fenced_blocks(text)
    commands = shell_commands(block.body)
    assert commands == ["make render STACK=prod", "rm -rf /mnt/models/hub --one-file-system"]
    assert [c for c in commands if c not in RUN_HERE and c not in NEEDS_A_REAL_SETUP] == [commands[1]]
    marked = fenced_blocks("x\n<!-- e2e: grow -->\n```bash\npulumi up\n```\n")
    assert marked[0].e2e == "grow"


@pytest.mark.parametrize(("path", "text"), sorted(set(RUN_ELSEWHERE.values())))
def test_what_runs_a_command_elsewhere_still_runs_it(path: str, text: str) -> None:
    assert text in (ROOT / path).read_text(), f"{path} no longer runs {text}"


def test_the_commands_run_here_work_as_printed(tmp_path: Path) -> None:
    """On a clone, as an operator types them (the project's venv, so make installs nothing)."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    for requirements in ("requirements.txt", "requirements-dev.txt"):
        os.utime(clone / requirements, (0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    for command in RUN_HERE:
        assert command in all_documents(), command
        result = subprocess.run(f"{command} VENV={ROOT / 'venv'}", shell=True, cwd=clone, env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, f"{command}: {result.stderr[-2000:]}"
    # What the README's "Quick start" says the render writes.
    for name in ("manifests.yaml", "resources.json", "outputs.json", "policy.txt", "policy-config.json"):
        assert (clone / "rendered/prod" / name).is_file(), name
    assert list((clone / "rendered/prod/nodes/k8s-worker-02").glob("*-preflight.sh"))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}


def test_every_link_to_a_section_leads_to_one() -> None:
    broken = []
    for source in runbook.documents():
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", source.read_text()):
            page = (source.parent / target).resolve() if target else source
            if anchor not in anchors(page):
                broken.append(f"{source.name}: {target}#{anchor}")
    assert not broken, broken


def test_the_contents_follow_the_order_an_operator_reads_in() -> None:
    text = readme()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections == ["Who it is for", "Quick start", "Your own stack", "What `pulumi up` then does",
                        "Use it from your own program", "Documentation", "Contributing"]
    # The Documentation table leads to every page of the site, and the site lists every page of docs/.
    table = text[text.index("## Documentation"):text.index("## Contributing")]
    linked = set(re.findall(r"^\| \[[^]]+\]\(docs/([^)#]+)\)", table, re.M))
    nav = set(re.findall(r":\s+([\w.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)) - {"index.md"}
    assert nav == {p.name for p in (ROOT / "docs").glob("*.md")}, "mkdocs.yml's nav and docs/ differ"
    pages_for_operators = nav - {p for p in nav if p.startswith("benchmarks-") or p.endswith("-plan.md")}
    assert linked == pages_for_operators, sorted(linked ^ pages_for_operators)
    # One step list for a new cluster, and it turns the device plugin on.
    deploying = (ROOT / "docs/deploying.md").read_text()
    steps_headings = [h for name in DOCUMENTS for h in re.findall(r"^#+ (.+)$", (ROOT / name).read_text(), re.M)
                      if "step by step" in h.lower()]
    assert steps_headings == ["Step by step"]
    steps = deploying[deploying.index("## Step by step"):deploying.index("## GitOps")]
    assert "`cluster.devicePlugin.enabled: true`" in steps and "`containerRuntime: none`" in steps


def test_the_readme_is_a_front_door() -> None:
    """Issue 39: short, no line wider than 160 characters outside tables, no word of the test bed's tuning,
    no jargon a reader cannot know."""
    lines = readme().splitlines()
    assert len(lines) <= 300, len(lines)
    wide = [n for n, line in enumerate(lines, 1) if len(line) > 160 and not line.startswith("|")]
    assert not wide, f"README lines over 160 characters: {wide}"
    text = readme().lower()
    for word in ("autogroup", "gcflags", "ci minutes", "the seed", "seed's", "the anchors"):
        assert word not in text, word
    # The diagram: bare disks → array → volume → model → endpoint, in one text block.
    diagram = next(b.body for b in fenced_blocks(readme()) if b.lang == "text")
    positions = [diagram.index(word) for word in ("bare disks", "RAID1 array", "model volume", "model:", "endpoint")]
    assert positions == sorted(positions)


def test_no_page_names_a_path_of_the_machine_it_was_written_on() -> None:
    """Not the clone's folder nor the one it sits in (tests/test_ci.py checks every tracked file for them); here
    also a page not committed yet, and the site's config."""
    folders = [str(folder) + "/" for folder in (ROOT, ROOT.parent) if str(folder) not in ("/", "/home", "/root", "/srv", "/opt")]
    for path in [*runbook.documents(), ROOT / "mkdocs.yml"]:
        assert not [folder for folder in folders if folder in path.read_text()], path.name


def readme_stack() -> str:
    section = readme()[readme().index("## Your own stack"):readme().index("## What `pulumi up` then does")]
    # The stack file to copy; the section's other YAML blocks are pieces of one (a model's entry).
    (block,) = [b for b in fenced_blocks(section) if b.lang == "yaml" and b.body.startswith("config:")]
    return block.body


def test_the_readme_stack_file_renders_as_it_says(tmp_path: Path) -> None:
    """Copied as it is: it renders, the policy pack finds nothing, and it needs the secrets the README names."""
    stack_file = tmp_path / "Pulumi.mine.yaml"
    stack_file.write_text(readme_stack())
    result = subprocess.run([sys.executable, "-m", "tools.render", "mine", "--stack-file", str(stack_file),
                             "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out/policy.txt").read_text() == ""
    assert "warning" not in result.stderr, result.stderr
    needs = re.search(r"^needs: (.+?) \(", result.stdout + result.stderr, re.M)
    assert needs, result.stdout + result.stderr
    assert "(here `" + "`, `".join(needs.group(1).split(", ")) + "`)" in " ".join(readme().split())
    assert list((tmp_path / "out/nodes/gpu-01").glob("*-preflight.sh"))
