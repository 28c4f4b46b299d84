"""A guest booted once and saved running, cached beside its image: a test VM resumes it in seconds
instead of booting."""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.vm.errors import VmError
from testbed.vm.image import ensure_image
from testbed.vm.machine import ROOT_PORTS, BootedState, Vm


def save_booted_state(
    folder: str | os.PathLike[str],
    image: str | os.PathLike[str] | None = None,
    *,
    memory_mib: int = 1024,
    cpus: int = 1,
    timeout: float = 600,
) -> BootedState:
    """Boot the image once (no extra disks), let the boot finish, save the running guest."""
    folder = Path(folder).resolve()
    vm = Vm(folder, (), image=image, memory_mib=memory_mib, cpus=cpus)
    vm.start()
    try:
        # start() waited for every boot job (networkd, logind, ...): a resumed guest starts where
        # a booted one is when a test begins.
        vm.ssh("sync", timeout=timeout)
        vm._stop_mux()  # no connection open in the saved state
        vm.monitor("stop")
        state = folder / "state"
        out = vm.monitor(f"migrate exec:cat>{shlex.quote(str(state))}", timeout=30)
        if "rror" in out.split("migrate", 1)[-1]:
            raise VmError(f"saving the booted guest failed: {out}")
        deadline = time.monotonic() + timeout
        while True:
            info = vm.monitor("info migrate")
            if "Migration status: completed" in info:
                break
            if "Migration status: failed" in info or time.monotonic() > deadline:
                raise VmError(f"saving the booted guest failed: {info}")
            time.sleep(0.5)
    finally:
        vm.stop(power_off=False)  # the saved root disk must stay exactly as the saved memory knows it
    vm.root_disk.chmod(0o444)
    assert vm.image is not None
    return BootedState(folder, vm.image, memory_mib, cpus, vm.root_ports)


def _booted_state_key(memory_mib: int, cpus: int) -> str:
    """What a saved guest is valid for: the qemu binary (its migration format) and the machine a
    resumed VM is started as (its devices must be the saved ones; the image is the folder's parent)."""
    version = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True, check=True).stdout
    machine = inspect.getsource(Vm._qemu_argv)
    return hashlib.sha256(f"{version}\n{machine}\n{ROOT_PORTS} {memory_mib} {cpus}".encode()).hexdigest()[:16]


def ensure_booted_state(image: str | os.PathLike[str] | None = None, *, memory_mib: int = 1024, cpus: int = 1) -> BootedState:
    """The image booted once and saved running (:func:`save_booted_state`), cached beside the image
    in ``booted-<key>/``, so later sessions (and the e2e lab VM) resume it instead of booting.
    Saved under a lock in a temporary folder renamed into place: parallel callers boot once, and a
    killed save leaves nothing half-made."""
    image = Path(image).resolve() if image else ensure_image()
    folder = image / f"booted-{_booted_state_key(memory_mib, cpus)}"
    with open(image / ".booted.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "state").is_file():
            for stale in image.glob(".booted-*"):
                shutil.rmtree(stale, ignore_errors=True)
            work = Path(tempfile.mkdtemp(prefix=".booted-", dir=image))
            save_booted_state(work, image, memory_mib=memory_mib, cpus=cpus)
            work.rename(folder)  # root.qcow2 names its backing image/disk.raw by absolute path
    return BootedState(folder, image, memory_mib, cpus, ROOT_PORTS)
