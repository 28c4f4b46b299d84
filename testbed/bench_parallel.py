"""Node steps of two machines under one `pulumi up`, on two lab VMs (issue #27, item 3).

The fleet section shows steps of 32 nodes side by side on SSH stand-ins that run nothing; this runs
the real steps (parted, mdadm, mkfs.xfs, the initramfs refresh) on two throwaway VMs
(testbed/vm), each the lab stack's node, through the real engine:

1. a first `up` of a two-node stack with the CLI's default `--parallel`;
2. a second array on the same disks (a stack of its own) with `--parallel 1`: the contrast, one
   operation at a time, so the two machines never work at once.

When each node worked is read from the guests' own sshd journal (each Command runs its script in one
SSH session: started, then closed), in the guests' clocks, which the harness sets from the host's at
resume. Both VMs share the host's 2 cores (qemu TCG), so the wall time says little; what the engine
runs at once is what this shows.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.bench_fleet import busy
from testbed.e2e.run import Run, rendering, stack_raw
from testbed.vm import DEFAULT_DISKS, GiB, Vm, ensure_booted_state, ensure_image

NODES = ("lab-node", "lab-node-2")
DISKS = (DEFAULT_DISKS, (("gs-disk-c", 4 * GiB), ("gs-disk-d", 4 * GiB)))
"""Each VM's blank disks: other serials on the second, since one serial on two nodes is refused (one disk)."""
STARTED = re.compile(r"^(?P<t>\d+\.\d+) \S+ sshd\[(?P<pid>\d+)\]: Starting session: .* id (?P<id>\d+)$")
CLOSED = re.compile(r"^(?P<t>\d+\.\d+) \S+ sshd\[(?P<pid>\d+)\]: Close session: .* id (?P<id>\d+)$")
VERBOSE = "printf 'LogLevel VERBOSE\\n' > /etc/ssh/sshd_config.d/gs-bench.conf && systemctl reload ssh"
"""sshd logs when each session (a Command's script) starts and closes only at VERBOSE; at INFO it logs the
connection, which the command provider keeps open until it exits."""


def sessions(journal: str) -> list[tuple[float, float]]:
    """(started, closed) epoch seconds of each SSH session that ended, from `journalctl -t sshd -o short-unix`."""
    opened: dict[tuple[str, str], float] = {}
    found = []
    for line in journal.splitlines():
        if match := STARTED.match(line):
            opened[match["pid"], match["id"]] = float(match["t"])
        elif (match := CLOSED.match(line)) and (match["pid"], match["id"]) in opened:
            found.append((opened.pop((match["pid"], match["id"])), float(match["t"])))
    return sorted(found)


def both_at_once(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> float:
    """Seconds during which each machine had an SSH session open: |A ∩ B| = |A| + |B| - |A ∪ B|."""
    return busy(first) + busy(second) - busy(first + second)


@dataclass(frozen=True)
class Up:
    parallel: str
    """The `--parallel` the CLI ran with ("default" or a number)."""
    seconds: float
    sessions: tuple[int, int]
    busy: tuple[float, float]
    """Seconds each machine had a step running."""
    together: float
    """Seconds both had one."""


def two_node_stack(ports: tuple[int, int], folder: Path, *, raid: str = "models", mount: str = "/mnt/models") -> dict[str, Any]:
    """The lab stack with a second node on the second VM."""
    raw = rendering(stack_raw("lab"), folder)
    first = raw["nodes"][0]
    raw["nodes"] = [{**first, "name": name, "ssh": {**first["ssh"], "port": port},
                     "storage": {**first["storage"], "disks": [Vm.by_id(disk) for disk, _ in disks], "raidName": raid,
                                 "mountpoint": mount}}
                    for name, port, disks in zip(NODES, ports, DISKS, strict=True)]
    return raw


def timed_up(program: Run, vms: tuple[Any, Any], stack: str, parallel: str) -> Up:
    began, start = time.time(), time.monotonic()
    program.pulumi("up", "--yes", "--skip-preview", *(["--parallel", parallel] if parallel != "default" else []),
                   stack=stack, timeout=3600)
    seconds = time.monotonic() - start
    time.sleep(2)  # the guest's journal is written a moment after the session closes
    found = [sessions(vm.ssh(f"journalctl -t sshd -o short-unix --no-pager --since @{int(began)}").stdout)
             for vm in vms]
    found = [[s for s in one if s[0] >= began] for one in found]
    return Up(parallel, seconds, (len(found[0]), len(found[1])), (busy(found[0]), busy(found[1])),
              both_at_once(found[0], found[1]))


def measure(program: Run, work: Path) -> tuple[Up, Up]:
    """Both runs on two fresh VMs: (default --parallel, --parallel 1)."""
    image = ensure_image()
    booted = ensure_booted_state(image)
    vms = tuple(Vm(work / f"vm-{i}", disks, image=image, booted=booted, boot_timeout=600) for i, disks in enumerate(DISKS))
    try:
        for vm in vms:
            vm.start()
            vm.ssh(VERBOSE)
        ports = (vms[0].port, vms[1].port)
        key = vms[0].key_path.read_text()
        program.new_stack("two-nodes", two_node_stack(ports, work / "yaml-two"), {"sshPrivateKey": key})
        together = timed_up(program, vms, "two-nodes", "default")
        program.new_stack("two-nodes-serial", two_node_stack(ports, work / "yaml-serial", raid="models2", mount="/mnt/models2"),
                         {"sshPrivateKey": key})
        serial = timed_up(program, vms, "two-nodes-serial", "1")
    finally:
        for vm in vms:
            vm.stop()
    return together, serial


def markdown(runs: tuple[Up, Up]) -> str:
    lines = [
        "#### Node steps of two machines at once, on two lab VMs",
        "",
        "Two throwaway VMs (`testbed/vm`, qemu TCG, sharing the 2 cores), each the lab stack's node with its "
        "two blank disks; one `pulumi up` of a two-node stack runs the real disk steps on both. When each machine had a "
        "step running is read from its own sshd journal (each Command's script runs in one SSH session). The second run builds a "
        "second array on the same disks with `--parallel 1` as the contrast (`testbed/bench_parallel.py`).",
        "",
        "| `pulumi up` | wall (s) | SSH sessions: VM 1 / VM 2 | seconds with a step running: VM 1 / VM 2 | seconds both ran one |",
        "|---|---|---|---|---|",
    ]
    for up in runs:
        shown = "the default `--parallel`" if up.parallel == "default" else f"`--parallel {up.parallel}`"
        lines.append(f"| {shown} | {up.seconds:.1f} | {up.sessions[0]} / {up.sessions[1]} "
                     f"| {up.busy[0]:.1f} / {up.busy[1]:.1f} | **{up.together:.1f}** |")
    return "\n".join(lines)
