"""Tests of the VM harness itself (one VM for the whole module; run with GS_VM_TESTS=1)."""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

import pytest

from testbed.vm import (
    OS_LAYOUT,
    GiB,
    MiB,
    SshError,
    Vm,
    checksum_regions,
    make_os_like_layout,
    os_layout_regions,
    os_layout_sha256s,
    partition_sha256s,
)

DISK_A, DISK_B = "gs-disk-a", "gs-disk-b"


def test_boots_its_own_kernel_and_initramfs(vm: Vm) -> None:
    out = vm.ssh("cat /proc/cmdline; hostname; findmnt -no SOURCE /; readlink -f /initrd.img").stdout
    cmdline, hostname, root_src, initrd = out.split("\n")[:4]
    # GRUB in the image's MBR loaded /vmlinuz + /initrd.img from the guest's own root fs
    assert cmdline.startswith("BOOT_IMAGE=/vmlinuz root=UUID=")
    # Forks cost a quarter under TCG without address randomisation; NVMe commands may wait long (build-image.sh).
    assert {"norandmaps", "nvme_core.io_timeout=600", "nvme_core.admin_timeout=600"} <= set(cmdline.split())
    assert hostname == "vmtest"
    assert root_src == "/dev/vda1"
    assert initrd.startswith("/boot/initrd.img-")
    conf = vm.ssh("grep -E '^MODULES=' /etc/initramfs-tools/initramfs.conf").stdout
    assert conf.strip() == "MODULES=list"


def test_extra_disks_visible_by_id(vm: Vm) -> None:
    out = vm.run_script(
        'for d in "$@"; do printf "%s %s\\n" "$(readlink -f "$d")" "$(blockdev --getsize64 "$d")"; done',
        args=[Vm.by_id(DISK_A), Vm.by_id(DISK_B)],
    ).stdout.split("\n")
    assert out[0] == f"/dev/vdb {4 * GiB}"
    assert out[1] == f"/dev/vdc {4 * GiB}"
    assert vm.disk_path(DISK_A) == vm.workdir / "gs-disk-a.raw"
    assert vm.disk_path(DISK_A).stat().st_size == 4 * GiB


def test_the_module_vm_is_a_fresh_copy_of_the_saved_boot(vm: Vm) -> None:
    # Resumed from the session's saved boot, not booted: its clock was set again, its random
    # state reseeded (a new VM generation ID), and its disks are blank files plugged in after.
    assert vm.resumed
    assert abs(float(vm.ssh("date +%s.%N").stdout) - time.time()) < 60
    assert "crng reseeded due to virtual machine fork" in vm.ssh("dmesg").stdout
    nonzero = vm.run_script('for d in "$@"; do dd if="$d" bs=1M count=8 status=none | tr -d "\\0" | wc -c; done',
                            args=[Vm.by_id(DISK_A), Vm.by_id(DISK_B)]).stdout.split()  # fmt: skip
    assert nonzero == ["0", "0"]


def test_md_module_loads(vm: Vm) -> None:
    vm.ssh("modprobe raid1")
    mdstat = vm.ssh("cat /proc/mdstat").stdout
    assert "Personalities" in mdstat and "[raid1]" in mdstat


def test_tools_present(vm: Vm) -> None:
    tools = (
        "mdadm parted sgdisk sfdisk wipefs blkid lsblk mkfs.xfs xfs_admin mkfs.ext4 "
        "udevadm update-initramfs lsinitramfs zstd findmnt blockdev partprobe ps"
    )
    vm.run_script('set -e; for t in "$@"; do command -v "$t" >/dev/null || { echo "missing $t"; exit 1; }; done',
                  args=tools.split())  # fmt: skip
    conf = vm.ssh("cat /etc/mdadm/mdadm.conf").stdout
    # the node scripts own this file; the image ships it without ARRAY lines
    assert not any(line.startswith("ARRAY") for line in conf.splitlines())


def test_ssh_helpers(vm: Vm, tmp_path: Path) -> None:
    r = vm.run_script('echo "args:$*"; cat >/dev/null; echo "$FOO"; exit 3', args=["a b", "c"],
                      env={"FOO": "bar baz"}, check=False)  # fmt: skip
    assert r.returncode == 3
    assert r.stdout == "args:a b c\nbar baz\n"
    with pytest.raises(SshError) as err:
        vm.ssh("echo to-stderr >&2; false")
    assert "to-stderr" in str(err.value)
    data = bytes(range(256)) * 64
    assert vm.ssh("sha256sum", input=data).stdout.split()[0] == hashlib.sha256(data).hexdigest()
    vm.put_file("hello\n", "/root/sub/hello.txt", mode="0600")
    assert vm.ssh("stat -c %a /root/sub/hello.txt; cat /root/sub/hello.txt").stdout == "600\nhello\n"
    # ssh_argv() lets other tools connect; a WRONG key is refused
    ok = subprocess.run([*vm.ssh_argv(), "true"], capture_output=True, timeout=60)
    assert ok.returncode == 0
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    bad = vm.ssh("true", key_path=wrong, check=False, timeout=60)
    assert bad.returncode == 255
    assert "Permission denied" in bad.stderr
    assert vm.host == "127.0.0.1" and vm.user == "root" and vm.port > 0 and vm.key_path.is_file()


def test_guest_report_names_the_disks_the_guest_still_has(vm: Vm) -> None:
    # What a failed step's message carries: a disk the kernel dropped is missing from this list.
    kernel_log = vm.ssh("echo 'gs-harness: a warning' > /dev/kmsg").returncode
    report = vm.guest_report()
    links = report.split("--- /dev/disk/by-id\n", 1)[1].split("--- /proc/mdstat", 1)[0].split()
    assert kernel_log == 0 and "gs-harness: a warning" in report.split("--- /dev/disk/by-id", 1)[0]
    assert Vm.by_id(DISK_A).rsplit("/", 1)[1] in links and Vm.by_id(DISK_B).rsplit("/", 1)[1] in links
    assert "Personalities :" in report.split("--- /proc/mdstat", 1)[1]


def test_checksum_regions_detects_a_changed_byte(tmp_path: Path) -> None:
    f = tmp_path / "d.raw"
    with open(f, "wb") as fh:
        fh.truncate(8 * MiB)
    regions = [(0, MiB), (-MiB, MiB), (3 * MiB, 4096)]
    before = checksum_regions(f, regions)
    assert set(before) == set(regions)
    with open(f, "r+b") as fh:
        fh.seek(8 * MiB - 1)
        fh.write(b"\x01")
    after = checksum_regions(f, regions)
    assert after[(0, MiB)] == before[(0, MiB)]
    assert after[(3 * MiB, 4096)] == before[(3 * MiB, 4096)]
    assert after[(-MiB, MiB)] != before[(-MiB, MiB)]
    with pytest.raises(ValueError):
        checksum_regions(f, [(8 * MiB - 10, 11)])


@pytest.fixture(scope="module")
def os_layout(vm: Vm) -> dict[str, str]:
    return make_os_like_layout(vm)


def test_os_like_layout(vm: Vm, os_layout: dict[str, str]) -> None:
    assert len(os_layout) == 2 * len(OS_LAYOUT)
    assert len(set(os_layout.values())) == len(os_layout)  # random data: all different
    # The host wrote the data: the guest reads the same bytes through its partitions (nothing
    # stale from before the fill), and the host's region hashes name the same partitions.
    assert partition_sha256s(vm, os_layout) == os_layout
    assert os_layout_sha256s(vm, (DISK_A, DISK_B)) == os_layout
    for disk in (DISK_A, DISK_B):
        host = checksum_regions(vm.disk_path(disk), os_layout_regions())
        guest = [os_layout[f"{Vm.by_id(disk)}-part{i}"] for i in range(1, len(OS_LAYOUT) + 1)]
        assert list(host.values()) == guest
    # Free space is left after the OS partitions
    free = vm.ssh(f"sgdisk -p {Vm.by_id(DISK_A)} | grep 'Total free space'").stdout
    assert "3.7 GiB" in free or "3.8 GiB" in free, free


def test_guest_write_is_seen_by_checksum(vm: Vm, os_layout: dict[str, str]) -> None:
    path = vm.disk_path(DISK_B)
    before = vm.checksum_disk(DISK_B)
    vm.ssh(f"printf 'x' | dd of={Vm.by_id(DISK_B)} bs=1 seek={4 * GiB - 100} conv=notrunc,fsync status=none")
    after = vm.checksum_disk(DISK_B)
    assert after[(0, MiB)] == before[(0, MiB)]
    assert after[(-MiB, MiB)] != before[(-MiB, MiB)]
    with open(path, "rb") as fh:
        fh.seek(4 * GiB - 100)
        assert fh.read(1) == b"x"
    # ... and it did not touch the OS partitions
    assert partition_sha256s(vm, os_layout) == os_layout
