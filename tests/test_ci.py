"""CI's entry point (.ci/run) and the repository depend on no folder of the machine they were made on."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tools.render import ROOT


def tracked_files_containing(needle: str) -> list[str]:
    result = subprocess.run(["git", "grep", "-lF", needle], cwd=ROOT, capture_output=True, text=True, check=False)
    return result.stdout.split()


# Folders every machine has: the project names them on purpose (a container's /root/.cache, /tmp).
SYSTEM_FOLDERS = {"/", "/tmp", "/var/tmp", "/home", "/root", "/srv", "/opt", "/usr", "/var", "/root/.cache"}


def test_no_tracked_file_names_a_folder_of_this_machine() -> None:
    for folder in (ROOT, ROOT.parent, Path.home() / ".cache"):
        if str(folder) in SYSTEM_FOLDERS:
            continue
        assert tracked_files_containing(str(folder) + "/") == [], folder


def test_ci_takes_the_engine_sources_from_beside_the_clone_only() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert "../shared/engine-src" in run
    assert "$HOME" not in run


def test_the_checks_ci_leaves_out_are_e2e_checks() -> None:
    # A renamed benchmark would otherwise run in CI again unnoticed, and a typo skip nothing.
    run = (ROOT / ".ci" / "run").read_text()
    skipped = re.search(r'E2E_ARGS="--skip ([^"]+)"', run)
    assert skipped, "CI's e2e stage names the checks it leaves out"
    sources = "".join(p.read_text() for p in (ROOT / "testbed" / "e2e").glob("*.py"))
    for name in skipped[1].split(","):
        assert f'.check("{name}",' in sources, name


def test_the_vm_tier_orders_every_module_it_has() -> None:
    # make test-vm hands modules to its two workers longest first (tests/vm/conftest.py); one missing from the
    # order runs last, and a long one there leaves the other worker idle for its whole length.
    conftest = (ROOT / "tests" / "vm" / "conftest.py").read_text()
    listed = re.findall(r'^    "(test_\w+\.py)",', conftest, re.M)
    assert sorted(listed) == sorted(p.name for p in (ROOT / "tests" / "vm").glob("test_*.py"))


def test_the_vm_modules_ci_leaves_out_exist() -> None:
    # `make test-vm` runs them all; CI's --ignore of a renamed module would silently run it again, or of a typo nothing.
    run = (ROOT / ".ci" / "run").read_text()
    ignored = re.findall(r"--ignore=(tests/vm/\w+\.py)", run)
    assert ignored, "CI's test-vm stage names the modules it leaves out"
    for path in ignored:
        assert (ROOT / path).is_file(), path
