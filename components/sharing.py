"""GPU sharing on the nodes (`nodes[].gpu.sharing`): the device plugin's per-node configs, the MIG manager's
layouts, and the node labels that pick them. Pure: the ConfigMaps are created by `components.cluster`.

NVIDIA's device plugin (its Helm chart, or the GPU Operator's) reads one ConfigMap of named configs and runs,
on each node, the one its label `nvidia.com/device-plugin.config` names (`default` where there is none); the
MIG manager partitions a node's cards as its label `nvidia.com/mig.config` names an entry of its own config.

Both programs read their ConfigMap as a mounted volume, which the kubelet refreshes only on its own sync (up to a
minute and more after the write), and both act on a label change at once: the MIG manager with the file as its
pod sees it, failing for good (`nvidia.com/mig.config.state=failed`, retried only on the next label change) when
that file lacks the entry; the device plugin's config manager exits and is restarted with back-off. No order of
the writes in one `pulumi up` can wait for the kubelet, so neither file depends on which entries the nodes name:
each holds every entry a stack can name (every layout `Mig` accepts, every `TimeSlicing.replicas`), each entry's
name is its content, and a label only ever moves between entries its program's file has held since the file was
written. The label patches still come after the ConfigMaps (components.node), for the first `up` that writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from stacks.config import Node
from stacks.config.cluster import GPU_REPLICAS_LABEL, mig_count_label
from stacks.config.sharing import REPLICAS, Sharing, every_layout, ordered

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
DEFAULT_CONFIG = "default"
"""The config the plugin's config manager falls back to on a node without the label (its `named` fallback)."""
MIG_DISABLED = "all-disabled"
"""The GPU Operator labels every MIG-capable node it finds unlabelled with this entry: the layouts must hold it."""


def sharing_labels(node: Node) -> dict[str, str]:
    """The labels that select the node's configs, and the project's own record of what it advertises (the policy
    pack counts capacity from them, as from GPU Feature Discovery's `nvidia.com/gpu.replicas` and `mig-*.count`)."""
    sharing = node.gpu.sharing
    if sharing is None:
        return {}
    labels = {DEVICE_PLUGIN_CONFIG_LABEL: sharing.device_plugin_config}
    if sharing.time_slicing is not None:
        labels[GPU_REPLICAS_LABEL] = str(sharing.time_slicing.replicas)
    if sharing.mig is not None:
        labels[MIG_CONFIG_LABEL] = sharing.mig.config_name
        labels.update({mig_count_label(profile): str(node.gpu.count * n) for profile, n in ordered(sharing.mig.profiles)})
    return labels


def plugin_config(sharing: Sharing | None) -> str:
    """One device plugin config file (its `version: v1` format)."""
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if sharing is not None and sharing.mig is not None:
        # mixed: one resource per profile (`nvidia.com/mig-3g.40gb`), and GFD keeps the card's product label.
        config["flags"]["migStrategy"] = "mixed"
    if sharing is not None and sharing.time_slicing is not None:
        config["sharing"] = {"timeSlicing": {
            # Renamed, a slice is `nvidia.com/gpu.shared`: only a pod that asks for it shares a card, and GFD leaves
            # the product label as it is (it appends -SHARED only when not renamed).
            "renameByDefault": True,
            # A pod asking for 2 slices would get no more compute and maybe one card twice: refused by the plugin.
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": sharing.time_slicing.replicas}],
        }}
    return yaml.safe_dump(config, sort_keys=False)


def device_plugin_configs(nodes: Sequence[Node]) -> dict[str, str]:
    """The ConfigMap's data: `default` (no sharing, for nodes without the label) and every config a node can be
    labelled with (MIG's, and time-slicing's at every replicas), whichever the nodes name; empty when no node
    shares its cards."""
    if not any(n.gpu.sharing is not None for n in nodes):
        return {}
    # MIG's config is one for every layout (its flags only): any accepted layout stands for them all.
    every = [Sharing.model_validate({"mig": {"card": "A100-80GB", "profiles": {"7g.80gb": 1}}})] + [
        Sharing.model_validate({"timeSlicing": {"replicas": r}}) for r in REPLICAS]
    configs = {DEFAULT_CONFIG: plugin_config(None)} | {s.device_plugin_config: plugin_config(s) for s in every}
    return dict(sorted(configs.items()))


def mig_parted_config(nodes: Sequence[Node]) -> str | None:
    """The MIG manager's `config.yaml` (mig-parted's `version: v1` format): `all-disabled` and every layout a stack
    can name, for every card of the node; None when no node uses MIG."""
    if not any(n.gpu.sharing is not None and n.gpu.sharing.mig for n in nodes):
        return None
    configs: dict[str, Any] = {MIG_DISABLED: [{"devices": "all", "mig-enabled": False}]}
    for name, profiles in every_layout().items():
        configs[name] = [{"devices": "all", "mig-enabled": True, "mig-devices": profiles}]
    return yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=False)


def time_slicing_configs(nodes: Sequence[Node]) -> list[str]:
    """The configs the stack's own device plugin runs a DaemonSet for, besides its plain one."""
    return sorted({n.gpu.sharing.device_plugin_config for n in nodes
                   if n.gpu.sharing is not None and n.gpu.sharing.time_slicing is not None})
