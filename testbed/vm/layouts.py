"""Partition layouts a test builds on a VM's blank extra disks, and their hashes: an OS-like one (a
node's sda1-sda4, whose bytes the node steps must leave alone) and the one the Ansible role left."""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Iterable, Sequence

from testbed.vm.disks import MiB
from testbed.vm.machine import Vm

# --------------------------------------------------------------------------- OS-like layout

# (GPT name, sgdisk type code, start MiB, size MiB): like a node's sda1..sda4.
OS_LAYOUT: tuple[tuple[str, str, int, int], ...] = (
    ("efi", "ef00", 1, 32),
    ("boot", "8300", 33, 64),
    ("swap", "8200", 97, 64),
    ("root", "8300", 161, 128),
)
OS_LAYOUT_END_MIB = OS_LAYOUT[-1][2] + OS_LAYOUT[-1][3]  # 289 MiB; the rest of the disk is free


def os_layout_regions() -> list[tuple[int, int]]:
    """Byte ranges ``(offset, length)`` of the OS_LAYOUT partitions in a raw disk file
    (use with :func:`checksum_regions` on the host: same sha256 as in the guest)."""
    return [(start * MiB, size * MiB) for _n, _t, start, size in OS_LAYOUT]


def partition_sha256s(vm: Vm, devices: Iterable[str]) -> dict[str, str]:
    """sha256 of each guest block device's content, read in the guest."""
    devs = list(devices)
    script = (
        'set -eu\nfor d in "$@"; do\n'
        '  blockdev --flushbufs "$d"\n'
        '  printf \'%s %s\\n\' "$d" "$(sha256sum < "$d" | cut -d\' \' -f1)"\n'
        "done\n"
    )
    out = vm.run_script(script, args=devs, timeout=900).stdout
    res = dict(line.split(" ", 1) for line in out.splitlines() if line.strip())
    return {d: res[d].strip() for d in devs}


def os_layout_sha256s(vm: Vm, disks: Iterable[str]) -> dict[str, str]:
    """:func:`partition_sha256s` of :func:`make_os_like_layout`'s partitions on ``disks``, with the
    bytes hashed on the host once the guest has flushed (a guest sha256 of 576 MiB costs ~18 s
    under TCG). The guest says where each partition lies; one that no longer starts and ends where
    OS_LAYOUT put it (or is gone) gets ``moved <start> <size>`` instead of a hash."""
    names = list(disks)
    parts = [f"{Vm.by_id(n)}-part{i}" for n in names for i in range(1, len(OS_LAYOUT) + 1)]
    script = (
        'set -u\nsync\nfor d in "$@"; do\n'
        '  k=$(readlink -f "$d"); k=${k##*/}\n'
        '  echo "$d $(cat /sys/class/block/$k/start 2>/dev/null) $(cat /sys/class/block/$k/size 2>/dev/null)"\n'
        "done\n"
    )
    where = {d: rest for d, _, rest in (line.partition(" ") for line in vm.run_script(script, args=parts).stdout.splitlines())}
    out: dict[str, str] = {}
    for name in names:
        sums = vm.checksum_disk(name, os_layout_regions())
        for i, ((_label, _code, start, size), digest) in enumerate(zip(OS_LAYOUT, sums.values(), strict=True), 1):
            part = f"{Vm.by_id(name)}-part{i}"
            out[part] = digest if where.get(part) == f"{start * 2048} {size * 2048}" else f"moved {where.get(part)}"
    return out


def make_os_like_layout(vm: Vm, disks: Iterable[str] | None = None) -> dict[str, str]:
    """Give each blank extra disk a GPT with OS-like partitions 1-4 (efi 32 MiB,
    boot 64 MiB, swap 64 MiB, root 128 MiB; ends at 289 MiB, the rest is free), fill
    each partition with random data and return ``{"/dev/disk/by-id/virtio-<disk>-part<N>": sha256}``.

    Run it on a running VM; ``disks`` defaults to all attached extra disks. The guest writes the
    GPT; the host writes the random data straight into the raw files (under TCG the guest took
    ~40 s to draw and write 576 MiB from /dev/urandom), then the guest drops what it had cached
    of those partitions, so every later read in the guest sees the host's bytes.
    """
    names = list(vm.attached if disks is None else disks)
    sg_args = []
    for i, (label, code, start, size) in enumerate(OS_LAYOUT, 1):
        end = start + size
        # sgdisk takes sectors when no unit is given; 512-byte sectors
        sg_args += [
            f"-n{i}:{start * 2048}:{end * 2048 - 1}",
            f"-t{i}:{code}",
            f"-c{i}:{label}",
        ]
    devices: list[str] = []
    lines = ["set -euo pipefail"]
    for name in names:
        disk = Vm.by_id(name)
        lines.append(f"sgdisk -Z {shlex.join(sg_args)} {disk} >/dev/null")
        devices += [f"{disk}-part{i}" for i in range(1, len(OS_LAYOUT) + 1)]
    lines.append("udevadm settle")
    lines += [f"test -b {part}" for part in devices]
    vm.run_script("\n".join(lines) + "\n", timeout=900)
    sums: dict[str, str] = {}
    for name in names:
        with open(vm.disk_path(name), "r+b") as f:
            for i, (_label, _code, start, size) in enumerate(OS_LAYOUT, 1):
                data = os.urandom(size * MiB)
                f.seek(start * MiB)
                f.write(data)
                sums[f"{Vm.by_id(name)}-part{i}"] = hashlib.sha256(data).hexdigest()
    # udev read the new partitions' first blocks (blkid) before the host wrote them.
    disks_and_parts = [Vm.by_id(n) for n in names] + devices
    vm.ssh("blockdev --flushbufs " + " ".join(disks_and_parts))
    return sums


# --------------------------------------------------------------------------- the Ansible role's layout

# The OS partitions in front of partition 5 on a node the seed's role prepared (sgdisk arguments).
ROLE_OS_TABLE = "-n1:1M:+32M -c1:efi -t1:ef00 -n2:33M:+64M -c2:boot -n3:97M:+64M -c3:swap -t3:8200 -n4:161M:+128M -c4:root"
ROLE_MD = "/dev/md1"


def ansible_role_layout(
    vm: Vm, disks: Sequence[str], mountpoint: str, data: str = "model.safetensors", *, resynced: bool = True
) -> dict[str, str]:
    """What roles/gpu_model_storage left on k8s-worker-02, built on two blank disks (guest paths,
    by-id): OS partitions 1-4, partition 5 from 34 GB (parted's decimal units) of
    gpu_model_storage_partition_size_gb (1 here), `mdadm --create /dev/md1`, mkfs.xfs,
    ansible.posix.mount by UUID with nofail, `mdadm --detail --scan` appended to mdadm.conf, and a
    16 MiB file of data, the array resynced (the role ran long ago). With ``resynced=False`` the
    array's first resync is slowed to 1 MB/s and still runs when this returns (about 17 minutes;
    ``echo system > /sys/block/md1/md/sync_speed_max`` lets it finish). The disks must be larger
    than 35 GB (sparse files are). Returns the data's path and sha256, the filesystem's and the
    array's UUID and partition 5's start (bytes)."""
    a, b = disks
    vm.run_script(
        "set -euo pipefail\n"
        f"for d in {a} {b}; do sgdisk {ROLE_OS_TABLE} $d >/dev/null; parted -s -a optimal $d mkpart primary 34GB 35GB; done\n"
        f"partprobe {a} {b}; udevadm settle\n"
        f"mdadm --create {ROLE_MD} --level=1 --raid-devices=2 --metadata=1.2 --run {a}-part5 {b}-part5\n"
        + ("" if resynced else "echo 1000 > /sys/block/md1/md/sync_speed_max\n")
        + f"mkfs.xfs -q {ROLE_MD}; udevadm settle\n"
        f"mkdir -p {mountpoint}; echo \"UUID=$(blkid -s UUID -o value {ROLE_MD}) {mountpoint} xfs defaults,nofail 0 0\" >> /etc/fstab\n"
        # Only md1's line: the machine may run other arrays (the lab VM runs the lab stack's).
        f"mdadm --detail --scan | grep '^ARRAY {ROLE_MD} ' >> /etc/mdadm/mdadm.conf\n"
        f"mount {mountpoint}; head -c 16M /dev/urandom > {mountpoint}/{data}; sync\n"
        + ("while [ $(cat /sys/block/md1/md/sync_action) != idle ]; do sleep 1; done\n" if resynced else ""),
        timeout=900,
    )

    def out(command: str) -> str:
        return vm.ssh(command).stdout.strip()

    path = f"{mountpoint}/{data}"
    return {
        "path": path,
        "data": out(f"sha256sum {path}").split()[0],
        "fs_uuid": out(f"blkid -s UUID -o value {ROLE_MD}"),
        "md_uuid": out(f"mdadm --detail --export {ROLE_MD} | sed -n 's/^MD_UUID=//p'"),
        "start": out(f"parted -m -s {a} unit B print | grep '^5:' | cut -d: -f2"),
    }
