"""`mig-layout-change` on the loopback cluster: a stack of the two shared kwok nodes (`share-a` time-sliced, `mig-a`
in MIG instances) written, then its MIG layout and its time-slicing replicas changed with `pulumi up`.

What NVIDIA's programs need (components/sharing.py): a node's `nvidia.com/mig.config` or
`nvidia.com/device-plugin.config` label only ever names an entry its program's file held before the label moved,
since each program reads that file as the kubelet last refreshed its volume and acts on the label at once.
Shown here from the engine's event log (the ConfigMaps are written before the label patches) and from the API
server (on a change, the ConfigMaps are not written at all: their resourceVersion stays, so no kubelet-refreshed
copy of them can lag behind; the old and the new entry are both in them before and after).

Standing in: kwok for the kubelets, so nothing mounts the ConfigMaps and no MIG manager or device plugin runs;
what each would do with the file and the label is read from their source (docs/few-gpus.md), not run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.e2e.cluster_checks import MIG_NODE, MIG_PRODUCT, SHARED_NODE, SHARED_PRODUCT, _sequence
from testbed.e2e.day_two import DayTwoEndToEnd, _changed, _events, _name
from testbed.e2e.run import require, stack_raw

STACK = "sharing-order"
OPERATOR_NAMESPACE = "gpu-operator"
MIG_LABEL, PLUGIN_LABEL = "nvidia.com/mig.config", "nvidia.com/device-plugin.config"
MAPS = {"plugin": ("cluster-device-plugin-config", "gpu-serving-device-plugin-config"),
        "mig": ("cluster-mig-parted-config", "gpu-serving-mig-parted-config")}
"""Resource name and ConfigMap name of the device plugin's configs and of the MIG manager's layouts."""


class SharingEndToEnd(DayTwoEndToEnd):
    """The order of the sharing configs and the labels that name their entries."""

    def sharing_raw(self) -> dict[str, Any]:
        """The few-GPUs stack on this cluster, its two nodes the kwok ones advertising slices and MIG instances; no
        model (what is checked is the configs and the labels)."""
        raw = stack_raw("fewgpus")
        raw["cluster"] = {**raw["cluster"], "namespace": STACK, "kubeconfig": {"path": self.cluster_env["KUBECONFIG"]},
                          "autoscaling": "none"}
        raw["cluster"].pop("requestHold", None)
        shared = {**raw["nodes"][0], "name": SHARED_NODE, "gpu": {"product": SHARED_PRODUCT, "count": 1,
                                                                  "sharing": {"timeSlicing": {"replicas": 2}}}}
        mig = {**raw["nodes"][1], "name": MIG_NODE, "gpu": {"product": MIG_PRODUCT, "count": 1,
                                                            "sharing": {"mig": {"card": "A100-80GB", "profiles": {"3g.40gb": 2}}}}}
        raw["nodes"], raw["models"] = [shared, mig], []
        return raw

    def sharing_up(self, events: Path, stack: str = STACK) -> list[dict[str, Any]]:
        self.pulumi("up", "--yes", "--skip-preview", "--event-log", str(events), stack=stack,
                    env={"PULUMI_DEBUG_COMMANDS": "true"})
        return _events(events)

    def config_maps(self) -> dict[str, dict[str, Any]]:
        return {kind: self.get("configmap", name, "-n", OPERATOR_NAMESPACE) for kind, (_, name) in MAPS.items()}

    def labels(self) -> dict[str, str]:
        return {"mig": self.get("node", MIG_NODE)["metadata"]["labels"].get(MIG_LABEL, ""),
                "plugin": self.get("node", SHARED_NODE)["metadata"]["labels"].get(PLUGIN_LABEL, "")}

    def operator_namespace(self) -> None:
        """The GPU operator's namespace, where the stack writes its device-plugin and MIG ConfigMaps: the operator's
        Helm release would have made it; each check that needs it makes it (any may run alone)."""
        if self.kubectl("get", "namespace", OPERATOR_NAMESPACE, check=False).returncode != 0:
            self.kubectl("create", "namespace", OPERATOR_NAMESPACE)

    def mig_layout_change(self) -> str:
        self.operator_namespace()
        self.new_stack(STACK, self.sharing_raw(), {"sshPrivateKey": "unused"})
        try:
            return self._change_layouts()
        finally:
            self.pulumi("destroy", "--yes", "--skip-preview", stack=STACK, check=False)

    def _change_layouts(self) -> str:
        # The first up: each ConfigMap is written before either node's label names an entry of it.
        first = self.sharing_up(self.tmp / "sharing-order-events-1.jsonl")
        for node in (SHARED_NODE, MIG_NODE):
            labelled = _sequence(first, "resourcePreEvent", f"NodePatch::{node}-gpu")
            for resource, _ in MAPS.values():
                written = _sequence(first, "resOutputsEvent", f"ConfigMap::{resource}")
                require(written < labelled, f"{node}'s labels were sent (event {labelled}) before {resource} was written ({written})")
        before_maps, before_labels = self.config_maps(), self.labels()
        old = dict(before_labels)
        require(old == {"mig": "gpu-serving-2x3g.40gb", "plugin": "gpu-serving-time-slicing-2"}, f"the first up labelled {old}")

        def edit(config: dict[str, Any]) -> None:
            nodes = config["gpu-serving:nodes"]
            nodes[0]["gpu"]["sharing"] = {"timeSlicing": {"replicas": 4}}
            nodes[1]["gpu"]["sharing"]["mig"]["profiles"] = {"4g.40gb": 1, "3g.40gb": 1}

        self.edit_stack(STACK, edit)
        new = {"mig": "gpu-serving-1x4g.40gb-1x3g.40gb", "plugin": "gpu-serving-time-slicing-4"}
        for kind in MAPS:
            require(_has(before_maps[kind], kind, old[kind]) and _has(before_maps[kind], kind, new[kind]),
                    f"before the change, the {kind} ConfigMap lacks {old[kind]} or {new[kind]}")

        events_path = self.tmp / "sharing-order-events-2.jsonl"
        self.sharing_up(events_path)
        changed = {_name(urn): op for urn, op in _changed(events_path).items()}
        require(changed == {f"{SHARED_NODE}-gpu": "update", f"{MIG_NODE}-gpu": "update"},
                f"the change did {changed}; expected only the two label patches updated")
        after_maps, after_labels = self.config_maps(), self.labels()
        require(after_labels == new, f"after the change the labels are {after_labels}, expected {new}")
        for kind in MAPS:
            version = before_maps[kind]["metadata"]["resourceVersion"], after_maps[kind]["metadata"]["resourceVersion"]
            require(version[0] == version[1], f"the {kind} ConfigMap was written during the change ({version[0]} → {version[1]})")
            require(_has(after_maps[kind], kind, old[kind]), f"the {kind} ConfigMap dropped {old[kind]}")
        self.pulumi("preview", "--expect-no-changes", stack=STACK)
        layouts = len(_entries(after_maps["mig"], "mig"))
        return (f"first up: both ConfigMaps written before either label; the change moved {old['mig']} → {new['mig']} and "
                f"{old['plugin']} → {new['plugin']} with only the two label patches updated, the ConfigMaps untouched "
                f"(resourceVersion {after_maps['mig']['metadata']['resourceVersion']}, "
                f"{after_maps['plugin']['metadata']['resourceVersion']}) holding old and new ({layouts} MIG entries)")


def _entries(config_map: dict[str, Any], kind: str) -> set[str]:
    """The entry names a label may name: the device plugin's keys, or the layouts of mig-parted's `config.yaml`."""
    data = config_map.get("data") or {}
    if kind == "plugin":
        return set(data)
    return set(yaml.safe_load(data.get("config.yaml") or "{}").get("mig-configs") or {})


def _has(config_map: dict[str, Any], kind: str, entry: str) -> bool:
    return entry in _entries(config_map, kind)

