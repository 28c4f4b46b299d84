"""`make bench` in its small mode runs and writes its tables (benchmarks are not timed tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.bench import generated_stack
from tools.render import ROOT


def test_quick_bench_writes_its_tables_and_chart(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tools.bench", "--quick", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "BENCHMARKS.md").read_text()
    for heading in ("## 1. Evaluation overhead", "## 2. Scaling", "## 3. Node steps on the VM", "## 4. Determinism"):
        assert heading in report
    assert "| 1 × 1 |" in report and "| 10 × 8 |" in report
    assert "**0** of" in report  # two renders of prod do not differ
    assert (tmp_path / "benchmarks-scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generated_stacks_are_valid_configs() -> None:
    from stacks.config import parse

    for models, nodes in ((1, 1), (100, 1), (100, 32)):
        document = generated_stack(models, nodes)["config"]
        stack = parse({key.split(":", 1)[1]: value for key, value in document.items()})
        assert (len(stack.models), len(stack.nodes)) == (models, nodes)
