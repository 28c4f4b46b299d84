"""Extract the metric names an exporter exports from its source, into the fixture lists of
tests/data/metrics/ that the dashboards' and alerts' queries are checked against.

    python -m tools.metric_names vllm <unpacked vllm wheel or sdist> <version>
    python -m tools.metric_names node-exporter <unpacked module zip> <version>
    python -m tools.metric_names kube-state-metrics <unpacked module zip> <version>
    python -m tools.metric_names dcgm-exporter <default-counters.csv> <version>

Each prints the fixture (provenance header, then one exported series name a line) on stdout.
Names are the series Prometheus stores: a prometheus_client Counter `vllm:x` is `vllm:x_total`, a
Histogram `vllm:y` is `vllm:y_bucket`, `_sum` and `_count`."""

from __future__ import annotations

import ast
import csv
import re
import sys
from pathlib import Path

VLLM_FILE = "vllm/v1/metrics/loggers.py"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram",
         "Gauge": "gauge", "Counter": "counter", "Histogram": "histogram"}


def _series(name: str, kind: str) -> list[str]:
    base = name.removesuffix("_total") if kind == "counter" else name
    return [base + suffix for suffix in SUFFIXES[kind]]


def vllm(tree: Path) -> tuple[list[str], list[str]]:
    """(exported by default, hidden): the metrics of PrometheusStatLogger, the ones under
    `if self.show_hidden_metrics:` only with `--show-hidden-metrics-for-version`."""
    module = ast.parse((tree / VLLM_FILE).read_text())
    shown: set[str] = set()
    hidden: set[str] = set()

    def visit(node: ast.AST, is_hidden: bool) -> None:
        if isinstance(node, ast.If) and "show_hidden_metrics" in ast.unparse(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, is_hidden)
            return
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            name = next((k.value for k in node.keywords if k.arg == "name"), None)
            if called in KINDS and isinstance(name, ast.Constant) and str(name.value).startswith("vllm:"):
                (hidden if is_hidden else shown).update(_series(name.value, KINDS[called]))
        for child in ast.iter_child_nodes(node):
            visit(child, is_hidden)

    visit(module, False)
    return sorted(shown), sorted(hidden - shown)


def go_collectors(tree: Path, files: list[str], namespace: str) -> list[str]:
    """`prometheus.BuildFQName(namespace, "<subsystem>", "<name>")` (node_exporter): the subsystem a
    literal or the file's `const subsystem`."""
    names: set[str] = set()
    for file in files:
        text = (tree / file).read_text()
        const = re.search(r'subsystem\s*=\s*"(\w+)"', text)
        for subsystem, name in re.findall(r'BuildFQName\(\s*namespace,\s*("\w+"|subsystem),\s*"(\w+)"\s*\)', text):
            sub = const.group(1) if subsystem == "subsystem" and const else subsystem.strip('"')
            names.add(f"{namespace}_{sub}_{name}")
    return sorted(names)


def kube_state_metrics(tree: Path, files: list[str]) -> list[str]:
    names: set[str] = set()
    for file in files:
        names.update(re.findall(r'"(kube_[a-z_]+)"', (tree / file).read_text()))
    return sorted(names)


def dcgm(counters: Path) -> list[str]:
    """dcgm-exporter's default counters file: `field, type, help`; type `label` is a label, no series."""
    rows = csv.reader(line for line in counters.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#"))
    return sorted(row[0].strip() for row in rows if row[1].strip() != "label")


KPS = "88.5.3"
"""The kube-prometheus-stack chart whose dependencies name the node-exporter and kube-state-metrics versions."""
NODE_EXPORTER_CHART = "4.56.1"
KSM_CHART = "8.4.0"
DCGM_COMMIT = "691c92762eb551313c825f6efe4ceeee20982801"
NODE_EXPORTER_FILES = ["collector/mdadm_linux.go", "collector/filesystem_common.go", "collector/uname.go"]
KSM_FILES = ["internal/store/deployment.go", "internal/store/job.go"]


def main(argv: list[str]) -> int:
    kind, source, version = argv
    path = Path(source)
    header = [f"# {kind} {version}: the series names it exports, one a line (tools/metric_names.py)."]
    if kind == "vllm":
        shown, hidden = vllm(path)
        header.append(f"# From {VLLM_FILE} of the vllm {version} wheel on PyPI (PrometheusStatLogger).")
        if hidden:
            header.append("# Not listed: exported only with --show-hidden-metrics-for-version: " + ", ".join(hidden))
        names = shown
    elif kind == "node-exporter":
        header.append(f"# From {', '.join(NODE_EXPORTER_FILES)} of module github.com/prometheus/node_exporter@{version}")
        chart = f"prometheus-node-exporter chart {NODE_EXPORTER_CHART}"
        header.append(f"# (proxy.golang.org); the version kube-prometheus-stack {KPS} runs ({chart}).")
        names = go_collectors(path, NODE_EXPORTER_FILES, "node")
    elif kind == "kube-state-metrics":
        header.append(f"# From {', '.join(KSM_FILES)} of module k8s.io/kube-state-metrics/v2@{version} (proxy.golang.org);")
        header.append(f"# the version kube-prometheus-stack {KPS} runs (kube-state-metrics chart {KSM_CHART}). Deployments and Jobs only.")
        names = kube_state_metrics(path, KSM_FILES)
    elif kind == "dcgm-exporter":
        header.append(f"# From etc/default-counters.csv of github.com/NVIDIA/dcgm-exporter at tag {version} (commit {DCGM_COMMIT}):")
        header.append("# the fields it exports without a custom counters file (the GPU Operator's default).")
        names = dcgm(path)
    else:
        print(f"unknown exporter {kind}: vllm, node-exporter, kube-state-metrics or dcgm-exporter", file=sys.stderr)
        return 2
    print("\n".join(header + names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
