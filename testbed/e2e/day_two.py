"""Day two on the loopback cluster: the runbook's operations (docs/operating.md), run as the docs print them
(testbed/e2e/runbook.py), each checked for what the runbook promises. They share the cluster stack
that `up-cluster` made, one after the other, so the whole set costs a few `pulumi up`s."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from stacks.config import usable_gib
from stacks.config.nodes import size_gb_for
from testbed.e2e import runbook
from testbed.e2e.cluster_checks import ADDED_NODE, NAMESPACE, ClusterEndToEnd, _sequence
from testbed.e2e.engine_checks import GROWN_SIZE_GB, ROLE_DISKS, SPARE_DISK
from testbed.e2e.run import JsonHandler, rendering, require, stack_raw

MODEL = "qwen25-05b"
DEPLOYMENT = f"vllm-{MODEL}"
# The cluster stack grows once more on the VM's 4 GiB disks (the lab stack left it at GROWN_SIZE_GB).
CLUSTER_GROWN_SIZE_GB = GROWN_SIZE_GB + 1
GROW_FILE = "/mnt/models/e2e-day-two.bin"
DISK_B = "gs-disk-b"  # the member replace-disk fails
# The adopt stack's array: the role's mountpoint, a name of its own beside the cluster stack's `models`.
ADOPT_MOUNT, ADOPT_RAID = "/mnt/ollama-models", "role"
# The prod names in the runbook's commands → the cluster stack's.
README_NAMES = {"k8s-worker-02": "lab-node", "ai-models": f"{NAMESPACE}-models", "vllm-qwen3-secrets": f"{DEPLOYMENT}-secrets",
                "vllm-qwen3": DEPLOYMENT, "ai": NAMESPACE}
NEW_REVISION = "5f5e2b1c0d9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"  # any commit id: kwok's Job pods download nothing
NEW_IMAGE = "vllm/vllm-openai:v0.11.1"
SECOND = {"name": "second", "huggingFaceId": "Qwen/Qwen2.5-1.5B-Instruct", "revision": "main", "image": "vllm/vllm-openai:v0.11.0",
          "gpuProduct": "nvidia-t4", "gpusPerReplica": 1, "maxModelLen": 4096, "weightsGb": 1, "cpu": "2", "memory": "8Gi"}


def _events(events_path: Path) -> list[dict[str, Any]]:
    """The engine's events of an `up`, without those of the preview it starts with (`planning`)."""
    events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    return [e for e in events if not any(isinstance(body, dict) and body.get("planning") for body in e.values())]


def _changed(events_path: Path) -> dict[str, str]:
    """URN → op of every resource a `pulumi up` did something to, from its event log."""
    changed = {}
    for event in _events(events_path):
        meta = (event.get("resourcePreEvent") or {}).get("metadata") or {}
        if meta.get("op") not in (None, "same", "read", "refresh"):
            changed[meta["urn"]] = meta["op"]
    return changed


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[1]


class _ModelsStub(JsonHandler):
    """Stands in for `kubectl port-forward` to a vLLM pod: answers /v1/models only with the current key."""

    key = ""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        ok = self.headers.get("Authorization") == f"Bearer {type(self).key}"
        self.reply_json(200 if ok else 401, {"object": "list", "data": [{"id": MODEL}]} if ok else {"error": "Unauthorized"})


@dataclass
class DayTwoEndToEnd(ClusterEndToEnd):
    """The runbook's operations on the cluster stack."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.readme = runbook.blocks()
        self.pv_uid = self.claim_uid = self.grow_sum = ""

    # ---- running the runbook ---------------------------------------------------------------

    def shell(self, command: str, *, events: Path | None = None, check: bool = True) -> Any:
        """One runbook command in the project copy, as the operator's shell runs it after `pulumi stack select`."""
        env = {"PULUMI_SKIP_CONFIRMATIONS": "true"}
        if self.cluster_env:  # adopt-ansible needs no cluster
            env.update(KUBECONFIG=self.cluster_env["KUBECONFIG"], PATH=f"{self.cluster_env['GS_CLUSTER_BIN']}:{self.env['PATH']}")
        if events is not None and command.startswith("pulumi up"):
            # Only observed: the engine's event log orders what the up did (the CLI offers it in debug mode).
            command += f" --event-log {events}"
            env["PULUMI_DEBUG_COMMANDS"] = "true"
        return self.logged(["bash", "-o", "pipefail", "-c", command], shown=command, env=env, check=check, timeout=1800)

    def run_block(self, name: str, *, names: dict[str, str] | None = None, drop: tuple[str, ...] = (),
                  events: Path | None = None, commands: slice = slice(None), stack: str | None = "cluster") -> list[Any]:
        """The block's commands (a slice of them) with the e2e names, `stack` selected first (None: commands
        that need none)."""
        block = self.readme.get(name)
        require(block is not None, f"the docs have no block marked `<!-- e2e: {name} -->`")
        if stack is not None:
            self.pulumi("stack", "select", stack)
        ran = []
        for command in block[commands]:  # type: ignore[index]
            text = runbook.substitute(command.text, {**(names or {}), **README_NAMES})
            if any(word in text for word in drop):
                continue
            ran.append(self.shell(text, events=events))
        return ran

    def node_names(self) -> dict[str, str]:
        """`ssh root@k8s-worker-02` of a runbook command → the lab VM's ssh command (its key and port)."""
        return {"ssh root@k8s-worker-02": shlex.join(self.vm.ssh_argv())}

    # ---- cluster state ----------------------------------------------------------------------

    def pods(self, model: str = MODEL) -> dict[str, dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={model},app.kubernetes.io/component=inference-server"
        return {p["metadata"]["uid"]: p for p in self.get("pods", "-n", NAMESPACE, "-l", selector)["items"]
                if not p["metadata"].get("deletionTimestamp")}

    def ready_pods(self, model: str = MODEL) -> dict[str, dict[str, Any]] | None:
        pods = self.pods(model)
        ready = {uid: p for uid, p in pods.items()
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))}
        return ready if ready and len(ready) == len(pods) else None

    def jobs(self, model: str = MODEL) -> dict[str, dict[str, Any]]:
        return {j["metadata"]["name"]: j for j in self.get("jobs", "-n", NAMESPACE)["items"]
                if j["metadata"]["name"].startswith(f"vllm-{model}-")}

    def secret_value(self, key: str) -> str:
        data = self.get("secret", f"{DEPLOYMENT}-secrets", "-n", NAMESPACE)["data"]
        return base64.b64decode(data[key]).decode()

    def vm_sh(self, command: str) -> str:
        return self.vm.ssh(command).stdout.strip()

    # ---- checks ------------------------------------------------------------------------------

    def runbook_check(self) -> str:
        # kwok runs no container: the port-forward is dropped, and a stand-in on loopback answers as
        # vLLM with `--api-key` does (401 without the key). The runbook's URLs point at it.
        _ModelsStub.key = self.canaries["vllmApiKey"]
        server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsStub)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            bare = self.shell(f"curl -sSf {url}/v1/models", check=False)
            require(bare.returncode == 22, f"the stand-in answered a request without the key (curl exit {bare.returncode})")
            ran = self.run_block("check", names={"https://ai.primer.rs": url, "localhost:8000": url[len("http://"):]},
                                 drop=("port-forward",))
        finally:
            server.shutdown()
        outputs = [proc.stdout for proc in ran]
        require(len(ran) == 5, f"ran {len(ran)} of the block's commands, expected 5 (all but the port-forward)")
        require("clean" in outputs[0], f"`pulumi stack output nodes` shows no clean health: {outputs[0][:200]}")
        gpus = outputs[1].split("lab-node", 1)[-1].split("\n", 1)[0].split()
        require(gpus == ["2"], f"kubectl get nodes does not list lab-node's 2 GPUs: {outputs[1][:200]}")
        for text in (outputs[2], outputs[4]):
            require(f'"id": "{MODEL}"' in text or f'"id":"{MODEL}"' in text, f"curl with the key got no model list: {text[:200]}")
        require(f"{DEPLOYMENT}.{NAMESPACE}.svc" in outputs[3], f"`pulumi stack output models` has no in-cluster URL: {outputs[3][:200]}")
        return ("ran the runbook's check as printed (port-forward dropped: kwok has no container): node health clean, GPUs listed, "
                "both curl lines answered with the key from the stack (without it: 401), model URLs in the output")

    def grow_cluster(self) -> str:
        # md refuses a size change while the lab stack's grow still resyncs (the runbook: watch /proc/mdstat first).
        self.vm.ssh("mdadm --wait /dev/md/models", check=False)
        before_sum = self.vm_sh(f"head -c 16M /dev/urandom > {GROW_FILE} && sync && sha256sum {GROW_FILE} | cut -d' ' -f1")
        before_size = int(self.vm_sh("df -B1 --output=size /mnt/models | tail -1"))
        pods = set(self.pods())
        claim = self.get("pvc", "models", "-n", NAMESPACE)
        self.edit_stack("cluster", lambda config: config["gpu-serving:nodes"][0]["storage"].__setitem__("sizeGb", CLUSTER_GROWN_SIZE_GB))
        events = self.tmp / "grow-cluster-events.jsonl"
        self.run_block("grow", events=events)
        changed = {_name(urn): op for urn, op in _changed(events).items()}
        require("model-storage-pvc" not in changed, f"the up changed the claim ({changed})")
        require(changed.get("model-storage-pv") == "update", f"the PV was not updated: {changed}")
        volume = self.get("pv", f"{NAMESPACE}-models")
        after_claim = self.get("pvc", "models", "-n", NAMESPACE)
        want = f"{usable_gib(CLUSTER_GROWN_SIZE_GB)}Gi"
        require(volume["spec"]["capacity"]["storage"] == want, f"PV capacity {volume['spec']['capacity']}, expected {want}")
        require(after_claim["metadata"]["uid"] == claim["metadata"]["uid"] and after_claim["status"].get("phase") == "Bound",
                f"the claim was re-created or is {after_claim['status'].get('phase')}")
        require(after_claim["spec"]["resources"] == claim["spec"]["resources"], "the claim's request changed")
        require(set(self.ready_pods() or {}) == pods, "the serving pods were restarted or are not Ready")
        after_size = int(self.vm_sh("df -B1 --output=size /mnt/models | tail -1"))
        require(after_size > before_size, f"XFS did not grow: {before_size} -> {after_size}")
        require(self.vm_sh(f"sha256sum {GROW_FILE} | cut -d' ' -f1") == before_sum, "the file on the volume changed")
        self.grow_sum = before_sum
        return (f"sizeGb {GROWN_SIZE_GB} -> {CLUSTER_GROWN_SIZE_GB}: updated {', '.join(sorted(changed))}; PV {want}, claim Bound and "
                f"untouched, pods kept; XFS {before_size} -> {after_size} bytes, file checksum kept")

    def plug(self, name: str) -> str:
        """A disk of the lab VM plugged in (as a technician would), once the guest shows it: its by-id path."""
        self.vm.plug(name)
        path = self.vm.disk_id(name)
        self.vm.ssh(f"for i in $(seq 300); do [ -e {path} ] && exit 0; sleep 0.2; done; exit 1", timeout=120)
        self.vm.ssh("udevadm settle")
        return path

    def replace_disk(self) -> str:
        # The lab stack's resync of its grow may still run: md would show it, not the rebuild.
        self.vm.ssh("mdadm --wait /dev/md/models", check=False)
        failed = self.vm_sh(f"readlink -f {self.vm.disk_id(DISK_B)}-part1")
        names = {**self.node_names(), "/dev/sdb5": failed}
        looked = self.run_block("replace-disk", names=names, commands=slice(0, 3))
        require("[UU]" in looked[0].stdout and failed.rsplit("/", 1)[1] in looked[1].stdout,
                f"the look commands show no healthy array with {failed}: {looked[0].stdout[-200:]}")
        detail = self.vm_sh("mdadm --detail /dev/md/models")
        require(failed not in detail and "Active Devices : 1" in detail, f"{failed} is still in the array: {detail[-300:]}")
        # The failed disk stays plugged in (the harness does not unplug); it is out of the array and the config.
        removed_sum = self.vm_sh(f"head -c 8M {failed} | sha256sum | cut -d' ' -f1")
        new_disk = self.plug(SPARE_DISK)
        self.edit_stack("cluster", lambda config: config["gpu-serving:nodes"][0]["storage"]["disks"].__setitem__(1, new_disk))
        events = self.tmp / "replace-disk-events.jsonl"
        ran = self.run_block("replace-disk", names=names, events=events, commands=slice(3, None))
        changed = {_name(urn): op for urn, op in _changed(events).items()}
        steps = {f"lab-node:{step}" for step in ("10-preflight", "20-partition", "30-raid", "60-grow", "70-health")}
        require(set(changed) == steps and set(changed.values()) == {"update"},
                f"the up changed {changed}, expected updates of {sorted(steps)}")
        member = self.vm_sh(f"readlink -f {new_disk}-part1")
        state = self.vm_sh("mdadm --detail /dev/md/models | sed -n 's/^ *State : *//p'")
        mdstat = self.vm_sh("cat /proc/mdstat")
        require(member.rsplit("/", 1)[1] in mdstat, f"{member} is not in the array: {mdstat}")
        rebuilt = "recover" in state or "recovery" in mdstat
        require(rebuilt or "[UU]" in mdstat, f"no rebuild onto {member}: {state}; {mdstat}")
        node = json.loads(self.pulumi("stack", "output", "nodes", "--json", stack="cluster").stdout)["lab-node"]
        require(node["disks"][1] == new_disk, f"the nodes output lists the disks {node['disks']}")
        # Measured by this up (the health step re-runs when the disks change): resyncing while the new
        # member is rebuilt, clean if it was done before the health step ran.
        printed = json.loads(ran[1].stdout)["lab-node"]["health"]
        require(node["health"] in ("resyncing", "clean") and printed == node["health"],
                f"health output {node['health']!r} (the block's command printed {printed!r}), expected resyncing (or clean)")
        require(self.vm_sh(f"sha256sum {GROW_FILE} | cut -d' ' -f1") == self.grow_sum, "the file on the volume changed")
        require(self.vm_sh(f"head -c 8M {failed} | sha256sum | cut -d' ' -f1") == removed_sum, "the removed disk was written to")
        progress = re.search(r"recovery = *([0-9.]+%)", mdstat)
        return (f"failed and removed {failed}, plugged {new_disk} ({member}): the up updated {len(changed)} steps, "
                f"{member} in the array ({state}{', recovery ' + progress[1] if progress else ''}); health output "
                f"{node['health']!r}; file checksum kept; the removed disk untouched")

    def rotate_api_key(self) -> str:
        old_key = self.canaries["vllmApiKey"]
        new_key = self.canaries["vllmApiKeyRotated"] = f"gs-canary-vllmApiKeyRotated-{secrets.token_hex(8)}"
        (self.project / "new-key.txt").write_text(new_key)
        pods_before = set(self.pods())
        smoke_before = {j["metadata"]["uid"] for name, j in self.jobs().items() if "-smoke-" in name}
        deployment_before = self.get("deployment", DEPLOYMENT, "-n", NAMESPACE)
        self.run_block("rotate-api-key")
        deployment = self.get("deployment", DEPLOYMENT, "-n", NAMESPACE)
        require(deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0, "the rollout may need a spare GPU")
        annotation = "gpu-serving/api-key-hmac"
        require(deployment["spec"]["template"]["metadata"]["annotations"][annotation] !=
                deployment_before["spec"]["template"]["metadata"]["annotations"][annotation], "the pod template did not change")
        pods = self.wait_for("the rolled pods Ready", self.ready_pods)
        require(not set(pods) & pods_before, "a pod from before the rotation still runs")
        smoke = {j["metadata"]["uid"]: j for name, j in self.jobs().items() if "-smoke-" in name}
        require(smoke and not set(smoke) & smoke_before, "the smoke test did not run again")
        require(all(j["status"].get("succeeded") for j in smoke.values()), "the new smoke test did not succeed")
        require(self.secret_value("api-key") == new_key, "the Secret does not hold the new key")
        # No object but the Secret may carry either key or an unsalted hash of it.
        everything = self.kubectl("get", "deployments,replicasets,pods,jobs,services,configmaps,events", "-n", NAMESPACE,
                                  "-o", "json").stdout
        needles = {k: [k, hashlib.sha256(k.encode()).hexdigest(), hashlib.sha1(k.encode()).hexdigest()] for k in (old_key, new_key)}
        leaks = [n for values in needles.values() for n in values if n in everything]
        require(not leaks, f"{len(leaks)} key or unsalted hash found in the namespace's objects")
        return (f"template annotation changed, {len(pods_before)} pod(s) replaced by {len(pods)} Ready (maxSurge 0), smoke test re-ran "
                f"and passed, Secret holds the new key; neither key nor its plain hash in any other object")

    def rotate_hf_token(self) -> str:
        new_token = self.canaries["hfTokenRotated"] = f"gs-canary-hfTokenRotated-{secrets.token_hex(8)}"
        (self.project / "new-token.txt").write_text(new_token)
        pods_before, jobs_before = set(self.pods()), {j["metadata"]["uid"] for j in self.jobs().values()}
        events = self.tmp / "rotate-hf-token-events.jsonl"
        self.run_block("rotate-hf-token", events=events)
        changed = {_name(urn): op for urn, op in _changed(events).items()}
        # The provider replaces a Secret whose stringData changes (same name, deleted first): still only the Secret.
        require(set(changed) == {f"{MODEL}-secrets"} and changed[f"{MODEL}-secrets"] in ("update", "create-replacement", "replace"),
                f"the up changed {changed}, expected only the Secret")
        require(self.secret_value("hf-token") == new_token, "the Secret does not hold the new token")
        require(set(self.pods()) == pods_before, "serving pods were restarted")
        require({j["metadata"]["uid"] for j in self.jobs().values()} == jobs_before, "a Job was re-created")
        return "only the Secret updated (it holds the new token); pods and Jobs untouched"

    def add_model(self) -> str:
        pods_before = set(self.pods())
        self.edit_stack("cluster", lambda config: config["gpu-serving:models"].append(SECOND))
        events = self.tmp / "add-model-events.jsonl"
        self.run_block("add-model", events=events)
        changed = _changed(events)
        first = sorted(f"{op} {_name(urn)}" for urn, op in changed.items() if f"::{MODEL}" in urn or f"${MODEL}" in urn)
        require(not first, f"the first model's objects changed: {first}")
        others = sorted(f"{op} {_name(urn)}" for urn, op in changed.items() if op != "create")
        require(not others, f"the up did more than create: {others}")
        log = _events(events)
        done, begun = _sequence(log, "resOutputsEvent", "::second-download"), _sequence(log, "resourcePreEvent", "::second-deployment")
        require(done < begun, f"the second Deployment began (event {begun}) before its download Job finished ({done})")
        require(self.wait_for("the second model's pods Ready", lambda: self.ready_pods("second")), "no second pod")
        require(set(self.pods()) == pods_before, "the first model's pods were restarted")
        return (f"created {len(changed)} objects of `second` only; its download Job done (#{done}) before its Deployment began "
                f"(#{begun}); first model untouched")

    def remove_model(self) -> str:
        pods_before = set(self.pods())
        claim, volume = self.get("pvc", "models", "-n", NAMESPACE), self.get("pv", f"{NAMESPACE}-models")
        self.edit_stack("cluster", lambda config: config.__setitem__("gpu-serving:models", config["gpu-serving:models"][:1]))
        events = self.tmp / "remove-model-events.jsonl"
        self.run_block("remove-model", events=events)
        changed = _changed(events)
        require(changed and all(op == "delete" and "second" in urn for urn, op in changed.items()),
                f"the up did more than delete the second model's objects: {sorted(changed.items())[:4]}")
        kinds = "deployments,services,jobs,poddisruptionbudgets,networkpolicies"
        left = [o["metadata"]["name"] for o in self.get(kinds, "-n", NAMESPACE)["items"] if o["metadata"]["name"].startswith("vllm-second")]
        require(not left, f"objects of the removed model are left: {left}")
        require(self.get("pvc", "models", "-n", NAMESPACE)["metadata"]["uid"] == claim["metadata"]["uid"], "the claim was re-created")
        require(self.get("pv", f"{NAMESPACE}-models")["status"]["phase"] == "Bound" and
                self.get("pv", f"{NAMESPACE}-models")["metadata"]["uid"] == volume["metadata"]["uid"], "the PV changed")
        require(set(self.pods()) == pods_before, "the first model's pods were restarted")
        return f"deleted the {len(changed)} objects of `second`; claim and PV kept and Bound; first model untouched"

    def refresh_drift(self) -> str:
        self.kubectl("-n", NAMESPACE, "delete", "deployment", DEPLOYMENT, "--wait=true")
        # targetPort, not the port: ports are keyed by port, so an edited port would be another entry.
        self.kubectl("-n", NAMESPACE, "patch", "service", DEPLOYMENT, "--type=json",
                     "-p", json.dumps([{"op": "replace", "path": "/spec/ports/0/targetPort", "value": 9000}]))
        events = self.tmp / "refresh-drift-events.jsonl"
        self.run_block("refresh-drift", events=events)
        changed = {_name(urn): op for urn, op in _changed(events).items()}
        require(changed == {f"{MODEL}-deployment": "create", f"{MODEL}-service": "update"},
                f"the up after refresh changed {changed}, expected the Deployment created and the Service updated")
        ports = self.get("service", DEPLOYMENT, "-n", NAMESPACE)["spec"]["ports"]
        require([(p["port"], p["targetPort"]) for p in ports] == [(8000, "http")], f"the Service's ports are {ports}")
        require(self.wait_for("the re-created Deployment's pods Ready", self.ready_pods), "no pod")
        return "after refresh, up re-created the Deployment and put the Service's targetPort back (http); nothing else changed"

    def drain_node(self) -> str:
        # kwok removes a pod a moment after its deletion starts: a watch may or may not see the grace
        # period the eviction gave it, so it is compared when seen and never required (the template's
        # value is). What the cluster always shows: drain goes through the eviction API and the PDB
        # allows it, the new pod stays Pending on the cordoned storage node, an up leaves the cordon.
        budget = self.get("pdb", DEPLOYMENT, "-n", NAMESPACE)
        require(budget["status"].get("disruptionsAllowed") == 1, f"the PDB allows {budget['status'].get('disruptionsAllowed')} evictions")
        template = self.get("deployment", DEPLOYMENT, "-n", NAMESPACE)["spec"]["template"]["spec"]
        want = self.offline_render("cluster").of_type("kubernetes:apps/v1:Deployment")[0].inputs["spec"]["template"]["spec"]
        require(template["terminationGracePeriodSeconds"] == want["terminationGracePeriodSeconds"],
                f"the live template's grace period is {template['terminationGracePeriodSeconds']}, the render's "
                f"{want['terminationGracePeriodSeconds']}")
        serving = self.pods()
        pods_before = set(serving)
        pods_before_names = {p["metadata"]["name"] for p in serving.values()}
        events = self.tmp / "drain-node-events.jsonl"
        watch = subprocess.Popen(
            [f"{self.cluster_env['GS_CLUSTER_BIN']}/kubectl", "get", "pods", "-n", NAMESPACE, "-w", "-o",
             'jsonpath={.metadata.name} {.metadata.deletionGracePeriodSeconds}{"\\n"}'],
            env={**self.env, "KUBECONFIG": self.cluster_env["KUBECONFIG"]}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        seen: list[list[str]] = []
        threading.Thread(target=lambda: seen.extend(line.split() for line in watch.stdout or [] if line.strip()), daemon=True).start()
        try:
            # Drain only once the watch listed the pods: its events then include the eviction's.
            self.wait_for("the pod watch to start", lambda: any(name in pods_before_names for name, *_ in seen), timeout=60)
            drain = self.run_block("drain-node", events=events, commands=slice(0, 1))[0]
        finally:
            time.sleep(2)
            watch.terminate()
            watch.wait(timeout=30)
        # The first grace period a pod shows is the eviction's (kwok's own delete may follow with 0).
        first: dict[str, int] = {}
        for name, *rest in list(seen):
            if rest and name in pods_before_names:
                first.setdefault(name, int(rest[0]))
        graces = set(first.values())
        require(graces <= {want["terminationGracePeriodSeconds"]}, f"an evicted pod got grace periods {sorted(graces)}")
        said = drain.stdout + drain.stderr
        evicted = re.findall(rf"pod/({DEPLOYMENT}-[a-z0-9]+-[a-z0-9]+) evicted", said)
        require(len(evicted) == len(pods_before) and "evicting pod" in said,
                f"drain did not evict the {len(pods_before)} serving pod(s) through the eviction API: {said[-300:]}")
        require(not set(self.pods()) & pods_before, "a serving pod survived the drain")

        def pending() -> dict[str, dict[str, Any]] | None:
            pods = self.pods()
            unschedulable = [p for p in pods.values() if p["status"].get("phase") == "Pending" and any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))]
            return pods if pods and len(unschedulable) == len(pods) else None
        waiting = self.wait_for("the replacement pods Pending (local storage: only the cordoned node has the volume)", pending)
        self.run_block("drain-node", events=events, commands=slice(1, 2))
        changed = _changed(events)
        require(not changed, f"the up during the drain changed {sorted(changed.values())}")
        require(self.get("node", "lab-node")["spec"].get("unschedulable") is True, "the up undid the cordon")
        self.run_block("drain-node", commands=slice(2, None))
        pods = self.wait_for("the serving pods back after uncordon", self.ready_pods)
        return (f"drain evicted {len(evicted)} pod(s) through the eviction API (PDB allowed 1); {len(waiting)} replacement(s) Pending "
                f"Unschedulable while cordoned; the up then changed nothing and kept the cordon; after uncordon {len(pods)} Ready; "
                f"template grace {template['terminationGracePeriodSeconds']} s as rendered; on the evicted pod "
                + (f"{sorted(graces)} s" if graces else "not seen (kwok removed it before the watch's event)"))

    def add_node(self) -> str:
        entry = {"name": ADDED_NODE, "ssh": {"host": "127.0.0.1", "port": self.vm.port}, "gpu": {"product": "nvidia-t4", "count": 1},
                 "containerRuntime": "none"}
        self.edit_stack("cluster", lambda config: config["gpu-serving:nodes"].append(entry))
        events = self.tmp / "add-node-events.jsonl"
        self.run_block("add-node", events=events)
        changed = {_name(urn): op for urn, op in _changed(events).items()}
        foreign = sorted(f"{op} {name}" for name, op in changed.items() if op != "create" or not name.startswith(ADDED_NODE))
        require(changed and not foreign, f"the up did more than create {ADDED_NODE}'s resources: {foreign}")
        labels = self.get("node", ADDED_NODE)["metadata"].get("labels", {})
        require(labels.get("gpu-serving/gpu.product") == "nvidia-t4", f"{ADDED_NODE} is not labelled: {labels}")
        return f"created only {ADDED_NODE}'s {len(changed)} resources ({', '.join(sorted(changed))}); lab-node re-ran nothing"

    def runtime_chain(self) -> str:
        """The runtime steps of two nodes under the real engine: one node at a time, the chain stopped
        at the first node whose step fails. Both nodes' SSH reaches the lab VM, where FAKE containerd,
        ctr and nvidia-ctk (testbed/vm/fakes) stand in for NVIDIA's packages: what is real is the
        engine's ordering and the step's restore, not a container runtime."""
        from testbed.vm.fakes import install_fake_containerd

        first, second = "lab-node", ADDED_NODE  # chained by name
        install_fake_containerd(self.vm)
        # nvidia-ctk makes nvidia the default runtime without configuring it: containerd restarts with
        # no CRI, the first node's step restores the files and fails.
        self.vm_sh("echo noruntime > /etc/fake-nvidia-ctk.mode")

        nodes = yaml.safe_load((self.project / "Pulumi.cluster.yaml").read_text())["config"]["gpu-serving:nodes"]
        require([node.get("containerRuntime") for node in nodes] == ["none", "none"], f"expected two nodes without a runtime step: {nodes}")

        def runtimes(value: str) -> None:
            self.edit_stack("cluster", lambda config: [node.__setitem__("containerRuntime", value) for node in config["gpu-serving:nodes"]])

        def up(label: str) -> tuple[Any, list[dict[str, Any]]]:
            events = self.tmp / f"runtime-chain-{label}-events.jsonl"
            self.pulumi("stack", "select", "cluster")
            return self.shell("pulumi up --yes --skip-preview", events=events, check=False), _events(events)

        def begun(events: list[dict[str, Any]], node: str) -> bool:
            urns = ((e.get("resourcePreEvent") or {}).get("metadata", {}).get("urn", "") for e in events)
            return any(urn.endswith(f"::{node}:80-runtime") for urn in urns)

        files = "cat /etc/containerd/config.toml /etc/containerd/conf.d/* 2>/dev/null || true"
        before = self.vm_sh(files)
        runtimes("containerd")
        try:
            failed, events = up("failing")
            require(failed.returncode != 0, "the up passed although the first node's runtime step had to fail")
            require(begun(events, first) and not begun(events, second),
                    f"{second}'s runtime step began although {first}'s failed")
            require(self.vm_sh(files) == before, "the failed step left containerd's files changed")
            require(self.vm_sh("systemctl is-active containerd || true").strip() == "active", "containerd is not running after the restore")
            self.vm_sh("echo good > /etc/fake-nvidia-ctk.mode")
            passed, events = up("passing")
            require(passed.returncode == 0, f"the up with a working runtime failed: {passed.stderr[-300:]}")
            done = _sequence(events, "resOutputsEvent", f"::{first}:80-runtime")
            start = _sequence(events, "resourcePreEvent", f"::{second}:80-runtime")
            require(done < start, f"{second}'s runtime step began (event {start}) before {first}'s ended ({done})")
        finally:
            runtimes("none")
            reverted, _ = up("reverted")
        require(reverted.returncode == 0, f"taking the runtime steps out again failed: {reverted.stderr[-300:]}")
        return (f"{first}'s failing runtime step stopped the chain ({second}'s never began) and restored the files; "
                f"with a working runtime {second}'s began (event {start}) after {first}'s ended ({done})")

    def change_model(self, block: str, key: str, value: str) -> str:
        """The runbook's change of a model's revision or image: the download Job for it is done before
        the Deployment's template changes, the rollout needs no spare GPU, the smoke test runs again."""
        pods_before = set(self.pods())
        smoke_before = {j["metadata"]["uid"] for name, j in self.jobs().items() if "-smoke-" in name}
        self.edit_stack("cluster", lambda config: config["gpu-serving:models"][0].__setitem__(key, value))
        events = self.tmp / f"{block}-events.jsonl"
        self.run_block(block, events=events)
        log = _events(events)
        changed = {_name(urn): op for urn, op in _changed(events).items()}
        require(changed.get(f"{MODEL}-deployment") == "update", f"the Deployment was not updated in place: {changed}")
        require(f"{MODEL}-download" in changed, f"no new download Job: {changed}")
        # The new Job's outputs (its await saw it complete), not those of deleting the old one.
        done = next((int(e["sequence"]) for e in log if (meta := (e.get("resOutputsEvent") or {}).get("metadata") or {})
                     and meta.get("urn", "").endswith(f"::{MODEL}-download") and not str(meta.get("op")).startswith(("delete", "discard"))),
                    None)
        require(done is not None, "no outputs of the new download Job in the event log")
        begun = _sequence(log, "resourcePreEvent", f"::{MODEL}-deployment")
        require(done < begun, f"the Deployment's update began (event {begun}) before the download Job was done ({done})")
        deployment = self.get("deployment", DEPLOYMENT, "-n", NAMESPACE)
        require(deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0, "the rollout may need a spare GPU")
        pods = self.wait_for("the rolled pods Ready", self.ready_pods)
        require(not set(pods) & pods_before, "a pod from before the change still runs")
        smoke = {j["metadata"]["uid"]: j for name, j in self.jobs().items() if "-smoke-" in name}
        require(smoke and not set(smoke) & smoke_before and all(j["status"].get("succeeded") for j in smoke.values()),
                "the smoke test did not run again and pass")
        return (f"{key} -> {value}: download Job {changed[f'{MODEL}-download']} done (#{done}) before the Deployment's update began "
                f"(#{begun}); {len(pods)} pod(s) rolled with maxSurge 0; smoke test re-ran and passed")

    def change_revision(self) -> str:
        return self.change_model("change-revision", "revision", NEW_REVISION)

    def upgrade_image(self) -> str:
        return self.change_model("upgrade-image", "image", NEW_IMAGE)

    def destroy_cluster_stack(self) -> None:
        # The destroy line of docs/nodes.md ("What deletion keeps"), before the claims of destroy-retains-pv.
        self.pv_uid = self.get("pv", f"{NAMESPACE}-models")["metadata"]["uid"]
        self.claim_uid = self.get("pvc", "models", "-n", NAMESPACE)["metadata"]["uid"]
        self.run_block("destroy-and-re-up", commands=slice(0, 1))

    def destroy_and_re_up(self) -> str:
        self.run_block("destroy-and-re-up", commands=slice(1, None))
        volume, claim = self.get("pv", f"{NAMESPACE}-models"), self.get("pvc", "models", "-n", NAMESPACE)
        require(volume["metadata"]["uid"] == self.pv_uid and claim["metadata"]["uid"] == self.claim_uid,
                "the PV or the claim was re-created instead of taken over")
        require(claim["status"].get("phase") == "Bound" and claim["spec"].get("volumeName") == f"{NAMESPACE}-models",
                f"the claim is {claim['status'].get('phase')} to {claim['spec'].get('volumeName')}")
        pods = self.wait_for("the serving pods Ready", self.ready_pods)
        checksum = self.vm_sh(f"sha256sum {GROW_FILE} | cut -d' ' -f1")
        require(checksum == self.grow_sum, "the file written before the destroy changed or is gone")
        state = json.loads(self.pulumi("stack", "export", stack="cluster").stdout)
        kinds = {r["type"] for r in state["deployment"]["resources"]}
        volumes = {"kubernetes:core/v1:PersistentVolume", "kubernetes:core/v1:PersistentVolumeClaim"}
        require(volumes <= kinds, "the state lacks the PV or the claim")
        return f"up after destroy took over the kept PV and claim (same UIDs, Bound), {len(pods)} pod(s) Ready, file checksum kept"

    def adopt_ansible(self) -> str:
        """The runbook's "Migrating from the Ansible role" on the lab VM, through the engine: a stack of its own
        (`adopt`: the lab's config, its Kubernetes side written as YAML) whose node is the lab VM with
        the role's array, beside the cluster stack's array."""
        from testbed.vm import ROLE_MD, ansible_role_layout

        disks = [self.plug(name) for name in ROLE_DISKS]
        role = ansible_role_layout(self.vm, disks, ADOPT_MOUNT)
        names = {**self.node_names(), "/dev/sda": disks[0]}
        # Step 1, as printed: on the node, before any stack takes it over.
        looked = self.run_block("adopt-ansible", names=names, commands=slice(0, 3), stack=None)
        mdstat, lsblk, table = (proc.stdout for proc in looked)
        require(re.search(r"^md1 : active raid1 .*\n.*\[UU\]", mdstat, re.M) is not None, f"/proc/mdstat shows no healthy md1: {mdstat}")
        require("xfs" in lsblk and role["fs_uuid"] in lsblk, f"lsblk -f shows no XFS on md1: {lsblk}")
        part = re.search(r"^ *5 +([0-9]+)B +([0-9]+)B +([0-9]+)B", table, re.M)
        require(part is not None, f"parted lists no partition 5: {table}")
        # Step 2: sizeGb at least the partition's size in GB, rounded up (as the runbook says to read it).
        size_gb = size_gb_for(int(part[3]))
        raw = rendering(stack_raw("lab"), self.tmp / "yaml-adopt")
        raw["cluster"]["namespace"] = "ai-adopt"
        raw["nodes"][0]["ssh"]["port"] = self.vm.port
        raw["nodes"][0]["storage"] = {"disks": disks, "sizeGb": size_gb, "raidName": ADOPT_RAID, "mountpoint": ADOPT_MOUNT,
                                      "adopt": ROLE_MD}
        raw["models"] = []
        self.new_stack("adopt", raw, self.secret_values(raw, self.vm.key_path.read_text()))
        start = time.monotonic()
        ran = self.run_block("adopt-ansible", names=names, commands=slice(3, None), stack="adopt")
        self.report["figures"]["adoptUpSeconds"] = round(time.monotonic() - start, 1)
        reports = self.step_reports("adopt")
        require([d["partition"] for d in reports["10-preflight"]["disks"]] == ["adopt", "adopt"],
                f"preflight did not take the role's partitions: {reports['10-preflight']['disks']}")
        require(reports["30-raid"]["uuid"] == role["md_uuid"], f"the raid step made or found another array: {reports['30-raid']}")
        require(reports["40-filesystem"]["result"] == "unchanged" and reports["40-filesystem"]["uuid"] == role["fs_uuid"],
                f"the filesystem step formatted: {reports['40-filesystem']}")
        node = json.loads(ran[-1].stdout)["lab-node"]
        require((node["arrayUuid"], node["filesystemUuid"]) == (role["md_uuid"], role["fs_uuid"]),
                f"the nodes output names another array or filesystem: {node}")
        require(self.vm_sh(f"sha256sum {role['path']} | cut -d' ' -f1") == role["data"], "the role's data changed")
        fstab = [line for line in self.vm_sh("cat /etc/fstab").splitlines() if f" {ADOPT_MOUNT} " in line]
        require(len(fstab) == 1 and fstab[0].startswith(f"UUID={role['fs_uuid']} "), f"fstab lines for {ADOPT_MOUNT}: {fstab}")
        arrays = [line for line in self.vm_sh("cat /etc/mdadm/mdadm.conf").splitlines() if line.startswith("ARRAY")]
        mine = [line for line in arrays if "/dev/md/models" not in line]
        require(mine == [f"ARRAY /dev/md/{ADOPT_RAID} metadata=1.2 UUID={role['md_uuid']}"], f"mdadm.conf ARRAY lines: {arrays}")
        require(self.vm_sh(f"findmnt -n -o SOURCE {ADOPT_MOUNT}") == self.vm_sh(f"readlink -f /dev/md/{ADOPT_RAID}"),
                f"{ADOPT_MOUNT} is not the adopted array under /dev/md/{ADOPT_RAID}")
        same = self.second_up_changes_nothing("adopt", "noopUpAdoptSeconds")
        grown = reports["60-grow"]["result"]
        return (f"the role's md1 ({int(part[3])} B partitions from {role['start']}) adopted as /dev/md/{ADOPT_RAID} with sizeGb "
                f"{size_gb}: nothing created or formatted (array and XFS UUIDs kept, grow {grown}), data checksum kept, one "
                f"fstab and one ARRAY line; second up: no changes ({same} the same)")

    def step_reports(self, stack: str) -> dict[str, dict[str, Any]]:
        """The JSON report each node step printed at its last run, from the stack's state: step → report."""
        state = json.loads(self.pulumi("stack", "export", stack=stack).stdout)
        reports = {}
        for resource in state["deployment"]["resources"]:
            if resource["type"] == "command:remote:Command":
                stdout = (resource.get("outputs") or {}).get("stdout", "")
                line = next((line for line in reversed(stdout.splitlines()) if line.startswith("{")), "{}")
                reports[resource["urn"].rsplit(":", 1)[1]] = json.loads(line)
        return reports
