"""What the VM harness raises: a VM that did not start, stop or reboot, and a guest command that failed."""

from __future__ import annotations

import shlex
import subprocess


class VmError(RuntimeError):
    """The VM did not start, stop or reboot as expected."""


class SshError(subprocess.CalledProcessError):
    """A command run over SSH exited non-zero; str() includes its output (and ``report``, if set)."""

    report = ""

    def __str__(self) -> str:
        def tail(s: str | bytes | None) -> str:
            if s is None:
                return ""
            if isinstance(s, bytes):
                s = s.decode(errors="replace")
            lines = s.rstrip().splitlines()
            return "\n".join(lines[-40:])

        cmd = self.cmd if isinstance(self.cmd, str) else shlex.join(self.cmd)
        if len(cmd) > 400:
            cmd = cmd[:400] + " ..."
        return (
            f"guest command exited {self.returncode}: {cmd}\n"
            f"--- stdout (tail) ---\n{tail(self.stdout)}\n"
            f"--- stderr (tail) ---\n{tail(self.stderr)}"
            + (f"\n{self.report}" if self.report else "")
        )
