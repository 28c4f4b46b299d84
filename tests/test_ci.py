"""CI's entry point (.ci/run) and the repository depend on no folder of the machine they were made on."""

from __future__ import annotations

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
