"""A partition-table re-read under the disk steps, on a real kernel and a real udev.

When a tool closes a disk it opened for writing, udev re-reads the disk's partition table, which
removes and re-adds every partition node; while no partition is in use, i.e. on a first `pulumi up`
until the array is assembled. A probe of a partition in that moment fails on a healthy partition: CI
met it once as `wipefs: error: /dev/vdb1: probing initialization failed: No such file or directory`
in the raid step, right after the partition step's parted had written the table.

The test runs parted's write as the partition step does, then the raid step's own probes (lib.sh's
resolve_disk, scan_disk, find_part, examine) in the guest; and, as the contrast, the same write
followed by a bare probe. Skipped unless GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

import shlex

import pytest

from components.node.script import SCRIPTS
from testbed.vm import Vm
from testbed.vm.steps import create_scripts

DISKS = ("gs-disk-a", "gs-disk-b")
PART_NAME = "gs-models"
# A round is a parted write (a second or two in the guest) and the probes.
ROUNDS = 40


@pytest.fixture(scope="module")
def partitioned(vm: Vm) -> dict[str, str]:
    """The disks as the partition step leaves them on a first `up` (no array yet), and the names to probe."""
    steps = create_scripts({"disks": [Vm.by_id(d) for d in DISKS], "sizeGb": 1, "raidName": "models", "mountpoint": "/mnt/models"})
    for name in ("10-preflight", "20-partition"):
        vm.ssh(steps[name], timeout=900)
    disk = vm.ssh(f"readlink -f {Vm.by_id(DISKS[0])}").stdout.strip()
    number = vm.ssh(f"parted -m -s {disk} print | awk -F: '$6 == \"{PART_NAME}\" {{print $1}}'").stdout.strip()
    assert number, vm.ssh(f"parted -m -s {disk} print").stdout
    return {"disk": disk, "base": disk.removeprefix("/dev/"), "number": number, "part": f"{disk}{number}"}


def removed_partitions(vm: Vm, disk: str, before: str = "") -> str:
    """The `remove` uevents of DISK's partitions while a tool opens DISK for writing and closes it (what
    parted's write ends with), seen by `udevadm monitor`; BEFORE runs first in the same shell (lib.sh's
    helpers, to hold the disk as a step does)."""
    script = "\n".join([
        before,
        "udevadm monitor -k -s block >/tmp/uevents 2>&1 & monitor=$!; sleep 1",
        f"python3 -c 'import os; os.close(os.open(\"{disk}\", os.O_RDWR))'",
        "udevadm settle; sleep 2; kill $monitor; wait $monitor || true",
        "grep -E '^KERNEL.* remove ' /tmp/uevents || true",
    ])
    return vm.ssh(script, timeout=300).stdout


def test_a_disk_a_step_holds_keeps_its_partitions_through_udevs_re_read(vm: Vm, partitioned: dict[str, str]) -> None:
    disk = partitioned["disk"]
    # Unheld, closing the disk after opening it for writing makes udev re-read the table: the partition
    # node is removed (and added again). This is the moment a probe fails.
    assert f"{partitioned['base']}/{partitioned['base']}{partitioned['number']}" in removed_partitions(vm, disk)
    # Held as every disk step holds its disks (resolve_disk, then hold_disk): udev does not re-read it.
    held = f"{(SCRIPTS / 'lib.sh').read_text()}\nresolve_disk {shlex.quote(disk)}"
    assert removed_partitions(vm, disk, before=held) == ""


def test_the_raid_step_probes_ride_out_the_re_read_after_parted_writes(vm: Vm, partitioned: dict[str, str]) -> None:
    """End to end, as CI met it: parted's write, then at once the raid step's probes, in a loop. The race
    is rare (5 bare probes of 100 failed in the test VM, none of 200 in a CI run), so this loop alone
    cannot show the fix; the test above does."""
    disk, number = (shlex.quote(partitioned[k]) for k in ("disk", "number"))
    write = f"parted -s {disk} name {number} {PART_NAME}"
    probes = f'resolve_disk {disk}; scan_disk "$DISK_DEV" {PART_NAME}; find_part "$DISK_BASE" "$PART_NUM"; ' \
             '[[ -n $PART_DEV ]]; examine "$PART_DEV"; [[ $SB_KIND == none ]]'
    fixed = vm.ssh("\n".join([
        (SCRIPTS / "lib.sh").read_text(),
        f"GS_RAID_NAME=models; fails=0; for _ in $(seq {ROUNDS}); do {write}; ( {probes} ) >/dev/null 2>&1 || fails=$((fails + 1)); done",
        "echo $fails",
    ]), timeout=1200).stdout.strip()
    assert fixed == "0", f"{fixed} of {ROUNDS} rounds of the raid step's probes after parted's write failed"
