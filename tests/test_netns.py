"""testbed/e2e/netns.py: the namespace the e2e runs KEDA's interceptor in (it listens on every address).

What the held-request check relies on: a server listening on 0.0.0.0 inside is not reachable from this machine, a
port brought in reaches this machine's 127.0.0.1, and the namespace's /etc/hosts is its own. Needs root (unshare).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from testbed.e2e.netns import NetworkNamespace, network_namespace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unshare and setns need root")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answer_once(server: socket.socket, reply: bytes) -> None:
    connection, _ = server.accept()
    with connection:
        connection.sendall(reply)


def _read(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        return c.recv(100)


def test_a_server_on_every_address_inside_is_not_reachable_from_outside(tmp_path: Path) -> None:
    port = _free_port()
    with network_namespace(tmp_path, {}) as namespace:
        server = namespace.call(lambda: socket.create_server(("0.0.0.0", port)))
        with server:
            threading.Thread(target=_answer_once, args=(server, b"inside"), daemon=True).start()
            with pytest.raises(ConnectionRefusedError):
                _read(port)
            assert namespace.call(lambda: _read(port)) == b"inside"


def test_a_forwarded_port_reaches_this_machines_loopback(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as outside, network_namespace(tmp_path, {}) as namespace:
        port = outside.getsockname()[1]
        threading.Thread(target=_answer_once, args=(outside, b"outside"), daemon=True).start()
        namespace.forward_in(port)
        assert namespace.call(lambda: _read(port)) == b"outside"


def test_its_hosts_file_is_its_own(tmp_path: Path) -> None:
    name = "vllm-m.some-namespace"
    with network_namespace(tmp_path, {name: "127.0.0.1"}) as namespace:
        inside = subprocess.run(["nsenter", "-t", str(namespace.holder.pid), "-m", "getent", "hosts", name],
                                capture_output=True, text=True)
        assert inside.stdout.split() == ["127.0.0.1", name]
    assert subprocess.run(["getent", "hosts", name], capture_output=True).returncode != 0


def test_close_ends_what_was_started_inside(tmp_path: Path) -> None:
    namespace = NetworkNamespace(tmp_path, {})
    proc = namespace.start(["sleep", "600"], dict(os.environ), tmp_path / "sleep.log")
    namespace.close()
    assert proc.poll() is not None and namespace.holder.poll() is not None
