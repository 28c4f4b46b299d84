"""Disk steps against real-server situations (issue 13): no path to data loss.

One VM for the module; the tests build on each other in file order:

    disks that are not plain disks -> a blank disk beside OS partitions -> first build with mkfs
    killed midway -> a damaged superblock is not formatted -> grow during a resync -> a new disk
    under a moved kernel name -> a 4Kn replacement -> a stale member and an array under another
    name with a blank member -> two runs at once -> an MBR disk -> a parted error.

Disks: a and b (4 GiB, OS-like partitions 1-4 then free space, like the seed's sda/sdb), c (4 GiB,
4096-byte logical sectors) and d (4 GiB, blank). Steps are the RENDERED scripts, sent as
pulumi_command sends them. Each refusal is checked to leave the disks as they were. Skipped unless
GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.vm import BootedState, GiB, Vm, make_os_like_layout, partition_sha256s, running
from testbed.vm.steps import create_scripts

DISKS = (("gs-disk-a", 4 * GiB), ("gs-disk-b", 4 * GiB), ("gs-disk-c", 4 * GiB), ("gs-disk-d", 4 * GiB))
A, B, C, D = (Vm.by_id(name) for name, _ in DISKS)
MOUNT = "/mnt/models"
MD = "/dev/md/models"
ORDER = ["10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health"]
OS_TABLE = "-n1:1M:+32M -c1:efi -t1:ef00 -n2:33M:+64M -c2:boot -n3:97M:+64M -c3:swap -t3:8200 -n4:161M:+128M -c4:root"


def steps_for(disks: list[str], size_gb: int = 1) -> dict[str, str]:
    return create_scripts({"disks": disks, "sizeGb": size_gb, "raidName": "models", "mountpoint": MOUNT})


def up(vm: Vm, steps: dict[str, str], names: list[str] = ORDER) -> tuple[str, subprocess.CompletedProcess[str]] | None:
    """Run the steps in order as `pulumi up` does; the first that fails and its result, or None."""
    for name in names:
        result = vm.ssh(steps[name], check=False, timeout=900)
        if result.returncode != 0:
            return name, result
    return None


def refused(vm: Vm, steps: dict[str, str], words: str, disks: list[str], names: list[str] = ORDER, at: str = "10-preflight") -> str:
    """The steps stop at `at` with `words` in the message, and `disks` are byte-identical."""
    before = tables(vm, disks)
    failed = up(vm, steps, names)
    assert failed is not None, f"every step succeeded; expected a refusal at {at} saying {words!r}"
    step, result = failed
    assert step == at, (step, result.stderr)
    assert words in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("ERROR: ")
    assert tables(vm, disks) == before
    return result.stderr


def tables(vm: Vm, disks: list[str]) -> str:
    """Partition tables and the first and last MiB of each disk, hashed in the guest."""
    script = "sync; " + " ".join(
        f"dd if={d} bs=1M count=1 status=none | sha256sum; dd if={d} bs=1M skip=4095 status=none | sha256sum;" for d in disks
    )
    return vm.ssh(script).stdout


def sha(vm: Vm, path: str) -> str:
    return vm.ssh(f"sha256sum {shlex.quote(path)}").stdout.split()[0]


def md_sys(vm: Vm, attr: str) -> str:
    return vm.ssh(f"cat /sys/block/$(basename $(readlink -f {MD}))/md/{attr}").stdout.strip()


def members(vm: Vm) -> str:
    return vm.ssh(f"mdadm --detail {MD} | sed -n '/Number/,$p'").stdout


def slaves(vm: Vm) -> list[str]:
    """Kernel names of the array's members (active, spare or rebuilding)."""
    return vm.ssh(f"ls /sys/block/$(basename $(readlink -f {MD}))/slaves/").stdout.split()


def kernel_name(vm: Vm, path: str) -> str:
    return vm.ssh(f"basename $(readlink -f {path})").stdout.strip()


def idle(vm: Vm) -> None:
    """Wait for the array's resync or recovery to end (a timeout, not a timing assert)."""
    vm.ssh(f"while [ $(cat /sys/block/$(basename $(readlink -f {MD}))/md/sync_action) != idle ]; do sleep 1; done", timeout=900)


@pytest.fixture(scope="module")
def vm(vm_booted: BootedState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    with running(tmp_path_factory.mktemp("vm"), DISKS, booted=vm_booted, sector_sizes={"gs-disk-c": 4096}) as machine:
        yield machine


@pytest.fixture(scope="module")
def node(vm: Vm) -> dict[str, Any]:
    layout = make_os_like_layout(vm, ["gs-disk-a", "gs-disk-b"])
    return {"layout": layout, "steps": steps_for([A, B])}


# ---------------------------------------------------------------------------- item 5


def test_a_loop_device_is_not_a_plain_disk(vm: Vm, node: dict[str, Any]) -> None:
    loop = vm.ssh("truncate -s 4G /root/lo.img && losetup -f --show /root/lo.img").stdout.strip()
    try:
        refused(vm, steps_for([A, loop]), "is a device-mapper, md or loop device, not a plain disk", [A])
    finally:
        vm.ssh(f"losetup -d {loop}; rm -f /root/lo.img", check=False)


def test_a_disk_held_by_a_device_mapper_map_is_refused(vm: Vm, node: dict[str, Any]) -> None:
    vm.ssh(f"dmsetup create gs-held --table \"0 $(blockdev --getsz {D}) linear $(readlink -f {D}) 0\" && udevadm settle")
    try:
        refused(vm, steps_for([A, D]), "is in use by dm-", [A, D])
        refused(vm, steps_for([A, "/dev/mapper/gs-held"]), "not a plain disk", [A, D])
    finally:
        vm.ssh("dmsetup remove gs-held", check=False)


def test_a_whole_disk_raid_member_is_refused(vm: Vm, node: dict[str, Any]) -> None:
    # A stopped whole-disk array (no holder left) over a GPT: parted still shows the GPT and free
    # space; the array's superblock at the end of the disk is what gives it away.
    vm.run_script(
        f"set -e; sgdisk -o -n1:1M:+100M {D} >/dev/null; truncate -s 64M /root/peer.img; p=$(losetup -f --show /root/peer.img)\n"
        f"mdadm --create /dev/md/whole --run --level=1 --raid-devices=2 --metadata=1.0 --homehost=any --size=32M {D} $p\n"
        f"mdadm --stop /dev/md/whole; losetup -d $p; rm -f /root/peer.img; udevadm settle"
    )
    try:
        refused(vm, steps_for([A, D]), "is a member of a whole-disk RAID", [A, D])
    finally:
        vm.ssh(f"wipefs -a -q {D}; sgdisk -Z {D} >/dev/null; partprobe {D}; udevadm settle", check=False)


def test_a_grown_lun_is_refused_until_its_gpt_is_fixed(vm: Vm, node: dict[str, Any]) -> None:
    # The GPT of a 2 GiB disk on what is now a 4 GiB disk: parted shows free space mkpart refuses.
    vm.run_script(
        f"set -e; truncate -s 2G /root/small.img; sgdisk -o -n1:1M:+100M /root/small.img >/dev/null\n"
        f"dd if=/root/small.img of={D} bs=1M count=1 conv=notrunc status=none\n"
        f"dd if=/root/small.img of={D} bs=1M skip=2047 seek=2047 count=1 conv=notrunc status=none\n"
        f"rm /root/small.img; partprobe {D}; udevadm settle"
    )
    try:
        message = refused(vm, steps_for([A, D]), "backup GPT header is not at the end of the disk", [A, D])
        assert "Move the backup header with 'sgdisk -e /dev/" in message
    finally:
        vm.ssh(f"sgdisk -Z {D} >/dev/null; wipefs -a -q {D}; partprobe {D}; udevadm settle", check=False)


# ---------------------------------------------------------------------------- item 3


def test_a_blank_disk_beside_os_partitions_gets_no_partition_where_they_are(vm: Vm, node: dict[str, Any]) -> None:
    steps = steps_for([A, D])
    message = refused(vm, steps, "virtio-gs-disk-a has partition 1 (efi)", [A, D])
    assert f"sgdisk -R {vm.ssh(f'readlink -f {D}').stdout.strip()}" in message
    # The partition step checks it too (a preflight from an older run, or none at all).
    refused(vm, steps, "where ours would go", [A, D], names=["20-partition"], at="20-partition")


# ---------------------------------------------------------------------------- items 2 and 1


def test_an_xfs_left_by_a_killed_mkfs_is_made_again(vm: Vm, node: dict[str, Any]) -> None:
    steps = node["steps"]
    assert up(vm, steps, ORDER[:3]) is None
    # What mkfs.xfs leaves when killed before its last write: a superblock with sb_inprogress=1.
    vm.ssh(f"mkfs.xfs -q {MD} && xfs_db -x -c 'sb 0' -c 'write inprogress 1' {MD} && udevadm settle")
    result = vm.ssh(steps["40-filesystem"], timeout=900)
    assert "never finished" in result.stdout
    assert json.loads(result.stdout.splitlines()[-1])["result"] == "changed"
    assert vm.ssh(f"xfs_db -r -c 'sb 0' -c 'p inprogress' {MD}").stdout.strip() == "inprogress = 0"
    assert up(vm, steps, ORDER[3:]) is None
    assert vm.ssh(f"findmnt -n -o FSTYPE {MOUNT}").stdout.strip() == "xfs"
    vm.ssh(f"head -c 8M /dev/urandom > {MOUNT}/weights.bin && sync")
    node["data"] = sha(vm, f"{MOUNT}/weights.bin")
    assert partition_sha256s(vm, node["layout"]) == node["layout"]


def test_a_filesystem_with_a_damaged_superblock_is_not_formatted(vm: Vm, node: dict[str, Any]) -> None:
    # One damaged byte makes the XFS invisible to blkid (the magic here; a bad CRC does the same with
    # util-linux >= 2.39): the array looks empty, but it is not the array this program just created.
    vm.ssh(f"umount {MOUNT} && printf Y | dd of={MD} bs=1 count=1 conv=notrunc status=none && udevadm settle")
    assert vm.ssh(f"blkid -p {MD}", check=False).returncode == 2  # nothing found
    try:
        result = vm.ssh(node["steps"]["40-filesystem"], check=False, timeout=900)
        assert result.returncode != 0, result.stdout
        assert "not an array this program has just created" in result.stderr
        assert f"xfs_repair -n {MD}" in result.stderr
    finally:
        vm.ssh(f"printf X | dd of={MD} bs=1 count=1 conv=notrunc status=none && udevadm settle")
    assert up(vm, node["steps"], ["40-filesystem", "50-mount"]) is None
    assert sha(vm, f"{MOUNT}/weights.bin") == node["data"]


# ---------------------------------------------------------------------------- item 7


def test_grow_waits_for_a_resync_and_keeps_the_bitmap(vm: Vm, node: dict[str, Any]) -> None:
    md = vm.ssh(f"basename $(readlink -f {MD})").stdout.strip()
    limits = "/proc/sys/dev/raid/speed_limit_min /proc/sys/dev/raid/speed_limit_max"
    saved = vm.ssh(f"cat {limits}").stdout.split()
    vm.ssh(f"for f in {limits}; do echo 1 > $f; done; echo check > /sys/block/{md}/md/sync_action")
    bigger = steps_for([A, B], size_gb=2)
    before = tables(vm, [A, B])
    try:
        assert vm.ssh(f"cat /sys/block/{md}/md/sync_action").stdout.strip() == "check"
        result = vm.ssh(bigger["60-grow"], check=False, timeout=900)
        assert result.returncode != 0
        assert "check in progress" in result.stderr and "re-run pulumi up later" in result.stderr, result.stderr
        assert md_sys(vm, "bitmap/location") != "none"
        assert tables(vm, [A, B]) == before
    finally:
        vm.ssh(f"echo idle > /sys/block/{md}/md/sync_action; echo {saved[0]} > /proc/sys/dev/raid/speed_limit_min; "
               f"echo {saved[1]} > /proc/sys/dev/raid/speed_limit_max")
    idle(vm)
    assert up(vm, bigger, ["10-preflight", "20-partition", "60-grow"]) is None
    assert md_sys(vm, "bitmap/location") != "none"
    assert sha(vm, f"{MOUNT}/weights.bin") == node["data"]
    node["steps"] = bigger


# ---------------------------------------------------------------------------- items 6 and 4


def test_a_new_disk_under_a_moved_name_is_not_added_to_a_healthy_array(vm: Vm, node: dict[str, Any]) -> None:
    vm.ssh(f"sgdisk -R {D} {A} >/dev/null && sgdisk -G {D} >/dev/null && sgdisk -d 5 {D} >/dev/null && partprobe {D} && udevadm settle")
    idle(vm)
    steps = steps_for([A, D], size_gb=2)
    message = refused(vm, steps, "already has all its members active", [A, B, D])
    assert "/dev/disk/by-id" in message
    assert "spare" not in members(vm)
    # The raid step refuses on its own too, once D has its partition (preflight passed over).
    assert up(vm, steps, ["20-partition"]) is None
    refused(vm, steps, "already has all its members active; refusing to add it as a spare", [A, B, D], names=["30-raid"], at="30-raid")
    assert "spare" not in members(vm)


def test_a_4kn_disk_does_not_replace_a_512_byte_member(vm: Vm, node: dict[str, Any]) -> None:
    vm.ssh(f"sgdisk {OS_TABLE} {C} >/dev/null && partprobe {C} && udevadm settle")
    vm.ssh(f"mdadm {MD} --fail {B}-part5 && mdadm {MD} --remove {B}-part5")
    steps = steps_for([A, C], size_gb=2)
    refused(vm, steps, "4096-byte logical sectors", [A, C])
    # The raid step refuses too, after the partition step made the partition.
    assert up(vm, steps, ["20-partition"]) is None
    refused(vm, steps, "4096-byte logical sectors", [A, C], names=["30-raid"], at="30-raid")
    assert md_sys(vm, "../queue/logical_block_size") == "512"
    assert slaves(vm) == [kernel_name(vm, f"{A}-part5")]


# ---------------------------------------------------------------------------- item 8


def test_a_stale_member_is_assembled_around_and_re_added(vm: Vm, node: dict[str, Any]) -> None:
    # b back in the array (it left in the previous test), then the array is started without it
    # (as at a boot with b missing) and written to: a's superblock still counts b as active, b's
    # superblock is older. Plain `mdadm --assemble` of both leaves such an array inactive.
    vm.ssh(f"umount {MOUNT} && mdadm --stop {MD} && udevadm settle")
    assert up(vm, node["steps"], ["30-raid"]) is None
    idle(vm)
    assert len(slaves(vm)) == 2
    vm.run_script(
        f"set -e; mdadm --stop {MD}; mdadm --assemble --run {MD} {A}-part5; udevadm settle; mount {MD} {MOUNT}\n"
        f"head -c 4M /dev/urandom > {MOUNT}/while-b-was-away.bin; sync; umount {MOUNT}; mdadm --stop {MD}; udevadm settle"
    )
    result = vm.ssh(node["steps"]["30-raid"], check=False, timeout=900)
    assert result.returncode == 0, result.stderr
    assert md_sys(vm, "array_state") in ("clean", "active")
    assert sorted(slaves(vm)) == sorted([kernel_name(vm, f"{A}-part5"), kernel_name(vm, f"{B}-part5")])
    assert up(vm, node["steps"], ["50-mount"]) is None
    node["data2"] = sha(vm, f"{MOUNT}/while-b-was-away.bin")


def test_an_array_under_another_name_with_a_blank_member_ends_running_under_ours(vm: Vm, node: dict[str, Any]) -> None:
    idle(vm)
    # A replaced disk (b blank again) and the array assembled by someone else under another name.
    vm.run_script(
        f"set -e; umount {MOUNT}; mdadm --stop {MD}; mdadm --zero-superblock {B}-part5\n"
        f"mdadm --assemble --run /dev/md/other {A}-part5; udevadm settle; test ! -e {MD}"
    )
    result = vm.ssh(node["steps"]["30-raid"], check=False, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "re-assembling it as /dev/md/models" in result.stdout
    assert vm.ssh(f"test -b {MD} && test ! -e /dev/md/other", check=False).returncode == 0
    assert sorted(slaves(vm)) == sorted([kernel_name(vm, f"{A}-part5"), kernel_name(vm, f"{B}-part5")])
    assert up(vm, node["steps"], ["50-mount", "70-health"]) is None
    assert sha(vm, f"{MOUNT}/weights.bin") == node["data"]
    assert sha(vm, f"{MOUNT}/while-b-was-away.bin") == node["data2"]


def test_a_mounted_array_under_another_name_gets_ours_in_place(vm: Vm, node: dict[str, Any]) -> None:
    # What an initramfs that predates our ARRAY line leaves (md127 as /dev/md/<host>:models), while
    # pods read it: the raid step cannot stop it, so it names it in place and goes on to mdadm.conf.
    real = vm.ssh(f"readlink -f {MD}").stdout.strip()
    vm.run_script(
        "set -e; map=/run/mdadm/map\n"
        f"awk -v d={real.removeprefix('/dev/')} '$1 == d {{ $4 = \"/dev/md/other\" }} {{ print }}' $map > $map.new; mv $map.new $map\n"
        f"udevadm trigger --action=change {real}; udevadm settle; test ! -e {MD}; test -b /dev/md/other"
    )
    assert up(vm, node["steps"], ["10-preflight"]) is None  # its mount is our array's
    result = vm.ssh(node["steps"]["30-raid"], check=False, timeout=900)
    assert result.returncode == 0, result.stderr
    assert f"naming it {MD} in place" in result.stdout
    assert vm.ssh(f"readlink -f {MD}; test ! -e /dev/md/other", check=False).stdout.strip() == real
    assert vm.ssh(f"findmnt -n -o SOURCE {MOUNT}").stdout.strip() == real  # never unmounted
    assert up(vm, node["steps"], ["30-raid", "40-filesystem", "50-mount", "70-health"]) is None
    assert sha(vm, f"{MOUNT}/weights.bin") == node["data"]


# ---------------------------------------------------------------------------- items 9 and 10


def test_a_second_run_waits_for_the_lock_and_then_says_why(vm: Vm, node: dict[str, Any]) -> None:
    lock = "/run/gpu-serving/lock"  # made by the steps that ran before, root-only
    assert vm.ssh("stat -c '%u %a' /run/gpu-serving").stdout.split() == ["0", "700"]
    vm.ssh(
        f"setsid flock {lock} sleep 600 >/dev/null 2>&1 < /dev/null & echo $! > /root/holder.pid\n"
        f"while flock -n {lock} true; do sleep 0.2; done"
    )  # until the holder has it
    try:
        result = vm.ssh("export GS_LOCK_WAIT=2\n" + node["steps"]["20-partition"], check=False, timeout=120)
        assert result.returncode != 0
        # The last step that took it has exited, so the holder file is not believed.
        assert f"ERROR: another gpu-serving step (not a node step) has held {lock} on this node for 2s" in result.stderr, result.stderr
    finally:
        vm.ssh("kill -- -$(cat /root/holder.pid); rm -f /root/holder.pid", check=False)
    assert up(vm, node["steps"], ["20-partition"]) is None
    assert "20-partition, pid " in vm.ssh("cat /run/gpu-serving/holder").stdout


def test_an_mbr_disk_is_refused_without_advice_that_breaks_grub(vm: Vm, node: dict[str, Any]) -> None:
    vm.ssh(f"sgdisk -Z {D} >/dev/null; parted -s {D} mklabel msdos && udevadm settle")
    message = refused(vm, steps_for([A, D], size_gb=2), "has a 'msdos' partition table", [A, D])
    assert "GRUB" in message and "Do not convert a boot disk in place" in message


def test_a_parted_error_is_reported_not_read_as_no_label(vm: Vm, node: dict[str, Any]) -> None:
    # A GPT whose backup copy is destroyed: parted says so on stderr (exit 0) and would rewrite it.
    vm.ssh(f"sgdisk -Z {D} >/dev/null; sgdisk -o -n1:1M:+100M {D} >/dev/null && partprobe {D}; udevadm settle")
    vm.ssh(f"dd if=/dev/zero of={D} bs=1M seek=4095 count=1 status=none; udevadm settle")
    message = refused(vm, steps_for([A, D], size_gb=2), "parted cannot read", [A, D])
    assert "The backup GPT table is corrupt" in message
