"""The nodes' disks: no disk or array claimed twice on one machine, no physical disk under two nodes, and
no partition smaller than the last `pulumi up` left (XFS cannot shrink)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stacks.config.base import ConfigError, _at
from stacks.config.nodes import disk_identity, size_gb_for

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_same_machine(stack: StackConfig) -> None:
    # Two node entries with the same SSH host and port reach one machine (e.g. a lab VM); their
    # arrays and mounts must not meet. The same host on another port is another machine (a
    # port-forwarding jump host or NAT in front of several nodes).
    seen: dict[tuple[str, int, str, str], int] = {}
    for i, node in enumerate(stack.nodes):
        if node.storage is None or not node.prepares_disks:
            continue
        claims = [("raidName", node.storage.raid_name), ("mountpoint", node.storage.mountpoint)]
        claims += [("disks", disk) for disk in node.storage.disks]
        for key, value in claims:
            other = seen.setdefault((node.ssh.host.lower(), node.ssh.port, key, value), i)
            if other != i:
                where = f"{node.ssh.host} port {node.ssh.port}"
                raise _at(f"nodes[{i}].storage.{key}", f"{value!r} is already used by nodes[{other}] on the same machine ({where})")


def check_one_disk_one_node(stack: StackConfig) -> None:
    # A by-id name (WWN, EUI, model_serial) names one physical disk wherever it is seen: listed
    # under two machines it is a shared LUN both would partition and mirror, and two names of one
    # serial on one machine are two paths to a single disk (a "mirror" of it protects nothing).
    seen: dict[tuple[str, str], tuple[int, int, str]] = {}
    for i, node in enumerate(stack.nodes):
        if node.storage is None or not node.prepares_disks:
            continue
        for j, disk in enumerate(node.storage.disks):
            identity = disk_identity(disk)
            if identity is None:
                continue
            other = seen.setdefault(identity, (i, j, disk))
            if other[:2] == (i, j):
                continue
            first = stack.nodes[other[0]]
            if other[0] != i and (first.ssh.host.lower(), first.ssh.port) == (node.ssh.host.lower(), node.ssh.port) \
                    and other[2] == disk:
                continue  # two entries of one machine: check_same_machine says it
            kind, value = identity
            where = f"nodes[{other[0]}].storage.disks[{other[1]}]"
            if other[0] == i:
                raise _at(f"nodes[{i}].storage.disks[{j}]",
                          f"{disk} and {other[2]} are one physical disk ({kind} {value}: two paths to one device); "
                          "a mirror needs two disks: list two different ones (`ls -l /dev/disk/by-id/` on the node)")
            raise _at(f"nodes[{i}].storage.disks[{j}]",
                      f"{disk} is the same physical disk ({kind} {value}) as {where} on {first.name}; two nodes "
                      f"would partition and mirror it and destroy each other's data: list {node.name}'s own disks "
                      "(`ls -l /dev/disk/by-id/` on it)")


def refuse_shrinking(stack: StackConfig, deployed_nodes: Mapping[str, Any]) -> None:
    """Raise ConfigError when a node's `sizeGb` is below the partitions its last `pulumi up` left.

    `deployed_nodes` is the stack output `nodes` of the previous run (`GpuNode.outputs` by node
    name). Partitions of another array or on other disks are not compared: nothing shrinks there.
    """
    if not isinstance(deployed_nodes, Mapping):
        return  # not what GpuNode exports: nothing to compare with
    for i, node in enumerate(stack.nodes):
        storage = node.storage
        before = deployed_nodes.get(node.name)
        if storage is None or not node.prepares_disks or not isinstance(before, Mapping):
            continue
        deployed_bytes = before.get("partitionBytes")
        if not isinstance(deployed_bytes, int | float) or isinstance(deployed_bytes, bool):
            continue  # unknown: deployed before this output existed, or the grow step never finished
        same_disks = set(before.get("disks") or []) & set(storage.disks)
        if before.get("arrayDevice") != storage.device or not same_disks:
            continue
        if storage.partition_bytes < deployed_bytes:
            at_least = size_gb_for(int(deployed_bytes))
            raise ConfigError(
                f"nodes[{i}].storage.sizeGb: {storage.size_gb} would shrink the partitions of {storage.device} on "
                f"{node.name} ({int(deployed_bytes)} bytes each since the last pulumi up); XFS cannot shrink. "
                f"Allowed: {at_least} or more"
            )
