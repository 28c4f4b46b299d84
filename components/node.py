"""GpuNode: one GPU worker, prepared over SSH from bare disks to a mounted model RAID, and labelled.

Each step is a `pulumi_command.remote.Command` that runs one real bash script kept beside this
file in `node_scripts/` (shellcheck-clean, idempotent, "unchanged" when there is nothing to do).
The script a node receives is rendered here: the file's shebang and `set -euo pipefail`, then
the step's parameters as `shlex.quote`d assignments, then the shared helpers (`lib.sh`) the step
calls, then the step's body. Nothing is spliced into the body, and the same config renders
byte-identical text.

A Command re-runs when its inputs change, so each step's script carries only the parameters it
needs (see `STEP_PARAMS`): changing the mountpoint re-runs (read-only) preflight, mount and health, never the disk
steps; raising the size re-runs preflight, partition (which keeps the partition) and grow.

Steps, chained with depends_on (runtime is independent of the disks):
    10-preflight  read-only checks, one JSON line
    20-partition  GPT partition `gs-<raidName>` after the last partition of each disk
    30-raid       mdadm RAID1 /dev/md/<raidName>, mdadm.conf, initramfs
    40-filesystem mkfs.xfs only on an empty array
    50-mount      fstab by filesystem UUID, mounted; a boot unit starts the array degraded if a disk is missing
    60-grow       grows partition, array and XFS to the configured size
    70-health     read-only: array state, UUIDs, usable bytes -> the node's outputs
    80-runtime    NVIDIA container runtime for containerd / k3s / rke2

The runtime step may restart the node's container runtime. Across the stack the runtime steps run
one node at a time (each waits for the previous node's, by node name; see `gpu_nodes`), so a
release never restarts every node's runtime at once and stops at the first node that fails.

Health is measured when the health step runs (first `up`, or when the disks, the array's name or the
mountpoint change: a replaced disk is measured again); to measure
again: `pulumi up --replace '<urn of <node>:70-health>'`. Shrinking is refused at config load,
against the partition size the last grow step exported (`stacks.deployed_outputs`); preflight and
grow refuse it again on the node, before any write.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

import stacks
from components.sharing import sharing_labels
from stacks.config import Cluster as ClusterConfig
from stacks.config import Node
from stacks.config.cluster import GPU_COUNT_LABEL

SCRIPTS = Path(__file__).resolve().parent / "node_scripts"
HEADER = "#!/usr/bin/env bash\nset -euo pipefail\n"
UNKNOWN = "unknown until pulumi up"

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
# mkfs, initramfs rebuilds (~90 s on a small VM, minutes on a big node) and resizes can be slow.
TIMEOUTS = {
    "30-raid": pulumi.CustomTimeouts(create="30m", update="30m", delete="5m"),
    "40-filesystem": pulumi.CustomTimeouts(create="30m", update="30m", delete="5m"),
    "60-grow": pulumi.CustomTimeouts(create="30m", update="30m", delete="5m"),
}
# Only the runtime step can see container runtime configuration (registry credentials live in
# containerd's config): its stdout/stderr are secret. The disk steps print device names, sizes and
# UUIDs only, kept readable in the state so a failed step can be diagnosed.
SECRET_OUTPUT_STEPS = frozenset({RUNTIME_STEP})

# Booting or rebooting hosts: keep dialling for ~10 minutes.
DIAL_ERROR_LIMIT = 40
PER_DIAL_TIMEOUT = 15


# ---------------------------------------------------------------------------- scripts


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


def assignments(params: dict[str, str | list[str]]) -> str:
    """`NAME=<quoted>` lines (bash arrays for lists), in the given order."""
    lines = []
    for name, value in params.items():
        if not name.isidentifier() or not name.isupper():
            raise ValueError(f"bad parameter name {name!r}")
        if isinstance(value, list):
            lines.append(f"{name}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            lines.append(f"{name}={shlex.quote(value)}")
    return "".join(line + "\n" for line in lines)


def _body(filename: str) -> str:
    text = (SCRIPTS / filename).read_text()
    if not text.startswith(HEADER):
        raise ValueError(f"{filename} must start with {HEADER!r}")
    return text[len(HEADER):]


FUNCTION = re.compile(r"([a-z_][a-z0-9_]*)\(\) *\{")


@functools.cache
def lib_parts(lib: str) -> tuple[tuple[str | None, str], ...]:
    """lib.sh cut into its functions, each with the comment lines right above it, and the lines
    between functions (name None), in order: joined, they are lib.sh again. A function starts with
    `name() {` at the start of a line and ends on that line or at the next line that is `}` alone."""
    parts: list[tuple[str | None, str]] = []
    lines, loose = lib.splitlines(keepends=True), []
    i = 0
    while i < len(lines):
        start = FUNCTION.match(lines[i])
        if not start:
            loose.append(lines[i])
            i += 1
            continue
        comment = len(loose)
        while comment and loose[comment - 1].startswith("#"):
            comment -= 1
        if loose[:comment]:
            parts.append((None, "".join(loose[:comment])))
        end: int | None = i  # `say() { ...; }` on one line
        if not lines[i].rstrip().endswith("}"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip("\n") == "}"), None)
            if end is None:
                raise ValueError(f"lib.sh: {start.group(1)}() has no closing `}}` alone on a line")
        parts.append((start.group(1), "".join(loose[comment:] + lines[i:end + 1])))
        loose, i = [], end + 1
    if loose:
        parts.append((None, "".join(loose)))
    return tuple(parts)


def _called(text: str, names: set[str]) -> set[str]:
    """The names that occur in `text` outside comment lines (a mention in a string counts: it may be
    a trap's command, and one function too many costs only bytes)."""
    code = re.sub(r"^\s*#.*$", "", text, flags=re.MULTILINE)
    return {name for name in names if re.search(rf"(?<![\w-]){name}(?![\w-])", code)}


def lib_for(body: str) -> str:
    """The part of lib.sh a step's body needs: every line outside a function, and each function that
    the body or those lines call, directly or through other functions. So a helper's change re-runs
    only the steps that call it, and every Command's script (held twice in the state, as input and
    output, and written with the whole state after every step of an `up`) carries no dead code."""
    return _lib_for(_body("lib.sh"), body)


@functools.cache
def _lib_for(lib: str, body: str) -> str:
    """lib_for, once per text: every node's steps share the same bodies."""
    parts = lib_parts(lib)
    functions = {name: text for name, text in parts if name is not None}
    needed = _called(body + "".join(text for name, text in parts if name is None), set(functions))
    pending = list(needed)
    while pending:
        found = _called(functions[pending.pop()], set(functions)) - needed
        needed |= found
        pending += found
    return "".join(text for name, text in parts if name is None or name in needed)


def render_script(filename: str, params: dict[str, str | list[str]], with_lib: bool = True) -> str:
    """The exact text a node runs: header, quoted parameters, the lib.sh helpers it calls, the script's body."""
    parts = [HEADER, f"# gpu-serving: components/node_scripts/{filename}, rendered by components/node.py\n"]
    parts.append(assignments(params))
    body = _body(filename)
    if with_lib:
        parts += ["# ---- lib.sh\n", lib_for(body)]
    parts += [f"# ---- {filename}\n", body]
    return "".join(parts)


@dataclass(frozen=True)
class Step:
    name: str
    """`NN-step`; the Command is named `<node>:<name>`."""
    create: str
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
                create=render_script(f"{name}.sh", own),
                delete=render_script("delete.sh", kept, with_lib=False),
                disk=disk,
                secret_outputs=name in SECRET_OUTPUT_STEPS,
                depends_on=(previous,) if disk and previous else (),
            )
        )
        if disk:
            previous = name
    return result


# ---------------------------------------------------------------------------- Kubernetes side


def node_labels(node: Node, cluster: ClusterConfig) -> dict[str, str]:
    """Under the project's own keys: GPU Feature Discovery owns `nvidia.com/gpu.product` and
    `.count` and would rewrite what a force-applied patch sets (labels flap, selectors miss).
    `nvidia.com/gpu.present` is what the device plugin's chart selects nodes by when nothing
    else labels them; with GFD it is GFD's. A node with `gpu.sharing` also gets the labels that pick its
    device plugin and MIG configs (components.sharing): those are inputs to NVIDIA's programs, not GFD's output."""
    labels = {cluster.gpu_product_label: node.gpu.product, GPU_COUNT_LABEL: str(node.gpu.count)}
    if not cluster.gpu_feature_discovery:
        labels["nvidia.com/gpu.present"] = "true"
    return labels | sharing_labels(node)


def node_taints(cluster: ClusterConfig) -> list[dict[str, str]]:
    taint = cluster.gpu_taint
    return [{"key": taint.key, "value": taint.value, "effect": taint.effect}]


# ---------------------------------------------------------------------------- health


def parse_report(stdout: str | None) -> dict[str, Any] | None:
    """The JSON report a step prints as its last line; None when there is none (mock render, preview)."""
    if not stdout:
        return None
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                return None
            return report if isinstance(report, dict) else None
    return None


def storage_outputs(health_stdout: str | None, grow_stdout: str | None, node: Node) -> dict[str, Any]:
    """The node's storage outputs from the health and grow reports ("unknown until pulumi up" without them).

    `partitionBytes` is what the last successful grow step left on each member; the next run's
    config check refuses a smaller `sizeGb` against it (see `stacks.config.refuse_shrinking`).
    """
    storage = node.storage
    report = parse_report(health_stdout)
    grown = parse_report(grow_stdout) or {}
    outputs: dict[str, Any] = {
        "arrayDevice": storage.device if storage else None,
        "disks": list(storage.disks) if storage else [],
        "partitionBytes": grown.get("partitionBytes", UNKNOWN),
        "arrayUuid": UNKNOWN,
        "filesystemUuid": UNKNOWN,
        "mountpoint": storage.mountpoint if storage else None,
        "usableBytes": UNKNOWN,
        "health": UNKNOWN,
    }
    if report is not None:
        outputs.update(
            arrayDevice=report.get("device", outputs["arrayDevice"]),
            arrayUuid=report.get("arrayUuid") or UNKNOWN,
            filesystemUuid=report.get("filesystemUuid") or UNKNOWN,
            mountpoint=report.get("mountpoint"),
            usableBytes=report.get("usableBytes") if report.get("mounted") else 0,
            health=report.get("health", UNKNOWN),
        )
    return outputs


def health_warning(node_name: str, outputs: dict[str, Any]) -> str | None:
    health = outputs.get("health")
    if health in ("clean", "resyncing", UNKNOWN, "no disk work"):
        return None
    if health == "degraded":
        return (f"node {node_name}: RAID1 {outputs.get('arrayDevice')} is degraded: it serves from one disk. "
                "Replace the failed member (cat /proc/mdstat), then run `pulumi up` to add it back.")
    return f"node {node_name}: RAID1 {outputs.get('arrayDevice')} health is {health!r}; check `mdadm --detail` on the node."


# ---------------------------------------------------------------------------- the component


@dataclass(frozen=True)
class GpuNodeArgs:
    node: Node
    cluster: ClusterConfig
    private_key: pulumi.Input[str]
    """SSH private key (a secret Output)."""
    host_key: pulumi.Input[str] | None = None
    """The node's SSH host public key; None turns host-key checking off."""
    extra_depends_on: list[pulumi.Resource] = field(default_factory=list)
    runtime_after: pulumi.Resource | None = None
    """The previous node's runtime step: this node's runtime step waits for it."""

    @staticmethod
    def from_config(node: Node, cluster: ClusterConfig) -> GpuNodeArgs:
        """Keys from the stack's secret config (`ssh.privateKeySecret`, `ssh.hostKeySecret`)."""
        return GpuNodeArgs(
            node=node,
            cluster=cluster,
            private_key=stacks.secret(node.ssh.private_key_secret),
            host_key=stacks.secret(node.ssh.host_key_secret) if node.ssh.host_key_secret else None,
        )


class GpuNode(pulumi.ComponentResource):
    """One GPU node: disk steps, container runtime, labels and taint.

    Disk Commands are retain_on_delete and their delete scripts only report what they kept:
    removing a node from the stack never touches its data.
    """

    storage_ready: list[pulumi.Resource]
    """The last disk step (empty without disk work): after it the array is mounted at its configured size."""
    outputs: pulumi.Output[dict[str, Any]]
    """arrayDevice, disks, partitionBytes, arrayUuid, filesystemUuid, mountpoint, usableBytes, health."""
    commands: dict[str, command.remote.Command]
    runtime_step: command.remote.Command | None
    """The runtime step (None when the node's runtime is `none`)."""
    node_patch: k8s.core.v1.NodePatch
    """The node's labels and taint: serving pods select the node by them."""
    gpu_product: str

    def __init__(self, name: str, args: GpuNodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-serving:node:GpuNode", name, None, opts)
        node, cluster = args.node, args.cluster
        self.gpu_product = node.gpu.product
        connection = command.remote.ConnectionArgs(
            host=node.ssh.host,
            port=node.ssh.port,
            user=node.ssh.user,
            private_key=args.private_key,
            host_key=args.host_key,
            dial_error_limit=DIAL_ERROR_LIMIT,
            per_dial_timeout=PER_DIAL_TIMEOUT,
        )
        self.commands = {}
        for step in steps(node, cluster):
            depends = [self.commands[d] for d in step.depends_on] + list(args.extra_depends_on)
            if step.name == RUNTIME_STEP and args.runtime_after is not None:
                depends.append(args.runtime_after)
            self.commands[step.name] = command.remote.Command(
                f"{node.name}:{step.name}",
                connection=connection,
                create=step.create,
                delete=step.delete,
                # Nothing from a previous run goes into the environment (it needs sshd AcceptEnv anyway).
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=depends,
                    retain_on_delete=step.disk,
                    additional_secret_outputs=["stdout", "stderr"] if step.secret_outputs else None,
                    custom_timeouts=TIMEOUTS.get(step.name),
                ),
            )

        health = self.commands.get("70-health")
        self.storage_ready = [self.commands["60-grow"]] if "60-grow" in self.commands else []
        if health is not None:
            def report(stdouts: list[str | None]) -> dict[str, Any]:
                outputs = storage_outputs(*stdouts, node)
                warning = health_warning(node.name, outputs)
                if warning:
                    pulumi.log.warn(warning, resource=self)
                return outputs

            self.outputs = pulumi.Output.all(health.stdout, self.commands["60-grow"].stdout).apply(report)
        else:
            self.outputs = pulumi.Output.from_input(
                {"arrayDevice": None, "disks": [], "partitionBytes": 0, "arrayUuid": None, "filesystemUuid": None,
                 "mountpoint": None, "usableBytes": 0, "health": "no disk work"}
            )

        # Labels and taint only once the runtime can start GPU containers.
        runtime = self.runtime_step = self.commands.get(RUNTIME_STEP)
        self.node_patch = k8s.core.v1.NodePatch(
            f"{node.name}-gpu",
            metadata=k8s.meta.v1.ObjectMetaPatchArgs(
                name=node.name,
                labels=node_labels(node, cluster),
                # Server-side apply: take over these fields even if kubectl set them before.
                annotations={"pulumi.com/patchForce": "true"},
            ),
            spec=k8s.core.v1.NodeSpecPatchArgs(
                taints=[k8s.core.v1.TaintPatchArgs(**taint) for taint in node_taints(cluster)],
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[runtime] if runtime else []),
        )
        self.register_outputs({"storage": self.outputs, "nodeName": node.name})


def labelled_for(nodes: dict[str, GpuNode], gpu_product: str) -> list[pulumi.Resource]:
    """The label patches of the nodes a model's pods select (by GPU product): its Deployment waits for them.
    Otherwise a fleet's first `up` creates every model's Deployment at once, each awaiting pods no node
    takes until its steps end and it is labelled; as many of them as `--parallel` hold every slot of the
    engine, and the node steps that would label the nodes wait behind them until the Deployments time
    out (seen at 32 nodes × 100 models on the loopback cluster)."""
    return [node.node_patch for node in nodes.values() if node.gpu_product == gpu_product]


def gpu_nodes(nodes: list[Node], cluster: ClusterConfig, opts: pulumi.ResourceOptions | None = None) -> dict[str, GpuNode]:
    """Every configured node, by name. Runtime steps are chained in node-name order (stable when
    the config list is reordered): restarting a container runtime stops that node's GPU pods, so
    a release restarts one node's runtime at a time, and stops at the first node whose step fails.
    """
    made: dict[str, GpuNode] = {}
    previous: pulumi.Resource | None = None
    for node in sorted(nodes, key=lambda n: n.name):
        args = GpuNodeArgs.from_config(node, cluster)
        made[node.name] = GpuNode(node.name, replace(args, runtime_after=previous), opts=opts)
        previous = made[node.name].runtime_step or previous
    return {node.name: made[node.name] for node in nodes}
