"""The GPU nodes: each prepared over SSH by bash steps (`scripts/`), rendered by a pure generator
(`steps`, `script`), reported back (`reports`) and labelled (`labels`); `component` holds the
Pulumi side."""

from components.node.component import GpuNode, GpuNodeArgs, gpu_nodes, labelled_for
from components.node.reports import parse_report
from components.node.steps import DISK_STEPS

__all__ = ["DISK_STEPS", "GpuNode", "GpuNodeArgs", "gpu_nodes", "labelled_for", "parse_report"]
