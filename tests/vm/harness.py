"""Throwaway Debian VM (qemu TCG) with blank extra disks, for testing node scripts on a real kernel.

Stdlib only. Typical use::

    image = ensure_image()                      # builds once, cached outside the repo
    with Vm(tmp_path) as vm:                    # boots, waits for SSH
        vm.run_script("set -e; mdadm --version")
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
import fcntl
import hashlib
import inspect
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

__all__ = [
    "DEFAULT_DISKS",
    "OS_LAYOUT",
    "BootedState",
    "GiB",
    "MiB",
    "SshError",
    "Vm",
    "VmError",
    "ansible_role_layout",
    "checksum_regions",
    "ensure_booted_state",
    "ensure_image",
    "image_dir",
    "make_os_like_layout",
    "os_layout_regions",
    "os_layout_sha256s",
    "partition_sha256s",
    "save_booted_state",
]

MiB = 1024**2
GiB = 1024**3

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-image.sh"
INSTALL_DEPS_SCRIPT = HERE / "install-host-deps.sh"

DEFAULT_DISKS: tuple[tuple[str, int], ...] = (("gs-disk-a", 4 * GiB), ("gs-disk-b", 4 * GiB))
ROOT_PORTS = 8  # PCIe root ports for extra disks; a VM with more disks gets one per disk

_SERIAL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,20}$")  # virtio-blk serials are at most 20 bytes


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


# --------------------------------------------------------------------------- image


def image_dir(cache_root: Path | None = None) -> Path:
    """Where build-image.sh puts (or has put) the image for its current content."""
    root = cache_root or Path(os.environ.get("GS_VM_CACHE") or Path.home() / ".cache" / "gpu-serving")
    digest = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:16]
    return root / f"image-{digest}"


def ensure_image(timeout: float = 1800) -> Path:
    """Build the VM image if it is not cached yet; return its folder.

    The folder holds ``disk.raw``, ``id_ed25519`` and ``id_ed25519.pub``.
    Building needs root and the tools from install-host-deps.sh (~3 min).
    """
    target = image_dir()
    if (target / "disk.raw").is_file():
        return target
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise VmError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")
    if not (target / "disk.raw").is_file():
        raise VmError(f"{BUILD_SCRIPT} succeeded but {target}/disk.raw is missing")
    return target


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


def checksum_regions(
    path: str | os.PathLike[str],
    regions: Iterable[tuple[int, int]] = ((0, MiB), (-MiB, MiB)),
) -> dict[tuple[int, int], str]:
    """sha256 of byte ranges of a (raw disk) file, keyed by the ``(offset, length)`` given.

    A negative offset counts from the end of the file, so the default
    ``((0, MiB), (-MiB, MiB))`` hashes the first and the last MiB.
    Reads past the end are an error. Hash a disk only after the guest has
    flushed it (``sync``/``blockdev --flushbufs``) or with the VM stopped.
    """
    path = Path(path)
    size = path.stat().st_size
    out: dict[tuple[int, int], str] = {}
    with open(path, "rb") as f:
        for region in regions:
            offset, length = region
            start = offset + size if offset < 0 else offset
            if start < 0 or length < 0 or start + length > size:
                raise ValueError(f"region {region} outside {path} ({size} bytes)")
            f.seek(start)
            h = hashlib.sha256()
            left = length
            while left:
                chunk = f.read(min(left, 4 * MiB))
                if not chunk:
                    raise ValueError(f"short read in {path} at region {region}")
                h.update(chunk)
                left -= len(chunk)
            out[(offset, length)] = h.hexdigest()
    return out


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
    Made by :func:`save_booted_state`; valid for the qemu binary and harness that made it."""

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


# --------------------------------------------------------------------------- the VM


class Vm:
    """One throwaway VM in its own work folder.

    ``disks`` are ``(name, size_bytes)``; each becomes ``<workdir>/<name>.raw`` (sparse,
    created on first use, kept across stop/start) and ``/dev/disk/by-id/virtio-<name>``
    in the guest. ``attach`` (attribute, or argument of ``start``) selects which of
    them are plugged in at the next boot; ``None`` means all.

    One vCPU by default: under TCG the guest's work here (fork-heavy shell, ``update-initramfs``)
    runs as fast on one vCPU as on two (88 s against 82 s, and two one-vCPU guests side by side
    took 84 and 100 s), so ``make test-vm`` runs one guest per host core instead of one guest on all.
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
        while True:
            status = self.monitor("info status")
            if "inmigrate" not in status and ("paused" in status or "running" in status):
                break
            if not self.running or time.monotonic() > deadline:
                raise VmError(f"the saved guest did not load within {timeout:.0f} s: {status!r}\n" + self._diagnostics())
            time.sleep(0.5)
        if "running" not in status:
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

    # ---- SSH --------------------------------------------------------------

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


# --------------------------------------------------------------------------- OS-like layout

# (GPT name, sgdisk type code, start MiB, size MiB): like a node's sda1..sda4.
OS_LAYOUT: tuple[tuple[str, str, int, int], ...] = (
    ("efi", "ef00", 1, 32),
    ("boot", "8300", 33, 64),
    ("swap", "8200", 97, 64),
    ("root", "8300", 161, 128),
)
OS_LAYOUT_END_MIB = OS_LAYOUT[-1][2] + OS_LAYOUT[-1][3]  # 289 MiB; the rest of the disk is free


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


def os_layout_regions() -> list[tuple[int, int]]:
    """Byte ranges ``(offset, length)`` of the OS_LAYOUT partitions in a raw disk file
    (use with :func:`checksum_regions` on the host: same sha256 as in the guest)."""
    return [(start * MiB, size * MiB) for _n, _t, start, size in OS_LAYOUT]


def partition_sha256s(vm: Vm, devices: Iterable[str]) -> dict[str, str]:
    """sha256 of each guest block device's content, read in the guest."""
    devs = list(devices)
    script = (
        'set -eu\nfor d in "$@"; do\n'
        '  blockdev --flushbufs "$d"\n'
        '  printf \'%s %s\\n\' "$d" "$(sha256sum < "$d" | cut -d\' \' -f1)"\n'
        "done\n"
    )
    out = vm.run_script(script, args=devs, timeout=900).stdout
    res = dict(line.split(" ", 1) for line in out.splitlines() if line.strip())
    return {d: res[d].strip() for d in devs}


def os_layout_sha256s(vm: Vm, disks: Iterable[str]) -> dict[str, str]:
    """:func:`partition_sha256s` of :func:`make_os_like_layout`'s partitions on ``disks``, with the
    bytes hashed on the host once the guest has flushed (a guest sha256 of 576 MiB costs ~18 s
    under TCG). The guest says where each partition lies; one that no longer starts and ends where
    OS_LAYOUT put it (or is gone) gets ``moved <start> <size>`` instead of a hash."""
    names = list(disks)
    parts = [f"{Vm.by_id(n)}-part{i}" for n in names for i in range(1, len(OS_LAYOUT) + 1)]
    script = (
        'set -u\nsync\nfor d in "$@"; do\n'
        '  k=$(readlink -f "$d"); k=${k##*/}\n'
        '  echo "$d $(cat /sys/class/block/$k/start 2>/dev/null) $(cat /sys/class/block/$k/size 2>/dev/null)"\n'
        "done\n"
    )
    where = {d: rest for d, _, rest in (line.partition(" ") for line in vm.run_script(script, args=parts).stdout.splitlines())}
    out: dict[str, str] = {}
    for name in names:
        sums = vm.checksum_disk(name, os_layout_regions())
        for i, ((_label, _code, start, size), digest) in enumerate(zip(OS_LAYOUT, sums.values(), strict=True), 1):
            part = f"{Vm.by_id(name)}-part{i}"
            out[part] = digest if where.get(part) == f"{start * 2048} {size * 2048}" else f"moved {where.get(part)}"
    return out


def make_os_like_layout(vm: Vm, disks: Iterable[str] | None = None) -> dict[str, str]:
    """Give each blank extra disk a GPT with OS-like partitions 1-4 (efi 32 MiB,
    boot 64 MiB, swap 64 MiB, root 128 MiB; ends at 289 MiB, the rest is free), fill
    each partition with random data and return ``{"/dev/disk/by-id/virtio-<disk>-part<N>": sha256}``.

    Run it on a running VM; ``disks`` defaults to all attached extra disks. The guest writes the
    GPT; the host writes the random data straight into the raw files (under TCG the guest took
    ~40 s to draw and write 576 MiB from /dev/urandom), then the guest drops what it had cached
    of those partitions, so every later read in the guest sees the host's bytes.
    """
    names = list(vm.attached if disks is None else disks)
    sg_args = []
    for i, (label, code, start, size) in enumerate(OS_LAYOUT, 1):
        end = start + size
        # sgdisk takes sectors when no unit is given; 512-byte sectors
        sg_args += [
            f"-n{i}:{start * 2048}:{end * 2048 - 1}",
            f"-t{i}:{code}",
            f"-c{i}:{label}",
        ]
    devices: list[str] = []
    lines = ["set -euo pipefail"]
    for name in names:
        disk = Vm.by_id(name)
        lines.append(f"sgdisk -Z {shlex.join(sg_args)} {disk} >/dev/null")
        devices += [f"{disk}-part{i}" for i in range(1, len(OS_LAYOUT) + 1)]
    lines.append("udevadm settle")
    lines += [f"test -b {part}" for part in devices]
    vm.run_script("\n".join(lines) + "\n", timeout=900)
    sums: dict[str, str] = {}
    for name in names:
        with open(vm.disk_path(name), "r+b") as f:
            for i, (_label, _code, start, size) in enumerate(OS_LAYOUT, 1):
                data = os.urandom(size * MiB)
                f.seek(start * MiB)
                f.write(data)
                sums[f"{Vm.by_id(name)}-part{i}"] = hashlib.sha256(data).hexdigest()
    # udev read the new partitions' first blocks (blkid) before the host wrote them.
    disks_and_parts = [Vm.by_id(n) for n in names] + devices
    vm.ssh("blockdev --flushbufs " + " ".join(disks_and_parts))
    return sums


# --------------------------------------------------------------------------- the Ansible role's layout

# The OS partitions in front of partition 5 on a node the seed's role prepared (sgdisk arguments).
ROLE_OS_TABLE = "-n1:1M:+32M -c1:efi -t1:ef00 -n2:33M:+64M -c2:boot -n3:97M:+64M -c3:swap -t3:8200 -n4:161M:+128M -c4:root"
ROLE_MD = "/dev/md1"


def ansible_role_layout(
    vm: Vm, disks: Sequence[str], mountpoint: str, data: str = "model.safetensors", *, resynced: bool = True
) -> dict[str, str]:
    """What roles/gpu_model_storage left on k8s-worker-02, built on two blank disks (guest paths,
    by-id): OS partitions 1-4, partition 5 from 34 GB (parted's decimal units) of
    gpu_model_storage_partition_size_gb (1 here), `mdadm --create /dev/md1`, mkfs.xfs,
    ansible.posix.mount by UUID with nofail, `mdadm --detail --scan` appended to mdadm.conf, and a
    16 MiB file of data, the array resynced (the role ran long ago). With ``resynced=False`` the
    array's first resync is slowed to 1 MB/s and still runs when this returns (about 17 minutes;
    ``echo system > /sys/block/md1/md/sync_speed_max`` lets it finish). The disks must be larger
    than 35 GB (sparse files are). Returns the data's path and sha256, the filesystem's and the
    array's UUID and partition 5's start (bytes)."""
    a, b = disks
    vm.run_script(
        "set -euo pipefail\n"
        f"for d in {a} {b}; do sgdisk {ROLE_OS_TABLE} $d >/dev/null; parted -s -a optimal $d mkpart primary 34GB 35GB; done\n"
        f"partprobe {a} {b}; udevadm settle\n"
        f"mdadm --create {ROLE_MD} --level=1 --raid-devices=2 --metadata=1.2 --run {a}-part5 {b}-part5\n"
        + ("" if resynced else "echo 1000 > /sys/block/md1/md/sync_speed_max\n")
        + f"mkfs.xfs -q {ROLE_MD}; udevadm settle\n"
        f"mkdir -p {mountpoint}; echo \"UUID=$(blkid -s UUID -o value {ROLE_MD}) {mountpoint} xfs defaults,nofail 0 0\" >> /etc/fstab\n"
        # Only md1's line: the machine may run other arrays (the lab VM runs the lab stack's).
        f"mdadm --detail --scan | grep '^ARRAY {ROLE_MD} ' >> /etc/mdadm/mdadm.conf\n"
        f"mount {mountpoint}; head -c 16M /dev/urandom > {mountpoint}/{data}; sync\n"
        + ("while [ $(cat /sys/block/md1/md/sync_action) != idle ]; do sleep 1; done\n" if resynced else ""),
        timeout=900,
    )

    def out(command: str) -> str:
        return vm.ssh(command).stdout.strip()

    path = f"{mountpoint}/{data}"
    return {
        "path": path,
        "data": out(f"sha256sum {path}").split()[0],
        "fs_uuid": out(f"blkid -s UUID -o value {ROLE_MD}"),
        "md_uuid": out(f"mdadm --detail --export {ROLE_MD} | sed -n 's/^MD_UUID=//p'"),
        "start": out(f"parted -m -s {a} unit B print | grep '^5:' | cut -d: -f2"),
    }
