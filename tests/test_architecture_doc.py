"""docs/architecture.md matches the tree: every file or folder it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
# The table's columns name paths inside their layer.
COLUMN_ROOTS = {1: ROOT / "stacks", 2: ROOT / "components", 3: ROOT / "policy" / "rules"}
PATH = re.compile(r"`([A-Za-z_][\w./<>-]*(?:\.py|\.sh|\.md|/))`")


def _exists(base: Path, name: str) -> bool:
    if "<" in name:  # a pattern such as stacks/config/<key>.py: its folder exists
        return (base / name.split("<")[0]).is_dir()
    return (base / name).exists()


def named_paths() -> list[tuple[Path, str]]:
    """(where the name is relative to, the name) for each path the doc names."""
    found = []
    header = True
    for line in DOC.read_text().splitlines():
        if line.startswith("|") and header:  # the table's header names the layers, not paths
            header = False
        elif line.startswith("|") and not line.startswith("|---"):
            cells = line.strip("|").split("|")
            for column, cell in enumerate(cells):
                base = COLUMN_ROOTS.get(column, ROOT)
                found += [(base, name) for name in PATH.findall(cell)]
        else:
            found += [(ROOT, name) for name in PATH.findall(line)]
    # The render's output is made by `make render`, not kept in the tree.
    return [(base, name) for base, name in found if not name.startswith("rendered/")]


def test_every_path_the_architecture_doc_names_exists() -> None:
    named = named_paths()
    assert len(named) > 40, "the doc names fewer paths than it does today: is the pattern still right?"
    missing = [f"{base.relative_to(ROOT) if base != ROOT else '.'}/{name}" for base, name in named if not _exists(base, name)]
    assert not missing, f"docs/architecture.md names what the tree does not have: {missing}"


def test_the_check_finds_a_path_that_does_not_exist(tmp_path: Path) -> None:
    assert not _exists(ROOT, "components/node.py") and not _exists(ROOT / "policy" / "rules", "stack.py")
    assert _exists(ROOT, "stacks/config/<key>.py") and not _exists(ROOT, "stacks/nothing/<key>.py")
