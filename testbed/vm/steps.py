"""The node steps a VM test runs: the prod stack's node, its storage pointed at the VM's disks,
rendered offline (tools/render/, the SDK's mock engine) exactly as `pulumi up` would send them."""

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
    storage: dict[str, Any], *, runtime: str = "containerd", deployed: dict[str, Any] | None = None
) -> dict[str, dict[str, str]]:
    """{step: {"create": script, "delete": script}} of the prod stack's node with ``storage``."""
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
            steps[step] = {"create": cmd.inputs["create"], "delete": cmd.inputs["delete"]}
    return steps


def create_scripts(storage: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    """{step: create script}: what each step runs on `pulumi up`."""
    return {step: scripts["create"] for step, scripts in rendered_steps(storage, **kwargs).items()}
