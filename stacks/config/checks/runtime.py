"""What the GPU pods run with: the NVIDIA runtime named where the node's Kubernetes does not make it the
default, and a non-root user where Pod Security refuses root."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacks.config.base import _at

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_runtime_class(stack: StackConfig) -> None:
    # k3s/rke2 add the `nvidia` runtime but never make it the default: GPU pods must name it.
    for i, node in enumerate(stack.nodes):
        if node.container_runtime in ("k3s", "rke2") and stack.cluster.runtime_class_name is None:
            raise _at(
                f"nodes[{i}].containerRuntime",
                f"{node.container_runtime} does not make the NVIDIA runtime its default, so GPU pods must name it: "
                "set cluster.runtimeClassName: nvidia",
            )


def check_pod_security(stack: StackConfig) -> None:
    if stack.cluster.pod_security.enforce != "restricted":
        return
    for i, model in enumerate(stack.models):
        if model.security_profile != "nonRoot":
            raise _at(
                f"models[{i}].securityProfile",
                "root, but cluster.podSecurity.enforce is restricted, which refuses pods that run as root: "
                "set securityProfile: nonRoot, or enforce: baseline",
            )
