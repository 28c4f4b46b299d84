"""Adopting the array the Ansible role built, on NVMe disks larger than 2 TiB (issue 13, item 11).

One VM with two 3 TiB sparse NVMe disks (guest names nvme0n1/nvme1n1, partitions `p`-suffixed). In
file order:

    the role's exact layout (OS partitions, partition 5 at the role's fixed 34 GB start, RAID1
    /dev/md1, XFS, its fstab and mdadm.conf lines, data), its first resync still running ->
    adopted with storage.adopt during the resync, the grow refused until it ends -> grown once it
    has: nothing created or formatted, data kept, one fstab and one ARRAY line -> a second run changes
    nothing -> a reboot brings it back as /dev/md/models, mounted -> a second array built by us
    past the 2 TiB mark of the same disks -> a boot with one disk missing starts the adopted array
    degraded and mounts it.

Skipped unless GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.vm import BootedState, GiB, Vm, ansible_role_layout, running
from testbed.vm.steps import create_scripts

NAMES = ("gs-nvme-a", "gs-nvme-b")
MOUNT = "/mnt/ollama-models"
MD = "/dev/md/models"
CONF = "/etc/mdadm/mdadm.conf"
ORDER = ["10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health"]


def up(vm: Vm, steps: dict[str, str], names: list[str] = ORDER) -> dict[str, dict[str, Any]]:
    reports = {}
    for name in names:
        result = vm.ssh(steps[name], check=False, timeout=900)
        assert result.returncode == 0, (name, result.stdout, result.stderr, vm.guest_report())
        reports[name] = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    return reports


def sha(vm: Vm, path: str) -> str:
    return vm.ssh(f"sha256sum {path}").stdout.split()[0]


@pytest.fixture(scope="module")
def vm(vm_booted: BootedState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    with running(tmp_path_factory.mktemp("vm"), [(n, 3 * 1024 * GiB) for n in NAMES], booted=vm_booted, nvme=NAMES) as machine:
        yield machine


@pytest.fixture(scope="module")
def node(vm: Vm) -> dict[str, Any]:
    disks = [vm.disk_id(n) for n in NAMES]
    built = ansible_role_layout(vm, disks, MOUNT, resynced=False)
    assert vm.ssh("cat /sys/block/md1/md/bitmap/location").stdout.strip() == "none"  # mdadm adds none below 100 GB
    return {
        "disks": disks,
        **built,
        "steps": create_scripts({"disks": disks, "sizeGb": 2, "raidName": "models", "mountpoint": MOUNT, "adopt": "/dev/md1"}),
    }


def test_the_roles_array_is_adopted_during_its_resync_and_grown_only_after(vm: Vm, node: dict[str, Any]) -> None:
    # A node the role set up just before the migration (or that crashed): its array still resyncs.
    reports = up(vm, node["steps"], ORDER[:5])
    assert vm.ssh("cat /sys/block/md1/md/sync_action").stdout.strip() == "resync"  # it really met one
    assert reports["40-filesystem"]["uuid"] == node["fs_uuid"] and reports["30-raid"]["uuid"] == node["md_uuid"]
    assert vm.ssh(f"readlink -f {MD}").stdout.strip() == vm.ssh("readlink -f /dev/md1").stdout.strip()
    assert vm.ssh(f"findmnt -n -o SOURCE {MOUNT}").stdout.strip() == vm.ssh("readlink -f /dev/md1").stdout.strip()
    tables = {disk: vm.ssh(f"parted -m -s {disk} unit B print").stdout for disk in node["disks"]}
    grow = vm.ssh(node["steps"]["60-grow"], check=False, timeout=300)
    assert grow.returncode != 0
    errors = [line for line in grow.stderr.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {MD}: resync in progress, "), grow.stderr
    assert "re-run pulumi up later" in errors[0]
    assert {disk: vm.ssh(f"parted -m -s {disk} unit B print").stdout for disk in node["disks"]} == tables  # nothing grown
    health = up(vm, node["steps"], ["70-health"])["70-health"]
    assert health["health"] == "resyncing", health
    assert sha(vm, f"{MOUNT}/model.safetensors") == node["data"]


def test_the_roles_array_is_grown_with_its_data_once_the_resync_ends(vm: Vm, node: dict[str, Any]) -> None:
    vm.ssh("echo system > /sys/block/md1/md/sync_speed_max && mdadm --wait /dev/md1 || true", timeout=900)
    assert vm.ssh("cat /sys/block/md1/md/sync_action").stdout.strip() == "idle"
    reports = up(vm, node["steps"])
    assert [d["partition"] for d in reports["10-preflight"]["disks"]] == ["adopt", "adopt"]
    assert reports["40-filesystem"]["result"] == "unchanged"
    assert reports["40-filesystem"]["uuid"] == node["fs_uuid"]  # not formatted
    assert reports["30-raid"]["uuid"] == node["md_uuid"]
    assert sorted(reports["30-raid"]["members"]) == ["/dev/nvme0n1p5", "/dev/nvme1n1p5"]
    assert vm.ssh(f"readlink -f {MD}").stdout.strip() == vm.ssh("readlink -f /dev/md1").stdout.strip()
    assert sha(vm, f"{MOUNT}/model.safetensors") == node["data"]
    # One ARRAY line (ours, by UUID) and one fstab line for the mountpoint (ours), no duplicates.
    conf = [line for line in vm.ssh(f"cat {CONF}").stdout.splitlines() if line.startswith("ARRAY")]
    assert conf == [f"ARRAY {MD} metadata=1.2 UUID={node['md_uuid']}"]
    fstab = [line for line in vm.ssh("cat /etc/fstab").stdout.splitlines() if MOUNT in line]
    assert len(fstab) == 1 and fstab[0].startswith(f"UUID={node['fs_uuid']} {MOUNT} xfs noatime,nofail"), fstab
    # The partitions carry our name now, and grew in place from the role's 34 GB start (aligned).
    assert 34 * 10**9 <= int(node["start"].rstrip("B")) < 34 * 10**9 + 2**20
    for disk in node["disks"]:
        table = vm.ssh(f"parted -m -s {disk} unit B print").stdout
        assert f"5:{node['start']}:" in table and ":gs-models:" in table, table
    assert reports["60-grow"]["result"] == "changed"
    assert vm.ssh(f"cat /sys/block/$(basename $(readlink -f {MD}))/md/bitmap/location").stdout.strip() != "none"
    assert reports["70-health"]["usableBytes"] > 1_900_000_000
    assert reports["70-health"]["health"] in ("clean", "resyncing")


def test_a_second_run_changes_nothing(vm: Vm, node: dict[str, Any]) -> None:
    vm.ssh(f"while [ $(cat /sys/block/$(basename $(readlink -f {MD}))/md/sync_action) != idle ]; do sleep 1; done", timeout=900)
    reports = up(vm, node["steps"])
    assert {name: r["result"] for name, r in reports.items()} == dict.fromkeys(ORDER, "unchanged")


def test_after_a_reboot_it_is_our_array_by_name(vm: Vm, node: dict[str, Any]) -> None:
    vm.reboot()
    assert vm.ssh(f"findmnt -n -o SOURCE {MOUNT}").stdout.strip() == vm.ssh(f"readlink -f {MD}").stdout.strip()
    assert sha(vm, f"{MOUNT}/model.safetensors") == node["data"]
    reports = up(vm, node["steps"])
    assert {name: r["result"] for name, r in reports.items()} == dict.fromkeys(ORDER, "unchanged")


def test_a_second_array_past_2_tib_on_the_same_disks(vm: Vm, node: dict[str, Any]) -> None:
    # A filler partition (no data) up to 2.2 TB: the next partition starts past the 2 TiB mark.
    for disk in node["disks"]:
        vm.ssh(f"parted -s -a optimal {disk} mkpart filler 36GB 2200GB && udevadm settle")
    steps = create_scripts({"disks": node["disks"], "sizeGb": 1, "raidName": "big", "mountpoint": "/mnt/big"})
    reports = up(vm, steps)
    assert sorted(reports["30-raid"]["members"]) == ["/dev/nvme0n1p7", "/dev/nvme1n1p7"]
    for disk in node["disks"]:
        start = vm.ssh(f"parted -m -s {disk} unit B print | grep ':gs-big:' | cut -d: -f2").stdout.strip()
        assert int(start.rstrip("B")) > 2 * 1024**4
    assert reports["40-filesystem"]["result"] == "changed"
    assert vm.ssh("findmnt -n -o FSTYPE /mnt/big").stdout.strip() == "xfs"
    assert sha(vm, f"{MOUNT}/model.safetensors") == node["data"]


# What storage.adopt refuses, each built on a fresh pair of partitions 8 and refused by every step
# that checks the adoption, before any write: (mdadm --create arguments, mkfs, the ERROR's words).
NOT_ADOPTABLE = [
    # Metadata 1.0 (or 0.90): the XFS at each member's start makes the members look foreign, and a
    # grown partition leaves the superblock behind.
    ("--metadata=1.0 --level=1 --raid-devices=2 --assume-clean {a} {b}", "mkfs.xfs -q", "has metadata 1.0 (superblock at the end"),
    ("--level=1 --raid-devices=2 --assume-clean {a} {b}", "mkfs.ext4 -q", "carries ext4, not XFS; only an XFS array can be adopted"),
    ("--level=0 --raid-devices=2 {a} {b}", "mkfs.xfs -q", "is raid0 with 2 members; only a two-member RAID1 can be adopted"),
    # Degraded: only a's member; adopt it after the repair.
    ("--level=1 --raid-devices=2 --assume-clean {a} missing", "mkfs.xfs -q", "has no member on"),
]


def test_what_cannot_be_adopted_is_refused_before_any_write(vm: Vm, node: dict[str, Any]) -> None:
    parts = []
    for disk in node["disks"]:
        vm.ssh(f"parted -s -a optimal {disk} mkpart legacy 2300GB 2301GB && udevadm settle")
        parts.append(vm.ssh(f"readlink -f {disk}-part8").stdout.strip())
    files = vm.ssh(f"sha256sum {CONF} /etc/fstab").stdout
    storage = {"disks": node["disks"], "sizeGb": 1, "raidName": "legacy2", "mountpoint": "/mnt/legacy", "adopt": "/dev/md/legacy"}
    steps = create_scripts(storage)
    for create, mkfs, words in NOT_ADOPTABLE:
        members = create.format(a=parts[0], b=parts[1])
        vm.ssh(f"mdadm --create /dev/md/legacy {members} --run && {mkfs} /dev/md/legacy && udevadm settle")
        arrays = vm.ssh("ls /dev/md").stdout
        try:
            for name in ("10-preflight", "20-partition", "30-raid"):
                result = vm.ssh(steps[name], check=False, timeout=300)
                assert result.returncode != 0, (words, name)
                errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR: ")]
                assert len(errors) == 1 and words in errors[0] and "storage.adopt: /dev/md/legacy" in errors[0], (name, result.stderr)
            assert vm.ssh(f"sha256sum {CONF} /etc/fstab").stdout == files and vm.ssh("ls /dev/md").stdout == arrays
        finally:
            # The filesystem inside the array too: the next variant's mkfs (never forced) would refuse it.
            vm.ssh(f"wipefs -a -q /dev/md/legacy; mdadm --stop /dev/md/legacy; wipefs -a -q {' '.join(parts)}; udevadm settle", check=False)
    assert sha(vm, f"{MOUNT}/model.safetensors") == node["data"]


def test_a_boot_with_a_disk_missing_starts_the_adopted_array_degraded(vm: Vm, node: dict[str, Any]) -> None:
    # The role named the array <host>:1; the boot unit must find it by UUID as well as by our name.
    vm.stop()
    vm.start(attach=[NAMES[0]])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and vm.ssh(f"findmnt -n {MOUNT}", check=False).returncode != 0:
        time.sleep(5)
    diagnostics = vm.ssh("cat /proc/mdstat; journalctl -b --no-pager -u 'gpu-serving-array-*' | tail -20").stdout
    assert vm.ssh(f"findmnt -n -o SOURCE {MOUNT}", check=False).stdout.strip() == vm.ssh(f"readlink -f {MD}").stdout.strip(), diagnostics
    assert sha(vm, f"{MOUNT}/model.safetensors") == node["data"]
    degraded = vm.ssh(f"cat /sys/block/$(basename $(readlink -f {MD}))/md/degraded").stdout.strip()
    assert degraded == "1", diagnostics
