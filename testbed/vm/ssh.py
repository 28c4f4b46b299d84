"""Commands in the guest over SSH: root by key on the forwarded loopback port, one shared master
connection per VM (a new connection costs the guest a key exchange under TCG), scripts, files and
the guest's own report for a failure message. Vm (machine.py) inherits this; it keeps the connection
up across boots."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed.vm.errors import SshError


class GuestSsh:
    """SSH into a running guest. The class that inherits it provides ``host``, ``user``, ``port``,
    ``key_path``, ``running`` and ``_mon_dir`` (the VM's short-path folder for unix sockets)."""

    host: str
    user: str
    port: int
    key_path: Path
    running: bool
    _mon_dir: str | None
    _mux: bool

    def ssh_options(self, *, connect_timeout: float = 10) -> list[str]:
        """``-o`` options for ssh/scp (no host/port/key)."""
        return [
            "-F", "/dev/null",
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes",
            "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={int(connect_timeout)}",
            "-o", "ServerAliveInterval=15",
            "-o", "ServerAliveCountMax=8",
        ]  # fmt: skip

    @property
    def _mux_socket(self) -> Path | None:
        return Path(self._mon_dir) / "ssh.sock" if self._mon_dir else None

    def _start_mux(self) -> None:
        """Open one SSH master connection that later ssh calls share: a fresh connection costs
        the guest a key exchange under TCG (~0.8 s), a session on the master a fraction of it.
        Best effort: without it every call connects on its own, as before."""
        self._stop_mux()
        sock = self._mux_socket
        if sock is None or not self.running:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            r = subprocess.run(
                ["ssh", *self.ssh_options(), "-i", str(self.key_path), "-p", str(self.port),
                 "-o", "ControlMaster=yes", "-o", f"ControlPath={sock}", "-o", "ControlPersist=yes",
                 "-N", "-f", f"{self.user}@{self.host}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
            )  # fmt: skip
            self._mux = r.returncode == 0 and sock.exists()

    def _stop_mux(self) -> None:
        """Close the master connection (before the guest goes down: a master whose guest
        vanished would hold every call until its keep-alive gives up)."""
        sock = self._mux_socket
        if self._mux and sock is not None:
            with contextlib.suppress(Exception):
                subprocess.run(
                    ["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", f"{self.user}@{self.host}"],
                    stdin=subprocess.DEVNULL, capture_output=True, timeout=15,
                )  # fmt: skip
        self._mux = False

    def ssh_argv(
        self,
        *,
        key_path: str | os.PathLike[str] | None = None,
        connect_timeout: float = 10,
        direct: bool = False,
    ) -> list[str]:
        """``ssh`` argv up to and including ``user@host`` (append the remote command).

        ``key_path`` overrides the key, e.g. to check that a WRONG key is refused; such a
        call, and one with ``direct``, makes its own connection instead of sharing the master.
        """
        if self._mux and key_path is None and not direct:
            mux = ["-o", "ControlMaster=no", "-o", f"ControlPath={self._mux_socket}"]
        else:
            mux = ["-o", "ControlPath=none"]
        return [
            "ssh",
            *self.ssh_options(connect_timeout=connect_timeout),
            *mux,
            "-i", str(key_path or self.key_path),
            "-p", str(self.port),
            f"{self.user}@{self.host}",
        ]  # fmt: skip

    def ssh(
        self,
        cmd: str,
        *,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float | None = 600,
        connect_timeout: float = 10,
        key_path: str | os.PathLike[str] | None = None,
        direct: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` (a shell command line) as root in the guest.

        Returns a text-mode CompletedProcess. ``input`` may be str or bytes (bytes
        are sent unchanged). With ``check`` a non-zero exit raises :class:`SshError`
        (exit 255 = ssh itself failed). ``direct``: a connection of its own (see ssh_argv).
        """
        argv = [*self.ssh_argv(key_path=key_path, connect_timeout=connect_timeout, direct=direct), cmd]
        if isinstance(input, bytes):
            raw = subprocess.run(argv, input=input, capture_output=True, timeout=timeout)
            res = subprocess.CompletedProcess(
                argv,
                raw.returncode,
                raw.stdout.decode(errors="replace"),
                raw.stderr.decode(errors="replace"),
            )
        else:
            res = subprocess.run(
                argv,
                input=input,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                stdin=subprocess.DEVNULL if input is None else None,
            )
        if check and res.returncode != 0:
            raise SshError(res.returncode, cmd, res.stdout, res.stderr)
        return res

    def run_script(
        self,
        text: str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = 600,
    ) -> subprocess.CompletedProcess[str]:
        """Pipe a bash script to ``bash -s`` in the guest (``args`` become $1...)."""
        prefix = ""
        if env:
            for k in env:
                if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                    raise ValueError(f"bad environment variable name {k!r}")
            prefix = "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
        cmd = prefix + "bash -s --" + "".join(" " + shlex.quote(a) for a in args)
        return self.ssh(cmd, input=text, check=check, timeout=timeout)

    def put_file(self, data: str | bytes, guest_path: str, mode: str = "0644") -> None:
        """Write ``data`` to ``guest_path`` in the guest (parent folder is created)."""
        q = shlex.quote(guest_path)
        self.ssh(
            f'mkdir -p -- "$(dirname -- {q})" && cat > {q} && chmod {mode} {q}',
            input=data if isinstance(data, bytes) else data.encode(),
        )

    def guest_report(self) -> str:
        """For a failure message: the guest kernel's warnings, the by-id links and /proc/mdstat.

        The serial log cannot tell: Debian lowers the console's log level, so a disk that the
        kernel dropped (an NVMe reset that failed, a hot-plug slot powered off) shows only here.
        """
        script = (
            "dmesg --level=emerg,alert,crit,err,warn | tail -n 40; echo '--- /dev/disk/by-id'; ls /dev/disk/by-id;"
            " echo '--- /proc/mdstat'; cat /proc/mdstat"
        )
        try:
            result = self.ssh(script, check=False, timeout=60)
        except subprocess.TimeoutExpired:
            return "--- guest report: the guest did not answer within 60 s"
        return f"--- guest report (exit {result.returncode}) ---\n{result.stdout}{result.stderr}"
