"""Stand-ins for the container runtime pieces the test VM does not have (NVIDIA's and containerd's
packages are not installable there: the guest reaches no network). Each is a small bash script beside
this file that does what the node steps rely on, no more, and says FAKE in its first lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FAKE_CONTAINERD = (HERE / "containerd.sh").read_text()
FAKE_CTR = (HERE / "ctr.sh").read_text()
FAKE_NVIDIA_CTK = (HERE / "nvidia-ctk.sh").read_text()
FAKE_K3S_START = (HERE / "k3s-start.sh").read_text()
CONTAINERD_UNIT = "[Unit]\nDescription=FAKE containerd (tests)\n[Service]\nExecStart=/usr/local/bin/containerd\n"
# Type=notify as containerd's own unit, with no start timeout (as a drop-in may set), and a daemon that
# never sends READY=1: a plain `systemctl restart containerd` would wait for ever.
CONTAINERD_UNIT_NEVER_READY = CONTAINERD_UNIT.replace("[Service]\n", "[Service]\nType=notify\nTimeoutStartSec=0\n")


def install_fake_containerd(vm: Any, *, ready: bool = True) -> None:
    """FAKE containerd (running as containerd.service), ctr and nvidia-ctk in the guest of ``vm``.
    ``ready=False``: a unit whose start never ends (see CONTAINERD_UNIT_NEVER_READY), not started here."""
    vm.put_file(FAKE_NVIDIA_CTK, "/usr/local/bin/nvidia-ctk", "0755")
    vm.put_file(FAKE_CONTAINERD, "/usr/local/bin/containerd", "0755")
    vm.put_file(FAKE_CTR, "/usr/local/bin/ctr", "0755")
    vm.put_file(CONTAINERD_UNIT if ready else CONTAINERD_UNIT_NEVER_READY, "/etc/systemd/system/containerd.service")
    vm.ssh("systemctl daemon-reload" + (" && systemctl restart containerd" if ready else ""))


def fake_k3s_unit(kind: str, unit: str, *, ready: bool = True) -> str:
    """A unit file for FAKE service `unit` of `kind` (k3s or rke2); FAKE_K3S_START goes to /usr/local/bin/fake-k3s-start.
    ``ready=False``: Type=notify with TimeoutStartSec=0, as k3s's and rke2's own units, and a daemon that never
    sends READY=1 (a real agent does only once it reached its server): its start never ends."""
    notify = "" if ready else "Type=notify\nTimeoutStartSec=0\n"
    return (f"[Unit]\nDescription=FAKE {unit} (tests)\n[Service]\n{notify}"
            f"ExecStartPre=/usr/local/bin/fake-k3s-start {kind}\nExecStart=/bin/sleep infinity\n")
