"""Throwaway Debian VM (qemu TCG) with blank extra disks, for testing node scripts on a real kernel.

    with Vm(tmp_path) as vm:                    # boots, waits for SSH
        vm.reboot()
    with Vm(tmp_path) as vm:                    # same disk files, new boot
        ...
    vm = Vm(tmp_path); vm.start(attach=["gs-disk-a"])   # boot with gs-disk-b detached

The guest is Debian bookworm booting its own GRUB + kernel + initramfs (so an
``update-initramfs`` inside it takes effect after a reboot). Each extra disk is a
sparse RAW file ``<workdir>/<name>.raw`` attached as virtio-blk with ``serial=<name>``,
so the guest sees ``/dev/disk/by-id/virtio-<name>``. The root disk is a qcow2
overlay ``<workdir>/root.qcow2`` over the cached image, so it too survives stop/start.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from testbed.vm.disks import GiB, MiB, checksum_regions
from testbed.vm.errors import VmError
from testbed.vm.image import ensure_image
from testbed.vm.ssh import GuestSsh

DEFAULT_DISKS: tuple[tuple[str, int], ...] = (("gs-disk-a", 4 * GiB), ("gs-disk-b", 4 * GiB))
ROOT_PORTS = 8  # PCIe root ports for extra disks; a VM with more disks gets one per disk

_SERIAL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,20}$")  # virtio-blk serials are at most 20 bytes


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child
    # If the Python process dies without stopping the VM, qemu gets SIGTERM
    # (a clean qemu exit) instead of lingering forever.
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_live_vms: weakref.WeakSet[Vm] = weakref.WeakSet()


@atexit.register
def _stop_leftover_vms() -> None:
    for vm in list(_live_vms):
        with contextlib.suppress(Exception):
            vm.stop(timeout=60)


# --------------------------------------------------------------------------- a booted guest, saved


class BootedState:
    """A guest booted once with no extra disks and saved while running: its root disk
    (``root.qcow2``, frozen) and its memory and device state (``state``, qemu's migration
    stream). ``Vm(..., booted=state)`` resumes it in seconds instead of booting (~40-70 s).
    Made by :func:`save_booted_state` (booted.py); valid for the qemu binary and harness that made it."""

    def __init__(self, folder: Path, image: Path, memory_mib: int, cpus: int, root_ports: int) -> None:
        self.folder = folder
        self.image = image
        self.memory_mib = memory_mib
        self.cpus = cpus
        self.root_ports = root_ports

    @property
    def root_disk(self) -> Path:
        return self.folder / "root.qcow2"

    @property
    def state(self) -> Path:
        return self.folder / "state"


# --------------------------------------------------------------------------- the VM


class Vm(GuestSsh):
    """One throwaway VM in its own work folder.

    ``disks`` are ``(name, size_bytes)``; each becomes ``<workdir>/<name>.raw`` (sparse,
    created on first use, kept across stop/start) and ``/dev/disk/by-id/virtio-<name>``
    in the guest. ``attach`` (attribute, or argument of ``start``) selects which of
    them are plugged in at the next boot; ``None`` means all.

    One vCPU by default: under TCG the guest's work here (fork-heavy shell, ``update-initramfs``)
    runs as fast on one vCPU as on two (88 s against 82 s, and two one-vCPU guests side by side
    took 84 and 100 s), so ``make test-vm`` runs one guest per host core instead of one guest on all.

    Commands, scripts and files in the guest come from :class:`GuestSsh` (ssh.py).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        disks: Sequence[tuple[str, int]] = DEFAULT_DISKS,
        *,
        image: str | os.PathLike[str] | None = None,
        memory_mib: int = 1024,
        cpus: int = 1,
        boot_timeout: float = 180,
        sector_sizes: Mapping[str, int] | None = None,
        nvme: Iterable[str] = (),
        serials: Mapping[str, str] | None = None,
        booted: BootedState | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.disks: dict[str, int] = {}
        for name, size in disks:
            if not _SERIAL_RE.match(name):
                raise ValueError(f"disk name {name!r}: use at most 20 chars of [A-Za-z0-9_.-] (it is the virtio serial)")
            if name in self.disks or name == "gs-root":
                raise ValueError(f"duplicate or reserved disk name {name!r}")
            self.disks[name] = int(size)
        if len(self.disks) > 24:
            raise ValueError("at most 24 extra disks")
        # Logical (= physical) sector size per disk, e.g. {"gs-disk-c": 4096} for a 4Kn disk.
        self.sector_sizes: dict[str, int] = dict(sector_sizes or {})
        # Disks attached as NVMe controllers (guest names nvme0n1, partitions nvme0n1p1) instead of virtio.
        self.nvme: frozenset[str] = frozenset(nvme)
        # The serial a disk reports, when not its name: two disks with one serial stand for one LUN
        # seen through two paths (by-id links then name only one of them: use kernel names).
        self.serials: dict[str, str] = dict(serials or {})
        for serial in self.serials.values():
            if not _SERIAL_RE.match(serial):
                raise ValueError(f"serial {serial!r}: use at most 20 chars of [A-Za-z0-9_.-]")
        for name in [*self.sector_sizes, *self.nvme, *self.serials]:
            if name not in self.disks:
                raise KeyError(f"no disk {name!r}; have {sorted(self.disks)}")
        self.image = Path(image) if image else None
        # A saved running guest the FIRST start() resumes instead of booting (see BootedState).
        self.booted = booted
        if booted is not None and (booted.memory_mib, booted.cpus) != (memory_mib, cpus):
            raise ValueError(f"booted state is for {booted.memory_mib} MiB / {booted.cpus} CPUs, not {memory_mib} / {cpus}")
        self.memory_mib = memory_mib
        self.cpus = cpus
        self.boot_timeout = boot_timeout
        self.attach: list[str] | None = None
        self.host = "127.0.0.1"
        self.user = "root"
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._mon_dir: str | None = None
        self._attached: list[str] = []
        self._key: Path | None = None
        self._mux = False  # an SSH master connection is up (see _start_mux)
        self.resumed = False  # the last start() resumed a BootedState instead of booting

    # ---- properties -------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise VmError("VM not started")
        return self._port

    @property
    def key_path(self) -> Path:
        """Private key accepted by root@guest (a copy inside workdir, mode 0600)."""
        if self._key is None:
            raise VmError("VM not started")
        return self._key

    @property
    def serial_log(self) -> Path:
        return self.workdir / "serial.log"

    @property
    def qemu_log(self) -> Path:
        return self.workdir / "qemu.log"

    @property
    def root_disk(self) -> Path:
        return self.workdir / "root.qcow2"

    @property
    def monitor_socket(self) -> Path | None:
        return Path(self._mon_dir) / "mon.sock" if self._mon_dir else None

    @property
    def attached(self) -> list[str]:
        """Extra disks plugged in at the current/last boot."""
        return list(self._attached)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def disk_path(self, name: str) -> Path:
        """Host path of the raw file behind extra disk ``name``."""
        if name not in self.disks:
            raise KeyError(f"no disk {name!r}; have {sorted(self.disks)}")
        return self.workdir / f"{name}.raw"

    @staticmethod
    def by_id(name: str) -> str:
        """Guest path of extra disk ``name``: ``/dev/disk/by-id/virtio-<name>``."""
        return f"/dev/disk/by-id/virtio-{name}"

    def disk_id(self, name: str) -> str:
        """Guest by-id path of extra disk ``name`` for its bus (NVMe: ``nvme-QEMU_NVMe_Ctrl_<name>``)."""
        if name in self.nvme:
            return f"/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_{name}"
        return self.by_id(name)

    # ---- lifecycle --------------------------------------------------------

    def _prepare_files(self) -> bool:
        """Create the key copy, root overlay and disk files that are missing; True when the
        root overlay is new (a fresh work folder: nothing has booted from it yet)."""
        img = self.image or (self.booted.image if self.booted else ensure_image())
        self.image = img
        src_key = img / "id_ed25519"
        self._key = self.workdir / "id_ed25519"
        if not self._key.exists():
            self._key.write_bytes(src_key.read_bytes())
            self._key.chmod(0o600)
            (self.workdir / "id_ed25519.pub").write_bytes((img / "id_ed25519.pub").read_bytes())
        fresh = not self.root_disk.exists()
        if fresh:
            # Over the booted state's frozen root disk when resuming it, else over the image.
            backing, fmt = (self.booted.root_disk, "qcow2") if self.booted else (img / "disk.raw", "raw")
            subprocess.run(
                ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", fmt, str(self.root_disk)],
                check=True,
            )
        for name, size in self.disks.items():
            p = self.disk_path(name)
            if not p.exists():
                with open(p, "wb") as f:
                    f.truncate(size)
        return fresh

    @property
    def root_ports(self) -> int:
        """PCIe root ports the extra disks sit behind (one per disk, at least ROOT_PORTS)."""
        return max(ROOT_PORTS, len(self.disks))

    def _disk_device(self, name: str) -> str:
        index = list(self.disks).index(name)
        model = "nvme" if name in self.nvme else "virtio-blk-pci"
        device = f"{model},drive=d-{name},id=dev-{name},serial={self.serials.get(name, name)},bus=gs-rp{index}"
        if name in self.sector_sizes:
            size = self.sector_sizes[name]
            device += f",logical_block_size={size},physical_block_size={size}"
        return device

    def _disk_drive(self, name: str) -> str:
        return f"file={self.disk_path(name)},if=none,id=d-{name},format=raw,cache=unsafe"

    def _qemu_argv(self, port: int, attach: list[str]) -> list[str]:
        argv = [
            "qemu-system-x86_64",
            "-name", f"gs-vmtest-{port}",
            "-machine", "q35",
            "-accel", "tcg,thread=multi,tb-size=256",  # KVM hangs on these hosts
            "-cpu", "qemu64",
            "-smp", str(self.cpus),
            "-m", str(self.memory_mib),
            "-nodefaults", "-no-user-config",
            "-display", "none",
            "-drive", f"file={self.root_disk},if=none,id=d-root,format=qcow2,cache=unsafe",
            "-device", "virtio-blk-pci,drive=d-root,serial=gs-root,bootindex=0,addr=0x4",
            # A resumed guest must not share its random state with every other copy of the
            # same saved boot: a new generation ID makes its kernel reseed.
            "-device", "vmgenid,guid=auto",
        ]  # fmt: skip
        # Each extra disk sits behind its own root port (the N-th declared disk behind port N,
        # whether or not the others are attached), so a disk plugged into a resumed guest and the
        # same disk at a cold boot are the same PCI device, and kernel names follow slot order.
        # io-reserve=0: neither virtio-blk behind a PCIe port nor NVMe needs I/O space, and
        # reserving 4 KiB per port would run out of it.
        for i in range(self.root_ports):
            argv += ["-device", f"pcie-root-port,id=gs-rp{i},chassis={i + 1},addr={5 + i:#x},io-reserve=0"]
        for name in attach:
            argv += ["-drive", self._disk_drive(name), "-device", self._disk_device(name)]
        argv += [
            # restrict=on: the guest reaches nothing (not the host, not outside);
            # only the explicit SSH forward on loopback works.
            "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
            "-device", "virtio-net-pci,netdev=n0,romfile=,addr=0x3",
            "-serial", f"file:{self.serial_log}",
            "-monitor", f"unix:{self.monitor_socket},server=on,wait=off",
            "-pidfile", str(self.workdir / "qemu.pid"),
        ]  # fmt: skip
        return argv

    def start(
        self,
        attach: Iterable[str] | None = None,
        *,
        timeout: float | None = None,
        port: int | None = None,
        keep_running: bool = False,
    ) -> Vm:
        """Boot the VM and wait until SSH answers.

        ``attach``: names of the extra disks to plug in for this boot (default:
        ``self.attach``, or all). The disk files of detached disks are kept.
        ``port``: a fixed SSH port on 127.0.0.1 instead of a free one.
        ``keep_running``: the VM outlives this Python process (the lab VM); stop it
        with ``stop()`` from a later process or ``poweroff`` over SSH.

        With ``booted`` (a :class:`BootedState`) and a fresh work folder, the first start
        resumes that saved guest instead of booting, then plugs in the disks one by one
        (``resumed`` says which happened); every later start is a real boot.
        """
        if self.running:
            raise VmError("VM already running")
        if attach is None:
            attach = self.attach
        names = list(self.disks) if attach is None else list(attach)
        for n in names:
            if n not in self.disks:
                raise KeyError(f"no disk {n!r}; have {sorted(self.disks)}")
        fresh = self._prepare_files()
        resume = fresh and self.booted is not None and not keep_running and self.root_ports == self.booted.root_ports
        if self.serial_log.exists() and self.serial_log.stat().st_size:
            # keep the previous run's console log (qemu truncates the file)
            self.serial_log.replace(self.workdir / "serial.prev.log")
        self._mon_dir = tempfile.mkdtemp(prefix="gsvm-")  # short path for the unix sockets
        last_err = ""
        fixed_port = port
        for _attempt in range(3):
            port = fixed_port or _free_port()
            argv = self._qemu_argv(port, [] if resume else names)
            if resume:
                assert self.booted is not None
                argv += ["-incoming", f"exec:cat {shlex.quote(str(self.booted.state))}"]
            with open(self.qemu_log, "wb") as log:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C in pytest must not kill qemu mid-write
                    preexec_fn=None if keep_running else _set_pdeathsig,
                )
            time.sleep(0.5)
            if self._proc.poll() is None:
                break
            last_err = self.qemu_log.read_text(errors="replace")
            self._proc = None
            if "forwarding" not in last_err and "in use" not in last_err:
                break  # not a port race: no point retrying
        if self._proc is None:
            self._cleanup_monitor()
            raise VmError(f"qemu failed to start:\n{last_err}")
        self._port = port
        self._attached = [] if resume else names
        self.resumed = resume
        if not keep_running:
            _live_vms.add(self)
        try:
            if resume:
                self._resume(names, timeout or self.boot_timeout)
            else:
                self.wait_ssh(timeout or self.boot_timeout)
                self._start_mux()
                self._wait_boot_finished(timeout or self.boot_timeout)
        except BaseException:
            self.stop(timeout=30)
            raise
        return self

    def _resume(self, names: list[str], timeout: float) -> None:
        """Run the incoming saved guest, set its clock, then plug in ``names`` in order."""
        deadline = time.monotonic() + timeout
        if "running" not in self._wait_loaded(deadline):
            self.monitor("cont")
        self.wait_ssh(max(deadline - time.monotonic(), 60))
        self._start_mux()
        # The guest's clock stopped when its state was saved.
        self.ssh(f"date -s @{time.time():.3f} >/dev/null")
        for count, name in enumerate(names, 1):
            self.plug(name)
            # Wait for each disk before the next, so kernel names follow declaration order
            # as at a cold boot (vdb, vdc, ...; nvme0n1, nvme1n1, ...).
            self.ssh(
                "for i in $(seq 1200); do"
                " [ $(ls /sys/block | grep -cE '^(vd[a-z]+|nvme[0-9]+n[0-9]+)$') -gt " + str(count) + " ] && exit 0;"
                " sleep 0.1; done; exit 1",
                timeout=300,
            )
        self.ssh("udevadm settle")

    def _wait_loaded(self, deadline: float) -> str:
        """Wait for the incoming saved guest to be loaded (paused or running); return qemu's status line."""
        while True:
            try:
                status = self.monitor("info status")
            except (FileNotFoundError, ConnectionRefusedError) as e:
                # qemu makes its monitor socket only once it has set itself up: on a loaded host that can take
                # longer than start()'s half-second look.
                status = f"monitor not yet listening ({e.strerror})"
            if "inmigrate" not in status and ("paused" in status or "running" in status):
                return status
            if not self.running or time.monotonic() > deadline:
                raise VmError(f"the saved guest did not load in time: {status!r}\n" + self._diagnostics())
            time.sleep(0.5)

    def plug(self, name: str) -> None:
        """Hot-plug extra disk ``name`` into the running guest (behind its own root port)."""
        if name not in self.disks:
            raise KeyError(f"no disk {name!r}; have {sorted(self.disks)}")
        if name in self._attached:
            raise VmError(f"disk {name!r} is attached already")
        for command in (f"drive_add 0 {self._disk_drive(name)}", f"device_add {self._disk_device(name)}"):
            out = self.monitor(command, timeout=30)
            reply = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out.split(command, 1)[-1]).replace("(qemu)", "").strip()
            if reply not in ("", "OK"):
                raise VmError(f"monitor {command!r}: {reply}")
        self._attached.append(name)

    def wait_ssh(self, timeout: float = 180, *, not_boot_id: str | None = None) -> None:
        """Poll (once a second) until SSH answers; with ``not_boot_id``, until it
        answers from a boot other than that one."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise VmError("qemu exited while waiting for SSH\n" + self._diagnostics())
            try:
                r = self.ssh(
                    "cat /proc/sys/kernel/random/boot_id",
                    check=False,
                    timeout=15,
                    connect_timeout=5,
                    direct=True,
                )
                seen = r.stdout.strip() if r.returncode == 0 else ""
                if seen and seen != not_boot_id:
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise VmError(f"SSH on {self.host}:{self.port} did not answer within {timeout:.0f} s\n" + self._diagnostics())
            time.sleep(1)

    def _diagnostics(self) -> str:
        parts = []
        for label, path in (("qemu log", self.qemu_log), ("serial log", self.serial_log)):
            try:
                lines = path.read_text(errors="replace").splitlines()[-60:]
            except OSError:
                lines = ["(missing)"]
            parts.append(f"--- {label} ({path}), tail ---\n" + "\n".join(lines))
        return "\n".join(parts)

    def boot_id(self) -> str:
        return self.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()

    def reboot(self, *, timeout: float | None = None) -> None:
        """``systemctl reboot`` in the guest, then wait for SSH from the NEW boot."""
        old = self.boot_id()
        # The connection may drop before ssh sees an exit status (255): ignore.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.ssh("systemctl reboot", check=False, timeout=30)
        self._await_boot(old, timeout)

    def power_cut(self, *, timeout: float | None = None) -> None:
        """Reset the guest at once, as a power cut would (qemu's ``system_reset``): what the guest
        had not written to its disks is gone, what it wrote is kept (qemu's own writes reach the
        host). Then wait for SSH from the new boot."""
        old = self.boot_id()
        self.monitor("system_reset")
        self._await_boot(old, timeout)

    def _await_boot(self, old: str, timeout: float | None) -> None:
        self._stop_mux()
        self.wait_ssh(timeout or self.boot_timeout + 60, not_boot_id=old)
        self._start_mux()
        self._wait_boot_finished(timeout or self.boot_timeout + 60)

    def _wait_boot_finished(self, timeout: float) -> None:
        """Wait (bounded, never failing) until systemd has no start job left: sshd answers
        before the rest of the boot ends (a nofail mount, a boot unit), and on a loaded host
        a test that looked at once would race them."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.ssh("systemctl is-system-running --wait >/dev/null", check=False, timeout=timeout)

    def monitor(self, command: str, timeout: float = 5) -> str:
        """Send one human-monitor command (e.g. ``quit``, ``info block``); return its output."""
        sock_path = self.monitor_socket
        if sock_path is None or not self.running:
            raise VmError("VM not running")
        out = b""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock_path))
            s.sendall(command.encode() + b"\n")
            with contextlib.suppress(OSError):
                end = time.monotonic() + timeout
                while time.monotonic() < end:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                    if command != "quit" and out.rstrip().endswith(b"(qemu)") and out.count(b"(qemu)") >= 2:
                        break
        return out.decode(errors="replace")

    def _wait_exit(self, timeout: float) -> bool:
        assert self._proc is not None
        try:
            self._proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, *, timeout: float = 120, power_off: bool = True) -> None:
        """Power off over SSH and wait for qemu to exit.

        Fallbacks, in order: ``quit`` on the monitor socket, SIGTERM, SIGKILL.
        ``power_off=False`` goes straight to ``quit``: for a VM whose disks are thrown away
        (with ``cache=unsafe`` a quit may lose writes the guest has not flushed).
        No-op when not running.
        """
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                if power_off:
                    with contextlib.suppress(Exception):
                        self.ssh("systemctl poweroff", check=False, timeout=30, connect_timeout=5)
                self._stop_mux()
                if not power_off or not self._wait_exit(timeout):
                    with contextlib.suppress(Exception):
                        self.monitor("quit")
                    if not self._wait_exit(15):
                        proc.terminate()
                        if not self._wait_exit(15):
                            proc.kill()
                            proc.wait()
        finally:
            self._stop_mux()
            _live_vms.discard(self)
            self._proc = None
            self._cleanup_monitor()

    def _cleanup_monitor(self) -> None:
        if self._mon_dir:
            with contextlib.suppress(OSError):
                for p in Path(self._mon_dir).iterdir():
                    p.unlink()
                os.rmdir(self._mon_dir)
            self._mon_dir = None

    def __enter__(self) -> Vm:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running on {self.host}:{self._port}" if self.running else "stopped"
        return f"<Vm {self.workdir} {state} attached={self._attached}>"

    # ---- disks in the guest ---------------------------------------------

    def wait_block(self, path: str, timeout: float = 15) -> None:
        """Wait until block device ``path`` exists: a step that closes a disk after a write makes
        udev re-read its partition table, and the partitions (and their by-id links) vanish briefly."""
        q = shlex.quote(path)
        self.ssh(
            f"for i in $(seq {int(timeout * 5)}); do udevadm settle --timeout=5; [ -b {q} ] && exit 0; sleep 0.2; done\n"
            f"echo 'no block device {path}' >&2; exit 1"
        )

    def checksum_disk(self, name: str, regions: Iterable[tuple[int, int]] = ((0, MiB), (-MiB, MiB))) -> dict[tuple[int, int], str]:
        """:func:`checksum_regions` of extra disk ``name``. Flushes the guest first if running."""
        if self.running:
            self.ssh("sync; blockdev --flushbufs /dev/vd? /dev/nvme?n? 2>/dev/null; true")
        return checksum_regions(self.disk_path(name), regions)


def discard(vm: Vm) -> None:
    """Stop the VM and delete its disk files (kept with GS_VM_KEEP=1; logs are always kept)."""
    keep = os.environ.get("GS_VM_KEEP") == "1"
    vm.stop(power_off=keep)  # the disks are deleted: no need to shut the guest down cleanly
    if keep:
        return
    for p in [vm.root_disk, *(vm.disk_path(n) for n in vm.disks)]:
        p.unlink(missing_ok=True)


@contextlib.contextmanager
def running(workdir: str | os.PathLike[str], disks: Sequence[tuple[str, int]] = DEFAULT_DISKS, **kwargs: object) -> Iterator[Vm]:
    """A started VM (Vm(workdir, disks, **kwargs)), discarded on exit."""
    machine = Vm(workdir, disks, **kwargs)  # type: ignore[arg-type]
    try:
        machine.start()
        yield machine
    finally:
        discard(machine)
