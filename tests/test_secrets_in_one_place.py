"""Secrets are read in one place: `__main__.py` hands `stacks.secret` to `components.stack.declare`, which reads each
secret with it and hands it to the component that uses it as an argument, so no component reads the stack's config
on its own (and the component package passes its consumer's secrets the same way)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READS_CONFIG = re.compile(r"\bpulumi\.Config\(|\bstacks\.secret\(|\brequire_secret\(|\bget_secret\(|\bruntime\.config\b|^import stacks$",
                          re.MULTILINE)


def test_no_component_reads_config_or_secrets() -> None:
    modules = sorted((ROOT / "components").rglob("*.py"))
    assert len(modules) > 10
    readers = {str(m.relative_to(ROOT)): READS_CONFIG.findall(m.read_text()) for m in modules}
    assert {name: found for name, found in readers.items() if found} == {}

