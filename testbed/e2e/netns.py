"""A network and mount namespace of its own for an upstream server that listens on every address of its host.

KEDA's HTTP add-on interceptor binds its proxy and admin ports on 0.0.0.0, with no setting to narrow it; this machine's
rule is that test servers listen on 127.0.0.1 only. In a namespace whose only interface is its own loopback, 0.0.0.0
is that loopback. What the process needs from outside is brought in port by port (`forward_in`: a listener inside
that connects to the same port on this machine's 127.0.0.1), and what a test needs from inside it reaches from a
thread that joined the namespace (`call`): a Linux thread can change its network namespace alone, and a socket keeps
the namespace it was made in. The mount namespace lets a file of its own stand for /etc/hosts, so a name the process
dials (a Service's, with no cluster DNS here) reaches a server the test runs inside.

Needs root (unshare, setns), as the VM image build does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from testbed.e2e.run import CheckError

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class NetworkNamespace:
    """Held open by a `sleep` of its own; `close` ends it (after the processes started in it)."""

    def __init__(self, folder: Path, hosts: dict[str, str]) -> None:
        if os.geteuid() != 0:
            raise CheckError("the interceptor's network namespace needs root (unshare, setns): run `make e2e` as root")
        self.holder = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", "sleep", "infinity"])
        self.processes: list[subprocess.Popen[bytes]] = []
        self.listeners: list[socket.socket] = []
        self._libc = ctypes.CDLL(None, use_errno=True)
        try:
            self.wait_for_namespace()
            self.enter_command("ip", "link", "set", "lo", "up")
            hosts_file = folder / "hosts"
            hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in sorted(hosts.items())))
            self.enter_command("mount", "--bind", str(hosts_file), "/etc/hosts")
        except BaseException:
            self.close()
            raise

    def wait_for_namespace(self) -> None:
        """`unshare` has made the namespaces once its child is `sleep` (the namespace file differs from ours)."""
        for _ in range(100):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{self.holder.pid}/ns/net") != os.readlink("/proc/self/ns/net") and \
                        Path(f"/proc/{self.holder.pid}/cmdline").read_bytes().startswith(b"sleep"):
                    return
            if self.holder.poll() is not None:
                raise CheckError(f"unshare exited {self.holder.returncode}: no network namespace")
            threading.Event().wait(0.05)
        raise CheckError("unshare made no network namespace within 5 s")

    def enter_command(self, *argv: str) -> None:
        proc = subprocess.run(["nsenter", "-t", str(self.holder.pid), "-n", "-m", "--", *argv], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CheckError(f"{' '.join(argv)} in the namespace: {proc.stderr.strip()[-300:]}")

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(["nsenter", "-t", str(self.holder.pid), "-n", "-m", "--", *argv], env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return proc

    def enter(self) -> None:
        """Move the calling thread (it alone) into the namespace: the sockets it makes from now on live there."""
        fd = os.open(f"/proc/{self.holder.pid}/ns/net", os.O_RDONLY)
        try:
            if self._libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the interceptor's network namespace")
        finally:
            os.close(fd)

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` on a thread of its own inside the namespace."""
        result: list[T] = []
        error: list[BaseException] = []

        def inside() -> None:
            try:
                self.enter()
                result.append(fn())
            except BaseException as e:  # handed to the caller's thread
                error.append(e)

        thread = threading.Thread(target=inside, daemon=True)
        thread.start()
        thread.join()
        if error:
            raise error[0]
        return result[0]

    def forward_in(self, port: int) -> None:
        """127.0.0.1:`port` inside reaches 127.0.0.1:`port` of this machine."""
        listener = self.call(lambda: socket.create_server(("127.0.0.1", port)))
        self.listeners.append(listener)

        def serve() -> None:
            while True:
                try:
                    inner, _ = listener.accept()
                except OSError:
                    return  # closed
                try:
                    outer = socket.create_connection(("127.0.0.1", port), timeout=10)
                    outer.settimeout(None)
                except OSError:
                    inner.close()
                    continue
                for a, b in ((inner, outer), (outer, inner)):
                    threading.Thread(target=_pump, args=(a, b), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for listener in self.listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes its accept()
            listener.close()
        if self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()


@contextlib.contextmanager
def network_namespace(folder: Path, hosts: dict[str, str]) -> Iterator[NetworkNamespace]:
    namespace = NetworkNamespace(folder, hosts)
    try:
        yield namespace
    finally:
        namespace.close()
