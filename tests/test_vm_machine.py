"""The VM harness's own logic that needs no qemu (tests/vm/ runs the rest on real guests)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from testbed.vm.machine import Vm, VmError


def _monitor_after(path: Path, delay: float, status: str) -> threading.Thread:
    """Listen on ``path`` as qemu's human monitor does, only after ``delay`` seconds (qemu under load)."""

    def serve() -> None:
        time.sleep(delay)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(path))
            server.listen()
            server.settimeout(10)
            with server.accept()[0] as conn:
                conn.recv(1024)
                conn.sendall(f"QEMU monitor\r\n(qemu) info status\r\n{status}\r\n(qemu) ".encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def vm(tmp_path: Path):
    machine = Vm(tmp_path / "vm")
    machine._proc = subprocess.Popen(["sleep", "60"])  # stands in for a qemu that is still setting itself up
    machine._mon_dir = str(tmp_path)
    yield machine
    machine._proc.kill()
    machine._proc.wait()


def test_a_saved_guest_is_waited_for_until_its_monitor_listens(vm: Vm) -> None:
    server = _monitor_after(vm.monitor_socket, 1.5, "VM status: paused")
    assert "paused" in vm._wait_loaded(time.monotonic() + 30)
    server.join(5)


def test_a_qemu_that_never_listens_ends_the_wait_with_an_error(vm: Vm) -> None:
    with pytest.raises(VmError, match="did not load in time: 'monitor not yet listening"):
        vm._wait_loaded(time.monotonic() + 1)
