"""The Makefile a new user meets first: help, what render installs, the Python check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tools.render import ROOT

MAKEFILE = (ROOT / "Makefile").read_text()
DEV_ONLY = ("pulumi_policy", "pytest", "hypothesis", "kubernetes_validate", "ruff", "yamllint", "matplotlib", "pyinstrument")


# Run as an operator would from a shell: under `make test` the outer make's level and flags would
# otherwise reach the inner one (its messages then say `make[1]:`).
OPERATOR_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}


def make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=OPERATOR_ENV)


def test_help_lists_every_target() -> None:
    phony = re.search(r"^\.PHONY:(.*)$", MAKEFILE, re.M)
    assert phony
    shown = make("help").stdout
    missing = [t for t in phony.group(1).split() if t != "help" and not re.search(rf"^make (\S+ / )?{re.escape(t)}\b", shown, re.M)
               and f"/ {t}" not in shown]
    assert missing == []


def test_test_needs_checkov(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    (venv / ".installed-runtime").touch()
    dry = make("-n", "test", f"VENV={venv}", f"CHECKOV_VENV={tmp_path / 'ck'}")
    assert dry.returncode == 0, dry.stderr
    assert "checkov==" in dry.stdout


def test_render_installs_only_the_runtime(tmp_path: Path) -> None:
    dry = make("-n", "render", f"VENV={tmp_path / 'venv'}")
    assert dry.returncode == 0, dry.stderr
    assert "-r requirements.txt" in dry.stdout
    assert "requirements-dev.txt" not in dry.stdout
    assert "requirements-dev.txt" in make("-n", "test", f"VENV={tmp_path / 'venv'}").stdout


def test_render_imports_nothing_from_the_dev_requirements(tmp_path: Path) -> None:
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {DEV_ONLY!r}:\n"
        "            raise ImportError('dev-only module imported by render: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from tools.render import main\n"
        f"sys.exit(main(['prod', '--out', {str(tmp_path / 'out')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "manifests.yaml").exists()


def test_an_old_python_gets_one_line_and_no_pip(tmp_path: Path) -> None:
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3.9\n")
    old.chmod(0o755)
    result = make("render", f"VENV={tmp_path / 'venv'}", f"PYTHON={old}")
    assert result.returncode != 0
    first = result.stderr.splitlines()[0]
    assert first == f"gpu-serving needs Python 3.11 or newer; {old} is 3.9 (set PYTHON=/path/to/python3.11)"
    assert "pip" not in result.stdout + result.stderr
    assert not (tmp_path / "venv").exists()
    missing = make("render", f"VENV={tmp_path / 'venv'}", "PYTHON=no-such-python3")
    assert missing.stderr.splitlines()[0].startswith("gpu-serving needs Python 3.11 or newer; 'no-such-python3' does not run")
    assert make("python-version").returncode == 0


def test_make_render_with_a_bad_config_is_the_one_line_and_make_exit_2(tmp_path: Path) -> None:
    """docs/rendering.md: the render's line, make's own trailer, exit 2; nothing on stdout."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    for requirements in ("requirements.txt", "requirements-dev.txt"):
        os.utime(clone / requirements, (0, 0))  # older than the venv's stamps: make installs nothing
    (clone / "Pulumi.bad.yaml").write_text((ROOT / "Pulumi.prod.yaml").read_text().replace("sizeGb: 1000", "sizeGb: -5"))
    result = make("render", "STACK=bad", f"VENV={ROOT / 'venv'}", cwd=clone)
    assert result.returncode == 2
    assert result.stdout == ""
    line, trailer = result.stderr.splitlines()
    assert line == "render bad: config error: nodes[0].storage.sizeGb: Input should be greater than or equal to 1 (got -5)"
    assert re.fullmatch(r"make: \*\*\* \[Makefile:\d+: render\] Error 1", trailer), trailer
    page = " ".join((ROOT / "docs/rendering.md").read_text().split())
    assert "make's own `make: *** [Makefile:NN: render] Error 1` after it, and exits 2" in page
