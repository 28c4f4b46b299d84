"""The node steps a VM test runs: the prod stack's node, its storage pointed at the VM's disks,
rendered offline (tools/render/, the SDK's mock engine) as `pulumi up` would send them, each made one script with the
linked file it sources (`self_contained`): what the node runs for the step, without its copy step."""

from __future__ import annotations

import json
from typing import Any

from tools.render import ROOT, run_program


def prod_config() -> dict[str, Any]:
    """Pulumi.prod.yaml's `config`, freshly read (callers change it)."""
    import yaml

    return yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]


def prod_node() -> dict[str, Any]:
    """The prod stack's first node, as Pulumi.prod.yaml writes it."""
    return prod_config()["gpu-serving:nodes"][0]


def rendered_steps(
    storage: dict[str, Any], *, runtime: str = "containerd", deployed: dict[str, Any] | None = None, as_sent: bool = False
) -> dict[str, dict[str, str]]:
    """{step: {"create": script, "delete": script}} of the prod stack's node with ``storage``: each made self-contained,
    or ``as_sent`` (the Commands' own text, which needs the node's copy of the step files: `install_step_files`)."""
    config = prod_config()
    nodes = config["gpu-serving:nodes"]
    nodes[0]["storage"] = storage
    nodes[0]["containerRuntime"] = runtime
    overrides = {"gpu-serving:nodes": json.dumps(nodes), "gpu-serving:models": "[]"}
    if runtime in ("k3s", "rke2"):  # neither makes the NVIDIA runtime the default: pods name the RuntimeClass
        overrides["gpu-serving:cluster"] = json.dumps({**config["gpu-serving:cluster"], "runtimeClassName": "nvidia"})
    render = run_program("prod", overrides=overrides, deployed=deployed)
    steps = {}
    for cmd in render.of_type("command:remote:Command"):
        node, _, step = cmd.name.partition(":")
        if node == nodes[0]["name"]:
            made = (lambda text: text) if as_sent else self_contained
            steps[step] = {"create": made(cmd.inputs["create"]), "delete": made(cmd.inputs["delete"])}
    return steps


def self_contained(command: str) -> str:
    """A step's Command with its runner replaced by the linked file the runner would find and source: the parameters,
    then `# ---- lib.sh`, the helpers, `# ---- NN-step.sh`, the body (components/node/script.py)."""
    import re

    from components.node.script import RUNNER
    from components.node.steps import step_files

    head, marker, _ = command.partition(f"# ---- {RUNNER}\n")
    found = re.search(r"^GS_SCRIPT=(\S+)$", head, re.M)
    if not marker or not found:
        raise ValueError("not a step's Command: no runner or no GS_SCRIPT")
    linked = step_files()[found.group(1)]
    return head + linked.split("\n", 3)[3]  # its shebang, `set -euo pipefail` and origin line are the Command's


def create_scripts(storage: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    """{step: create script}: what each step runs on `pulumi up`."""
    return {step: scripts["create"] for step, scripts in rendered_steps(storage, **kwargs).items()}


def install_step_files(vm: Any) -> str:
    """What a node's copy step delivers (components/node/linked/ under its version's folder), put on a test VM so the
    rendered Commands find their linked scripts as on a node; returns that folder."""
    import io
    import shlex
    import tarfile

    from components.node.script import STEPS_DIR
    from components.node.steps import files_version, step_files

    files = step_files()
    folder = f"{STEPS_DIR}/{files_version(files)}/linked"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    vm.ssh(f"mkdir -p {shlex.quote(folder)} && tar -x -C {shlex.quote(folder)}", input=archive.getvalue())
    return folder
