"""The two-node checks of `make e2e` (issue #38, `modelStorage.type: nodeCache`): after the seven real-node checks,
a second VM joins the same loopback cluster as a real node, the stack is switched from `type: local` to
`nodeCache`, and each node serves the model from its own array; the model is made a group spanning both nodes
(LeaderWorkerSet) and back; then one node is powered off and the replica moves to the other.

Real: both kubelets, containerd, runc and kube-proxy; the node steps building each VM's own RAID1 + XFS; the
local PersistentVolume bind-mounted by each kubelet from its own node's array; the scheduler's volume binding,
node selector (the weights label) and spread; the node controller's grace period and the taint manager's
eviction after the pods' `tolerationSeconds`; the real `huggingface_hub` client in each node's download Job.
Standing in: vLLM (testbed/standins/vllm_sim.py: it reports `weights_sha256` of the files it loaded), the hub
(testbed/standins/hub.py: one per node on the host's loopback, each serving the same repository and commit
with bytes of its own, so a pod's answer names the node whose download wrote what it read), the GPU (capacity
patched into each node's status), cluster DNS (testbed/node/dns on each node), the network between the nodes
(a qemu UDP socket link on the host's 127.0.0.1 with static routes: no CNI overlay, no NetworkPolicy), a power
cut (SIGKILL of the guest's qemu: the guest's disks are files that stay; no switch, no BMC).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.e2e.cluster_checks import CLUSTER_SH, _free_port_block, _time
from testbed.e2e.real_node import (
    MODEL,
    NAMESPACE,
    NODE,
    REAL_NODE_CHECKS,
    STARTUP_SECONDS,
    VM_CPUS,
    VM_MEMORY_MIB,
    WEIGHTS,
    RealNodeEndToEnd,
    weights_sha256,
)
from testbed.e2e.run import CheckError, require, tail
from testbed.node.join import BUNDLE_DISK, HUB_GUEST_PORT, LINK_PREFIX, POD_CIDR, RealNode

NODE_B = "real-node-b"
POD_CIDR_B = "10.244.1.0/24"
POD_GATEWAY_B = "10.244.1.1"
DISKS_B = (("gs-disk-c", 4 * 2**30), ("gs-disk-d", 4 * 2**30))
"""Disks of their own (a serial of their own: the config refuses one serial under two nodes)."""
WEIGHTS_B = {**WEIGHTS, "model.safetensors": hashlib.sha256(b"gpu-serving real node b").digest() * 4096}
"""What the second node's hub serves for the same repository and commit: a pod's `weights_sha256` then names the
node whose download wrote the files it read."""
NODE_LOSS_EVICTION_SECONDS = 10
REAL_CACHE_CHECKS = ("real-cache-join", "real-cache-migrate", "real-cache-own-array", "real-group", "real-cache-failover",
                     "real-cache-no-changes")
ALL_REAL_CHECKS = (*REAL_NODE_CHECKS, *REAL_CACHE_CHECKS)
SNAPSHOT = "/mnt/models/hub/models--{org}--{name}/snapshots/{commit}"


@dataclass
class TwoNodeEndToEnd(RealNodeEndToEnd):
    """The real-node checks, then the two-node ones on the same cluster, stack and first VM."""

    vm_b: Any = None
    node_b: RealNode | None = None
    hub_b: Any = None

    def checks(self) -> None:
        super().checks()
        started = time.monotonic()
        try:
            self.check("real-cache-join", self.real_cache_join, needs=("real-node-ready",))
            self.check("real-cache-migrate", self.real_cache_migrate, needs=("real-cache-join",))
            self.check("real-cache-own-array", self.real_cache_own_array, needs=("real-cache-migrate",))
            self.check("real-group", self.real_group, needs=("real-cache-migrate",))
            self.check("real-cache-failover", self.real_cache_failover, needs=("real-cache-migrate",))
            self.check("real-cache-no-changes", self.real_cache_no_changes, needs=("real-cache-failover",))
        finally:
            self.report["figures"]["realCacheSeconds"] = round(time.monotonic() - started, 1)

    def stop(self) -> None:
        if self.node_b is not None:
            self.node_b.stop_forwards()
        if self.hub_b is not None:
            self.hub_b.__exit__(None, None, None)
        try:
            super().stop()
        finally:
            if self.vm_b is not None:
                self.vm_b.stop(power_off=False)

    # ---- tools ------------------------------------------------------------------------------

    def vm_of(self, node: str) -> Any:
        return {NODE: self.vm, NODE_B: self.vm_b}[node]

    def pods(self) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={MODEL},app.kubernetes.io/component=inference-server"
        return [p for p in self.get("pods", "-n", NAMESPACE, "-l", selector)["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self, count: int, timeout: float = 300) -> list[dict[str, Any]]:
        def probe() -> list[dict[str, Any]] | None:
            pods = self.pods()
            return pods if len(pods) == count and all(self.is_ready(p) for p in pods) else None
        return self.wait_for(f"{count} Ready serving pods", probe, timeout)

    def snapshot(self) -> str:
        org, name = self.raw["models"][0]["huggingFaceId"].split("/")
        return SNAPSHOT.format(org=org, name=name, commit=self.commit)

    @property
    def commit(self) -> str:
        return hashlib.sha1(b"real-node").hexdigest()

    def on_disk_sha256(self, vm: Any) -> str:
        """What vllm_sim computes, computed by the node's own shell from its own array."""
        return vm.ssh(f"cd {self.snapshot()} && find -L . -type f -printf '%P\\n' | LC_ALL=C sort | "
                      "xargs -d '\\n' sha256sum | sha256sum | cut -d' ' -f1").stdout.strip()

    # ---- checks -----------------------------------------------------------------------------

    def real_cache_join(self) -> str:
        """The second VM from the first one's saved boot, its own disks and hub, linked to the first, joined."""
        from testbed.standins.hub import Hub, Repo
        from testbed.vm import Vm, ensure_booted_state

        start = time.monotonic()
        assert self.node is not None and self.vm is not None
        vm = Vm(self.tmp / "node-vm-b", (*DISKS_B, (BUNDLE_DISK, 1)), image=self.vm.image, memory_mib=VM_MEMORY_MIB,
                cpus=VM_CPUS, boot_timeout=600, booted=ensure_booted_state(self.vm.image, memory_mib=VM_MEMORY_MIB, cpus=VM_CPUS))
        # The same read-only bundle (binaries, .debs, images), a copy for the second guest's drive.
        subprocess.run(["cp", "--sparse=always", str(self.vm.disk_path(BUNDLE_DISK)), str(vm.disk_path(BUNDLE_DISK))], check=True)
        self.vm_b = vm
        vm.start()
        self.report["figures"]["realCacheVmSeconds"] = round(time.monotonic() - start, 1)
        repo = Repo(self.raw["models"][0]["huggingFaceId"], WEIGHTS_B, self.commit, token=self.secrets["hfToken"])
        self.hub_b = Hub([repo], 0, f"http://{POD_GATEWAY_B}:{HUB_GUEST_PORT}").__enter__()
        # The link: two UDP ports on the host's loopback, one per guest.
        port_a, port_b = _free_port_block(2), _free_port_block(2)
        link_a = self.node.link(1, port_a, port_b, {POD_CIDR_B: 2})
        node_b = RealNode(vm, NODE_B, self.cluster_dir, int(self.cluster_env["GS_CLUSTER_PORT"]), self.node.images,
                          self.tmp / "node-b", self.hub_b.server.server_address[1], kubelet_port=_free_port_block(1),
                          pod_cidr=POD_CIDR_B)
        link_b = node_b.link(2, port_b, port_a, {POD_CIDR: 1})
        # No ping in the image: the peer's sshd, over the link.
        ping = self.vm.ssh(f"timeout 10 bash -c '</dev/tcp/{LINK_PREFIX}.2/22'", check=False)
        require(ping.returncode == 0, f"{NODE} does not reach {NODE_B}'s sshd over the link: {tail(ping.stdout + ping.stderr)}")
        self.node_b = node_b
        node_b.join(self.kubectl)
        self.report["figures"]["realCacheJoin"] = node_b.timings
        nodes = {n["metadata"]["name"]: n for n in self.get("nodes")["items"]}
        ready = sorted(name for name, n in nodes.items() if self.node.ready(self.kubectl, name))
        require(ready == sorted([NODE, NODE_B]), f"Ready nodes {ready}")
        return (f"{NODE_B} resumed from {NODE}'s saved boot with disks of its own, on a link of its own with {NODE} ({link_a} "
                f"{LINK_PREFIX}.1 <-> {link_b} {LINK_PREFIX}.2, qemu UDP sockets on 127.0.0.1; pods {POD_CIDR} and {POD_CIDR_B} "
                f"routed over it), joined and Ready ({node_b.timings}); its own hub stand-in, DNS stand-in and API server forward")

    def real_cache_migrate(self) -> str:
        """The documented migration: `modelStorage.type: local` -> `nodeCache`, the second node added, `pulumi up`."""
        assert self.vm_b is not None and self.hub is not None and self.hub_b is not None
        before_a = len(self.hub.requests)

        def edit(config: dict[str, Any]) -> None:
            nodes = config["gpu-serving:nodes"]
            second = json.loads(json.dumps(nodes[0]))
            second["name"], second["ssh"]["port"] = NODE_B, self.vm_b.port
            second["storage"]["disks"] = [self.vm_b.by_id(name) for name, _ in DISKS_B]
            nodes.append(second)
            config["gpu-serving:modelStorage"] = {"type": "nodeCache"}
            config["gpu-serving:cluster"]["nodeLossEvictionSeconds"] = NODE_LOSS_EVICTION_SECONDS
            config["gpu-serving:models"][0]["replicas"] = {"min": 2, "max": 2}
        self.edit_stack("node", edit)
        self.timed("upRealCacheMigrateSeconds", "up", "--yes", "--skip-preview", stack="node", timeout=1800)
        jobs = {}
        for job in self.get("jobs", "-n", NAMESPACE)["items"]:
            # A cache node's download is pinned by its hostname label (the Job of `type: local` has no selector).
            node = (job["spec"]["template"]["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
            if node:
                jobs[node] = job
        require(sorted(jobs) == sorted([NODE, NODE_B]), f"download Jobs per node: {sorted(jobs)}")
        logs = {}
        for node, job in jobs.items():
            done = any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"].get("conditions", []))
            require(done, f"{job['metadata']['name']} on {node} is not complete: {job['status']}")
            pod = self.get("pods", "-n", NAMESPACE, "-l", f"job-name={job['metadata']['name']}")["items"]
            require(pod and pod[0]["spec"].get("nodeName") == node,
                    f"{job['metadata']['name']}'s pod ran on {[p['spec'].get('nodeName') for p in pod]}, not {node}")
            logs[node] = self.kubectl("logs", f"job/{job['metadata']['name']}", "-n", NAMESPACE).stdout.strip()
        require("nothing to do" in logs[NODE], f"{NODE}'s Job downloaded again: {tail(logs[NODE])}")
        require("ready in" in logs[NODE_B], f"{NODE_B}'s Job: {tail(logs[NODE_B])}")
        fetched_a = [path for _, path, _ in self.hub.requests[before_a:] if "/resolve/" in path or "/lfs/" in path]
        fetched_b = [path for _, path, _ in self.hub_b.requests if "/resolve/" in path or "/lfs/" in path]
        require(not fetched_a and fetched_b, f"file requests during the migration: {NODE}'s hub {fetched_a}, {NODE_B}'s {fetched_b}")
        pods = self.ready_pods(2)
        # What the two guests cost the host, each serving (qemu touches guest memory lazily).
        self.report["figures"]["realCacheQemuRssMiB"] = {
            node: int(Path(f"/proc/{vm.pid}/status").read_text().split("VmRSS:")[1].split()[0]) // 1024
            for node, vm in ((NODE, self.vm), (NODE_B, self.vm_b))}
        placed = sorted(p["spec"]["nodeName"] for p in pods)
        require(placed == sorted([NODE, NODE_B]), f"the two serving pods run on {placed}")
        claims = {p["spec"]["volumes"][0].get("persistentVolumeClaim", {}).get("claimName") for p in pods}
        return (f"`up` {self.report['figures']['upRealCacheMigrateSeconds']} s ({NODE_B}'s node steps built its array): "
                f"{NODE}'s download Job said {logs[NODE].splitlines()[-1]!r} (its hub served no file), {NODE_B}'s downloaded "
                f"({len(fetched_b)} file requests to its hub: {logs[NODE_B].splitlines()[-1]!r}); two pods Ready, one per node "
                f"({', '.join(placed)}), claim {sorted(c for c in claims if c)}")

    def real_cache_own_array(self) -> str:
        """Per pod: /models in its mount namespace is its own node's md array, built from that VM's own disks,
        and what it serves is what that node's download wrote."""
        want = {NODE: weights_sha256(WEIGHTS), NODE_B: weights_sha256(WEIGHTS_B)}
        seen = []
        for pod in sorted(self.ready_pods(2), key=lambda p: p["spec"]["nodeName"]):
            node, vm = pod["spec"]["nodeName"], self.vm_of(pod["spec"]["nodeName"])
            pid = vm.ssh("pgrep -f -n 'vllm_sim.py'").stdout.strip()
            inside = vm.ssh(f"findmnt -N {pid} -n -o SOURCE,FSTYPE /models").stdout.split()
            array = vm.ssh("findmnt -n -o SOURCE /mnt/models").stdout.strip()
            require(inside[-1] == "xfs" and inside[0].startswith(array), f"{node}: /models is {inside}, /mnt/models is {array}")
            md = vm.ssh(f"basename $(readlink -f {array})").stdout.strip()
            serials = sorted(vm.ssh(f"for s in /sys/block/{md}/slaves/*; do d=$(basename $(readlink -f $s/..));"
                                    " cat /sys/block/$d/serial; echo; done").stdout.split())
            disks = sorted(n for n in vm.disks if n != BUNDLE_DISK)
            require(serials == disks, f"{node}: {md} is built from disks {serials}, not the VM's own {disks}")
            disk_sum = self.on_disk_sha256(vm)
            served = self.models(self.port_forward(pod["metadata"]["name"]))["data"][0].get("weights_sha256")
            require(disk_sum == want[node], f"{node}: its array holds weights {disk_sum}, its hub served {want[node]}")
            require(served == disk_sum, f"{node}'s pod serves weights {served}; its node's array holds {disk_sum}")
            seen.append(f"{node}: /models = {inside[0]} (md {md} of {'+'.join(serials)}), serves {served[:12]}… = its own array's")
        require(want[NODE] != want[NODE_B], "the two nodes' weights are the same bytes: the check would prove nothing")
        return "; ".join(seen) + " (each node's hub served its own bytes: the other node's copy would answer another sum)"

    def real_group(self) -> str:
        """The model made a group across both nodes (`nodesPerReplica: 2`, one replica), then back: the cluster's
        LeaderWorkerSet controller puts the leader on one node and the worker on the other; the worker, given
        `--master-addr=$(LWS_LEADER_ADDRESS)` by the program (the variable set by LeaderWorkerSet's webhook, expanded
        by the real kubelet, the name resolved by the node's DNS stand-in), reaches the leader over the nodes' link;
        the leader serves only once it joined, and answers through the Service. The join is vllm_sim's stand-in for
        torch.distributed and NCCL: one TCP connection, the address and the path, not a collective."""
        group = f"vllm-{MODEL}-group"
        self.edit_stack("node", lambda c: c["gpu-serving:models"][0].update(nodesPerReplica=2, replicas={"min": 1, "max": 1}))
        # The documented step (docs/models.md): both nodes' one GPU each is the Deployment's until it goes, and the
        # engine deletes it only after the LeaderWorkerSet it would wait for; the preview says so first.
        preview = self.pulumi("preview", stack="node", timeout=900)
        require(f"delete deployment vllm-{MODEL}" in preview.stdout + preview.stderr,
                f"the preview did not warn of the Deployment holding the GPUs: {tail(preview.stdout + preview.stderr)}")
        self.kubectl("delete", "deployment", f"vllm-{MODEL}", "-n", NAMESPACE, "--wait=true")
        self.timed("upRealGroupSeconds", "up", "--yes", "--skip-preview", stack="node", timeout=1800)
        lws = self.get("leaderworkerset", group, "-n", NAMESPACE)
        require(lws["status"].get("readyReplicas") == 1, f"{group}: {lws['status']}")
        members = {p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"]: p
                   for p in self.get("pods", "-n", NAMESPACE, "-l", f"leaderworkerset.sigs.k8s.io/name={group}")["items"]
                   if not p["metadata"].get("deletionTimestamp")}
        require(sorted(members) == ["0", "1"], f"{group}'s pods: {sorted(members)}")
        leader, worker = members["0"], members["1"]
        nodes = (leader["spec"]["nodeName"], worker["spec"]["nodeName"])
        require(sorted(nodes) == sorted([NODE, NODE_B]), f"leader and worker on {nodes}: not one per node")
        address = next(e["value"] for e in worker["spec"]["containers"][0]["env"] if e["name"] == "LWS_LEADER_ADDRESS")
        said = self.kubectl("logs", worker["metadata"]["name"], "-n", NAMESPACE).stdout
        joined = re.search(rf"rank 1 of 2 joined the leader at {re.escape(address)}:(\d+) \(([0-9.]+)\)", said)
        require(joined is not None and joined[2] == leader["status"]["podIP"],
                f"the worker did not reach the leader's pod ({leader['status']['podIP']}) at {address}: {tail(said)}")
        served = self.models(self.port_forward(leader["metadata"]["name"]))["data"][0]
        require(served.get("group") == [{"rank": 1, "address": worker["status"]["podIP"]}],
                f"the leader's group is {served.get('group')}, the worker's pod is {worker['status']['podIP']}")
        ask = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        status, body = self.request(self.service_port(), "POST", "/v1/chat/completions", key=self.secrets["vllmApiKey"], body=ask)
        require(status == 200 and b'"choices"' in body, f"the leader through the Service answered {status}: {body[:200]!r}")
        self.edit_stack("node", lambda c: c["gpu-serving:models"][0].update(nodesPerReplica=1, replicas={"min": 2, "max": 2}))
        self.kubectl("delete", "leaderworkerset", group, "-n", NAMESPACE, "--wait=true")
        members_left = f"leaderworkerset.sigs.k8s.io/name={group}"
        forced = ""
        try:
            self.wait_for(f"{group}'s pods gone", lambda: not self.get("pods", "-n", NAMESPACE, "-l", members_left)["items"], 90)
        except CheckError:
            # A worker restarted as its leader went can get its SIGTERM in the stand-in's first milliseconds, before it
            # blocks the signal, when PID 1 drops it: the kubelet then waits out the 630 s grace period.
            self.kubectl("delete", "pods", "-n", NAMESPACE, "-l", members_left, "--force", "--grace-period=0")
            forced = " (a member still Terminating after 90 s force-deleted: the stand-in missed its SIGTERM while starting)"
        self.pulumi("up", "--yes", "--skip-preview", stack="node", timeout=1800)
        self.ready_pods(2)
        return (f"{group}: leader on {nodes[0]}, worker on {nodes[1]}; the worker joined the leader at {address}:{joined[1]} "
                f"({joined[2]}, across the nodes' link), the leader reports rank 1 from {worker['status']['podIP']} and answered "
                f"a completion through the Service (`up` {self.report['figures']['upRealGroupSeconds']} s, after the preview "
                "warned of the Deployment holding the GPUs and it was deleted as documented); then back to a Deployment of "
                f"two replicas{forced}")

    def real_cache_failover(self) -> str:
        """The model on the second node only, whose qemu is then killed: the time until the Service, through the
        first node, answers again."""
        assert self.vm_b is not None and self.node_b is not None
        # One replica, on the second node: cordon the first, scale with the stack, move the pod if it stayed.
        self.kubectl("cordon", NODE)
        try:
            self.edit_stack("node", lambda c: c["gpu-serving:models"][0].__setitem__("replicas", {"min": 1, "max": 1}))
            self.pulumi("up", "--yes", "--skip-preview", stack="node", timeout=1800)
            for pod in self.pods():
                if pod["spec"].get("nodeName") == NODE:
                    self.kubectl("delete", "pod", pod["metadata"]["name"], "-n", NAMESPACE, "--wait=false")

            def alone_on_b() -> bool:
                pods = self.pods()
                return len(pods) == 1 and pods[0]["spec"].get("nodeName") == NODE_B and self.is_ready(pods[0])
            self.wait_for(f"the one serving pod Ready on {NODE_B}", alone_on_b, 300)
        finally:
            self.kubectl("uncordon", NODE)
        port = self.service_port(self.vm)  # through the first node's kube-proxy, to the pod on the second
        before = self.models(port)["data"][0]["weights_sha256"]
        require(before == weights_sha256(WEIGHTS_B), f"before the power-off the Service answers {before}")
        key = self.secrets["vllmApiKey"]
        # Power off: the guest's qemu killed, then what the host held open to it.
        self.vm_b._stop_mux()
        killed, killed_at = time.monotonic(), time.time()
        subprocess.run(["kill", "-9", str(self.vm_b.pid)], check=True)
        self.node_b.stop_forwards()
        timeline: dict[str, float] = {}
        answered = None
        while time.monotonic() - killed < 400:
            with contextlib.suppress(Exception):
                status, body = self.request(port, "GET", "/v1/models", key=key, timeout=2)
                if status == 200 and json.loads(body)["data"][0].get("weights_sha256") == weights_sha256(WEIGHTS):
                    answered = time.monotonic() - killed
                    break
            if "nodeNotReady" not in timeline:
                node = self.get("node", NODE_B)
                if any(c["type"] == "Ready" and c["status"] != "True" for c in node["status"]["conditions"]):
                    timeline["nodeNotReady"] = round(time.monotonic() - killed, 1)
            time.sleep(1)
        require(answered is not None, f"no answer from {NODE}'s copy through the Service within 400 s of the power-off ({timeline})")
        self.report["figures"]["nodeLossToAnswerSeconds"] = round(answered, 1)
        self.report["figures"]["nodeLossTimeline"] = timeline
        moved = [p for p in self.pods() if p["spec"].get("nodeName") == NODE]
        require(len(moved) == 1 and self.is_ready(moved[0]), f"serving pods on {NODE}: {[p['metadata']['name'] for p in moved]}")
        # The replacement's own stamps (the API server's clock is this host's), seconds after the kill.
        status = moved[0]["status"]
        stamps = {"podCreated": moved[0]["metadata"]["creationTimestamp"],
                  "containerStarted": status["containerStatuses"][0]["state"]["running"]["startedAt"],
                  "podReady": next(c["lastTransitionTime"] for c in status["conditions"] if c["type"] == "Ready")}
        timeline.update({k: round(_time(v).timestamp() - killed_at, 1) for k, v in stamps.items()})
        timeline["answered"] = round(answered, 1)
        grace = re.search(r"--node-monitor-grace-period=(\w+)", CLUSTER_SH.read_text())
        return (f"{NODE_B}'s qemu killed (SIGKILL) with the only replica on it; the Service through {NODE} answered from "
                f"{NODE}'s array {answered:.0f} s later (node NotReady at {timeline.get('nodeNotReady')} s: the controller-"
                f"manager's --node-monitor-grace-period {grace[1] if grace else '?'}; pod evicted after tolerationSeconds "
                f"{NODE_LOSS_EVICTION_SECONDS}, replacement created at {timeline['podCreated']} s, its "
                f"container started at {timeline['containerStarted']} s, then the stand-in's {STARTUP_SECONDS} s load and the "
                f"probes: Ready at {timeline['podReady']} s)")

    def real_cache_no_changes(self) -> str:
        """With the second node still off, the stack as it stands changes nothing."""
        self.pulumi("preview", "--expect-no-changes", stack="node", timeout=900)
        self.pulumi("up", "--yes", "--skip-preview", "--expect-no-changes", stack="node", timeout=900)
        changes = self.last_update_changes("node")
        require(set(changes) <= {"same"}, f"the up with {NODE_B} off changed {changes}")
        return (f"with {NODE_B} powered off, `pulumi preview --expect-no-changes` and an `up` change nothing "
                f"({changes.get('same', 0)} resources the same: no node step reconnects to it, no object waits on it)")

