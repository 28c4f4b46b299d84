"""The policy pack's findings on a render, judged by the thresholds that follow from the stack's
own choices (its taint, labels and ingress class)."""

from __future__ import annotations

import json
from typing import Any

from stacks.config.cluster import GPU_COUNT_LABEL
from tools.render.result import Render


def policy_config(render: Render) -> dict[str, dict[str, Any]]:
    """The policy pack's thresholds that follow from the stack's own choices."""
    if render.config is None:
        return {}
    cluster = render.config.cluster
    config: dict[str, dict[str, Any]] = {
        "gpu-taint-toleration": {"gpuTaintKey": cluster.gpu_taint.key},
        "gpu-node-selector": {"gpuProductLabel": cluster.gpu_product_label},
        # The stack's own count label beside its product label: with a custom product label the pack would
        # otherwise pair it with GFD's count label, find no node, and check nothing.
        "gpu-capacity": {"gpuProductLabel": cluster.gpu_product_label, "gpuCountLabel": GPU_COUNT_LABEL},
        "ingress-vllm-streaming": {"ingressClassNames": [cluster.ingress_class]},
        "vllm-revision-pinned": {"requireCommit": cluster.require_commit_revisions},
    }
    if any(n.gpu.sharing is not None and n.gpu.sharing.time_slicing is not None for n in render.config.nodes):
        config["gpu-shared-memory"] = {"gpuProductLabel": cluster.gpu_product_label, "gpuCountLabel": GPU_COUNT_LABEL}
    if render.config.model_storage.type == "nodeCache":
        # The holders' GPUs, read by the same labels as gpu-capacity's.
        config["cache-holders-fit"] = {"gpuProductLabel": cluster.gpu_product_label, "gpuCountLabel": GPU_COUNT_LABEL}
    if any(m.scales_to_zero for m in render.config.models):
        config["vllm-request-hold"] = {"ingressClassNames": [cluster.ingress_class]}
    return config


def policy_config_json(render: Render) -> str:
    """policy_config as the file `pulumi preview --policy-pack policy --policy-pack-config` reads, so the
    engine's pack judges the stack by the same settings as this render (a custom taint, label or class)."""
    return json.dumps(policy_config(render), indent=2, sort_keys=True) + "\n"


def policy_violations(render: Render, resources: list[dict[str, Any]]) -> list[Any]:
    from policy.rules import check_resources

    return check_resources(resources, config=policy_config(render), source="resources.json")


def policy_lines(render: Render, resources: list[dict[str, Any]]) -> list[str]:
    from policy.rules import format_line

    return sorted(format_line(v) for v in policy_violations(render, resources))
