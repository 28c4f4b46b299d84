"""Every node serves (`modelStorage.type: nodeCache`, issue #38) on the loopback cluster: a stack of four simulated
GPU nodes, three holding the model, its node steps answered by SSH stand-ins; a holder lost, a drain, and then
nothing for `pulumi up` to change.

Real: the API server, the scheduler (the volume's node affinity by label, the weights-label gate, the spread, the
taints), the controllers (the node lifecycle controller's unreachable taint and eviction, the ReplicaSet's
replacement, the Eviction API through the PodDisruptionBudget), the engine's ordering of Jobs, labels and the
Deployment. Standing in: kwok for the kubelets, so nothing is mounted, no download runs (a Job's pod "completes"
at once, so a weights label appears with no data behind it; the verify-weights init container never runs), pods
are Ready whatever their spec, and a deleted pod goes at once (no grace period, no real eviction timing);
testbed/standins/ssh.py for the nodes' SSH (the steps' scripts are not run). A lost node is simulated by taking
its Lease from kwok: kwok v0.8.0 keeps renewing a node's Lease after its annotation is removed, and stops when
another holder has it."""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from testbed.bench_fleet.measure import ssh_standin
from testbed.e2e.cluster_checks import _sequence
from testbed.e2e.run import require
from testbed.e2e.upgrade_checks import UpgradeEndToEnd
from tools.render import ROOT

CACHE_NAMESPACE = "ai-cache"
CACHE_NODES = ("cache-a", "cache-b", "cache-c", "cache-d")
HOLDERS = CACHE_NODES[:3]
"""cache-d is a cache node too, but not in the model's `nodes`: free GPUs and no weights label, so never a pod."""
CACHE_PRODUCT = "e2e-cache"
CACHE_MODEL = "qwen3"
EVICTION_S = 10
CACHE_CHECKS = ("cache-up", "cache-node-lost", "cache-drain", "cache-no-changes", "cache-revision", "cache-remove-node")
NEW_REVISION = "0123456789abcdef0123456789abcdef01234567"
SERVING = f"app.kubernetes.io/instance={CACHE_MODEL},app.kubernetes.io/component=inference-server"


@dataclass
class CacheEndToEnd(UpgradeEndToEnd):
    """The node-cache checks, on the cluster `cluster-up` started, beside the cluster stack."""

    cache_stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def cache_raw(self, ports: dict[str, int]) -> dict[str, Any]:
        """The README's two-server stack (docs/examples/Pulumi.cache.yaml), grown to four one-GPU nodes on this cluster."""
        document = yaml.safe_load((ROOT / "docs/examples/Pulumi.cache.yaml").read_text())["config"]
        raw = {key.split(":", 1)[1]: value for key, value in document.items()}
        raw["cluster"] = {**raw["cluster"], "namespace": CACHE_NAMESPACE, "kubeconfig": {"path": self.cluster_env["KUBECONFIG"]},
                          "autoscaling": "none", "nodeLossEvictionSeconds": EVICTION_S}
        template = raw["nodes"][0]
        raw["nodes"] = []
        for name in CACHE_NODES:
            node = copy.deepcopy(template)
            node["name"] = name
            node["ssh"] = {"host": "127.0.0.1", "port": ports[name]}
            node["gpu"] = {"product": CACHE_PRODUCT, "count": 1}
            node["storage"]["disks"] = [f"/dev/disk/by-id/virtio-{name}-{side}" for side in "ab"]
            raw["nodes"].append(node)
        model = raw["models"][0]
        model.update(name=CACHE_MODEL, gpuProduct=CACHE_PRODUCT, nodes=list(HOLDERS), replicas={"min": 2, "max": 2})
        return raw

    def cache_pods(self) -> dict[str, dict[str, Any]]:
        """The serving pods not being deleted, by name."""
        pods = self.get("pods", "-n", CACHE_NAMESPACE, "-l", SERVING)["items"]
        return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}

    def cache_placement(self) -> dict[str, str]:
        """Ready serving pods by node."""
        return {p["spec"]["nodeName"]: name for name, p in self.cache_pods().items() if p["spec"].get("nodeName")
                and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))}

    # ---- checks ---------------------------------------------------------------------------

    def cache_up(self) -> str:
        nodes = self.cluster_sh("nodes", *[arg for name in CACHE_NODES for arg in ("--node", f"{name}:1:32:128Gi")]).stdout
        self.kubectl("apply", "-f", "-", stdin=nodes)
        self.wait_for("the cache nodes Ready", lambda: all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in self.get("node", n)["status"].get("conditions", []))
            for n in CACHE_NODES), timeout=60)
        ports = self.cache_stack.enter_context(ssh_standin(list(CACHE_NODES), self.tmp / "ssh-cache.jsonl"))
        raw = self.cache_raw(ports)
        self.new_stack("cache", raw, self.secret_values(raw, self.canaries["sshPrivateKey"]))
        events = self.tmp / "up-cache-events.jsonl"
        self.timed("upCacheSeconds", "up", "--yes", "--skip-preview", "--event-log", str(events), stack="cache",
                   timeout=1200, env={"PULUMI_DEBUG_COMMANDS": "true"})
        # Each holder downloaded onto its own array: one Job per holder, its pod on that node.
        jobs = self.get("jobs", "-n", CACHE_NAMESPACE, "-l", "app.kubernetes.io/component=model-download")["items"]
        pinned = {}
        for job in jobs:
            node = job["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            require(job["status"].get("succeeded") == 1, f"{job['metadata']['name']} did not complete")
            pods = self.get("pods", "-n", CACHE_NAMESPACE, "-l", f"job-name={job['metadata']['name']}")["items"]
            ran = {p["spec"]["nodeName"] for p in pods}
            require(ran == {node}, f"{job['metadata']['name']} is pinned to {node} but ran on {sorted(ran)}")
            pinned[node] = job["metadata"]["name"]
        require(sorted(pinned) == list(HOLDERS), f"download Jobs on {sorted(pinned)}, expected {list(HOLDERS)}")
        # The labels: the cache label on all four, the weights label on the holders only.
        weights = self.weights_key()
        labels = {n: self.get("node", n)["metadata"]["labels"] for n in CACHE_NODES}
        unlabelled = [n for n in CACHE_NODES if labels[n].get(f"cache.gpu-serving.io/{CACHE_NAMESPACE}") != "ready"]
        require(not unlabelled, f"cache nodes without the cache label: {unlabelled}")
        holding = sorted(n for n in CACHE_NODES if labels[n].get(weights) == "verified")
        require(holding == list(HOLDERS), f"{weights} is on {holding}, expected {list(HOLDERS)}")
        volume = self.get("pv", f"{CACHE_NAMESPACE}-model-cache")
        require(volume["status"].get("phase") == "Bound", f"the cache volume is {volume['status'].get('phase')}")
        placement = self.wait_for("two Ready serving pods", lambda: (p := self.cache_placement()) and len(p) == 2 and p, timeout=120)
        require(set(placement) <= set(HOLDERS), f"serving pods on {sorted(placement)}: not all hold the weights")
        # The engine: each Job done before its node's label is set, every label before the Deployment begins.
        log = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
        deployment = _sequence(log, "resourcePreEvent", f"::{CACHE_MODEL}-deployment")
        digest = weights.rsplit("/", 1)[1]
        for node in HOLDERS:
            job_done = _sequence(log, "resOutputsEvent", f"::{CACHE_MODEL}-download-{node}")
            label_begun = _sequence(log, "resourcePreEvent", f"::{node}-{CACHE_MODEL}-weights-{digest}")
            label_done = _sequence(log, "resOutputsEvent", f"::{node}-{CACHE_MODEL}-weights-{digest}")
            require(job_done < label_begun < label_done < deployment,
                    f"{node}: Job done #{job_done}, label #{label_begun}-#{label_done}, Deployment begun #{deployment}")
        return (f"3 Jobs, each on its node; {weights}=verified on {', '.join(HOLDERS)} (not cache-d); serving pods on "
                f"{', '.join(sorted(placement))} (spread); engine: each Job before its label, the labels before the "
                f"Deployment (#{deployment})")

    def cache_node_lost(self) -> str:
        placement = self.cache_placement()
        require(len(placement) == 2, f"serving pods on {sorted(placement)} before the loss")
        lost = sorted(placement)[0]
        (spare,) = sorted(set(HOLDERS) - set(placement))
        started = time.monotonic()
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.kubectl("patch", "lease", "-n", "kube-node-lease", lost, "--type", "merge", "-p",
                     json.dumps({"spec": {"holderIdentity": "e2e-node-lost", "leaseDurationSeconds": 3600, "renewTime": now}}))
        try:
            moved = self.wait_for(f"a Ready replica on {spare}", lambda: spare in self.cache_placement(), timeout=180)
            seconds = round(time.monotonic() - started, 1)
            node = self.get("node", lost)
            taints = {t["key"] for t in node["spec"].get("taints", [])}
            require("node.kubernetes.io/unreachable" in taints, f"{lost} was never tainted unreachable: {sorted(taints)}")
            placement = self.cache_placement()
            require(lost not in placement and "cache-d" not in placement, f"serving pods on {sorted(placement)}")
        finally:
            # Give the Lease back to kwok: it takes a node whose Lease is gone at once.
            self.kubectl("delete", "lease", "-n", "kube-node-lease", lost, check=False)
        self.wait_for(f"{lost} Ready again", lambda: not {t["key"] for t in self.get("node", lost)["spec"].get("taints", [])}
                      & {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}, timeout=120)
        self.report["figures"]["cacheNodeLossToReadySeconds"] = seconds
        require(moved, "no replica moved")
        return (f"{lost} lost (its Lease taken from kwok): unreachable after the 40 s grace, its replica evicted after "
                f"{EVICTION_S} s and Ready on {spare} {seconds} s after the loss, never on cache-d (no weights label); {lost} back")

    def cache_drain(self) -> str:
        placement = self.cache_placement()
        require(len(placement) == 2, f"serving pods on {sorted(placement)} before the drain")
        free = sorted(set(HOLDERS) - set(placement))
        require(len(free) == 1, f"no single free holder: {free}")
        drained = sorted(placement)[0]
        proc = self.kubectl("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s")
        try:
            said = proc.stdout + proc.stderr
            require("evicting pod" in said and "evicted" in said, f"drain did not evict through the Eviction API: {said[-300:]}")
            self.wait_for(f"a Ready replica on {free[0]}", lambda: free[0] in self.cache_placement(), timeout=120)
            placement = self.cache_placement()
            require(drained not in placement and "cache-d" not in placement, f"serving pods on {sorted(placement)}")
        finally:
            self.kubectl("uncordon", drained, check=False)
        return (f"drained {drained}: its replica evicted through the PodDisruptionBudget, Ready on {free[0]}; serving on "
                f"{', '.join(sorted(placement))}")

    def cache_no_changes(self) -> str:
        same = self.second_up_changes_nothing("cache", "noopUpCacheSeconds")
        return f"after the loss and the drain, preview and up: no changes ({same} resources the same)"

    def weights_key(self) -> str:
        selector = self.get("deployment", f"vllm-{CACHE_MODEL}", "-n", CACHE_NAMESPACE)["spec"]["template"]["spec"]["nodeSelector"]
        (key,) = [k for k in selector if ".weights.gpu-serving.io/" in k]
        return key

    def labelled(self, key: str) -> list[str]:
        return sorted(n for n in CACHE_NODES if self.get("node", n)["metadata"]["labels"].get(key) == "verified")

    def cache_revision(self) -> str:
        """A new revision: downloaded on every holder before the Deployment's update begins; the old label gone after."""
        old = self.weights_key()

        def edit(config: dict[str, Any]) -> None:
            config["gpu-serving:models"][0]["revision"] = NEW_REVISION

        self.edit_stack("cache", edit)
        events = self.tmp / "up-cache-revision-events.jsonl"
        self.timed("upCacheRevisionSeconds", "up", "--yes", "--skip-preview", "--event-log", str(events), stack="cache",
                   timeout=1200, env={"PULUMI_DEBUG_COMMANDS": "true"})
        new = self.weights_key()
        require(new != old, "the Deployment still selects the old weights label")
        log = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
        update = _sequence(log, "resourcePreEvent", f"::{CACHE_MODEL}-deployment")
        digest = new.rsplit("/", 1)[1]
        late = [n for n in HOLDERS if _sequence(log, "resOutputsEvent", f"::{n}-{CACHE_MODEL}-weights-{digest}") > update]
        require(not late, f"the Deployment's update began (#{update}) before the new label was set on {late}")
        require(self.labelled(new) == list(HOLDERS), f"{new} on {self.labelled(new)}")
        require(self.labelled(old) == [], f"the old label {old} is still on {self.labelled(old)}")
        placement = self.wait_for("two Ready serving pods", lambda: (p := self.cache_placement()) and len(p) == 2 and p, timeout=120)
        require(set(placement) <= set(HOLDERS), f"serving pods on {sorted(placement)}")
        return (f"new revision: Jobs and {new} on {', '.join(HOLDERS)} before the Deployment's update (#{update}); "
                f"{old} gone from every node; serving on {', '.join(sorted(placement))}")

    def cache_remove_node(self) -> str:
        """A holder taken out of the model's nodes: its Job and label go; nothing else changes."""
        key = self.weights_key()
        gone = HOLDERS[2]

        def edit(config: dict[str, Any]) -> None:
            config["gpu-serving:models"][0]["nodes"] = list(HOLDERS[:2])

        self.edit_stack("cache", edit)
        # Two holders left for replicas.min 2 of one GPU each: the stack's surviveNodeLoss promise no longer holds.
        refused = self.pulumi("up", "--yes", "--skip-preview", stack="cache", timeout=600, check=False)
        said = refused.stdout + refused.stderr
        refusal = next((line.strip() for line in said.splitlines() if "error: config error: cluster.surviveNodeLoss" in line), None)
        require(refused.returncode != 0 and refusal is not None, f"the up was not refused by cluster.surviveNodeLoss: {said[-300:]}")
        self.edit_stack("cache", lambda config: config["gpu-serving:cluster"].update(surviveNodeLoss=False))
        self.pulumi("up", "--yes", "--skip-preview", stack="cache", timeout=1200)
        changes = self.last_update_changes("cache")
        require(changes.get("delete") == 2 and not changes.get("create") and not changes.get("replace"),
                f"the up changed {changes}, expected the node's Job and label deleted")
        require(self.labelled(key) == list(HOLDERS[:2]), f"{key} on {self.labelled(key)}")
        jobs = {j["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
                for j in self.get("jobs", "-n", CACHE_NAMESPACE, "-l", "app.kubernetes.io/component=model-download")["items"]}
        require(gone not in jobs, f"{gone}'s download Job is still there: {sorted(jobs)}")
        self.pulumi("preview", "--expect-no-changes", stack="cache")
        return (f"{gone} out of models[0].nodes: refused at first ({refusal.split('config error: ', 1)[1][:110]}…); with "
                f"surviveNodeLoss off, its Job and {key} deleted ({changes}); then no changes")

    def cache_stop(self) -> None:
        """The SSH stand-ins go; the stack's objects stay in the cluster, which stops at the end of the run."""
        self.cache_stack.close()
