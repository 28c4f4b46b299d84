"""`make bench` in its small mode runs and writes its tables (benchmarks are not timed tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from testbed.bench import generated_stack
from tools.render import ROOT


def test_quick_bench_writes_its_tables_and_chart(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "testbed.bench", "--quick", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "BENCHMARKS.md").read_text()
    for heading in ("## 1. Evaluation overhead", "## 2. Scaling", "## 3. Node steps on the VM", "## 4. Determinism"):
        assert heading in report
    assert "| 1 × 1 |" in report and "| 10 × 8 |" in report
    assert "**0** of" in report  # two renders of prod do not differ
    assert (tmp_path / "benchmarks-scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The profile of the largest stack splits all of its time between the groups.
    shares = [int(share) for share in re.findall(r"^\| [^|]+ \| (\d+)% \|$", report, flags=re.MULTILINE)]
    assert len(shares) == 7 and 97 <= sum(shares) <= 103


def test_generated_stacks_are_valid_configs() -> None:
    from stacks.config import parse

    for models, nodes in ((1, 1), (100, 1), (100, 32)):
        document = generated_stack(models, nodes)["config"]
        stack = parse({key.split(":", 1)[1]: value for key, value in document.items()})
        assert (len(stack.models), len(stack.nodes)) == (models, nodes)


def test_node_step_profile_reads_a_real_bash_trace(tmp_path: Path) -> None:
    from testbed.bench_node import profile, traced

    trace = tmp_path / "trace"
    script = "set -euo pipefail\nsleep 0.4\nx=$(echo hi)\ntrue\n"
    subprocess.run(["bash", "-c", traced(script, str(trace))], check=True)
    spent = profile(trace.read_text())
    assert {"sleep", "echo", "x", "true"} <= set(spent)
    assert max(spent, key=spent.__getitem__) == "sleep"


def test_node_step_report_separates_our_writes_from_the_guests() -> None:
    from testbed.bench_node import Measured, markdown

    measured = Measured(
        first={"10-preflight": 2.0, "30-raid": 78.0}, rerun={"10-preflight": 1.0, "30-raid": 3.0},
        results={"10-preflight": "unchanged", "30-raid": "unchanged"}, login=0.5,
        written=["/var/log/journal/abc/system.journal", "/var/log/wtmp", "/etc/fstab"], profile={"parted": 0.8, "udevadm": 0.2},
    )  # fmt: skip
    report = markdown(measured)
    assert "| **all 2 steps** | **80.0** | **4.0** (5.0% of the first run" in report
    assert "| **the steps' own work** | | **3.0** (3.8% of the first run) |" in report
    assert "**Files written by the re-run: 1** of ours (/etc/fstab); the guest itself wrote 2" in report
    assert report.index("`parted`") < report.index("`udevadm`")


def test_benchmarks_write_to_an_untracked_folder_unless_asked() -> None:
    from testbed.bench import BENCH_OUT, DOCS, output_folder

    assert output_folder(None, update_docs=False) == BENCH_OUT
    assert output_folder(None, update_docs=True) == DOCS
    assert output_folder(Path("/x"), update_docs=True) == Path("/x")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(BENCH_OUT / "BENCHMARKS.md")], cwd=ROOT)
    assert ignored.returncode == 0
    for module in ("testbed.bench", "testbed.bench_node", "testbed.bench_engine"):
        usage = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert "--update-docs" in usage.stdout, module
    contributing = (ROOT / "docs/contributing.md").read_text()
    assert "make bench BENCH_ARGS=--update-docs" in contributing and "make bench BENCH_ARGS=--quick" in contributing
