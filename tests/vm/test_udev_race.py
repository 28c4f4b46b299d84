"""A partition-table re-read under the disk steps, on a real kernel and a real udev.

parted opens a disk for writing even to print it; when it closes the disk, udev re-reads the partition
table, which removes and re-adds every partition node. A probe of a partition in that moment fails on
a healthy partition: CI met it once as `wipefs: error: /dev/vdb1: probing initialization failed: No
such file or directory` in the raid step, right after the partition step. The re-read only happens
while no partition of the disk is in use, i.e. before the array is assembled: on a first `pulumi up`.

Both tests run the real helpers of lib.sh (`scan_disk`, `find_part`, `examine`) in the guest, and the
same probe without them as the contrast. Skipped unless GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from harness import Vm
from steps import create_scripts

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from components.node import SCRIPTS  # noqa: E402

DISKS = ("gs-disk-a", "gs-disk-b")
PART_NAME = "gs-models"
# Bounded loops: each round is a parted print and a probe, tens of milliseconds in the guest.
BARE_ROUNDS = 300
ROUNDS = 60


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


def lib_loop(body: str, rounds: int) -> str:
    """lib.sh's helpers, then BODY run ROUNDS times in a subshell each (a `die` ends only its round);
    prints how many rounds failed."""
    return "\n".join([
        (SCRIPTS / "lib.sh").read_text(),
        f"GS_RAID_NAME=models; fails=0; for _ in $(seq {rounds}); do ( {body} ) >/dev/null 2>&1 || fails=$((fails + 1)); done",
        "echo $fails",
    ])


def test_a_probe_right_after_parted_meets_the_re_read_and_examine_does_not(vm: Vm, partitioned: dict[str, str]) -> None:
    disk, part = shlex.quote(partitioned["disk"]), shlex.quote(partitioned["part"])
    # The race as CI met it: parted's print, then at once a probe of the partition. Rounds until the
    # first failure: the contrast shows the race is real on this kernel, so the second half can fail.
    bare = vm.ssh(
        f"for i in $(seq {BARE_ROUNDS}); do parted -m -s {disk} unit B print free >/dev/null; "
        f"wipefs -n --noheadings -- {part} >/dev/null 2>&1 || {{ echo failed at $i; exit 0; }}; done; echo never",
        timeout=600,
    ).stdout.strip()
    assert bare.startswith("failed at"), f"no probe of {BARE_ROUNDS} right after parted met a re-read: the contrast shows nothing"
    # The steps' own sequence: scan_disk settles after parted, examine waits for a vanished node.
    fixed = vm.ssh(lib_loop(
        f"scan_disk {disk} {PART_NAME}; find_part {partitioned['base']} {partitioned['number']}; "
        '[[ -n $PART_DEV ]]; examine "$PART_DEV"; [[ $SB_KIND == none ]]',
        ROUNDS,
    ), timeout=600).stdout.strip()
    assert fixed == "0", f"{fixed} of {ROUNDS} rounds of scan_disk, find_part and examine failed ({bare} without them)"


def test_examine_rides_out_re_reads_made_by_another_process(vm: Vm, partitioned: dict[str, str]) -> None:
    """Not only our own parted: anything that closes the disk after opening it for writing (an
    operator's parted, a monitoring agent) makes udev re-read the table, also in the middle of a probe."""
    disk, part = shlex.quote(partitioned["disk"]), shlex.quote(partitioned["part"])
    storm = f"( for _ in $(seq 400); do parted -m -s {disk} unit B print free >/dev/null 2>&1; sleep 0.1; done ) & storm=$!"
    bare = vm.ssh(
        f"{storm}; fails=0; for _ in $(seq {ROUNDS}); do wipefs -n --noheadings -- {part} >/dev/null 2>&1 || fails=$((fails + 1)); "
        "sleep 0.05; done; kill $storm; wait; echo $fails",
        timeout=600,
    ).stdout.strip()
    fixed = vm.ssh(
        f"{storm}\n" + lib_loop(f'examine {part}; [[ $SB_KIND == none ]]; sleep 0.05', ROUNDS) + "\nkill $storm; wait",
        timeout=600,
    ).stdout.strip().splitlines()[-1]
    assert int(bare) > 0, "no bare probe met a re-read: the storm shows nothing"
    assert fixed == "0", f"{fixed} of {ROUNDS} examine calls failed during re-reads ({bare} bare probes did)"
