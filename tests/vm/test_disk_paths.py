"""One LUN seen through two paths (issue 13, item 5): both configured disks report the same serial,
as multipath without dm-multipath shows one LUN twice. Preflight must refuse before any write: a
RAID1 of a disk with itself would write every block twice to one LUN and lose both "copies" at once.
Its own VM, since two disks with one serial make by-id names ambiguous for every other test.
Skipped unless GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_disk_safety import refused, steps_for

from testbed.vm import BootedState, GiB, Vm, running


@pytest.fixture(scope="module")
def vm(vm_booted: BootedState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    disks = (("gs-path-1", 4 * GiB), ("gs-path-2", 4 * GiB))
    with running(tmp_path_factory.mktemp("vm"), disks, booted=vm_booted, serials={"gs-path-1": "gs-lun", "gs-path-2": "gs-lun"}) as machine:
        yield machine


def test_two_paths_to_one_lun_are_refused(vm: Vm) -> None:
    # Kernel names, in slot order: root is vda, then the two disks. The by-id link names only one.
    disks = ["/dev/vdb", "/dev/vdc"]
    serials = vm.ssh("cat /sys/block/vdb/serial; echo; cat /sys/block/vdc/serial").stdout.split()
    assert serials == ["gs-lun", "gs-lun"], serials
    message = refused(vm, steps_for(disks), "both storage.disks are the same disk seen through two paths", disks)
    assert "ID_SERIAL=gs-lun" in message, message
