"""Models larger than one node (`models[].nodesPerReplica`, issue #41) on the loopback cluster: a stack of its own on
five simulated two-GPU nodes, one model of two nodes per replica at two replicas, its node steps answered by SSH
stand-ins; the groups scheduled, one member's node lost, a rolling update, then nothing for `pulumi up` to change.

Real: the API server (every object server-side applied by the engine, the LeaderWorkerSet CRD's schema), the
LeaderWorkerSet controller and its webhooks built from the pinned module (testbed/cluster: the StatefulSets, the
headless Service, the group restart, the rolling update, the leader's address injected into every member), the
scheduler (whole nodes by GPUs, the weights-label gate) and the node lifecycle controller. Standing in: kwok for the
kubelets, so no container runs (pods are Ready whatever their spec, `$(LWS_LEADER_ADDRESS)` is never expanded, no
stage joins another). A lost node is its Lease and its kwok annotation taken from kwok, which then acts for neither
the node nor its pods, as a dead kubelet would not: its pods stay Terminating as on a real cluster, until the node is
marked out of service (docs/models.md).
The workers reaching their leader on real nodes is the lab VMs' part."""

from __future__ import annotations

import copy
import json
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from testbed.bench_fleet.measure import ssh_standin
from testbed.e2e.endpoint_checks import EndpointEndToEnd
from testbed.e2e.run import CheckError, require
from tools.render import ROOT

GROUP_NAMESPACE = "ai-group"
GROUP_NODES = ("group-a", "group-b", "group-c", "group-d", "group-e")
"""Two groups of two take four nodes: the fifth is where a group goes when it loses one."""
GROUP_PRODUCT = "e2e-group"
GROUP_MODEL = "big"
GROUP_SET = f"vllm-{GROUP_MODEL}-group"
EVICTION_S = 10
GROUP_CHECKS = ("group-up", "group-node-lost", "group-rollout", "group-no-changes")
LWS = "leaderworkerset.sigs.k8s.io"
KWOK_NODE = "kwok.x-k8s.io/node"
"""The annotation by which kwok (testbed/cluster/cluster.sh) takes a node for its own."""
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
"""Kubernetes' non-graceful node shutdown: on a node with this taint that is not Ready, the pod garbage collector
force-deletes the pods that are terminating (and their volumes detach)."""
MEMBERS = f"app.kubernetes.io/instance={GROUP_MODEL},app.kubernetes.io/component in (inference-server,inference-worker)"


def ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def groups_of(pods: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{group index: {"leader": pod, "worker": pod}} of the pods not being deleted, by LeaderWorkerSet's labels."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        if pod["metadata"].get("deletionTimestamp") or f"{LWS}/group-index" not in labels:
            continue
        role = "leader" if labels.get(f"{LWS}/worker-index") == "0" else "worker"
        found.setdefault(labels[f"{LWS}/group-index"], {})[role] = pod
    return found


def unavailable_at_most(events: list[dict[str, Any]], groups: int) -> int:
    """Replaying a pod watch (`--output-watch-events`): the most groups at once without a Ready leader."""
    pods: dict[str, dict[str, Any]] = {}
    worst = 0
    for event in events:
        pod = event["object"]
        if event["type"] == "DELETED":
            pods.pop(pod["metadata"]["name"], None)
        else:
            pods[pod["metadata"]["name"]] = pod
        up = {g for g, members in groups_of(list(pods.values())).items() if "leader" in members and ready(members["leader"])}
        worst = max(worst, groups - len(up))
    return worst


@dataclass
class GroupEndToEnd(EndpointEndToEnd):
    """The multi-node checks, on the cluster `cluster-up` started, beside the other stacks."""

    def group_raw(self, ports: dict[str, int]) -> dict[str, Any]:
        """docs/examples/Pulumi.multinode.yaml on this cluster: five two-GPU nodes, groups of two at two replicas."""
        document = yaml.safe_load((ROOT / "docs/examples/Pulumi.multinode.yaml").read_text())["config"]
        raw = {key.split(":", 1)[1]: value for key, value in document.items()}
        raw["cluster"] = {**raw["cluster"], "namespace": GROUP_NAMESPACE, "kubeconfig": {"path": self.cluster_env["KUBECONFIG"]},
                          "nodeLossEvictionSeconds": EVICTION_S}
        template = raw["nodes"][0]
        raw["nodes"] = []
        for name in GROUP_NODES:
            node = copy.deepcopy(template)
            node.update(name=name, ssh={"host": "127.0.0.1", "port": ports[name]}, gpu={"product": GROUP_PRODUCT, "count": 2})
            node["storage"]["disks"] = [f"/dev/disk/by-id/virtio-{name}-{side}" for side in "ab"]
            raw["nodes"].append(node)
        model = raw["models"][0]
        model.update(name=GROUP_MODEL, gpuProduct=GROUP_PRODUCT, gpusPerReplica=2, weightsGb=6, cpu="4", memory="16Gi",
                     maxModelLen=8192, replicas={"min": 2, "max": 2})
        return raw

    def group_pods(self) -> list[dict[str, Any]]:
        return self.get("pods", "-n", GROUP_NAMESPACE, "-l", MEMBERS)["items"]

    def ready_groups(self) -> dict[str, dict[str, dict[str, Any]]] | None:
        """Both groups, each a Ready leader and a Ready worker; None until then."""
        found = groups_of(self.group_pods())
        whole = {g: m for g, m in found.items() if set(m) == {"leader", "worker"} and all(ready(p) for p in m.values())}
        return whole if len(whole) == 2 else None

    # ---- checks ---------------------------------------------------------------------------

    def group_up(self) -> str:
        nodes = self.cluster_sh("nodes", *[arg for name in GROUP_NODES for arg in ("--node", f"{name}:2:32:128Gi")]).stdout
        self.kubectl("apply", "-f", "-", stdin=nodes)
        self.wait_for("the group nodes Ready", lambda: all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in self.get("node", n)["status"].get("conditions", []))
            for n in GROUP_NODES), timeout=60)
        ports = self.cache_stack.enter_context(ssh_standin(list(GROUP_NODES), self.tmp / "ssh-group.jsonl"))
        raw = self.group_raw(ports)
        self.new_stack("group", raw, self.secret_values(raw, self.canaries["sshPrivateKey"]))
        self.timed("upGroupSeconds", "up", "--yes", "--skip-preview", stack="group", timeout=1200)
        lws = self.get("leaderworkerset", "-n", GROUP_NAMESPACE, GROUP_SET)
        available = [c for c in lws["status"].get("conditions", []) if c["type"] == "Available"]
        require(lws["status"].get("readyReplicas") == 2 and available and available[0]["status"] == "True",
                f"{GROUP_SET} is not Available with 2 ready groups: {lws['status']}")
        groups = self.wait_for("two whole Ready groups", self.ready_groups, timeout=60)
        nodes = [p["spec"]["nodeName"] for m in groups.values() for p in m.values()]
        require(len(set(nodes)) == 4, f"the four members share nodes: {nodes}")
        weights = next(k for k in lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["nodeSelector"]
                       if ".weights.gpu-serving.io/" in k)
        unlabelled = [n for n in nodes if self.get("node", n)["metadata"]["labels"].get(weights) != "verified"]
        require(not unlabelled, f"members on nodes without the weights label: {unlabelled}")
        for index, members in sorted(groups.items()):
            leader, worker = members["leader"], members["worker"]
            require(leader["metadata"]["labels"]["app.kubernetes.io/component"] == "inference-server"
                    and worker["metadata"]["labels"]["app.kubernetes.io/component"] == "inference-worker",
                    f"group {index}: the leader and worker templates are not where LeaderWorkerSet put them")
            env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0].get("env", [])}
            # The pod webhook's doing: the address the program's `--master-addr=$(LWS_LEADER_ADDRESS)` names.
            require(env.get("LWS_LEADER_ADDRESS", "").startswith(f"{leader['metadata']['name']}.{GROUP_SET}.")
                    and env.get("LWS_WORKER_INDEX") == "1" and env.get("LWS_GROUP_SIZE") == "2",
                    f"group {index}: the worker's LeaderWorkerSet environment is {env}")
        headless = self.get("service", "-n", GROUP_NAMESPACE, GROUP_SET)
        require(headless["spec"].get("clusterIP") == "None", f"{GROUP_SET} (LeaderWorkerSet's own Service) is not headless")
        leaders = {m["leader"]["metadata"]["name"] for m in groups.values()}
        slices = self.get("endpointslices", "-n", GROUP_NAMESPACE, "-l", f"kubernetes.io/service-name=vllm-{GROUP_MODEL}")["items"]
        behind = {e.get("targetRef", {}).get("name") for s in slices for e in s.get("endpoints") or []}
        require(behind == leaders, f"Service vllm-{GROUP_MODEL} sends to {sorted(behind)}, not the leaders {sorted(leaders)}")
        address = env["LWS_LEADER_ADDRESS"]
        return (f"{GROUP_SET}: 2 groups Available, each a leader and a worker on their own nodes ({', '.join(sorted(nodes))}), "
                f"all holding the weights; the webhook gave each worker LWS_LEADER_ADDRESS ({address}); Service "
                f"vllm-{GROUP_MODEL} reaches the 2 leaders only, the set's headless Service its own")

    def group_node_lost(self) -> str:
        """A worker's node lost: LeaderWorkerSet recreates the group, whose deletion waits (foreground) for the lost
        member's pod, which stays Terminating as on a real cluster (nothing can say it stopped); the documented step,
        the node marked out of service, lets the pod garbage collector remove it, and the group starts elsewhere."""
        groups = self.ready_groups()
        require(groups is not None, "no two whole Ready groups before the loss")
        assert groups is not None
        hit, other = sorted(groups)
        lost = groups[hit]["worker"]["spec"]["nodeName"]
        stranded = groups[hit]["worker"]["metadata"]["name"]
        before = {g: {r: p["metadata"]["uid"] for r, p in m.items()} for g, m in groups.items()}
        started = time.monotonic()
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.kubectl("patch", "lease", "-n", "kube-node-lease", lost, "--type", "merge", "-p",
                     json.dumps({"spec": {"holderIdentity": "e2e-node-lost", "leaseDurationSeconds": 3600, "renewTime": now}}))
        # Without its annotation kwok no longer acts for the node's pods either, as a dead kubelet would not.
        self.kubectl("annotate", "node", lost, f"{KWOK_NODE}-")

        def recreated() -> dict[str, dict[str, dict[str, Any]]] | None:
            now_groups = self.ready_groups()
            if now_groups is None or hit not in now_groups:
                return None
            fresh = all(p["metadata"]["uid"] != before[hit][r] for r, p in now_groups[hit].items())
            return now_groups if fresh and all(p["spec"]["nodeName"] != lost for p in now_groups[hit].values()) else None

        def terminating() -> bool:
            pod = self.kubectl("get", "pod", "-n", GROUP_NAMESPACE, stranded, "-o", "json", check=False)
            return pod.returncode == 0 and bool(json.loads(pod.stdout)["metadata"].get("deletionTimestamp"))

        try:
            self.wait_for(f"{stranded} evicted from {lost}", terminating, timeout=180)
            evicted = round(time.monotonic() - started, 1)
            time.sleep(20)
            require(terminating() and recreated() is None,
                    f"group {hit} came back with {stranded} on the lost node not yet gone: kwok does what a lost kubelet cannot")
            # The operator's step (docs/models.md): the node is known to be down.
            self.kubectl("taint", "node", lost, f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute")
            marked = round(time.monotonic() - started, 1)
            after = self.wait_for(f"group {hit} recreated off {lost}", recreated, timeout=240)
            seconds = round(time.monotonic() - started, 1)
        finally:
            self.kubectl("taint", "node", lost, f"{OUT_OF_SERVICE}-", check=False)
            self.kubectl("annotate", "node", lost, f"{KWOK_NODE}=fake", check=False)
            self.kubectl("delete", "lease", "-n", "kube-node-lease", lost, check=False)
        self.wait_for(f"{lost} Ready again", lambda: not {t["key"] for t in self.get("node", lost)["spec"].get("taints", [])}
                      & {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}, timeout=120)
        kept = {r: p["metadata"]["uid"] for r, p in after[other].items()}
        require(kept == before[other], f"group {other}, on nodes still up, was restarted too")
        self.report["figures"]["groupNodeLossToReadySeconds"] = seconds
        moved = ", ".join(f"{r} on {p['spec']['nodeName']}" for r, p in sorted(after[hit].items()))
        return (f"{lost} lost (the worker of group {hit}): evicted at {evicted} s, the group's restart then waits on that pod, "
                f"still Terminating 20 s later (no kubelet to confirm it stopped); {lost} tainted out-of-service at {marked} s: "
                f"the whole group recreated, its leader too (new pods: {moved}), Ready at {seconds} s; group {other} untouched; "
                f"{lost} back")

    def group_rollout(self) -> str:
        """A change to the pod template: the groups replaced one at a time, never both down (maxUnavailable 1, no
        surge), read from a watch of the pods kept through the whole `pulumi up`."""
        before = {p["metadata"]["uid"] for p in self.group_pods()}
        self.edit_stack("group", lambda config: config["gpu-serving:models"][0].update(env={"GS_E2E_ROLLOUT": "1"}))
        kubectl = [f"{self.cluster_env['GS_CLUSTER_BIN']}/kubectl", "get", "pods", "-n", GROUP_NAMESPACE, "-l", MEMBERS,
                   "--watch", "--output-watch-events", "-o", "json"]
        watch = subprocess.Popen(kubectl, env={**self.env, "KUBECONFIG": self.cluster_env["KUBECONFIG"]},
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        events: list[dict[str, Any]] = []

        def read() -> None:
            decoder, buffer = json.JSONDecoder(), ""
            assert watch.stdout is not None
            for line in watch.stdout:
                buffer += line
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    continue
                events.append(event)
                buffer = buffer.lstrip()[end:]

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            time.sleep(2)  # the watch's initial list
            self.timed("upGroupRolloutSeconds", "up", "--yes", "--skip-preview", stack="group", timeout=1200)
            groups = self.wait_for("two whole Ready groups of the new template", lambda: (g := self.ready_groups()) and all(
                p["metadata"]["uid"] not in before for m in g.values() for p in m.values()) and g, timeout=120)
            time.sleep(2)
        finally:
            watch.terminate()
            watch.wait(timeout=30)
            reader.join(timeout=30)
        if not events:
            raise CheckError("the pod watch saw nothing")
        worst = unavailable_at_most(events, 2)
        require(worst == 1, f"at worst {worst} groups were down at once during the rollout (expected 1: one at a time)")
        deleted = [e["object"]["metadata"]["name"] for e in events if e["type"] == "DELETED"]
        env = {e["name"]: e.get("value") for m in groups.values() for p in m.values() for e in p["spec"]["containers"][0]["env"]}
        require(env.get("GS_E2E_ROLLOUT") == "1", "the new pods do not carry the change")
        return (f"new template rolled: every member replaced ({len(deleted)} pod deletions seen), never more than one group "
                f"without a Ready leader ({len(events)} watch events)")

    def group_no_changes(self) -> str:
        same = self.second_up_changes_nothing("group", "noopUpGroupSeconds")
        return f"after the loss and the rollout, preview and up: no changes ({same} resources the same)"
