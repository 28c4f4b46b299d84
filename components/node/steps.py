"""A node's steps and the exact text of each one's scripts: stack config in, scripts out, no Pulumi.

Each step is one real bash script in `scripts/` (shellcheck-clean, idempotent, "unchanged" when
there is nothing to do), linked with the lib.sh helpers it calls (`script.linked_script`). The linked
scripts are the same on every node: a node receives them once, by its copy step (`step_files`, kept as
snapshot files in `linked/`), and each step's Command carries only its parameters and the sha256 of its
linked script (`script.render_invocation`). A Command re-runs when its inputs change, so each step
carries only the parameters it needs (see `STEP_PARAMS`): changing the mountpoint re-runs (read-only)
preflight, mount and health, never the disk steps; raising the size re-runs preflight, partition
(which keeps the partition) and grow; a change of a helper re-runs the steps that call it.

Steps, chained with depends_on (runtime is independent of the disks):
    10-preflight  read-only checks, one JSON line
    20-partition  GPT partition `gs-<raidName>` after the last partition of each disk
    30-raid       mdadm RAID1 /dev/md/<raidName>, mdadm.conf, initramfs
    40-filesystem mkfs.xfs only on an empty array
    50-mount      fstab by filesystem UUID, mounted; a boot unit starts the array degraded if a disk is missing
    60-grow       grows partition, array and XFS to the configured size
    70-health     read-only: array state, UUIDs, usable bytes -> the node's outputs
    80-runtime    NVIDIA container runtime for containerd / k3s / rke2
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from components.node.script import linked_delete, linked_script, render_invocation, render_script
from stacks.config import ClusterConfig, Node

LINKED = Path(__file__).resolve().parent / "linked"
"""The snapshot of `step_files()`: what the copy step delivers (tests keep the two equal; `make node-scripts` writes it)."""
COPY_STEP = "steps"
"""The copy step's name after `<node>:`."""
DISK_STEPS = ("10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health")
RUNTIME_STEP = "80-runtime"

# What each step's script receives: only these parameters can make it run again.
STEP_PARAMS: dict[str, tuple[str, ...]] = {
    "10-preflight": ("GS_DISKS", "GS_RAID_NAME", "GS_PART_NAME", "GS_PART_BYTES", "GS_MOUNTPOINT", "GS_ADOPT"),
    "20-partition": ("GS_DISKS", "GS_PART_NAME", "GS_PART_BYTES", "GS_ADOPT"),
    "30-raid": ("GS_DISKS", "GS_RAID_NAME", "GS_PART_NAME", "GS_ADOPT"),
    "40-filesystem": ("GS_RAID_NAME",),
    # The mount is ordered before the unit that runs the kubelet (kubelet.service, or k3s's or
    # rke2's own): that unit, not the runtime, so a node's runtime step switched on or off
    # (`none` <-> `containerd`) does not run the mount step again.
    "50-mount": ("GS_RAID_NAME", "GS_MOUNTPOINT", "GS_DEVICE_TIMEOUT", "GS_KUBELET"),
    "60-grow": ("GS_DISKS", "GS_RAID_NAME", "GS_PART_NAME", "GS_PART_BYTES"),
    # The disks only so that a replaced disk is measured again (the script reads the array alone).
    "70-health": ("GS_DISKS", "GS_RAID_NAME", "GS_MOUNTPOINT"),
    "80-runtime": ("GS_RUNTIME", "GS_SET_AS_DEFAULT"),
}
# What each step's delete script names when it explains what it kept (a subset of STEP_PARAMS).
DELETE_PARAMS: dict[str, tuple[str, ...]] = {
    "10-preflight": (),
    "20-partition": ("GS_DISKS", "GS_PART_NAME", "GS_PART_BYTES"),
    "30-raid": ("GS_DISKS", "GS_RAID_NAME", "GS_PART_NAME"),
    "40-filesystem": ("GS_RAID_NAME",),
    "50-mount": ("GS_RAID_NAME", "GS_MOUNTPOINT", "GS_DEVICE_TIMEOUT"),
    "60-grow": ("GS_DISKS", "GS_RAID_NAME", "GS_PART_NAME", "GS_PART_BYTES"),
    "70-health": (),
    "80-runtime": ("GS_RUNTIME", "GS_SET_AS_DEFAULT"),
}
# Only the runtime step can see container runtime configuration (registry credentials live in
# containerd's config): its stdout/stderr are secret. The disk steps print device names, sizes and
# UUIDs only, kept readable in the state so a failed step can be diagnosed.
SECRET_OUTPUT_STEPS = frozenset({RUNTIME_STEP})


def parameters(node: Node, cluster: ClusterConfig) -> dict[str, str | list[str]]:
    """Every step parameter of a node, by name (`GS_DISKS` is a bash array)."""
    params: dict[str, str | list[str]] = {
        "GS_RUNTIME": node.container_runtime,
        "GS_KUBELET": node.container_runtime if node.container_runtime in ("k3s", "rke2") else "kubelet",
        # No RuntimeClass for GPU pods means the NVIDIA runtime must be the default one.
        "GS_SET_AS_DEFAULT": "true" if cluster.runtime_class_name is None else "false",
    }
    if node.storage is not None:
        storage = node.storage
        params.update(
            GS_DISKS=list(storage.disks),
            GS_RAID_NAME=storage.raid_name,
            GS_PART_NAME=storage.partition_name,
            GS_PART_BYTES=str(storage.partition_bytes),
            GS_MOUNTPOINT=storage.mountpoint,
            GS_DEVICE_TIMEOUT=str(storage.device_timeout_seconds),
        )
        # Only an adopting node gets it, so the scripts of every other node stay as they were.
        if storage.adopt is not None:
            params["GS_ADOPT"] = storage.adopt
    return params


@dataclass(frozen=True)
class Step:
    name: str
    """`NN-step`; the Command is named `<node>:<name>`."""
    create: str
    """The Command's text: parameters, the linked script's name and sha256, the runner."""
    full: str
    """All the node runs for it as one script (parameters, helpers, body): the offline render shows it."""
    delete: str
    disk: bool
    secret_outputs: bool
    depends_on: tuple[str, ...] = ()


def steps(node: Node, cluster: ClusterConfig) -> list[Step]:
    """The node's steps in order, with their exact scripts. Pure: no Pulumi resources."""
    params = parameters(node, cluster)
    names: list[str] = list(DISK_STEPS) if node.prepares_disks else []
    if node.container_runtime != "none":
        names.append(RUNTIME_STEP)
    result = []
    previous: str | None = None
    for name in names:
        own = {key: params[key] for key in STEP_PARAMS[name] if key in params}
        kept = {"GS_STEP": name.split("-", 1)[1]} | {key: params[key] for key in DELETE_PARAMS[name]}
        disk = name in DISK_STEPS
        result.append(
            Step(
                name=name,
                create=render_invocation(f"{name}.sh", own, f"{node.name}:{COPY_STEP}"),
                full=render_script(f"{name}.sh", own),
                delete=render_invocation("delete.sh", kept, f"{node.name}:{COPY_STEP}", delete=True),
                disk=disk,
                secret_outputs=name in SECRET_OUTPUT_STEPS,
                depends_on=(previous,) if disk and previous else (),
            )
        )
        if disk:
            previous = name
    return result


def step_files() -> dict[str, str]:
    """Every step's linked script by file name: what each node's copy step delivers, the same on every node."""
    return {f"{name}.sh": linked_script(f"{name}.sh") for name in (*DISK_STEPS, RUNTIME_STEP)} | {"delete.sh": linked_delete()}


def checked_files() -> dict[str, str]:
    """`step_files()`, refused when the snapshot the copy step delivers differs: a node would then hold files whose
    hashes its Commands do not name, and every step would stop with an ERROR line."""
    files = step_files()
    on_disk = {p.name: p.read_text() for p in LINKED.glob("*.sh")}
    if on_disk != files:
        stale = sorted(n for n in set(files) | set(on_disk) if files.get(n) != on_disk.get(n))
        raise ValueError(f"components/node/linked is not what components/node/scripts make ({', '.join(stale)}): "
                         "run `make node-scripts` and commit the folder")
    return files


def files_version(files: dict[str, str]) -> str:
    """The folder the copy step puts them in on the node: a new version never overwrites the one steps ran from."""
    digest = hashlib.sha256()
    for name, text in sorted(files.items()):
        digest.update(f"{name}\0{len(text)}\0".encode() + text.encode())
    return digest.hexdigest()[:16]
