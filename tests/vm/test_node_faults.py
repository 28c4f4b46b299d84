"""Node faults on a real kernel: each stops before any write, says what to do, and leaves the disks
byte-identical (first and last MiB of each disk image, the partition tables, the OS partitions).

Steps run as `pulumi up` runs them: the rendered scripts in order over SSH, stopping at the first
that fails. Skipped unless GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.vm import MiB, Vm, make_os_like_layout, os_layout_regions, partition_sha256s
from testbed.vm.steps import create_scripts

DISKS = ("gs-disk-a", "gs-disk-b")
MOUNT = "/mnt/models"
ORDER = ["10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health"]


def steps_for(disks: list[str], size_gb: int = 2) -> list[tuple[str, str]]:
    scripts = create_scripts({"disks": disks, "sizeGb": size_gb, "raidName": "models", "mountpoint": MOUNT})
    return [(name, scripts[name]) for name in ORDER]


def pulumi_up(vm: Vm, steps: list[tuple[str, str]]) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run the steps in order; return the first that fails and its result."""
    for name, script in steps:
        result = vm.ssh(script, check=False, timeout=900)
        if result.returncode != 0:
            return name, result
    raise AssertionError("every step succeeded, but this fault must be refused")


def disk_state(vm: Vm) -> dict[str, Any]:
    tables = vm.ssh(" ".join(f"sfdisk --dump {Vm.by_id(d)} | sha256sum;" for d in DISKS)).stdout
    return {
        # First and last MiB and the OS partitions' bytes, hashed on the host once the guest has
        # flushed (a guest sha256 of the 576 MiB of OS partitions costs TCG seconds per call);
        # the partition table, which says where those partitions lie, is in "tables".
        "images": {d: vm.checksum_disk(d, [(0, MiB), (-MiB, MiB), *os_layout_regions()]) for d in DISKS},
        "tables": tables,
        "md": vm.ssh("cat /proc/mdstat; ls /dev/md 2>/dev/null || true").stdout,
    }


@pytest.fixture(scope="module")
def layout(vm: Vm) -> dict[str, str]:
    return make_os_like_layout(vm, DISKS)


def assert_refused(vm: Vm, layout: dict[str, str], steps: list[tuple[str, str]], words: str) -> str:
    before = disk_state(vm)
    step, result = pulumi_up(vm, steps)
    assert step == "10-preflight", (step, result.stderr)
    assert words in result.stderr, result.stderr
    assert result.stderr.strip().startswith("ERROR: ")
    assert disk_state(vm) == before
    return result.stderr


def test_a_disk_path_that_does_not_exist(vm: Vm, layout: dict[str, str]) -> None:
    message = assert_refused(vm, layout, steps_for([Vm.by_id(DISKS[0]), "/dev/disk/by-id/virtio-gs-missing"]),
                             "/dev/disk/by-id/virtio-gs-missing is not a block device on this node")
    assert "ls -l /dev/disk/by-id" in message


def test_a_disk_smaller_than_the_partition(vm: Vm, layout: dict[str, str]) -> None:
    message = assert_refused(vm, layout, steps_for([Vm.by_id(d) for d in DISKS], size_gb=5), "bytes free after its last partition")
    assert "lower storage.sizeGb" in message


def test_the_raid_name_used_by_a_different_array(vm: Vm, layout: dict[str, str]) -> None:
    vm.run_script(
        "set -e; for i in 0 1; do truncate -s 64M /root/other$i.img; done\n"
        "a=$(losetup -f --show /root/other0.img); b=$(losetup -f --show /root/other1.img)\n"
        "mdadm --create /dev/md/models --run --level=1 --raid-devices=2 --metadata=1.2 --homehost=any --name=models $a $b\n"
        # Resynced before the snapshot: its progress in /proc/mdstat would differ before and after.
        "udevadm settle; test -e /dev/md/models; mdadm --wait /dev/md/models || true"
    )
    try:
        message = assert_refused(vm, layout, steps_for([Vm.by_id(d) for d in DISKS]),
                                 "/dev/md/models already exists and is not built from our gs-models partitions")
        assert "choose another storage.raidName" in message
    finally:
        vm.run_script("mdadm --stop /dev/md/models; losetup -D; rm -f /root/other*.img", check=False)


def test_the_mountpoint_used_by_another_filesystem(vm: Vm, layout: dict[str, str]) -> None:
    vm.ssh(f"mkdir -p {MOUNT} && mount -t tmpfs -o size=1M other {MOUNT}")
    try:
        message = assert_refused(vm, layout, steps_for([Vm.by_id(d) for d in DISKS]), f"other is mounted at {MOUNT}, not our array")
        assert "choose another storage.mountpoint" in message
    finally:
        vm.ssh(f"umount {MOUNT}", check=False)


@pytest.mark.parametrize("target", ["/mnt/models/", "/mnt//models", "/mnt/\\155odels", "/mnt/gs-link/models"])
def test_an_fstab_line_for_the_mountpoint_is_refused_however_spelt(vm: Vm, layout: dict[str, str], target: str) -> None:
    # mount(8) and the boot take each of these for /mnt/models; preflight compared the text (#44).
    fstab = vm.ssh("cp -p /etc/fstab /root/fstab.kept && ln -sfn /mnt /mnt/gs-link && cat /etc/fstab").stdout.rstrip("\n") + "\n"
    vm.put_file(fstab + f"tmpfs {target} tmpfs size=1m 0 0\n", "/etc/fstab")
    try:
        line = len(fstab.splitlines()) + 1
        message = assert_refused(vm, layout, steps_for([Vm.by_id(d) for d in DISKS]),
                                 f"/etc/fstab line {line} mounts tmpfs at {target}, which is storage.mountpoint {MOUNT}")
        assert "Remove or comment out that line (or choose another storage.mountpoint)" in message
    finally:
        vm.ssh("cp -p /root/fstab.kept /etc/fstab && rm /mnt/gs-link")


def test_a_wrong_ssh_key_runs_nothing(vm: Vm, layout: dict[str, str], tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    before = disk_state(vm)
    _, script = steps_for([Vm.by_id(d) for d in DISKS])[1]  # the partition step: it would write
    result = vm.ssh(script, key_path=wrong, check=False, timeout=60)
    assert result.returncode == 255
    assert "Permission denied" in result.stderr
    assert disk_state(vm) == before


def test_after_the_faults_the_same_disks_still_prepare_cleanly(vm: Vm, layout: dict[str, str]) -> None:
    """The refusals left nothing behind that would stop a correct config."""
    steps = steps_for([Vm.by_id(d) for d in DISKS])
    for name, script in steps:
        result = vm.ssh(script, check=False, timeout=900)
        assert result.returncode == 0, (name, result.stderr)
    assert vm.ssh(f"findmnt -n -o FSTYPE {MOUNT}").stdout.strip() == "xfs"
    assert partition_sha256s(vm, layout) == layout
