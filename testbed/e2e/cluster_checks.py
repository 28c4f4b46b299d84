"""Checks 10–20: the program against a real Kubernetes control plane on loopback (testbed/cluster),
its GPU nodes simulated by kwok, the lab VM still the node the disk steps run on."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from testbed.e2e.engine_checks import GROWN_SIZE_GB, EndToEnd
from testbed.e2e.run import CheckError, require, stack_raw, tail
from tools.render import ROOT, RenderError, run_program

CLUSTER_SH = ROOT / "testbed" / "cluster" / "cluster.sh"
NAMESPACE = "ai-cluster"
# Two 2-GPU nodes of a product no stack uses, for the per-node fit demonstration.
FIT_NODES = ("fit-a", "fit-b")
FIT_PRODUCT = "e2e-fit"
# Two GPUs on the lab node of the cluster stack: room for a second model (add-model).
LAB_NODE_GPUS = 2
# A GPU node the cluster has from the start and the cluster stack takes in later (add-node).
ADDED_NODE = "lab-node-2"
# Shared cards for the shared-gpu-fit demonstration, each of a product of its own: one card
# time-sliced in two, and one A100 80GB in two MIG 3g.40gb instances (what the device plugin
# advertises for them: `nvidia.com/gpu.shared`, `nvidia.com/mig-3g.40gb`).
SHARED_NODE, SHARED_PRODUCT = "share-a", "e2e-share"
MIG_NODE, MIG_PRODUCT = "mig-a", "e2e-mig"


def _free_port_block(size: int = 6) -> int:
    """A port whose next `size` ports are free on 127.0.0.1 (the cluster takes six in a row), below the kernel's
    ephemeral range: a block inside it can lose a port to an outgoing connection between this probe and the
    bind (the API server's connections to etcd on the block's first port took its third, seen once)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    floor = 10000
    for _ in range(50):
        base = random.randrange(floor, max(floor + 1, low - size))
        try:
            for port in range(base, base + size):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise CheckError("no block of free ports on 127.0.0.1")


def _sequence(events: list[dict[str, Any]], kind: str, urn_suffix: str) -> int:
    """The sequence number of the first `kind` event of the resource whose URN ends with `urn_suffix`."""
    for event in events:
        body = event.get(kind)
        urn = (body or {}).get("metadata", {}).get("urn", "")
        if urn.endswith(urn_suffix):
            return int(event["sequence"])
    raise CheckError(f"no {kind} for *{urn_suffix} in the engine's event log")


def warnings(text: str) -> list[str]:
    """The prerequisite warnings of a preview's diagnostics (the progress lines repeat them)."""
    return sorted({line.strip() for line in text.splitlines() if line.strip().startswith("warning: cluster prerequisite:")})


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@dataclass
class ClusterEndToEnd(EndToEnd):
    """Checks 1–9, then 10–20 on the loopback cluster."""

    cluster_env: dict[str, str] = field(default_factory=dict)

    @property
    def cluster_dir(self) -> Path:
        return self.tmp / "cluster"

    @property
    def events(self) -> Path:
        """The engine's event log of the first `up` against the cluster (ordered by sequence)."""
        return self.tmp / "up-cluster-events.jsonl"

    # ---- tools ----------------------------------------------------------------------------

    def cluster_sh(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {"GS_CLUSTER_DIR": str(self.cluster_dir), **self.cluster_env}
        return self.logged(["bash", str(CLUSTER_SH), *args], shown=f"cluster.sh {' '.join(args)}", check=check,
                           timeout=timeout, env=env)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [f"{self.cluster_env['GS_CLUSTER_BIN']}/kubectl", *args]
        proc = subprocess.run(argv, env={**self.env, "KUBECONFIG": self.cluster_env["KUBECONFIG"]}, input=stdin,
                              capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise CheckError(f"kubectl {' '.join(args)}: {tail(proc.stderr)}")
        return proc

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def missing_from_cluster(self, objects: list[dict[str, Any]]) -> list[str]:
        """Kind/name of each of `objects` (as rendered) the API server does not have."""
        missing = []
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            kind = f"{obj['kind']}.{obj['apiVersion'].split('/')[0]}" if "/" in obj["apiVersion"] else obj["kind"]
            if self.kubectl("get", kind, obj["metadata"]["name"], *(["-n", namespace] if namespace else []), check=False).returncode:
                missing.append(f"{obj['kind']}/{obj['metadata']['name']}")
        return missing

    def pod_starts(self, namespace: str) -> dict[str, tuple[str, str]]:
        """Every pod of `namespace` that is not a Job's nor going away: (uid, startTime) by name, to tell a restart."""
        pods = self.get("pods", "-n", namespace)["items"]
        return {p["metadata"]["name"]: (p["metadata"]["uid"], p["status"].get("startTime", ""))
                for p in pods if not p["metadata"].get("labels", {}).get("job-name") and not p["metadata"].get("deletionTimestamp")}

    def wait_for(self, what: str, probe: Any, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise CheckError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(1)

    # ---- the stack on the cluster ---------------------------------------------------------

    def cluster_raw(self) -> dict[str, Any]:
        """The lab stack, its Kubernetes side on this cluster; the disk steps on the VM at the grown size."""
        raw = stack_raw("lab")
        raw["cluster"] = {**raw["cluster"], "namespace": NAMESPACE,
                          "kubeconfig": {"path": self.cluster_env["KUBECONFIG"]}}
        node = raw["nodes"][0]
        node["ssh"]["port"] = self.vm.port
        node["storage"]["sizeGb"] = GROWN_SIZE_GB  # the array on the VM already has this size: never shrink
        node["gpu"]["count"] = LAB_NODE_GPUS
        raw["models"][0]["apiKeySecret"] = "vllmApiKey"
        return raw

    # ---- checks ---------------------------------------------------------------------------

    def cluster_up(self) -> str:
        # What each node advertises, by resource after `nvidia.com/`.
        nodes = {"lab-node": {"gpu": LAB_NODE_GPUS}, ADDED_NODE: {"gpu": 1}, **{name: {"gpu": 2} for name in FIT_NODES},
                 SHARED_NODE: {"gpu.shared": 2}, MIG_NODE: {"mig-3g.40gb": 2}}
        self.cluster_env = {"GS_CLUSTER_PORT": str(_free_port_block())}
        start = time.monotonic()
        specs = {name: ",".join(f"{resource}={count}" for resource, count in gpus.items()) for name, gpus in nodes.items()}
        self.cluster_sh("start", *[arg for name, gpus in specs.items() for arg in ("--node", f"{name}:{gpus}:32:128Gi")])
        self.report["figures"]["clusterStartSeconds"] = round(time.monotonic() - start, 1)
        for line in self.cluster_sh("env").stdout.splitlines():
            key, _, value = line.partition("=")
            self.cluster_env[key] = value
        require(self.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok", "the API server is not ready")
        seen = {}
        wanted = {name: (True, {f"nvidia.com/{resource}": str(count) for resource, count in gpus.items()})
                  for name, gpus in nodes.items()}
        for item in self.get("nodes")["items"]:
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"].get("conditions", []))
            gpus = {k: v for k, v in item["status"]["capacity"].items() if k.startswith("nvidia.com/")}
            seen[item["metadata"]["name"]] = (ready, gpus)
        require(seen == wanted, f"nodes (Ready, GPU resources) are {seen}, expected {wanted}")
        version = self.kubectl("version", "-o", "json").stdout
        server = json.loads(version)["serverVersion"]["gitVersion"]
        self.report["engine"]["kube-apiserver"] = server
        return f"{server} on 127.0.0.1:{self.cluster_env['GS_CLUSTER_PORT']}; nodes Ready with GPUs {nodes}"

    def server_dry_run_all_stacks(self) -> str:
        rejected, total = [], 0
        stacks = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
        examples = {p.stem.removeprefix("Pulumi."): p for p in sorted((ROOT / "docs" / "examples").glob("*.yaml"))}
        renders: dict[str, Any] = {stack: lambda stack=stack: run_program(stack) for stack in stacks}
        renders |= {f"docs/examples/{path.name}": lambda name=name, path=path: run_program(name, stack_file=path)
                    for name, path in examples.items()}
        # What no stack file uses: the Gateway API edge (an HTTPRoute) with the non-root profile on prod, and
        # in front of a model held at zero (the route to the add-on's interceptor under a ReferenceGrant).
        raw = stack_raw("prod")
        # As a Gateway edge must be set: no cert-manager issuer (the listener holds the certificate), the data
        # plane's pods admitted instead of ingress-nginx's (stacks/config/checks/edge.py refuses both left over).
        gateway = {"edge": "gateway", "gateway": {"name": "public", "namespace": "gateway-system"},
                   "network": {"ingressNamespace": "gateway-system", "ingressPodLabels": {"app": "gateway"}}}
        raw["cluster"] = {k: v for k, v in raw["cluster"].items() if k != "clusterIssuer"}
        variant = {"gpu-serving:cluster": json.dumps({**raw["cluster"], **gateway}),
                   "gpu-serving:models": json.dumps([{**m, "securityProfile": "nonRoot",
                                                      "ingress": {k: v for k, v in m["ingress"].items() if k != "tlsSecret"}}
                                                     for m in raw["models"]])}
        renders["prod+gateway+nonRoot"] = lambda: run_program("prod", overrides=variant)
        held_path = examples["scale-to-zero"]
        held = yaml.safe_load(held_path.read_text())["config"]
        held_cluster = {k: v for k, v in held["gpu-serving:cluster"].items() if k != "clusterIssuer"}
        held_variant = {"gpu-serving:cluster": json.dumps({**held_cluster, **gateway}),
                        "gpu-serving:models": json.dumps([{**m, "ingress": {k: v for k, v in m["ingress"].items() if k != "tlsSecret"}}
                                                          for m in held["gpu-serving:models"]])}
        renders["scale-to-zero+gateway"] = lambda: run_program("scale-to-zero", overrides=held_variant, stack_file=held_path)
        # A model held at zero behind the teams' endpoint: its hold's Backend, AIServiceBackend and key policy.
        endpoint = yaml.safe_load(examples["endpoint"].read_text())["config"]
        endpoint["gpu-serving:cluster"]["requestHold"] = {}
        endpoint["gpu-serving:models"][2].update(replicas={"min": 0, "max": 1}, apiKeySecret="embedApiKey")
        endpoint_variant = {key: json.dumps(endpoint[key]) for key in ("gpu-serving:cluster", "gpu-serving:models")}
        renders["endpoint+held"] = lambda: run_program("endpoint", overrides=endpoint_variant, stack_file=examples["endpoint"],
                                                       secret_values={"embedApiKey": "k-embed-dry-run"})
        must_have = {"prod+gateway+nonRoot": "HTTPRoute", "scale-to-zero+gateway": "ReferenceGrant",
                     "endpoint+held": "BackendSecurityPolicy",
                     "docs/examples/Pulumi.sharing.yaml": "ConfigMap", "fewgpus": "InterceptorRoute",
                     "docs/examples/Pulumi.endpoint.yaml": "AIGatewayRoute"}
        for label, render in renders.items():
            try:
                objects = render().kubernetes_objects()
            except RenderError as exc:
                raise CheckError(f"render {label}: {exc}") from None
            if label in must_have:
                require(any(o["kind"] == must_have[label] for o in objects), f"{label} renders no {must_have[label]}")
            namespaces = {o["metadata"].get("namespace") for o in objects} - {None}
            for namespace in sorted(namespaces):
                # Server-side dry runs create nothing, so an object's namespace must exist for real.
                if self.kubectl("get", "namespace", namespace, check=False).returncode != 0:
                    self.kubectl("create", "namespace", namespace)
            for obj in objects:
                total += 1
                proc = self.kubectl("apply", "--dry-run=server", "--server-side", "--field-manager=e2e", "-f", "-",
                                    stdin=yaml.safe_dump(obj), check=False)
                if proc.returncode != 0:
                    rejected.append(f"{label} {obj['kind']}/{obj['metadata']['name']}: {tail(proc.stderr, 2)}")
        self.report["figures"]["serverRejectedObjects"] = len(rejected)
        require(not rejected, f"{len(rejected)} of {total} objects rejected: {rejected[:3]}")
        return f"{total} objects of {', '.join(renders)} accepted by the API server (dry run)"

    def up_cluster(self) -> str:
        raw = self.cluster_raw()
        self.new_stack("cluster", raw, self.secret_values(raw, self.vm.key_path.read_text()))
        self.timed("upClusterSeconds", "up", "--yes", "--skip-preview", "--event-log", str(self.events), stack="cluster",
                   timeout=1800, env={"PULUMI_DEBUG_COMMANDS": "true"})  # the CLI offers --event-log only then
        declared = self.offline_render("cluster").kubernetes_objects()
        missing = self.missing_from_cluster(declared)
        require(not missing, f"declared but not in the cluster: {missing}")
        kinds = sorted({o["kind"] for o in declared})
        return f"every declared object is in the cluster, awaited: {len(declared)} ({', '.join(kinds)})"

    def servers_scraped(self, namespace: str = NAMESPACE) -> str:
        """The namespace's one PodMonitor selects every model's serving pods, as a PodMonitor per model selected each
        (its Deployment's selector), and no other pod. The API server evaluates the selector: the Prometheus Operator
        makes the same label match of it, but neither the operator nor a Prometheus runs here, so what a scrape reads
        is not shown (tests/test_serving_monitoring.py runs the queries on promtool)."""
        monitors = self.get("podmonitors.monitoring.coreos.com", "-n", namespace)["items"]
        names = [m["metadata"]["name"] for m in monitors]
        require(names == ["gpu-serving-servers"], f"PodMonitors in {namespace}: {names}, expected the one gpu-serving-servers")

        def pods(match: dict[str, str]) -> set[str]:
            selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
            return {p["metadata"]["name"] for p in self.get("pods", "-n", namespace, "-l", selector)["items"]
                    if not p["metadata"].get("deletionTimestamp")}

        selected = pods(monitors[0]["spec"]["selector"]["matchLabels"])
        models = [d for d in self.get("deployments", "-n", namespace)["items"]
                  if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "inference-server"]
        serving = set().union(*(pods(d["spec"]["selector"]["matchLabels"]) for d in models))
        require(models and serving, f"no serving pod in {namespace} ({len(models)} model Deployments)")
        require(selected == serving, f"selected {sorted(selected)}, the models' serving pods are {sorted(serving)}")
        port = monitors[0]["spec"]["podMetricsEndpoints"][0]["port"]
        everyone = self.get("pods", "-n", namespace)["items"]
        unnamed = [p["metadata"]["name"] for p in everyone if p["metadata"]["name"] in selected
                   and port not in {q.get("name") for c in p["spec"]["containers"] for q in c.get("ports", [])}]
        require(not unnamed, f"selected pods without a container port named {port}: {unnamed}")
        others = sorted({p["metadata"].get("labels", {}).get("app.kubernetes.io/component", "?") for p in everyone
                         if p["metadata"]["name"] not in selected})
        return (f"{namespace}: one PodMonitor selects the {len(serving)} serving pods of {len(models)} models (each Deployment's "
                f"selector), port {port} named on each; not the namespace's other pods ({', '.join(others) or 'none'})")

    def nodes_patched(self) -> str:
        node = self.get("node", "lab-node")
        labels, taints = node["metadata"].get("labels", {}), node["spec"].get("taints", [])
        want = {"gpu-serving/gpu.product": "nvidia-t4", "nvidia.com/gpu.present": "true", "gpu-serving/gpu.count": str(LAB_NODE_GPUS)}
        require(all(labels.get(k) == v for k, v in want.items()), f"labels {labels}, expected {want}")
        require({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in taints, f"taints {taints}")
        state = json.loads(self.pulumi("stack", "export", stack="cluster").stdout)
        require(any(r["type"] == "kubernetes:core/v1:NodePatch" for r in state["deployment"]["resources"]), "no NodePatch in the state")
        preview = json.loads(self.pulumi("preview", "--json", stack="cluster").stdout)
        changed = [f"{s['op']} {s['urn']}" for s in preview.get("steps", []) if "NodePatch" in s["urn"] and s["op"] != "same"]
        require(not changed, f"a second up would change the NodePatch: {changed}")
        return "labels and taint on lab-node; the next up leaves the NodePatch unchanged"

    def pvc_bound(self) -> str:
        claim = self.get("pvc", "models", "-n", NAMESPACE)
        volume = claim["spec"].get("volumeName")
        require(claim["status"].get("phase") == "Bound", f"claim is {claim['status'].get('phase')}")
        require(volume == f"{NAMESPACE}-models", f"claim bound to {volume!r}")
        return f"claim {NAMESPACE}/models Bound to {volume}"

    def download_before_deployment(self) -> str:
        jobs = [j for j in self.get("jobs", "-n", NAMESPACE)["items"] if "-dl-" in j["metadata"]["name"]]
        require(jobs, "no download Job")
        deployment = self.get("deployment", "vllm-qwen25-05b", "-n", NAMESPACE)
        created = _time(deployment["metadata"]["creationTimestamp"])
        for job in jobs:
            done = job["status"].get("completionTime")
            require(done is not None, f"{job['metadata']['name']} never completed")
            require(_time(done) <= created, f"{job['metadata']['name']} completed {done}, after the Deployment was created {created}")
        # Kubernetes keeps whole seconds; the engine's event log orders the two exactly: the Job's
        # outputs (after its await saw it complete) come before the Deployment's create starts.
        events = [json.loads(line) for line in self.events.read_text().splitlines() if line.strip()]
        job_done = _sequence(events, "resOutputsEvent", "::qwen25-05b-download")
        deployment_start = _sequence(events, "resourcePreEvent", "::qwen25-05b-deployment")
        require(job_done < deployment_start,
                f"the Deployment's create began (event {deployment_start}) before the Job finished ({job_done})")
        return (f"{jobs[0]['metadata']['name']} completed {jobs[0]['status']['completionTime']}, Deployment created "
                f"{deployment['metadata']['creationTimestamp']}; engine events: Job done #{job_done}, Deployment begun #{deployment_start}")

    def namespace_first(self) -> str:
        # The model objects take the namespace from the Namespace's output: the engine must have
        # finished the Namespace before it starts any of them.
        events = [json.loads(line) for line in self.events.read_text().splitlines() if line.strip()]
        namespace_done = _sequence(events, "resOutputsEvent", "kubernetes:core/v1:Namespace::cluster-namespace")
        kinds = ("core/v1:Secret", "batch/v1:Job", "apps/v1:Deployment", "core/v1:PersistentVolumeClaim", "core/v1:Service")
        starts = {}
        for event in events:
            urn = (event.get("resourcePreEvent") or {}).get("metadata", {}).get("urn", "")
            if any(f"kubernetes:{kind}::" in urn for kind in kinds) and urn not in starts:
                starts[urn] = int(event["sequence"])
        require(starts, "no namespaced object in the event log")
        early = sorted(urn.rsplit("::", 1)[1] for urn, sequence in starts.items() if sequence < namespace_done)
        require(not early, f"begun before the Namespace was done (event {namespace_done}): {early}")
        return f"Namespace done at event #{namespace_done}; {len(starts)} namespaced objects begun after it (first #{min(starts.values())})"

    def preview_prerequisites(self) -> str:
        # The prod stack's Kubernetes side against this bare cluster: no ingress controller, cert-manager
        # or prometheus-adapter. The preview must say what to install; once they exist, it must not.
        raw = stack_raw("prod")
        # The HPA path (prod uses KEDA, whose CRD this cluster has), with an adapter namespace of its own:
        # server-dry-run-all-stacks created `monitoring` for real.
        raw["cluster"] = {**raw["cluster"], "namespace": "prereq", "kubeconfig": {"path": self.cluster_env["KUBECONFIG"]},
                          "autoscaling": "hpa", "prometheusAdapter": {"namespace": "prereq-monitoring"}}
        raw["nodes"][0]["name"] = FIT_NODES[0]  # a node this cluster has, for the NodePatch's dry run
        if raw["modelStorage"].get("type") == "local":
            raw["modelStorage"]["node"] = FIT_NODES[0]
        self.new_stack("prereq", raw, self.secret_values(raw, self.canaries["sshPrivateKey"]))
        first = self.pulumi("preview", stack="prereq", check=False)
        text = first.stdout + first.stderr
        found = warnings(text)
        wanted = ("no IngressClass nginx", "cert-manager is not installed", "namespace prereq-monitoring does not exist",
                  "no custom metrics API")
        require(all(any(w in line for line in found) for w in wanted), f"expected warnings for {wanted}, got {found}")
        self.kubectl("create", "namespace", "prereq-monitoring")
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(
            {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "nginx"},
             "spec": {"controller": "k8s.io/ingress-nginx"}}))
        second = self.pulumi("preview", stack="prereq", check=False)
        after = warnings(second.stdout + second.stderr)
        require(not [line for line in after if "IngressClass" in line or "namespace prereq-monitoring" in line],
                f"still warned after installing them: {after}")
        require(len(after) == len(found) - 2, f"expected {len(found) - 2} warnings left, got {after}")
        return (f"{len(found)} warnings on the bare cluster ({'; '.join(wanted)}), {len(after)} after adding the namespace and "
                f"IngressClass (preview exits {first.returncode}, {second.returncode})")

    def deployment_available(self) -> str:
        deployment = self.get("deployment", "vllm-qwen25-05b", "-n", NAMESPACE)
        available = [c for c in deployment["status"].get("conditions", []) if c["type"] == "Available"]
        require(available and available[0]["status"] == "True", f"Deployment not Available: {deployment['status']}")
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        pods = self.get("pods", "-n", NAMESPACE, "-l", selector)["items"]
        require(pods, "no pods")
        for pod in pods:
            node = self.get("node", pod["spec"]["nodeName"])
            require(node["metadata"]["labels"].get("nvidia.com/gpu.present") == "true", f"{pod['metadata']['name']} on a non-GPU node")
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            require(limits.get("nvidia.com/gpu") == "1", f"GPU limit {limits}")
        return f"Available; {len(pods)} pod(s) on {', '.join(sorted({p['spec']['nodeName'] for p in pods}))} with 1 GPU each"

    def smoke_job_complete(self) -> str:
        jobs = [j for j in self.get("jobs", "-n", NAMESPACE)["items"] if "-smoke-" in j["metadata"]["name"]]
        require(jobs, "no smoke-test Job")
        for job in jobs:
            complete = [c for c in job["status"].get("conditions", []) if c["type"] == "Complete" and c["status"] == "True"]
            require(complete, f"{job['metadata']['name']} is not complete: {job['status']}")
        return f"{', '.join(j['metadata']['name'] for j in jobs)} complete (simulated pods: the wiring, not vLLM)"

    def per_node_fit(self) -> str:
        # 1. The program refuses it at load, through the real engine.
        raw = stack_raw("prod")
        raw["cluster"] = {"namespace": "fit", "renderYamlTo": str(self.tmp / "yaml-fit"), "autoscaling": "none"}
        node = raw["nodes"][0]
        # Each node its own disks: one disk under two nodes is refused at load, before the fit.
        raw["nodes"] = [{**node, "name": name, "ssh": {"host": name}, "gpu": {"product": FIT_PRODUCT, "count": 2},
                         "storage": {**node["storage"], "disks": [f"/dev/disk/by-id/virtio-{name}-{side}" for side in "ab"]}}
                        for name in FIT_NODES]
        raw["modelStorage"] = {"type": "nfs", "server": "nas", "path": "/models", "sizeGi": 100}
        model = {k: v for k, v in raw["models"][0].items() if k != "ingress"}
        raw["models"] = [{**model, "name": "small", "gpuProduct": FIT_PRODUCT, "gpusPerReplica": 1, "replicas": {"min": 2, "max": 2}},
                         {**model, "name": "large", "gpuProduct": FIT_PRODUCT, "gpusPerReplica": 2, "replicas": {"min": 1, "max": 1}}]
        self.new_stack("fit", raw, {"sshPrivateKey": "unused", "sshHostKeyWorker02": "unused"})
        proc = self.pulumi("preview", stack="fit", check=False)
        text = proc.stdout + proc.stderr
        refusal = next((line.strip() for line in text.splitlines() if "models[1].gpusPerReplica" in line), None)
        require(proc.returncode != 0 and refusal is not None, f"the preview was not refused naming models[1].gpusPerReplica: {tail(text)}")
        # 2. Without the refusal, the scheduler does strand the large pod: the same pods as plain Deployments.
        for name in FIT_NODES:
            self.kubectl("label", "--overwrite", "node", name, f"gpu-serving/gpu.product={FIT_PRODUCT}")
        self.kubectl("create", "namespace", "fit")
        self.kubectl("apply", "-f", "-", stdin=_fit_deployment("small", gpus=1, replicas=2))
        self.wait_for("both 1-GPU pods scheduled", lambda: self._scheduled_nodes("small", 2))
        self.kubectl("apply", "-f", "-", stdin=_fit_deployment("large", gpus=2, replicas=1))
        small = self._scheduled_nodes("small", 2)
        if len(set(small)) == 1:
            raise CheckError(f"the scheduler put both 1-GPU pods on {small[0]}: no stranding to show this run")
        reason = self.wait_for("the 2-GPU pod's FailedScheduling event", lambda: self._failed_scheduling("large"), timeout=60)
        self.kubectl("delete", "namespace", "fit", "--wait=false")
        return f"refused at load ({refusal[:120]}…); without it: 1-GPU pods on {', '.join(sorted(small))}, the 2-GPU pod Pending: {reason}"

    def shared_gpu_fit(self) -> str:
        """The load checks of shared cards through the real engine, then what the scheduler does without them."""
        raw = stack_raw("fewgpus")
        raw["cluster"] = {**raw["cluster"], "namespace": "sharefit", "renderYamlTo": str(self.tmp / "yaml-sharefit"),
                          "autoscaling": "none"}
        raw["cluster"].pop("kubeconfig", None)
        raw["cluster"].pop("requestHold", None)
        shared = {**raw["nodes"][0], "name": SHARED_NODE, "gpu": {"product": SHARED_PRODUCT, "count": 1,
                                                                  "sharing": {"timeSlicing": {"replicas": 2}}}}
        mig = {**raw["nodes"][1], "name": MIG_NODE, "gpu": {"product": MIG_PRODUCT, "count": 1,
                                                            "sharing": {"mig": {"card": "A100-80GB", "profiles": {"3g.40gb": 2}}}}}
        raw["nodes"] = [shared, mig]
        base = {k: v for k, v in raw["models"][0].items() if k not in ("replicas", "apiKeySecret")}
        models = {
            # Two pods at 0.6 of one card's memory: the scheduler puts both on the two slices of one card.
            "memory": [{**base, "name": "big-a", "gpuProduct": SHARED_PRODUCT, "gpuMemoryUtilization": 0.6},
                       {**base, "name": "big-b", "gpuProduct": SHARED_PRODUCT, "gpuMemoryUtilization": 0.6}],
            # Three pods for two MIG instances.
            "mig": [{**base, "name": "mig", "gpuProduct": MIG_PRODUCT, "gpuResource": "mig-3g.40gb",
                     "gpuMemoryUtilization": 0.9, "replicas": {"min": 3, "max": 3}}],
        }
        refusals = {}
        for case, key in (("memory", "models[0].gpuMemoryUtilization"), ("mig", "models:")):
            self.new_stack(f"sharefit-{case}", {**raw, "models": models[case]}, {"sshPrivateKey": "unused"})
            proc = self.pulumi("preview", stack=f"sharefit-{case}", check=False)
            text = proc.stdout + proc.stderr
            refusals[case] = next((line[line.index(key):].strip() for line in text.splitlines() if key in line), "")
            require(proc.returncode != 0 and refusals[case], f"the {case} preview was not refused naming {key}: {tail(text)}")
        require("nvidia.com/mig-3g.40gb" in refusals["mig"], f"the MIG refusal does not name the resource: {refusals['mig']}")
        # Without the refusals: the same pods as plain Deployments on the simulated nodes.
        self.kubectl("label", "--overwrite", "node", SHARED_NODE, f"gpu-serving/gpu.product={SHARED_PRODUCT}")
        self.kubectl("label", "--overwrite", "node", MIG_NODE, f"gpu-serving/gpu.product={MIG_PRODUCT}")
        self.kubectl("create", "namespace", "sharefit")
        for app in ("big-a", "big-b"):
            self.kubectl("apply", "-f", "-", stdin=_fit_deployment(app, gpus=1, replicas=1, namespace="sharefit",
                                                                    product=SHARED_PRODUCT, resource="nvidia.com/gpu.shared"))

        def both() -> list[list[str]] | None:
            nodes = [self._scheduled_nodes(app, 1, "sharefit") for app in ("big-a", "big-b")]
            return nodes if all(nodes) else None  # type: ignore[return-value]

        shared_nodes = self.wait_for("both 0.6 pods scheduled", both)
        require(shared_nodes == [[SHARED_NODE], [SHARED_NODE]], f"the shared pods are on {shared_nodes}")
        self.kubectl("apply", "-f", "-", stdin=_fit_deployment("mig", gpus=1, replicas=3, namespace="sharefit",
                                                                product=MIG_PRODUCT, resource="nvidia.com/mig-3g.40gb"))
        reason = self.wait_for("a MIG pod's FailedScheduling event", lambda: self._failed_scheduling("mig", "sharefit"), timeout=60)
        placed = sorted(node for p in self.get("pods", "-n", "sharefit", "-l", "app=mig")["items"]
                        if (node := p["spec"].get("nodeName")))
        require(placed == [MIG_NODE, MIG_NODE], f"expected two MIG pods on {MIG_NODE}, got {placed}")
        require("nvidia.com/mig-3g.40gb" in reason, f"the Pending pod's reason names no MIG resource: {reason}")
        self.kubectl("delete", "namespace", "sharefit", "--wait=false")
        return (f"refused at load: {refusals['memory'][:140]}…; {refusals['mig'][:140]}…. Without them: both 0.6 pods scheduled "
                f"on {SHARED_NODE}'s one card (the scheduler counts slices, not memory); two MIG pods on {MIG_NODE}, "
                f"the third Pending: {reason}")

    def _scheduled_nodes(self, app: str, count: int, namespace: str = "fit") -> list[str] | None:
        pods = self.get("pods", "-n", namespace, "-l", f"app={app}")["items"]
        nodes = [p["spec"].get("nodeName") for p in pods]
        return nodes if len(nodes) == count and all(nodes) else None

    def _failed_scheduling(self, app: str, namespace: str = "fit") -> str | None:
        pods = [p for p in self.get("pods", "-n", namespace, "-l", f"app={app}")["items"] if not p["spec"].get("nodeName")]
        if not pods:
            return None
        events = self.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={pods[0]['metadata']['name']}")["items"]
        return next((e["message"] for e in events if e.get("reason") == "FailedScheduling"), None)

    def second_up_no_changes_cluster(self) -> str:
        same = self.second_up_changes_nothing("cluster", "noopUpClusterSeconds")
        return f"preview and up: no changes ({same} resources the same)"

    def destroy_cluster_stack(self) -> None:
        self.pulumi("destroy", "--yes", "--skip-preview", stack="cluster", timeout=1800)

    def destroy_retains_pv(self) -> str:
        self.destroy_cluster_stack()
        left = [f"{o['kind']}/{o['metadata']['name']}" for o in self.get("deployments,jobs,services,ingresses", "-n", NAMESPACE)["items"]]
        require(not left, f"workloads left after destroy: {left}")
        volume = self.get("pv", f"{NAMESPACE}-models")
        require(volume["spec"].get("persistentVolumeReclaimPolicy") == "Retain", "the PV is not Retain")
        require(volume["spec"].get("local", {}).get("path") == "/mnt/models", f"the PV points at {volume['spec'].get('local')}")
        claim = self.get("pvc", "models", "-n", NAMESPACE)
        phase = volume["status"].get("phase")
        # The claim and namespace are kept too (retain_on_delete), so the volume stays Bound to the same claim.
        require(phase == "Bound" and claim["status"].get("phase") == "Bound", f"PV {phase}, claim {claim['status'].get('phase')}")
        return f"workloads gone; PV {NAMESPACE}-models Retain, {phase} to the kept claim, path /mnt/models"


def _fit_deployment(app: str, gpus: int, replicas: int, namespace: str = "fit", product: str = FIT_PRODUCT,
                    resource: str = "nvidia.com/gpu") -> str:
    return yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}}, "template": {
            "metadata": {"labels": {"app": app}},
            "spec": {"nodeSelector": {"gpu-serving/gpu.product": product},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                     "resources": {"requests": {"cpu": "4", "memory": "16Gi"},
                                                   "limits": {resource: str(gpus), "memory": "16Gi"}}}]}}},
    })
