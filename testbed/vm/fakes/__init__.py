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


def install_fake_containerd(vm: Any) -> None:
    """FAKE containerd (running as containerd.service), ctr and nvidia-ctk in the guest of ``vm``."""
    vm.put_file(FAKE_NVIDIA_CTK, "/usr/local/bin/nvidia-ctk", "0755")
    vm.put_file(FAKE_CONTAINERD, "/usr/local/bin/containerd", "0755")
    vm.put_file(FAKE_CTR, "/usr/local/bin/ctr", "0755")
    vm.put_file(CONTAINERD_UNIT, "/etc/systemd/system/containerd.service")
    vm.ssh("systemctl daemon-reload && systemctl restart containerd")


def fake_k3s_unit(kind: str, unit: str) -> str:
    """A unit file for FAKE service `unit` of `kind` (k3s or rke2); FAKE_K3S_START goes to /usr/local/bin/fake-k3s-start."""
    return (f"[Unit]\nDescription=FAKE {unit} (tests)\n[Service]\n"
            f"ExecStartPre=/usr/local/bin/fake-k3s-start {kind}\nExecStart=/bin/sleep infinity\n")
