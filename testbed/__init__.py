"""What proves the product: the engine and cluster builds, the VMs, the stand-ins, the e2e checks and the benchmarks."""

from __future__ import annotations

import re
from pathlib import Path

CLUSTER_VERSIONS = Path(__file__).resolve().parent / "cluster" / "versions.env"


def cluster_pins() -> dict[str, str]:
    """The test bed's pins (testbed/cluster/versions.env, the one place they live): NAME → value, as written there."""
    return dict(re.findall(r"^([A-Z0-9_]+)=(\S+)$", CLUSTER_VERSIONS.read_text(), re.M))
