"""The real-node checks of `make e2e`: the lab VM joins a loopback cluster of its own as a real
Kubernetes node (testbed/node/join.py) and the lab stack serves on it, from bare disks to an
answered request.

Real: the node steps on the VM's disks, kubelet, containerd and runc starting the pods, the local
PersistentVolume bind-mounted by the kubelet, probes, the preStop hook and SIGTERM, kube-proxy's
Service rules, the real `huggingface_hub` client in the download Job.
Standing in, each said to be one where it answers: vLLM (testbed/standins/vllm_sim.py, no GPU, no
model), the Hugging Face hub (testbed/standins/hub.py on the host's loopback), the GPU (capacity
patched into the node's status), cluster DNS (testbed/node/dns: Service names only). Not here:
NetworkPolicy enforcement (the bridge CNI enforces none), an ingress controller.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.serving import NON_ROOT_UID, PRESTOP_S
from testbed.e2e.cluster_checks import ClusterEndToEnd, _free_port_block, _time
from testbed.e2e.real_endpoint import ONE_URL_CHECKS, OneUrlChecks
from testbed.e2e.real_picker import PICKER_ARCHIVE, PICKER_CHECKS, PickerChecks
from testbed.e2e.run import CheckError, require, stack_raw, tail
from testbed.node.join import BUNDLE_DISK, GUEST_IP, HUB_GUEST_PORT, POD_GATEWAY, RealNode, make_bundle, ssh_forward

NAMESPACE = "ai-real"
NODE = "real-node"
PRODUCT = "nvidia-a10"
MODEL = "qwen25-05b"
DEPLOYMENT = f"vllm-{MODEL}"
IMAGE = "gs-testbed/vllm-sim:v0.18.0"
SMOKE_IMAGE = "gs-testbed/smoke:v1"
STARTUP_SECONDS = 20
"""The stand-in's pretended load time: long enough that the startup probe must hold Ready back."""
REAL_NODE_CHECKS = ("real-node-ready", "real-pvc-mounted", "real-request", "real-probes", "real-drain", "real-nonroot", "real-live-rerun",
                    *PICKER_CHECKS, *ONE_URL_CHECKS)
VM_MEMORY_MIB, VM_CPUS = 11264, 2
"""The serving pod is Guaranteed at its memory plus /dev/shm (1Gi + 8Gi here): the kubelet must have 9Gi
to give. qemu touches guest memory lazily, so the host pays for what the guest uses."""
WEIGHTS = {"config.json": b'{"model_type": "qwen2", "stand_in": true}\n',
           "model.safetensors": hashlib.sha256(b"gpu-serving real node").digest() * 4096}


def weights_sha256(files: dict[str, bytes]) -> str:
    """What vllm_sim reports for a snapshot: sha256 over `sha256sum` lines sorted by path."""
    lines = "".join(f"{hashlib.sha256(data).hexdigest()}  {path}\n" for path, data in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


@dataclass
class RealNodeEndToEnd(OneUrlChecks, PickerChecks, ClusterEndToEnd):
    """The real-node checks; a Run of their own (own VM, cluster, stack) beside the kwok ones."""

    node: RealNode | None = None
    hub: Any = None
    tunnels: list[subprocess.Popen[Any]] = field(default_factory=list)

    def run_all(self) -> None:
        """The checks in order, each needing the one before; everything stopped afterwards. The wall time
        they add to `make e2e`, set-up and tear-down included, is the report's `realNodeSeconds`."""
        started = time.monotonic()
        try:
            self.checks()
        finally:
            self.stop()
            self.report["figures"]["realNodeSeconds"] = round(time.monotonic() - started, 1)

    def checks(self) -> None:
        self.check("real-node-ready", self.real_node_ready)
        self.check("real-pvc-mounted", self.real_pvc_mounted, needs=("real-node-ready",))
        self.check("real-request", self.real_request, needs=("real-node-ready",))
        self.check("real-probes", self.real_probes, needs=("real-node-ready",))
        self.check("real-drain", self.real_drain, needs=("real-node-ready",))
        self.check("real-nonroot", self.real_nonroot, needs=("real-node-ready",))
        self.check("real-live-rerun", self.real_live_rerun, needs=("real-node-ready",))
        # The endpoint picker on the same node (testbed/e2e/real_picker.py), then the teams' URLs over three pools
        # (testbed/e2e/real_endpoint.py), which build on its pool.
        self.picker_checks(NAMESPACE, needs=("real-node-ready",))
        self.one_url_checks(needs=("real-node-ready",))
        self.picker_cleanup()

    def node_raw(self, vm_port: int, smoke_image: str) -> dict[str, Any]:
        raw = stack_raw("lab")
        raw["cluster"] = {**raw["cluster"], "namespace": NAMESPACE, "kubeconfig": {"path": self.cluster_env["KUBECONFIG"]},
                          "smokeImage": smoke_image}
        node = raw["nodes"][0]
        node["name"], node["ssh"]["port"] = NODE, vm_port
        # 3 GB, not the lab's 2: the array must also hold the model's compile-cache allowance when the
        # two-node checks (real_cache.py) make it a model cache.
        node["storage"]["sizeGb"] = 3
        node["gpu"]["product"] = PRODUCT
        raw["modelStorage"]["node"] = NODE
        model = raw["models"][0]
        model.update(image=IMAGE, gpuProduct=PRODUCT, cpu="1", memory="1Gi", apiKeySecret="vllmApiKey",
                     extraArgs=[f"--sim-startup-seconds={STARTUP_SECONDS}"])
        return raw

    # ---- set-up -----------------------------------------------------------------------------

    def start(self) -> None:
        """A cluster with no simulated nodes, the hub stand-in, the VM with the node's bundle, joined."""
        from testbed.node import images as node_images
        from testbed.standins.hub import Hub, Repo
        from testbed.vm import DEFAULT_DISKS, Vm, ensure_booted_state, ensure_image

        self.cluster_env = {"GS_CLUSTER_PORT": str(_free_port_block())}
        self.cluster_sh("start")
        for line in self.cluster_sh("env").stdout.splitlines():
            key, _, value = line.partition("=")
            self.cluster_env[key] = value
        start = time.monotonic()
        built = node_images.build(hf_endpoint=f"http://{GUEST_IP}:{HUB_GUEST_PORT}")
        self.report["figures"]["realNodeImagesSeconds"] = round(time.monotonic() - start, 1)
        image = ensure_image()
        disks = (*DEFAULT_DISKS, (BUNDLE_DISK, 1))
        vm = Vm(self.tmp / "node-vm", disks, image=image, memory_mib=VM_MEMORY_MIB, cpus=VM_CPUS, boot_timeout=600,
                booted=ensure_booted_state(image, memory_mib=VM_MEMORY_MIB, cpus=VM_CPUS))
        # The picker checks' images ride on the same disk: copied over ssh under TCG they took tens of seconds.
        start = time.monotonic()
        self.picker_images = node_images.build_picker()
        self.report["figures"]["pickerImagesSeconds"] = round(time.monotonic() - start, 1)
        make_bundle(vm.disk_path(BUNDLE_DISK), Path(self.cluster_env["GS_CLUSTER_BIN"]), built.archive,
                    extra={PICKER_ARCHIVE: self.picker_images.archive})
        self.vm = vm
        start = time.monotonic()
        vm.start()
        self.report["figures"]["realNodeVmSeconds"] = round(time.monotonic() - start, 1)
        self.raw = self.node_raw(vm.port, built.pinned(SMOKE_IMAGE))
        self.secrets = self.secret_values(self.raw, vm.key_path.read_text())
        repo = Repo(self.raw["models"][0]["huggingFaceId"], WEIGHTS, hashlib.sha1(b"real-node").hexdigest(),
                    token=self.secrets["hfToken"])
        # The CDN under the bridge's address: another host name for the client, as the hub's CDN is.
        self.hub = Hub([repo], 0, f"http://{POD_GATEWAY}:{HUB_GUEST_PORT}").__enter__()
        self.node = RealNode(vm, NODE, self.cluster_dir, int(self.cluster_env["GS_CLUSTER_PORT"]), list(built.digests),
                             self.tmp / "node", self.hub.server.server_address[1], kubelet_port=_free_port_block(1))
        self.node.join(self.kubectl)
        self.report["figures"]["realNodeJoin"] = self.node.timings
        self.new_stack("node", self.raw, self.secrets)

    def stop(self) -> None:
        for tunnel in self.tunnels:
            tunnel.terminate()
        if self.node is not None:
            self.node.stop_forwards()
        if self.hub is not None:
            self.hub.__exit__(None, None, None)
        if self.cluster_env.get("KUBECONFIG"):
            self.cluster_sh("stop", check=False)
        if self.vm is not None:
            self.vm.stop()

    # ---- tools ------------------------------------------------------------------------------

    def pod(self) -> dict[str, Any]:
        selector = f"app.kubernetes.io/instance={MODEL},app.kubernetes.io/component=inference-server"
        pods = [p for p in self.get("pods", "-n", NAMESPACE, "-l", selector)["items"] if not p["metadata"].get("deletionTimestamp")]
        require(len(pods) == 1, f"{len(pods)} serving pods: {[p['metadata']['name'] for p in pods]}")
        return pods[0]

    def tunnel(self, target: str, vm: Any = None) -> int:
        """A host port on 127.0.0.1 that the guest's sshd connects through to `target` (host:port as
        the guest sees it: a ClusterIP goes through kube-proxy's rules like a pod's connection)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = ssh_forward(vm or self.vm, ["-L", f"127.0.0.1:{port}:{target}"])
        self.tunnels.append(proc)
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return port
            require(proc.poll() is None, f"ssh -L {target} exited {proc.returncode}")
            time.sleep(0.2)
        raise CheckError(f"ssh -L {target} did not listen in 20 s")

    def port_forward(self, pod: str) -> int:
        """`kubectl port-forward` to the pod's 8000: through the API server, the forwarded kubelet port and the CRI."""
        argv = [f"{self.cluster_env['GS_CLUSTER_BIN']}/kubectl", "port-forward", "-n", NAMESPACE, f"pod/{pod}", ":8000"]
        proc = subprocess.Popen(argv, env={**self.env, "KUBECONFIG": self.cluster_env["KUBECONFIG"]}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.tunnels.append(proc)
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"127\.0\.0\.1:(\d+) ->", line)
        if match is None:
            error = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
            raise CheckError(f"kubectl port-forward printed {line!r}: {error}")
        return int(match.group(1))

    def service_port(self, vm: Any = None) -> int:
        """A host port reaching the model's Service through `vm`'s sshd and kube-proxy (default: the first node)."""
        service = self.get("service", DEPLOYMENT, "-n", NAMESPACE)
        return self.tunnel(f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}", vm)

    # ---- checks -----------------------------------------------------------------------------

    def real_node_ready(self) -> str:
        self.start()
        self.timed("upRealNodeSeconds", "up", "--yes", "--skip-preview", stack="node", timeout=1800)
        node = self.get("node", NODE)
        labels, taints, info = node["metadata"].get("labels", {}), node["spec"].get("taints", []), node["status"]["nodeInfo"]
        require(labels.get("gpu-serving/gpu.product") == PRODUCT, f"labels {labels}")
        require({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in taints, f"taints {taints}")
        require(node["status"]["allocatable"].get("nvidia.com/gpu") == "1", f"allocatable {node['status']['allocatable']}")
        server = json.loads(self.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
        require(info["kubeletVersion"] == server, f"kubelet {info['kubeletVersion']}, API server {server}")
        require(info["containerRuntimeVersion"].startswith("containerd://2."), f"runtime {info['containerRuntimeVersion']}")
        smoke = self.smoke_jobs_complete()
        return (f"{NODE}: kubelet {info['kubeletVersion']}, {info['containerRuntimeVersion']}, Ready, labelled and tainted by the "
                f"stack, nvidia.com/gpu 1 (patched: no device plugin); {smoke}; join {self.node.timings if self.node else {}}")

    def smoke_jobs_complete(self) -> str:
        """Every smoke-test Job complete, its pod run here: the Service's name resolved (the DNS stand-in) and
        reached through kube-proxy, the smoke image's curl answered by the server with the key."""
        jobs = [j for j in self.get("jobs", "-n", NAMESPACE)["items"] if "-smoke-" in j["metadata"]["name"]]
        require(jobs, "no smoke-test Job")
        for job in jobs:
            done = any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"].get("conditions", []))
            require(done, f"{job['metadata']['name']} is not complete: {job['status']}")
        return f"smoke Job {', '.join(j['metadata']['name'] for j in jobs)} complete"

    def real_pvc_mounted(self) -> str:
        pod = self.pod()
        require(pod["spec"].get("nodeName") == NODE, f"the serving pod runs on {pod['spec'].get('nodeName')}")
        volume = self.get("pv", f"{NAMESPACE}-models")
        local = volume["spec"]["local"]["path"]
        # What the container sees at /models, from inside its mount namespace: the kubelet's bind
        # mount of the PV's path, which is the node steps' XFS on the md array.
        pid = self.vm_sh("pgrep -f -o 'vllm_sim.py'")
        inside = self.vm_sh(f"findmnt -N {pid} -n -o SOURCE,FSTYPE /models")
        array = self.vm_sh(f"findmnt -n -o SOURCE,FSTYPE {local}")
        require(inside.split()[-1] == "xfs" and inside.split()[0].startswith(array.split()[0]),
                f"/models in the container is {inside!r}; {local} on the node is {array!r}")
        served = self.models(self.service_port())["data"][0]
        want = weights_sha256(WEIGHTS)
        require(served.get("weights_sha256") == want, f"/v1/models reports weights {served.get('weights_sha256')}, the hub served {want}")
        logs = self.kubectl("logs", pod["metadata"]["name"], "-n", NAMESPACE).stdout
        require(f"weights sha256 {want}" in logs, f"`kubectl logs` (API server to kubelet) lacks the load line: {tail(logs)}")
        return (f"PV path {local} = the array's mount ({array}); in the container /models is {inside}; the server read the "
                f"files the download Job wrote (weights sha256 {want[:12]}… in /v1/models and in `kubectl logs`)")

    def models(self, port: int) -> dict[str, Any]:
        status, body = self.request(port, "GET", "/v1/models", key=self.secrets["vllmApiKey"])
        require(status == 200, f"/v1/models answered {status}: {body[:200]!r}")
        return json.loads(body)

    def request(self, port: int, method: str, path: str, *, key: str | None = None, body: Any = None,
                timeout: float = 60) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()

    def real_request(self) -> str:
        port = self.service_port()
        key = self.secrets["vllmApiKey"]
        ask = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": True, "max_tokens": 16}
        status, body = self.request(port, "POST", "/v1/chat/completions", key=key, body=ask)
        chunks = [line[len(b"data: "):] for line in body.splitlines() if line.startswith(b"data: ")]
        require(status == 200 and chunks and chunks[-1] == b"[DONE]", f"streamed completion: {status}, {body[-200:]!r}")
        words = [json.loads(c)["choices"][0]["delta"].get("content", "") for c in chunks[:-1]]
        refused, _ = self.request(port, "POST", "/v1/chat/completions", body=ask)
        require(refused == 401, f"without the API key /v1 answered {refused}")
        forwarded = self.port_forward(self.pod()["metadata"]["name"])
        health, _ = self.request(forwarded, "GET", "/health")
        require(health == 200, f"/health through `kubectl port-forward` answered {health}")
        metrics_status, metrics = self.request(port, "GET", "/metrics")
        require(metrics_status == 200 and b"vllm:num_requests_waiting" in metrics, f"/metrics answered {metrics_status}")
        return (f"through the Service's ClusterIP (kube-proxy, nftables): a streamed chat completion of {len(chunks) - 1} chunks "
                f"({''.join(words)[:40]!r}…) ending [DONE]; 401 without the key; /health by `kubectl port-forward`; /metrics open (the "
                "NetworkPolicy that limits it to Prometheus is not enforced by the bridge CNI: the policy pack checks it)")

    def ready_pod(self, timeout: float = 180) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            with contextlib.suppress(CheckError):
                pod = self.pod()
                if self.is_ready(pod):
                    return pod
            return None
        return self.wait_for("a Ready serving pod", probe, timeout)

    def real_probes(self) -> str:
        pod = self.ready_pod()
        status = pod["status"]["containerStatuses"][0]
        started = _time(status["state"]["running"]["startedAt"])
        ready = _time(next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"])
        # The API keeps whole seconds: the pod became Ready no earlier than the pretended load allows.
        require((ready - started).total_seconds() >= STARTUP_SECONDS - 1,
                f"Ready {ready - started} after the container started, before the {STARTUP_SECONDS} s load ended")
        require(status["restartCount"] == 0, f"the server restarted {status['restartCount']} times while loading")
        # Readiness: a server that stops answering leaves the Service (three 10 s periods), and comes back.
        pid = self.vm_sh("pgrep -f -o 'vllm_sim.py'")
        self.vm_sh(f"kill -STOP {pid}")
        try:
            start = time.monotonic()
            self.wait_for("the stopped server's pod to turn NotReady", lambda: not self.is_ready(self.pod()), 90)
            unready_after = time.monotonic() - start
            endpoints = self.endpoints()
            require(endpoints == [], f"the Service still has ready endpoints {endpoints} for a NotReady pod")
        finally:
            self.vm_sh(f"kill -CONT {pid}")
        self.wait_for("the pod to turn Ready again", lambda: self.is_ready(self.pod()), 90)
        after = self.pod()["status"]["containerStatuses"][0]
        require(after["restartCount"] == 0, "the liveness probe restarted the server during a 30 s pause (it allows 90 s)")
        return (f"Ready {int((ready - started).total_seconds())} s after start (startup probe held it back through a "
                f"{STARTUP_SECONDS} s load); paused (SIGSTOP): NotReady after {unready_after:.0f} s and out of the Service's "
                "endpoints, back after SIGCONT, no restart (liveness allows 90 s)")

    @staticmethod
    def is_ready(pod: dict[str, Any]) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))

    def endpoints(self) -> list[str]:
        slices = self.get("endpointslices", "-n", NAMESPACE, "-l", f"kubernetes.io/service-name={DEPLOYMENT}")["items"]
        return [address for s in slices for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready")
                for address in e["addresses"]]

    def real_drain(self) -> str:
        pod = self.ready_pod()
        name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
        port = self.service_port()
        result: dict[str, Any] = {}

        def stream() -> None:
            # ignore_eos (a vLLM extension): the whole max_tokens, a stream that outlives preStop and SIGTERM.
            ask = {"model": MODEL, "messages": [{"role": "user", "content": "a long answer"}], "stream": True, "max_tokens": 3000,
                   "ignore_eos": True}
            try:
                result["status"], result["body"] = self.request(port, "POST", "/v1/chat/completions", key=self.secrets["vllmApiKey"],
                                                                body=ask, timeout=180)
            except Exception as exc:  # reported by the check below
                result["error"] = repr(exc)
            result["ended"] = time.monotonic()

        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        time.sleep(3)
        deleted = time.monotonic()
        self.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=false")
        refused = None
        while thread.is_alive() and time.monotonic() - deleted < 120:
            if self.vm.ssh(f"timeout 2 bash -c '</dev/tcp/{ip}/8000'", check=False).returncode != 0:
                refused = time.monotonic() - deleted
                break
            time.sleep(0.5)
        thread.join(180)
        body = result.get("body", b"")
        require(result.get("status") == 200 and body.rstrip().endswith(b"data: [DONE]"),
                f"the stream running at the deletion did not complete: {result.get('error') or body[-200:]!r}")
        require(refused is not None, "the deleted pod kept taking new connections until the stream ended")
        require(refused >= PRESTOP_S - 1, f"new connections refused {refused:.0f} s after the deletion, before preStop's {PRESTOP_S} s")
        ended = result["ended"] - deleted
        require(ended > refused, f"the stream ended {ended:.0f} s after the deletion, before the server stopped listening")
        self.ready_pod()
        return (f"deleted mid-stream: preStop held SIGTERM {PRESTOP_S} s, then new connections were refused ({refused:.0f} s), "
                f"the running stream completed ({ended:.0f} s, [DONE]); the Deployment's next pod is Ready")

    def real_nonroot(self) -> str:
        self.edit_stack("node", lambda config: config["gpu-serving:models"][0].__setitem__("securityProfile", "nonRoot"))
        self.timed("upRealNonRootSeconds", "up", "--yes", "--skip-preview", stack="node", timeout=1800)
        pod = self.ready_pod()
        require(pod["spec"]["securityContext"].get("runAsUser") == NON_ROOT_UID, f"pod securityContext {pod['spec']['securityContext']}")
        pid = self.vm_sh("pgrep -f -n 'vllm_sim.py'")
        uid = self.vm_sh(f"awk '/^Uid:/{{print $2}}' /proc/{pid}/status")
        require(uid == str(NON_ROOT_UID), f"the server runs as uid {uid}")
        name = pod["metadata"]["name"]
        exec_uid = self.kubectl("exec", name, "-n", NAMESPACE, "--", "id", "-u").stdout.strip()
        require(exec_uid == str(NON_ROOT_UID), f"`kubectl exec id -u` says {exec_uid}")
        write = self.kubectl("exec", name, "-n", NAMESPACE, "--", "/bin/sh", "-c", "echo x > /gs-probe", check=False)
        require(write.returncode != 0 and "Read-only" in write.stderr, f"writing / in the container: {write.returncode} {write.stderr!r}")
        # It started, so it wrote what vllm_sim writes where vLLM does (its lock in the download dir, the
        # compile caches on the volume, HOME and /tmp); and it answers.
        served = self.models(self.service_port())["data"][0]
        owner = self.vm_sh("stat -c '%u:%g %a' /mnt/models/hub")
        refused = write.stderr.strip().splitlines()[0][:60]
        return (f"uid {uid} (`kubectl exec id -u` too) with a read-only root ({refused}), serving {served['id']}; "
                f"the volume's download dir is {owner} (fsGroup {NON_ROOT_UID}, OnRootMismatch)")

    def streaming(self, port: int, stop: threading.Event, results: list[tuple[int, bytes]]) -> threading.Thread:
        """Streams one after the other (10 s each) until `stop`: the pod is serving throughout."""
        def loop() -> None:
            ask = {"model": MODEL, "messages": [{"role": "user", "content": "keep talking"}], "stream": True, "max_tokens": 1000,
                   "ignore_eos": True}
            while not stop.is_set():
                try:
                    results.append(self.request(port, "POST", "/v1/chat/completions", key=self.secrets["vllmApiKey"], body=ask,
                                                timeout=120))
                except Exception as exc:  # reported by the check
                    results.append((0, repr(exc).encode()))
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def real_live_rerun(self) -> str:
        before = self.ready_pod()
        pid = self.vm_sh("pgrep -f -n 'vllm_sim.py'")
        mount = self.vm_sh(f"findmnt -N {pid} -n -o SOURCE,FSTYPE /models")
        state = json.loads(self.pulumi("stack", "export", "--show-secrets", stack="node").stdout)
        steps = {r["urn"].rsplit("::", 1)[-1]: r["inputs"]["create"] for r in state["deployment"]["resources"]
                 if r["type"] == "command:remote:Command" and r["urn"].rsplit("::", 1)[-1].startswith(f"{NODE}:")}
        require(len(steps) >= 7, f"node steps in the state: {sorted(steps)}")
        stop, results = threading.Event(), []
        thread = self.streaming(self.service_port(), stop, results)
        try:
            time.sleep(2)
            # Every step again as the engine sent it (parameters unchanged), in order, over SSH.
            for name in sorted(steps):
                self.vm.ssh(steps[name], timeout=900)
            # A release that changes only a comment of lib.sh: the engine re-runs every step.
            lib = self.project / "components" / "node" / "scripts" / "lib.sh"
            shebang, strict, rest = lib.read_text().split("\n", 2)  # the program requires these two lines first
            lib.write_text(f"{shebang}\n{strict}\n# real-live-rerun: a release changed this comment\n{rest}")
            self.pulumi("up", "--yes", "--skip-preview", stack="node", timeout=1800)
            updated = self.last_update_changes("node").get("update", 0)
        finally:
            stop.set()
            thread.join(180)
        failed = [body[-120:] for status, body in results if status != 200 or not body.rstrip().endswith(b"data: [DONE]")]
        require(results and not failed, f"{len(failed)} of {len(results)} streams did not complete: {failed[:2]}")
        require(updated >= len(steps), f"the lib.sh change updated {updated} resources, fewer than the {len(steps)} node steps")
        after = self.pod()
        restarts = after["status"]["containerStatuses"][0]["restartCount"]
        require(after["metadata"]["uid"] == before["metadata"]["uid"] and restarts == 0,
                f"the pod was replaced or restarted (uid {before['metadata']['uid']} -> {after['metadata']['uid']}, restarts {restarts})")
        still = self.vm_sh(f"findmnt -N {pid} -n -o SOURCE,FSTYPE /models")
        require(still == mount, f"/models in the container was {mount!r}, is {still!r}")
        return (f"{len(steps)} node steps re-run over SSH as the engine sent them, then all of them updated by `pulumi up` "
                f"after a lib.sh comment change, while {len(results)} streams ran back to back: all completed, same pod, "
                f"no restart, /models still {mount}")
