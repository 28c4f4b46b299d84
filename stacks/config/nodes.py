"""`nodes`: how each GPU node is reached, what GPUs it has and which disks it mirrors."""

from __future__ import annotations

import posixpath
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from policy.rules.mig import product_contradicts
from stacks.config.base import IPV4, RAID_NAME, LabelValue, NodeName, SafePath, SecretKeyName, _Model, refuse_port
from stacks.config.models import _at_key
from stacks.config.sharing import Sharing, advertised


class Ssh(_Model):
    host: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:_-]+$")
    """Address or name the machine running `pulumi` reaches the node's sshd at."""
    port: int = Field(22, ge=1, le=65535)
    """sshd port."""
    user: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    """Login user: root (bash as login shell). The steps partition, mirror, mount and write /etc without sudo."""
    private_key_secret: SecretKeyName = "sshPrivateKey"
    """Secret config key holding the SSH private key (PEM/OpenSSH text)."""
    host_key_secret: SecretKeyName | None = None
    """Secret config key holding the node's SSH host public key; unset disables host-key pinning."""

    @field_validator("host")
    @classmethod
    def _no_port_in_host(cls, host: str) -> str:
        return refuse_port(host, "set the host to {name!r} and the port in `port` (ssh.port: {port})")

    @field_validator("host")
    @classmethod
    def _an_address_of_a_machine(cls, host: str) -> str:
        if IPV4.match(host):
            octets = [int(o) for o in host.split(".")]
            if max(octets) > 255:
                raise ValueError("not an IPv4 address (each part is 0-255): ssh would look it up as a "
                                 "host name and fail; give the node's address or DNS name")
            if octets[0] == 0:
                # 0.0.0.0 is "this host": ssh reaches the machine running pulumi, which the node steps would then change.
                raise ValueError("no machine's address (0.x.x.x means this host: the steps would run on the "
                                 "machine running pulumi); give the node's address or DNS name")
        elif host.strip(":") == "" or host in ("::0", "0:0:0:0:0:0:0:0"):
            raise ValueError("the unspecified IPv6 address, no machine's; give the node's address or DNS name")
        return host

    @field_validator("user")
    @classmethod
    def _root(cls, user: str) -> str:
        if user != "root":
            # Every step runs parted, mdadm, mkfs, mount and writes /etc and the runtime config
            # directly; as another user each fails half-way with "permission denied".
            raise ValueError("the node steps run as root (parted, mdadm, mkfs.xfs, mount, /etc) and do not use sudo; "
                             "log in as root: put the key in /root/.ssh/authorized_keys and write user: root")
        return user


class Gpu(_Model):
    product: LabelValue = Field(min_length=1)
    """Value of the GPU product node label; models choose nodes by it."""
    count: int = Field(ge=1, le=256)
    """Physical cards, also with `sharing` (what the node then advertises is counted from it: count × replicas
    time-slices, or count × the MIG layout)."""
    sharing: Sharing | None = None
    """Share the cards between pods: `timeSlicing` or `mig`; unset: each pod gets whole cards (`nvidia.com/gpu`)."""

    @property
    def advertised(self) -> dict[str, int]:
        """What the node's device plugin advertises, by resource name after `nvidia.com/`."""
        return advertised(self.count, self.sharing)

    @model_validator(mode="after")
    def _mig_card_of_the_product(self) -> Gpu:
        mig = self.sharing.mig if self.sharing is not None else None
        why = product_contradicts(mig.card, self.product) if mig is not None else None
        if mig is not None and why:
            # mig-parted applies the layout by profile name to whatever card is there: one the card lacks
            # fails the MIG manager (nvidia.com/mig.config.state=failed) and the node advertises nothing.
            raise _at_key("sharing.mig.card", f"{mig.card}, but gpu.product {self.product!r} {why}: the MIG manager "
                                              "would fail the layout on the real card; set the card the node has (one "
                                              "without MIG can only time-slice)")
        return self


class NodeStorage(_Model):
    disks: list[SafePath] = Field(max_length=2)
    """The two mirror members, whole disks; `/dev/disk/by-id/...` survives reordering. Empty: no disk work."""
    size_gb: int = Field(1000, ge=1, le=1_000_000)
    """Partition size on each member, in GB (10^9 bytes)."""
    raid_name: str = Field("models", pattern=RAID_NAME)
    """Array name: the array is `/dev/md/<raidName>`, the GPT partitions are named `gs-<raidName>`."""
    mountpoint: SafePath = "/mnt/models"
    """Where the array is mounted on the node; the node-local PV points here."""
    filesystem: Literal["xfs"] = "xfs"
    """Filesystem made on the array (XFS: grows online)."""
    device_timeout_seconds: int = Field(30, ge=1, le=3600)
    """How long systemd waits for the array at boot before giving up on the (nofail) mount."""
    adopt: str | None = Field(None, pattern=r"^/dev/md(/[A-Za-z0-9_.:-]+|[0-9]+)$")
    """An existing RAID1 of these disks carrying XFS (e.g. the Ansible role's `/dev/md1`) to take over, not build:
    nothing is created or formatted; it is recorded as `/dev/md/<raidName>`. Unset: build the array."""

    @field_validator("disks")
    @classmethod
    def _two_distinct_disks(cls, disks: list[str]) -> list[str]:
        if len(disks) not in (0, 2):
            raise ValueError(f"a RAID1 mirror needs exactly 2 disks (or [] for no disk work), got {len(disks)}")
        if len(disks) == 2 and disks[0] == disks[1]:
            raise ValueError(f"the two disks must differ, both are {disks[0]!r}")
        return disks

    @field_validator("disks")
    @classmethod
    def _whole_disks(cls, disks: list[str]) -> list[str]:
        for disk in disks:
            if PARTITION.match(disk):
                raise ValueError(f"{disk!r} is a partition; list whole disks (e.g. /dev/disk/by-id/...), the partition is created on them")
        return disks

    @field_validator("mountpoint")
    @classmethod
    def _not_system_dir(cls, mountpoint: str) -> str:
        normal = posixpath.normpath(mountpoint)
        if normal != mountpoint.rstrip("/") or normal in SYSTEM_DIRS:
            raise ValueError(f"{mountpoint!r} is a system directory or not a normalised path; use e.g. /mnt/models")
        return normal

    @property
    def device(self) -> str:
        return f"/dev/md/{self.raid_name}"

    @property
    def partition_name(self) -> str:
        return f"gs-{self.raid_name}"

    @property
    def partition_bytes(self) -> int:
        return partition_bytes(self.size_gb)


def partition_bytes(size_gb: int) -> int:
    """Partition size: `sizeGb` GB (10^9 bytes) rounded down to whole MiB, so that a 1 MiB-aligned
    start gives an optimally aligned end and parted never adjusts it."""
    return size_gb * 10**9 // 2**20 * 2**20


def size_gb_for(part_bytes: int) -> int:
    """The smallest `sizeGb` whose partition holds `part_bytes`."""
    size_gb = max(1, -(-part_bytes // 10**9))
    while partition_bytes(size_gb) < part_bytes:
        size_gb += 1
    return size_gb


def disk_identity(disk: str) -> tuple[str, str] | None:
    """What physically identifies a `/dev/disk/by-id/` name: its WWN, EUI or serial (None for kernel
    and by-path names, which only mean something on one machine).

    `wwn-0x5000c500a1b2c3d4` and `scsi-35000c500a1b2c3d4` are one WWN; `ata-ST4000NM0035_ZC1ABCDE` and
    `scsi-SATA_ST4000NM0035_ZC1ABCDE` one serial.
    """
    prefix = "/dev/disk/by-id/"
    if not disk.startswith(prefix):
        return None
    name = disk[len(prefix):]
    bus, _, rest = name.partition("-")
    if bus == "wwn":
        return ("WWN", rest.lower().removeprefix("0x"))
    if bus == "scsi" and rest[:1] in "235" and re.fullmatch(r"[0-9a-fA-F]{16,32}", rest[1:]):
        return ("WWN", rest[1:].lower())  # SCSI VPD page 0x83 designator: the WWN
    if bus == "nvme" and rest.startswith("eui."):
        return ("EUI", rest[4:].lower())
    parts = rest.split("_")
    if bus == "virtio" or (bus in ("ata", "nvme", "scsi", "usb") and len(parts) > 1):
        # <model>_<serial>, NVMe sometimes with a namespace suffix (_1).
        serial = parts[-2] if len(parts) > 2 and parts[-1].isdigit() and len(parts[-1]) <= 2 else parts[-1]
        return ("serial", serial)
    return ("name", name)


# Clearly a partition: sda1, vdb2, xvdc3, nvme0n1p1, mmcblk0p1, or a by-id/by-path name ending -partN.
PARTITION = re.compile(r"^/dev/((s|v|h|xv)d[a-z]+[0-9]+|(nvme[0-9]+n[0-9]+|mmcblk[0-9]+)p[0-9]+|disk/by-[a-z]+/.+-part[0-9]+)$")

SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/mnt", "/opt", "/proc", "/root",
     "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/lib/kubelet"]
)


class Node(_Model):
    name: NodeName
    """The Kubernetes node name (what `kubectl get nodes` shows)."""
    ssh: Ssh
    """How `pulumi up` reaches the node."""
    gpu: Gpu
    """The node's GPUs, as labels and for the capacity checks."""
    storage: NodeStorage | None = None
    """Model disk preparation; unset or `disks: []` means this node does no disk work."""
    container_runtime: Literal["containerd", "k3s", "rke2", "none"] = "containerd"
    """Runtime to configure for NVIDIA (`none`: leave it alone). k3s and rke2 need `cluster.runtimeClassName`."""

    @property
    def prepares_disks(self) -> bool:
        return self.storage is not None and len(self.storage.disks) == 2
