"""What the node steps report back: the JSON line a step prints last, read into the node's outputs.

Health is measured when the health step runs (first `up`, or when the disks, the array's name or the
mountpoint change: a replaced disk is measured again); to measure
again: `pulumi up --replace '<urn of <node>:70-health>'`. Shrinking is refused at config load,
against the partition size the last grow step exported (`stacks.deployed_outputs`); preflight and
grow refuse it again on the node, before any write.
"""

from __future__ import annotations

import json
from typing import Any

from stacks.config import Node

UNKNOWN = "unknown until pulumi up"


def parse_report(stdout: str | None) -> dict[str, Any] | None:
    """The JSON report a step prints as its last line; None when there is none (mock render, preview)."""
    if not stdout:
        return None
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                return None
            return report if isinstance(report, dict) else None
    return None


def storage_outputs(health_stdout: str | None, grow_stdout: str | None, node: Node) -> dict[str, Any]:
    """The node's storage outputs from the health and grow reports ("unknown until pulumi up" without them).

    `partitionBytes` is what the last successful grow step left on each member; the next run's
    config check refuses a smaller `sizeGb` against it (see `stacks.config.refuse_shrinking`).
    """
    storage = node.storage
    report = parse_report(health_stdout)
    grown = parse_report(grow_stdout) or {}
    outputs: dict[str, Any] = {
        "arrayDevice": storage.device if storage else None,
        "disks": list(storage.disks) if storage else [],
        "partitionBytes": grown.get("partitionBytes", UNKNOWN),
        "arrayUuid": UNKNOWN,
        "filesystemUuid": UNKNOWN,
        "mountpoint": storage.mountpoint if storage else None,
        "usableBytes": UNKNOWN,
        "health": UNKNOWN,
    }
    if report is not None:
        outputs.update(
            arrayDevice=report.get("device", outputs["arrayDevice"]),
            arrayUuid=report.get("arrayUuid") or UNKNOWN,
            filesystemUuid=report.get("filesystemUuid") or UNKNOWN,
            mountpoint=report.get("mountpoint"),
            usableBytes=report.get("usableBytes") if report.get("mounted") else 0,
            health=report.get("health", UNKNOWN),
        )
    return outputs


def health_warning(node_name: str, outputs: dict[str, Any]) -> str | None:
    health = outputs.get("health")
    if health in ("clean", "resyncing", UNKNOWN, "no disk work"):
        return None
    if health == "degraded":
        return (f"node {node_name}: RAID1 {outputs.get('arrayDevice')} is degraded: it serves from one disk. "
                "Replace the failed member (cat /proc/mdstat), then run `pulumi up` to add it back.")
    return f"node {node_name}: RAID1 {outputs.get('arrayDevice')} health is {health!r}; check `mdadm --detail` on the node."
