"""The lab node: the test VM (testbed/vm) kept running, as the `lab` stack's GPU node.

    python -m testbed.lab_vm start    # make lab-vm
    python -m testbed.lab_vm stop     # make lab-vm-stop
    python -m testbed.lab_vm status

A Debian VM (qemu, software emulation) with two blank 4 GiB disks, SSH on 127.0.0.1:2222 as
root. `Pulumi.lab.yaml` points its node at it, so `pulumi up -s lab` prepares a disposable
machine's disks before anyone touches real hardware. Its disks live in
~/.cache/gpu-serving/lab/ and survive stop/start; delete that folder for blank disks.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from testbed.vm import DEFAULT_DISKS, Vm, ensure_image

PORT = 2222
LAB = Path(os.environ.get("GS_VM_CACHE", Path.home() / ".cache" / "gpu-serving")) / "lab"


def _ssh(command: str, key: Path, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(key), "-p", str(PORT), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=timeout,
    )


def answering(key: Path) -> bool:
    try:
        return key.exists() and _ssh("true", key).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def instructions(key: Path) -> str:
    return f"""lab node is up: ssh -i {key} -p {PORT} root@127.0.0.1
disks: /dev/disk/by-id/virtio-gs-disk-a, /dev/disk/by-id/virtio-gs-disk-b (files in {LAB})

To prepare it with the real program (Pulumi CLI; a cluster for the Kubernetes side in .kube/lab.yaml):
  pulumi stack select lab --create
  pulumi config set --secret sshPrivateKey -s lab < {key}
  pulumi config set --secret hfToken -s lab < hf-token.txt
  pulumi up -s lab
Offline, as reviewers do:  make render STACK=lab
Stop it:  make lab-vm-stop"""


def start() -> int:
    key = LAB / "id_ed25519"
    if answering(key):
        print(instructions(key))
        return 0
    vm = Vm(LAB, DEFAULT_DISKS, image=ensure_image())
    vm.start(port=PORT, keep_running=True)
    print(instructions(vm.key_path))
    return 0


def stop() -> int:
    key, pidfile = LAB / "id_ed25519", LAB / "qemu.pid"
    if not answering(key):
        print("lab node is not running")
        return 0
    _ssh("systemctl poweroff", key)
    pid = int(pidfile.read_text().strip()) if pidfile.exists() else None
    for _ in range(120):
        if pid is None or not Path(f"/proc/{pid}").exists():
            print("lab node stopped")
            return 0
        time.sleep(1)
    print(f"lab node (qemu pid {pid}) did not power off in 2 minutes", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.lab_vm", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    args = parser.parse_args(argv)
    if args.action == "start":
        return start()
    if args.action == "stop":
        return stop()
    up = answering(LAB / "id_ed25519")
    print("lab node is running on 127.0.0.1:2222" if up else "lab node is not running")
    return 0 if up else 3


if __name__ == "__main__":
    sys.exit(main())
