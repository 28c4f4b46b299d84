"""pytest fixtures for the VM tests (tests/vm).

Every test under tests/vm is skipped unless GS_VM_TESTS=1 (``make test-vm``),
so the fast ``make test`` never boots a VM.

Fixtures:
  vm_image    (session)  folder of the cached image (built on first use, ~3-4 min)
  vm_booted   (session)  the image booted once and saved running (testbed.vm.BootedState), cached
                         beside the image: booted by the first session only
  vm          (module)   a started Vm with two blank 4 GiB disks, shared by a test module:
                         vm_booted resumed (seconds, not a boot), then the disks plugged in
  fresh_vm    (function) the same, but a new VM for each test
  vm_factory  (function) ``vm_factory(disks=..., name=...)`` -> an UNSTARTED Vm in a tmp
                         folder whose start() really boots (pass ``booted=vm_booted`` to
                         resume instead); every Vm it made is stopped at teardown

Set GS_VM_KEEP=1 to keep the disk files of finished VMs (they are deleted otherwise,
the logs are always kept in pytest's tmp folder).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.vm import DEFAULT_DISKS, BootedState, Vm, discard, ensure_booted_state, ensure_image, running

HERE = Path(__file__).resolve().parent
VM_TESTS_ENABLED = os.environ.get("GS_VM_TESTS") == "1"
SKIP_REASON = "VM test: boots a Debian VM under qemu (minutes); set GS_VM_TESTS=1 (make test-vm) to run it"


# make test-vm runs one module per worker (pytest-xdist --dist loadfile) and hands out modules in
# collection order: the longest first, so no long module starts last while the other worker idles.
# Seconds per module of the last measured run (a warm `.ci/run`, 2026-12-06; printed at the end of every run). Every
# module is listed (tests/test_ci.py): one left out starts last, as test_step_records.py did (577 s, the longest).
SLOWEST_FIRST = (
    "test_step_records.py",  # 577
    "test_node_scripts.py",  # 575
    "test_disk_adopt.py",  # 541
    "test_first_run_sweep.py",  # 487
    "test_live_node.py",  # 461
    "test_disk_safety.py",  # 351
    "test_node_faults.py",  # 228
    "test_udev_race.py",  # 112
    "test_slow_disk.py",  # 55
    "test_harness.py",  # 206 before its reboot and detached-disk boot moved to test_node_scripts.py
    "test_disk_paths.py",  # 7
)


def _module_rank(item: pytest.Item) -> int:
    name = Path(item.path).name
    return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VM_TESTS_ENABLED:
        items.sort(key=_module_rank)  # stable: tests keep their order within a module
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vm_image() -> Path:
    missing = [t for t in ("qemu-system-x86_64", "qemu-img", "ssh", "debootstrap") if not shutil.which(t)]
    if missing:
        pytest.fail(
            f"missing host tools {missing}: run testbed/vm/install-host-deps.sh (as root) first",
            pytrace=False,
        )
    return ensure_image()


@pytest.fixture(scope="session")
def vm_booted(vm_image: Path) -> BootedState:
    return ensure_booted_state(vm_image)


def _running(workdir: Path, booted: BootedState) -> Iterator[Vm]:
    with running(workdir, image=booted.image, booted=booted) as machine:
        yield machine


@pytest.fixture(scope="module")
def vm(vm_booted: BootedState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    yield from _running(tmp_path_factory.mktemp("vm"), vm_booted)


@pytest.fixture
def fresh_vm(vm_booted: BootedState, tmp_path: Path) -> Iterator[Vm]:
    yield from _running(tmp_path / "vm", vm_booted)


@pytest.fixture
def vm_factory(vm_image: Path, tmp_path: Path) -> Iterator[object]:
    made: list[Vm] = []

    def make(disks=DEFAULT_DISKS, name: str = "vm", **kwargs: object) -> Vm:
        machine = Vm(tmp_path / name, disks, image=vm_image, **kwargs)  # type: ignore[arg-type]
        made.append(machine)
        return machine

    try:
        yield make
    finally:
        for machine in made:
            discard(machine)


# Seconds per module (setup, call and teardown of its tests, module fixtures included), printed at
# the end of the run: what SLOWEST_FIRST is ordered by and what tests/vm/README.md measures.
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if VM_TESTS_ENABLED and _MODULE_SECONDS:
        terminalreporter.write_sep("=", "seconds per module")
        for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:8.0f}  {module}")
