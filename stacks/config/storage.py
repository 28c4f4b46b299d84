"""`modelStorage`: the volume that holds the weights, and its capacity derived from the partition."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator

from stacks.config.base import LOOPBACK, K8sName, NodeName, SafePath, _Model, refuse_port

# mdadm 1.2 superblocks reserve a data offset in front of the data; recent mdadm uses up to
# 128 MiB on large members (the internal bitmap lives in that gap).
RAID_DATA_OFFSET_BYTES = 128 * 2**20
# XFS keeps part of the device for its log, allocation-group headers, inode chunks and the
# reserved block pool. 2 % bounds what `df` shows missing on a fresh mkfs.xfs (measured on
# the test VM; see docs/nodes.md, "Capacity of the model volume").
XFS_OVERHEAD_FRACTION = 0.02


def usable_gib(size_gb: int) -> int:
    """PersistentVolume capacity, in GiB, for a RAID1 of two `size_gb` GB partitions with XFS.

    GB (10^9) to bytes, minus the mdadm data offset, minus the XFS overhead, to GiB, rounded down.
    1000 GB gives 912 GiB (the seed hand-picked 900Gi).
    """
    raid_bytes = size_gb * 10**9 - RAID_DATA_OFFSET_BYTES
    return max(0, math.floor(raid_bytes * (1 - XFS_OVERHEAD_FRACTION) / 2**30))


# vLLM's torch.compile and Triton caches live on the model volume (components/serving/profile.py), one
# per model and image: each cache node keeps room for them. An allowance, not a measurement: 2 % of the
# weights, at least 1 GB.
COMPILE_CACHE_FRACTION = 0.02
COMPILE_CACHE_MIN_GB = 1.0


def compile_cache_gb(weights_gb: float) -> float:
    """What a model's compile caches may take on a cache node's array, in GB."""
    return max(COMPILE_CACHE_MIN_GB, weights_gb * COMPILE_CACHE_FRACTION)


class _StorageBase(_Model):
    name: K8sName = "models"
    """Name of the PersistentVolume and its claim."""


class LocalStorage(_StorageBase):
    """ReadWriteOnce on one node's RAID mount: every model pod runs on that node."""

    type: Literal["local"]
    node: NodeName
    """A configured node whose `storage` prepares the RAID; the PV is its mountpoint."""


class NfsStorage(_StorageBase):
    """ReadWriteMany on an NFS export: pods may run on any GPU node."""

    type: Literal["nfs"]
    server: str = Field(min_length=1, pattern=r"^[A-Za-z0-9.:_-]+$")
    """NFS server name or address (no port: the kubelet mounts NFS on the standard port)."""
    path: SafePath
    """Exported path; must not squash root (the download Job writes as root)."""
    size_gi: int = Field(ge=1)
    """Capacity of the export in GiB (the program cannot measure a remote server)."""

    @field_validator("server")
    @classmethod
    def _no_port(cls, server: str) -> str:
        if LOOPBACK.match(server) or server == "::1":
            # The kubelet of whichever node the pod lands on mounts it: each would mount itself.
            raise ValueError("a loopback address; the kubelet on each node mounts the export, so every node would mount "
                             "itself: give the NFS server's name or address as the nodes reach it, e.g. nas.lan or 10.0.0.9")
        return refuse_port(server, "write server: {name} (a Kubernetes NFS volume has no port field; the kubelet mounts port 2049)")


class ClassStorage(_StorageBase):
    """ReadWriteMany from an existing storage class that provisions shared volumes."""

    type: Literal["storageClass"]
    storage_class: K8sName
    """An existing storage class that provisions ReadWriteMany volumes."""
    size_gi: int = Field(ge=1)
    """Size of the claim in GiB."""


class NodeCacheStorage(_StorageBase):
    """Every cache node's own array holds the models it serves: pods read their node's copy and may run on any
    node that holds their weights, so the scheduler spreads them and moves them when a node is lost."""

    type: Literal["nodeCache"]
    name: K8sName = "model-cache"
    """Name of the PersistentVolume (prefixed with the namespace) and its claim; not `local`'s `models`, so a
    switch from `local` makes new ones (a PV's node affinity cannot change) and the old ones keep their files."""
    nodes: list[NodeName] | None = Field(None, min_length=1)
    """The cache nodes, by name; unset: every node whose `storage` prepares disks."""


ModelStorageConfig = Annotated[LocalStorage | NfsStorage | ClassStorage | NodeCacheStorage, Field(discriminator="type")]
