"""The test VM: a throwaway Debian guest under qemu (TCG) with blank extra disks, where the node
scripts run on a real kernel (tests/vm), and the lab and benchmark VMs of the test bed. Stdlib only.

    image = ensure_image()                      # built once by build-image.sh, cached outside the repo
    with Vm(tmp_path) as vm:                    # boots, waits for SSH
        vm.run_script("set -e; mdadm --version")
        vm.reboot()
    booted = ensure_booted_state(image)         # the image booted once and saved running
    with running(tmp_path, booted=booted, image=image) as vm:   # resumed in seconds, discarded on exit
        ...

Where each part lives: machine.py (the VM: qemu, disks, boots, stop), ssh.py (commands, scripts and
files in the guest), image.py and build-image.sh (the image), booted.py (saving a booted guest, cached beside the image), disks.py
and layouts.py (the disks' hashes and the layouts tests build on them). Imported by their own names:
testbed.vm.steps (the node steps a VM test runs, rendered offline: it imports the renderer and the
Pulumi SDK, which the lab VM and the harness do without) and testbed.vm.fakes (stand-ins for the
container runtime's packages). docs/nodes.md and docs/testbed.md have the rest.
"""

from testbed.vm.booted import ensure_booted_state
from testbed.vm.disks import GiB, MiB, checksum_regions
from testbed.vm.errors import SshError, VmError
from testbed.vm.image import ensure_image
from testbed.vm.layouts import (
    OS_LAYOUT,
    ROLE_MD,
    ansible_role_layout,
    make_os_like_layout,
    os_layout_regions,
    os_layout_sha256s,
    partition_sha256s,
)
from testbed.vm.machine import DEFAULT_DISKS, BootedState, Vm, discard, running

__all__ = [
    "DEFAULT_DISKS",
    "OS_LAYOUT",
    "ROLE_MD",
    "BootedState",
    "GiB",
    "MiB",
    "SshError",
    "Vm",
    "VmError",
    "ansible_role_layout",
    "checksum_regions",
    "discard",
    "ensure_booted_state",
    "ensure_image",
    "make_os_like_layout",
    "os_layout_regions",
    "os_layout_sha256s",
    "partition_sha256s",
    "running",
]
