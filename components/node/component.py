"""GpuNode: one GPU worker, prepared over SSH from bare disks to a mounted model RAID, and labelled.

Each step (`steps.steps`) becomes a `pulumi_command.remote.Command` that runs its rendered script.
The runtime step may restart the node's container runtime. Across the stack the runtime steps run
one node at a time (each waits for the previous node's, by node name; see `gpu_nodes`), so a
release never restarts every node's runtime at once and stops at the first node that fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components.node.labels import node_labels, node_taints
from components.node.reports import health_warning, storage_outputs
from components.node.script import STEPS_DIR
from components.node.steps import COPY_STEP, LINKED, RUNTIME_STEP, checked_files, files_version, steps
from stacks.config import ClusterConfig, Node

# mkfs, initramfs rebuilds (~90 s on a small VM, minutes on a big node) and resizes can be slow.
TIMEOUTS = {
    "30-raid": pulumi.CustomTimeouts(create="30m", update="30m", delete="5m"),
    "40-filesystem": pulumi.CustomTimeouts(create="30m", update="30m", delete="5m"),
    "60-grow": pulumi.CustomTimeouts(create="30m", update="30m", delete="5m"),
}

# Booting or rebooting hosts: keep dialling for ~10 minutes.
DIAL_ERROR_LIMIT = 40
PER_DIAL_TIMEOUT = 15


@dataclass(frozen=True)
class GpuNodeArgs:
    node: Node
    cluster: ClusterConfig
    private_key: pulumi.Input[str]
    """SSH private key: the secret `ssh.privateKeySecret` names."""
    host_key: pulumi.Input[str] | None = None
    """The node's SSH host public key (the secret `ssh.hostKeySecret` names); None turns host-key checking off."""
    extra_depends_on: list[pulumi.Resource] = field(default_factory=list)
    runtime_after: pulumi.Resource | None = None
    """The previous node's runtime step: this node's runtime step waits for it (`gpu_nodes` sets it)."""
    caches_models: bool = False
    """A node of the stack's node cache (`modelStorage.type: nodeCache`): labelled for the cache volume once its array is mounted."""
    sharing_configs: list[pulumi.Resource] = field(default_factory=list)
    """The ConfigMaps whose entries a node with `gpu.sharing` is labelled with (ClusterBase.sharing_configs)."""


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
        node_steps = steps(node, cluster)
        files = checked_files()
        # The linked scripts, once per node (a folder archive: the state keeps its path and hash, not its text).
        # A new version goes to a folder of its own, so a step still running from the old one is never cut.
        copied = command.remote.CopyToRemote(
            f"{node.name}:{COPY_STEP}",
            connection=connection,
            source=pulumi.FileArchive(linked_path()),
            remote_path=f"{STEPS_DIR}/{files_version(files)}",
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.extra_depends_on)),
        ) if node_steps else None
        for step in node_steps:
            depends = [self.commands[d] for d in step.depends_on] + list(args.extra_depends_on) + ([copied] if copied else [])
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

        # Labels and taint only once the runtime can start GPU containers, and on a cache node once its array is
        # mounted: the cache volume's pods may land wherever the label is. A sharing node's labels name entries of
        # the sharing ConfigMaps, which NVIDIA's programs act on as soon as they see the label: after those are written.
        runtime = self.runtime_step = self.commands.get(RUNTIME_STEP)
        labelled_after = (([runtime] if runtime else []) + (self.storage_ready if args.caches_models else [])
                          + (args.sharing_configs if node.gpu.sharing is not None else []))
        self.node_patch = k8s.core.v1.NodePatch(
            f"{node.name}-gpu",
            metadata=k8s.meta.v1.ObjectMetaPatchArgs(
                name=node.name,
                labels=node_labels(node, cluster, args.caches_models),
                # Server-side apply: take over these fields even if kubectl set them before.
                annotations={"pulumi.com/patchForce": "true"},
            ),
            spec=k8s.core.v1.NodeSpecPatchArgs(
                taints=[k8s.core.v1.TaintPatchArgs(**taint) for taint in node_taints(cluster)],
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=labelled_after),
        )
        self.register_outputs({"storage": self.outputs, "nodeName": node.name})


def linked_path() -> str:
    """The linked scripts' folder as the state records it. Relative to the program's working folder when they are
    under it (the project): the same path in every checkout's state. Absolute from the component package, whose
    consumer program runs elsewhere; the command provider, which reads the folder at `up`, runs there too."""
    try:
        return LINKED.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(LINKED)


def labelled_for(nodes: dict[str, GpuNode], gpu_product: str) -> list[pulumi.Resource]:
    """The label patches of the nodes a model's pods select (by GPU product): its Deployment waits for them.
    Otherwise a fleet's first `up` creates every model's Deployment at once, each awaiting pods no node
    takes until its steps end and it is labelled; as many of them as `--parallel` hold every slot of the
    engine, and the node steps that would label the nodes wait behind them until the Deployments time
    out (seen at 32 nodes × 100 models on the loopback cluster)."""
    return [node.node_patch for node in nodes.values() if node.gpu_product == gpu_product]


def gpu_nodes(nodes: list[GpuNodeArgs], opts: pulumi.ResourceOptions | None = None) -> dict[str, GpuNode]:
    """Every configured node, by name, in the given order. Runtime steps are chained in node-name order
    (stable when the config list is reordered): restarting a container runtime stops that node's GPU pods,
    so a release restarts one node's runtime at a time, and stops at the first node whose step fails.
    """
    made: dict[str, GpuNode] = {}
    previous: pulumi.Resource | None = None
    for args in sorted(nodes, key=lambda a: a.node.name):
        made[args.node.name] = GpuNode(args.node.name, replace(args, runtime_after=previous), opts=opts)
        previous = made[args.node.name].runtime_step or previous
    return {args.node.name: made[args.node.name] for args in nodes}
