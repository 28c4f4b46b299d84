"""The labels and taint a GPU node gets: serving pods select and tolerate the node by them."""

from __future__ import annotations

from components.sharing import sharing_labels
from components.storage import CACHE_READY, cache_label
from stacks.config import ClusterConfig, Node
from stacks.config.cluster import GPU_COUNT_LABEL


def node_labels(node: Node, cluster: ClusterConfig, caches_models: bool = False) -> dict[str, str]:
    """Under the project's own keys: GPU Feature Discovery owns `nvidia.com/gpu.product` and
    `.count` and would rewrite what a force-applied patch sets (labels flap, selectors miss).
    `nvidia.com/gpu.present` is what the device plugin's chart selects nodes by when nothing
    else labels them; with GFD it is GFD's. A node with `gpu.sharing` also gets the labels that pick its
    device plugin and MIG configs (components.sharing): those are inputs to NVIDIA's programs, not GFD's output.
    A cache node (`modelStorage.type: nodeCache`) also gets the label the stack's cache volume selects nodes by."""
    labels = {cluster.gpu_product_label: node.gpu.product, GPU_COUNT_LABEL: str(node.gpu.count)}
    if not cluster.gpu_feature_discovery:
        labels["nvidia.com/gpu.present"] = "true"
    cache = {cache_label(cluster.namespace): CACHE_READY} if caches_models else {}
    return labels | sharing_labels(node) | cache


def node_taints(cluster: ClusterConfig) -> list[dict[str, str]]:
    taint = cluster.gpu_taint
    return [{"key": taint.key, "value": taint.value, "effect": taint.effect}]
