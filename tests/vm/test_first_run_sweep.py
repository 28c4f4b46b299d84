"""The induced-failure sweep on first runs (issue #44, item 7). From blank disks, a ladder of `up`s: in each, one
tool the disk steps write with is SIGKILLed whenever a step runs it to write (a stand-in earlier in PATH that passes
reads through to the real tool), in the order a first run first writes with them. Each `up` meets what the killed one
before it left half-made, and either stops at a step that says so in exactly one ERROR line, or ends with the node as
a clean first run leaves it (that tool's write was not needed: the disks are then blanked, so the next tool meets a
first run again). The last `up`, nothing killed, converges: one array of both members under our name, mounted, one
fstab line, one ARRAY line, the boot unit enabled. A ladder rather than a first run per tool: the same half-made
states in 254 to 282 s of VM time where a first run per tool took 458 s for nine tools.

The sweep on a converged node (what a re-run meets) is tests/vm/test_step_records.py's; adopting the role's array
during its resync is tests/vm/test_disk_adopt.py's. One VM with two blank disks, the sweep run in the guest in one
script. Skipped unless GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

import shlex

import pytest

from testbed.vm import Vm
from testbed.vm.steps import create_scripts

DISKS = ("gs-disk-a", "gs-disk-b")
MOUNT = "/mnt/models"
MD = "/dev/md/models"
UNIT = "gpu-serving-array-models.service"
ORDER = ["10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health"]
WRITES = {
    "parted": "mklabel|mkpart|name|set|resizepart|rm",
    "partx": "-u|--update|-a|--add",
    "partprobe": ".*",
    "mdadm": "--create|--add|--re-add|--grow|--zero-superblock|--assemble|--run",
    "update-initramfs": "-u",
    "mkfs.xfs": ".*",
    "systemctl": "enable|daemon-reload|start|restart",
    "chattr": "[+]i",
    "mount": "/[^ ]*",
    "wipefs": "-a|--all",
}
"""Each tool a first run changes the node with, and the arguments (an ERE matching one whole argument) that make a
call a write: the
partition table and the kernel's re-read of it, the array, the filesystem, the mount and its immutable mountpoint, the
boot unit, the initramfs. Reads pass through, so the kill lands on the write path; reads are swept on the converged
node (tests/vm/test_step_records.py)."""

BLANK = f"""
# Back to what a first `up` meets: our array stopped and its partitions gone, our lines and files removed.
umount {MOUNT} 2>/dev/null || true
chattr -i {MOUNT} 2>/dev/null || true
systemctl disable -q {UNIT} 2>/dev/null || true
rm -f /etc/systemd/system/{UNIT} /usr/local/sbin/gpu-serving-start-array
for md in /dev/md[0-9]*; do  # ours, under whatever name a killed create left it (the VM has no other array)
  [ -b "$md" ] || continue
  wipefs -qa "$md" || true  # its filesystem: a new array on the same partitions would find it again
  mdadm --stop "$md" >/dev/null 2>&1 || true
done
for disk in "$@"; do
  for part in $(lsblk -lnpo NAME,PARTLABEL "$disk" | awk '$2 == "gs-models" {{print $1}}'); do
    mdadm --zero-superblock "$part" 2>/dev/null || true
    wipefs -qa "$part"
    parted -s "$disk" rm "${{part##*[!0-9]}}"
  done
  wipefs -qa "$disk"  # the partition table too: our first run wrote it on a blank disk
done
udevadm settle
sed -i '\\| {MOUNT} |d' /etc/fstab
sed -i '/^ARRAY /d' /etc/mdadm/mdadm.conf
rm -rf /var/lib/gpu-serving
systemctl daemon-reload
"""

CONVERGED = f"""
# One line: members, mount source, fstab lines, ARRAY lines, unit state.
echo "$(mdadm --detail {MD} 2>/dev/null | grep -c 'active sync') $(findmnt -n -o SOURCE {MOUNT} || echo none)" \\
  "$(readlink -f {MD}) $(grep -c ' {MOUNT} ' /etc/fstab) $(grep -c '^ARRAY {MD} ' /etc/mdadm/mdadm.conf)" \\
  "$(systemctl is-enabled {UNIT} 2>/dev/null || echo absent)"
"""


@pytest.fixture(scope="module")
def steps(vm: Vm) -> dict[str, str]:
    return create_scripts({"disks": [vm.disk_id(d) for d in DISKS], "sizeGb": 1, "raidName": "models", "mountpoint": MOUNT})


def sweep_script(disks: list[str]) -> str:
    """The ladder in one guest script. One line per `up` in /root/sweep.out: the tool killed (`none` for the last),
    the step that failed (or `none`), its ERROR line count, the CONVERGED line after it."""
    lines = ["set -u", "rm -f /root/sweep.out", f"blank() {{ {BLANK}\n}}", f"converged() {{ {CONVERGED}\n}}",
             "up() {  # the steps in order; prints the first that fails and its ERROR line count, or `none 0`",
             f"  for step in {' '.join(ORDER)}; do",
             "    if ! bash /root/$step.sh </dev/null >/dev/null 2>/root/err; then",
             "      echo \"$step $(grep -c '^ERROR: ' /root/err)\"; return", "    fi",
             "  done; echo 'none 0'", "}"]
    disk_args = " ".join(disks)
    for tool, writes in WRITES.items():
        killer = f"#!/bin/bash\nre='(^| )({writes})( |$)'\n[[ \" $* \" =~ $re ]] && kill -KILL $$\nexec $real \"$@\"\n"
        lines += [
            f"real=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v {tool})",
            f"printf '%s' {shlex.quote(killer)} | sed \"s|\\$real|$real|\" > /usr/local/sbin/{tool}; chmod 755 /usr/local/sbin/{tool}",
            f"killed=$(up); rm -f /usr/local/sbin/{tool}; state=$(converged)",
            f'echo "{tool}|${{killed% *}}|${{killed#* }}|$state" >> /root/sweep.out',
            # A first run again for the next tool: this one's write was not needed and the node converged.
            f'if [ "${{killed% *}}" = none ]; then blank {disk_args} >/root/blank.log 2>&1 || {{ cat /root/blank.log; exit 1; }}; fi',
        ]
    lines += ["clean=$(up); state=$(converged)", 'echo "none|${clean% *}|${clean#* }|$state" >> /root/sweep.out']
    return "\n".join(lines)


def is_converged(state: list[str]) -> bool:
    members, source, md, fstab, arrays, unit = state
    return members == "2" and source == md != "none" and fstab == "1" and arrays == "1" and unit == "enabled"


def test_a_first_run_killed_at_any_write_tool_says_so_and_the_next_run_converges(vm: Vm, steps: dict[str, str]) -> None:
    for name, text in steps.items():
        vm.put_file(text, f"/root/{name}.sh", "0700")
    vm.run_script(sweep_script([vm.disk_id(d) for d in DISKS]), timeout=3600)
    rows = []
    for line in vm.ssh("cat /root/sweep.out").stdout.splitlines():
        tool, failed, errors, state = line.split("|")
        rows.append({"tool": tool, "failed": failed, "errors": int(errors), "state": state.split()})
    assert [r["tool"] for r in rows] == [*WRITES, "none"], rows
    *killed, last = rows
    # A killed `up` that failed said so in one line; one that did not fail left the node as a clean first run does.
    unreported = [r for r in killed
                  if (r["failed"] != "none" and r["errors"] != 1) or (r["failed"] == "none" and not is_converged(r["state"]))]
    assert not unreported, rows
    assert last["failed"] == "none" and is_converged(last["state"]), rows
    # The ladder did stop first runs, in the partition, raid, filesystem and mount steps.
    assert {"20-partition", "30-raid", "40-filesystem", "50-mount"} <= {r["failed"] for r in killed}, rows
