"""The largest generated stack brought up once against the loopback cluster (testbed/cluster) instead of YAML."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacks.config import parse
from testbed.bench import generated_stack
from testbed.bench_fleet.measure import disk_chains_overlapping, exported, node_names, sample, ssh_standin
from testbed.e2e.run import Run
from testbed.standins.ssh import read_log

CLUSTER_NODE = "4:64:512Gi"
"""What each kwok node advertises: GPUs (the generated stack asks at most ⌈models / nodes⌉ = 4 per node at
32 × 100), CPUs and memory (four replicas of 4 CPUs, 16 GiB each fit)."""


@dataclass(frozen=True)
class ClusterResult:
    nodes: int
    models: int
    resources: int
    server: str
    up_seconds: float
    noop_seconds: float
    noop_commands: int
    noop_changes: dict[str, int]
    up_overlap: int
    state_mib: float

    @property
    def label(self) -> str:
        return f"{self.nodes} × {self.models}"


def cluster_config(nodes: int, models: int, ports: dict[str, int], kubeconfig: str) -> dict[str, Any]:
    """The generated stack against a cluster: the same nodes and models, without the Ingress (no
    controller here would ever give it an address, which the provider awaits) or its certificate issuer."""
    document = generated_stack(models, nodes)["config"]
    raw = {key.split(":", 1)[1]: value for key, value in document.items()}
    raw["cluster"] = {"namespace": raw["cluster"]["namespace"], "kubeconfig": {"path": kubeconfig}}
    for model in raw["models"]:
        model.pop("ingress", None)
    for node in raw["nodes"]:
        node["ssh"] = {"host": "127.0.0.1", "port": ports[node["name"]], "user": "root"}
    return raw


def cluster_up(program: Run, nodes: int, models: int, key: str, work: Path) -> ClusterResult:
    """A first `up` and a no-op `up` of the generated stack on the loopback cluster (testbed/cluster: a real
    kube-apiserver, controllers and scheduler; kwok stands in for the nodes' kubelets and marks pods Ready
    and Job pods complete), one run each: every object created and awaited as on a real cluster."""
    from testbed.e2e.cluster_checks import CLUSTER_SH, _free_port_block

    cluster = {"GS_CLUSTER_DIR": str(work / "cluster"), "GS_CLUSTER_PORT": str(_free_port_block())}
    names = node_names(nodes, models)
    node_args = [arg for name in names for arg in ("--node", f"{name}:{CLUSTER_NODE}")]
    started = program.logged(["bash", str(CLUSTER_SH), "start", *node_args], shown="cluster.sh start", timeout=900, env=cluster)
    printed = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    kubeconfig, kubectl = printed["KUBECONFIG"], f"{printed['GS_CLUSTER_BIN']}/kubectl"
    try:
        log = work / "ssh-cluster.jsonl"
        with ssh_standin(names, log) as ports:
            raw = cluster_config(nodes, models, ports, kubeconfig)
            stack = f"fleet-{nodes}x{models}-cluster"
            secrets_given = {name: f"bench-{name}" for name in parse(raw).secret_keys()} | {"sshPrivateKey": key}
            program.new_stack(stack, raw, secrets_given)
            up = sample(program, ("up", "--yes", "--skip-preview"), stack, work / "hook-cluster.jsonl")
            first = read_log(log)
            noop = sample(program, ("up", "--yes", "--skip-preview", "--expect-no-changes"), stack, work / "hook-cluster.jsonl")
            server = json.loads(program.logged([kubectl, "--kubeconfig", kubeconfig, "version", "-o", "json"],
                                               shown="kubectl version", check=False).stdout or "{}")
            in_state, mib = exported(program, stack)
            return ClusterResult(
                nodes, models, in_state, server.get("serverVersion", {}).get("gitVersion", "?"), up.seconds, noop.seconds,
                len(read_log(log)) - len(first), program.last_update_changes(stack),
                disk_chains_overlapping(first, up.window), mib)
    finally:
        program.logged(["bash", str(CLUSTER_SH), "stop"], shown="cluster.sh stop", check=False, timeout=300, env=cluster)
