"""The endpoint picker checks of the real-node run (issue #43, docs/one-endpoint-plan.md §7 "The picker, for
real"): after the real-node checks, on the same joined VM, an InferencePool of two llm-d-inference-sim pods and
its endpoint picker (EPP) from GAIE v1.5.0, asked for an endpoint as Envoy would ask it.

Real: the EPP binary built from the pinned module, its ext_proc gRPC server (TLS, HTTP/2), scheduler (the
chart's profile: queue, KV-cache and prefix-cache scorers), datastore fed by its own pod and InferencePool
watches through the API server with its own ServiceAccount and Role, its scrape of each pod's /metrics; the
kubelet's readiness probes that decide which pods it may pick; llm-d's simulator serving vLLM's metric names.
Standing in: Envoy, by testbed/endpoint/extproc_client (the ext_proc stream as Envoy's filter opens it; it
reads the pick and goes no further: no request reaches the pod through it); the metric values, set on the
simulator at run time (`POST /admin/config`), not produced by load.
The pool and its picker are the stack's own objects: the example endpoint stack (docs/examples/Pulumi.endpoint.yaml)
rendered by tools.render into this namespace with the picker image built here, and one model's InferencePool, picker
ServiceAccount, Role, RoleBinding, ConfigMap, Deployment, Service and NetworkPolicy applied as rendered, but for one
change (`on_the_lab_node`): the picker tolerates the GPU taint, the lab cluster having no other node. Its model
servers are the two simulator pods of testbed/endpoint/simulators.yaml, labelled with the pool's selector.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.e2e.run import CheckError, require, tail
from tools.render import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.endpoint.yaml"
MODEL = "mistral"
"""The example's model whose pool and picker are proven here: served under its own name, no adapters."""
SIMULATORS = ROOT / "testbed" / "endpoint" / "simulators.yaml"
APISERVER_SLICE = SIMULATORS.with_name("apiserver-for-pods.yaml")
PICKER_ARCHIVE = "picker-images.tar"
PICKER_CHECKS = ("picker-follows-metrics", "picker-skips-unready", "picker-rbac", "picker-bench")
PICKS = 8
"""Requests per look: enough that a picker choosing at random between two pods names both (1 in 128 it does not)."""


class PickerChecks:
    """Mixed into the real-node run (testbed/e2e/real_node.py): uses its kubectl, VM and tunnels."""

    picker: dict[str, Any] | None = None
    picker_images: Any = None
    """testbed.node.images.build_picker()'s archive, on the node's bundle disk as PICKER_ARCHIVE (real_node.py)."""

    def picker_checks(self, namespace: str, needs: tuple[str, ...]) -> None:
        self.picker_namespace = namespace
        self.check("picker-follows-metrics", self.picker_follows_metrics, needs=needs)
        self.check("picker-skips-unready", self.picker_skips_unready, needs=needs)
        self.check("picker-rbac", self.picker_rbac, needs=needs)
        self.check("picker-bench", self.picker_bench, needs=needs)

    def picker_cleanup(self) -> None:
        if self.picker is not None:
            self.kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found", stdin=self.picker["manifest"], check=False)

    # ---- set-up -----------------------------------------------------------------------------

    def picker_up(self) -> dict[str, Any]:
        """Once per run: the images imported into the node's containerd, the CRD, the objects, both pods and the
        picker Ready, tunnels to the picker's 9002 and each pod's 8000."""
        if self.picker is not None:
            return self.picker
        from testbed.node import images as node_images
        from testbed.node.join import BUNDLE_MOUNT

        start = time.monotonic()
        built = self.picker_images
        bins = Path(subprocess.run(["bash", str(node_images.ENDPOINT_BUILD), "--print"], capture_output=True, text=True,
                                   check=True).stdout.strip())
        clients = sorted(bins.glob("extproc-client-*"))
        require(len(clients) == 1, f"{bins}: extproc-client builds {clients}")
        self.vm.ssh(f"ctr -n k8s.io images import --platform linux/amd64 {BUNDLE_MOUNT}/{PICKER_ARCHIVE} >/dev/null", timeout=300)
        self.pods_reach_apiserver()
        # The CRDs (InferencePool, and the InferenceObjective and InferenceModelRewrite the picker then watches) are
        # the loopback cluster's from its start (cluster.sh).
        require(self.kubectl("get", "inferencepools", "-n", self.picker_namespace, check=False).returncode == 0,
                "the cluster serves no InferencePool CRD")
        names = node_images.picker_names()
        objects = on_the_lab_node(stack_picker_objects(self.picker_namespace, built.pinned(names["epp"]), self.tmp / "picker"))
        by_kind = {o["kind"]: o for o in objects}
        pool = by_kind["InferencePool"]
        selector = pool["spec"]["selector"]["matchLabels"]
        simulators = model_simulators(self.picker_namespace, MODEL, selector, built.pinned(names["llm-d-inference-sim"]),
                                      self.raw["cluster"]["smokeImage"])
        manifest = yaml.safe_dump_all([*objects, simulators], sort_keys=False)
        self.kubectl("apply", "-f", "-", stdin=manifest)
        pod_selector = ",".join(f"{k}={v}" for k, v in selector.items())
        picker_selector = ",".join(f"{k}={v}" for k, v in by_kind["Deployment"]["spec"]["selector"]["matchLabels"].items())
        pods = self.wait_for("two Ready simulator pods", lambda: self.pool_pods(pod_selector, ready=2), 360)
        epp = self.wait_for("a Ready picker", lambda: self.ready_one(picker_selector), 360)
        self.picker = {
            "manifest": manifest,
            "objects": by_kind,
            "name": pool["spec"]["endpointPickerRef"]["name"],
            "pod_selector": pod_selector,
            "simulators": simulators["metadata"]["name"],
            "client": clients[0],
            "grpc": self.tunnel(f"{epp['status']['podIP']}:9002"),
            "pods": {p["metadata"]["name"]: {"ip": p["status"]["podIP"], "port": self.tunnel(f"{p['status']['podIP']}:8000")}
                     for p in pods},
            "pod": epp["metadata"]["name"],
        }
        # Ready is not yet listening: the picker's health server (9003) runs before its caches sync, its ext_proc
        # server (9002) only after (GAIE v1.5.0 cmd/epp/runner: a leader-election runnable), so Envoy would meet
        # refused connections for that while. Set-up ends at the first answer.
        ready = time.monotonic()
        self.wait_for("the picker's ext_proc server to answer", lambda: self.client(1).returncode == 0, 120)
        self.report["figures"]["pickerReadyToListeningSeconds"] = round(time.monotonic() - ready, 1)
        self.report["figures"]["pickerSetupSeconds"] = round(time.monotonic() - start, 1)
        return self.picker

    def pods_reach_apiserver(self) -> None:
        """The picker is the first pod here that talks to the API server: the host's API server forwarded to the
        bridge's address in the guest, and the `kubernetes` Service's endpoint set to it (apiserver-for-pods.yaml)."""
        from testbed.node.join import APISERVER_GUEST_PORT, POD_GATEWAY, ssh_forward

        target = f"{POD_GATEWAY}:{APISERVER_GUEST_PORT}"
        self.tunnels.append(ssh_forward(self.vm, ["-R", f"{target}:127.0.0.1:{self.cluster_env['GS_CLUSTER_PORT']}"]))
        probe = f"timeout 2 bash -c '</dev/tcp/{POD_GATEWAY}/{APISERVER_GUEST_PORT}'"
        self.wait_for(f"the API server at {target} in the guest", lambda: self.vm.ssh(probe, check=False).returncode == 0, 30)
        slice_ = string.Template(APISERVER_SLICE.read_text()).substitute(address=POD_GATEWAY, port=APISERVER_GUEST_PORT)
        self.kubectl("apply", "-f", "-", stdin=slice_)

    def pool_pods(self, selector: str, ready: int | None = None) -> list[dict[str, Any]] | None:
        pods = [p for p in self.get("pods", "-n", self.picker_namespace, "-l", selector)["items"]
                if not p["metadata"].get("deletionTimestamp")]
        if ready is not None and (len(pods) != ready or not all(self.is_ready(p) for p in pods)):
            return None
        return sorted(pods, key=lambda p: p["metadata"]["name"])

    def ready_one(self, selector: str) -> dict[str, Any] | None:
        pods = [p for p in self.get("pods", "-n", self.picker_namespace, "-l", selector)["items"] if self.is_ready(p)]
        return pods[0] if len(pods) == 1 else None

    # ---- tools ------------------------------------------------------------------------------

    def picks(self, count: int = PICKS) -> list[str]:
        """`count` requests through the ext_proc stream; each pick as `IP:port`, header and metadata agreeing."""
        self.picker_up()
        proc = self.client(count)
        if proc.returncode != 0:
            raise CheckError(f"extproc-client: {tail(proc.stderr)}")
        picks = [json.loads(line) for line in proc.stdout.splitlines()]
        refused = [p for p in picks if p.get("immediate")]
        require(not refused, f"the picker answered with an immediate response: {refused[:2]}")
        require(all(p["header"] == p["metadata"] for p in picks), f"header and envoy.lb metadata disagree: {picks[:2]}")
        return [p["header"] for p in picks]

    def pick_all(self, want: str, what: str, timeout: float = 30) -> float:
        """Seconds until every one of PICKS requests names `want` (IP:8000): the picker's metrics refresh lag."""
        start, seen = time.monotonic(), []

        def probe() -> bool:
            seen[:] = self.picks()
            return set(seen) == {want}
        try:
            self.wait_for(what, probe, timeout)
        except CheckError as exc:
            raise CheckError(f"{exc}; last picks {sorted(set(seen))}") from None
        return time.monotonic() - start

    def client(self, count: int) -> subprocess.CompletedProcess[str]:
        assert self.picker is not None
        argv = [str(self.picker["client"]), "-addr", f"127.0.0.1:{self.picker['grpc']}", "-model", MODEL, "-n", str(count)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def set_metrics(self, pod: str, **metrics: float) -> None:
        """The simulator's fake metrics, changed at run time (its admin API, through a tunnel to the pod)."""
        port = self.picker_up()["pods"][pod]["port"]
        body = json.dumps({"fake-metrics": {name.replace("_", "-"): value for name, value in metrics.items()}})
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/admin/config", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        require(response.status == 200, f"POST /admin/config on {pod}: {response.status} {response.read()[:200]!r}")

    def scraped(self, pod: str) -> dict[str, float]:
        """What the picker scrapes from the pod: the vLLM gauges its default extractor reads."""
        port = self.picker_up()["pods"][pod]["port"]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        return {name: float(value) for name, value in
                re.findall(r"^(vllm:num_requests_waiting|vllm:kv_cache_usage_perc)\{[^}]*\} (\S+)$", text, re.M)}

    def endpoint(self, pod: str) -> str:
        return f"{self.picker_up()['pods'][pod]['ip']}:8000"

    # ---- checks -----------------------------------------------------------------------------

    def picker_follows_metrics(self) -> str:
        picker = self.picker_up()
        a, b = sorted(picker["pods"])
        self.set_metrics(a, waiting_requests=30, kv_cache_usage=0.1)
        self.set_metrics(b, waiting_requests=0, kv_cache_usage=0.1)
        to_b = self.pick_all(self.endpoint(b), f"every pick to name {b} (queue 0) over {a} (queue 30)")
        self.set_metrics(a, waiting_requests=0)
        self.set_metrics(b, waiting_requests=30)
        to_a = self.pick_all(self.endpoint(a), f"every pick to name {a} once the queues swapped")
        self.set_metrics(b, waiting_requests=0, kv_cache_usage=0.1)
        self.set_metrics(a, kv_cache_usage=0.9)
        by_kv = self.pick_all(self.endpoint(b), f"every pick to name {b} (KV cache 10 %) over {a} (90 %)")
        scraped = {pod: self.scraped(pod) for pod in (a, b)}
        require(scraped[a].get("vllm:kv_cache_usage_perc") == 0.9, f"{a} serves {scraped[a]}")
        return (f"{PICKS} ext_proc requests per look, header and envoy.lb metadata agreeing: queue 30 vs 0 -> all to the "
                f"0 pod ({to_b:.1f} s), swapped -> all to the other ({to_a:.1f} s), KV cache 90 % vs 10 % -> all to the 10 % "
                f"pod ({by_kv:.1f} s); the simulators' /metrics as the picker scrapes them: {scraped}")

    def picker_skips_unready(self) -> str:
        picker = self.picker_up()
        a, b = sorted(picker["pods"])
        # b the better pick by every metric; only its readiness keeps the picker off it.
        self.set_metrics(a, waiting_requests=30, kv_cache_usage=0.9)
        self.set_metrics(b, waiting_requests=0, kv_cache_usage=0.1)
        self.pick_all(self.endpoint(b), f"every pick to name {b} while Ready")
        self.kubectl("exec", "-n", self.picker_namespace, b, "-c", "gate", "--", "touch", "/tmp/unready")
        try:
            start = time.monotonic()
            self.wait_for(f"{b} to turn NotReady", lambda: not self.is_ready(self.get("pod", b, "-n", self.picker_namespace)), 60)
            unready = time.monotonic() - start
            # From the moment the API server holds NotReady (the kubelet's report), the picker never names b.
            looks = [self.picks() for _ in range(3)]
            named = sorted({p for look in looks for p in look})
            require(named == [self.endpoint(a)], f"while {b} was NotReady the picker named {named}")
            still = self.scraped(b)
            require(still.get("vllm:num_requests_waiting") == 0, f"{b}'s simulator stopped serving its metrics: {still}")
        finally:
            self.kubectl("exec", "-n", self.picker_namespace, b, "-c", "gate", "--", "rm", "-f", "/tmp/unready")
        self.wait_for(f"{b} to turn Ready again", lambda: self.is_ready(self.get("pod", b, "-n", self.picker_namespace)), 60)
        back = self.pick_all(self.endpoint(b), f"every pick to name {b} once Ready again")
        return (f"{b} (queue 0, KV 10 %; {a}: 30, 90 %) made NotReady by its gate container's probe: NotReady after "
                f"{unready:.1f} s, then {3 * PICKS} picks all to {a} while {b}'s simulator still served queue 0; Ready again -> "
                f"all to {b} within {back:.1f} s")

    def picker_rbac(self) -> str:
        picker = self.picker_up()
        ns = self.picker_namespace
        role, epp = picker["objects"]["Role"], picker["name"]
        rendered = {(f"{r}.{g}" if g else r, verb) for rule in role["rules"] for g in rule["apiGroups"]
                    for r in rule["resources"] for verb in rule["verbs"]}
        # What the API server grants the picker's ServiceAccount beyond what any ServiceAccount of the namespace
        # gets (discovery, self reviews): a name no binding mentions is the baseline.
        granted = self.can_i(f"system:serviceaccount:{ns}:{epp}") - self.can_i(f"system:serviceaccount:{ns}:picker-rbac-baseline")
        require(granted == rendered, f"{epp} may {sorted(granted - rendered)} beyond its Role, lacks {sorted(rendered - granted)}")
        pod = self.get("pod", picker["pod"], "-n", ns)
        require(pod["spec"]["serviceAccountName"] == epp, f"the picker runs as {pod['spec']['serviceAccountName']}")
        bound = [f"{b['kind']}/{b['metadata']['name']}" for kind in ("clusterrolebindings", "rolebindings")
                 for b in self.get(kind, *(("-n", ns) if kind == "rolebindings" else ()))["items"]
                 for s in b.get("subjects") or [] if s.get("kind") == "ServiceAccount" and s.get("name") == epp]
        require(bound == [f"RoleBinding/{epp}"], f"bindings naming {epp}: {bound}")
        logs = self.kubectl("logs", "-n", ns, picker["pod"]).stdout
        forbidden = [line for line in logs.splitlines() if "forbidden" in line.lower()]
        require(not forbidden, f"the picker was refused by the API server: {forbidden[:2]}")
        return (f"`kubectl auth can-i --list` as {epp}, less a ServiceAccount with no binding: exactly its Role "
                f"({', '.join(sorted({r for r, _ in rendered}))}: get, list, watch); one binding (RoleBinding/{epp}); "
                "the picker ran every check with it and its log has no forbidden")

    def picker_bench(self) -> str:
        """A benchmark, not a timed test: its figures go to the report (`pickerBench`), and what it requires is behaviour
        (every request answered 200 by the endpoint it was sent to; the busy replica given fewer of the burst than
        round-robin gives it). Envoy's last hop is the client, run in the guest beside the pods: it asks the picker, then
        streams the request to the pod picked (-forward), or skips the picker and sends round-robin (-endpoints)."""
        picker = self.picker_up()
        ns, deployment = self.picker_namespace, picker["simulators"]
        container = self.get("deployment", deployment, "-n", ns)["spec"]["template"]["spec"]["containers"][0]
        args = [a for a in container["args"] if not a.startswith("--fake-metrics")] + list(BENCH_ARGS)
        patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
        self.kubectl("patch", "deployment", deployment, "-n", ns, "--type=json", "-p", json.dumps(patch))
        self.kubectl("rollout", "status", "deployment", deployment, "-n", ns, "--timeout=360s")
        pods = self.wait_for("two Ready simulator pods", lambda: self.pool_pods(picker["pod_selector"], ready=2), 360)
        a, b = (f"{p['status']['podIP']}:8000" for p in pods)
        epp = self.get("pod", picker["pod"], "-n", ns)["status"]["podIP"]
        client = "/var/tmp/extproc-client"
        self.vm.put_file(Path(picker["client"]).read_bytes(), client, "0755")
        base = f"{client} -addr {epp}:9002 -model {MODEL} -timeout 120s"
        # The picker watches the new pods and scrapes them; a first pick through it says it has them.
        self.wait_for("the picker to name the new pods", lambda: self.vm.ssh(f"{base} -n 1", check=False).returncode == 0, 60)

        def run(args: str) -> dict[str, Any]:
            """BENCH_REQUESTS requests: the run's percentiles, how many went to the busy replica (`a`), its wall time."""
            start = time.monotonic()
            out = self.vm.ssh(f"{base} {args} -n {BENCH_REQUESTS} -max-tokens {BENCH_TOKENS}", check=False, timeout=900)
            if out.returncode != 0:
                raise CheckError(f"extproc-client {args}: {tail(out.stderr)}")
            rows = [json.loads(line) for line in out.stdout.splitlines()]
            require(all(r["status"] == 200 for r in rows) and len(rows) == BENCH_REQUESTS,
                    f"extproc-client {args}: {len(rows)} answers of {BENCH_REQUESTS}")
            return {"ttftMs": percentiles([r["ttft_ms"] for r in rows]), "totalMs": percentiles([r["total_ms"] for r in rows]),
                    "pickMs": percentiles([r["pick_ms"] for r in rows]), "toBusy": sum(r["endpoint"] == a for r in rows),
                    "seconds": round(time.monotonic() - start, 1)}

        # What the picker adds to a request, one at a time on an idle pool: through it, against straight to a pod.
        figures: dict[str, Any] = {"picked": run("-forward -c 1"), "direct": run(f"-endpoints {a},{b} -c 1")}

        def burst(mode: str) -> dict[str, Any]:
            hold = f"{base} -endpoints {a} -c 4 -n 4 -max-tokens {HOLD_TOKENS} >/dev/null 2>/var/tmp/hold.err"
            self.vm.ssh(f"setsid nohup sh -c '{hold}' >/dev/null 2>&1 & sleep 2", timeout=60)
            try:
                return run(f"{mode} -c 4")
            finally:
                self.vm.ssh(f"pkill -f -- '-n 4 -max-tokens {HOLD_TOKENS}' || true", check=False)
                time.sleep(1)

        # A burst of 4 at a time while one replica's 4 sequences are taken by long generations.
        figures["burstPicked"] = burst("-forward")
        figures["burstRoundRobin"] = burst(f"-endpoints {a},{b}")
        self.report["figures"]["pickerBench"] = {"requests": BENCH_REQUESTS, "tokens": BENCH_TOKENS, "holdTokens": HOLD_TOKENS,
                                                 "simulatorArgs": list(BENCH_ARGS), **figures}
        picked, rr = figures["burstPicked"], figures["burstRoundRobin"]
        require(picked["toBusy"] < rr["toBusy"],
                f"the picker sent {picked['toBusy']} of {BENCH_REQUESTS} to the busy replica, round-robin {rr['toBusy']}")
        return (f"{BENCH_REQUESTS} streamed requests of {BENCH_TOKENS} tokens per run, client in the guest; idle pool, one at a "
                f"time: TTFT p50/p99 {figures['picked']['ttftMs']['p50']}/{figures['picked']['ttftMs']['p99']} ms through the "
                f"picker (the pick {figures['picked']['pickMs']['p50']}/{figures['picked']['pickMs']['p99']} ms of it) against "
                f"{figures['direct']['ttftMs']['p50']}/{figures['direct']['ttftMs']['p99']} ms straight to a pod; 4 at a time "
                f"with one replica's 4 sequences held: the picker sent {picked['toBusy']} to it, TTFT p50/p99 "
                f"{picked['ttftMs']['p50']}/{picked['ttftMs']['p99']} ms; round-robin {rr['toBusy']}, "
                f"{rr['ttftMs']['p50']}/{rr['ttftMs']['p99']} ms")

    def can_i(self, user: str) -> set[tuple[str, str]]:
        out = self.kubectl("auth", "can-i", "--list", "-n", self.picker_namespace, f"--as={user}", "--no-headers").stdout
        return can_i_rows(out)


BENCH_ARGS = ("--max-num-seqs=4", "--max-model-len=8192", "--time-to-first-token=50ms", "--inter-token-latency=10ms", "--mode=random")
"""The simulators for the benchmark: metrics from their own load (no fake ones), 4 sequences at once each, vLLM-like
latencies (50 ms to the first token, 10 ms per token after it), a context long enough for the holding streams."""
BENCH_TOKENS = 8
BENCH_REQUESTS = int(os.environ.get("GS_PICKER_BENCH_REQUESTS", "24"))
"""Per run: 24 in `make e2e` (about 50 s under TCG, CI's budget); docs/endpoint.md's figures are of a run with 300."""
HOLD_TOKENS = 500 if BENCH_REQUESTS <= 100 else 4000
"""Four streams of this many tokens (5 s or 40 s at 10 ms a token, about three times that under TCG) fill one replica's
4 sequences for the burst: a replica busy with long generations, the case a router that looks at the replicas is for."""


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 and p99 by nearest rank, in ms rounded to 0.1."""
    ordered = sorted(values)
    return {f"p{q}": round(ordered[max(0, -(-q * len(ordered) // 100) - 1)], 1) for q in (50, 99)}


def model_simulators(namespace: str, model: str, selector: dict[str, str], sim_image: str, gate_image: str,
                     replicas: int = 2) -> dict[str, Any]:
    """testbed/endpoint/simulators.yaml for `model`: its pods labelled with the pool's `selector`."""
    sim = yaml.safe_load(string.Template(SIMULATORS.read_text()).substitute(
        namespace=namespace, name=f"{model}-simulators", model=model, sim_image=sim_image, gate_image=gate_image))
    sim["spec"]["replicas"] = replicas
    sim["spec"]["selector"]["matchLabels"] = sim["spec"]["template"]["metadata"]["labels"] = selector
    return dict(sim)


def stack_picker_objects(namespace: str, picker_image: str, work: Path) -> list[dict[str, Any]]:
    """MODEL's InferencePool and every object of its picker, as `tools.render` renders the example endpoint stack
    with `namespace` and `picker_image` (the same code `pulumi up` runs; its objects holding secrets are not needed)."""
    return model_picker_objects(render_example(namespace, picker_image, work), MODEL)


def render_example(namespace: str, picker_image: str, work: Path) -> list[dict[str, Any]]:
    """Every object `tools.render` renders for the example endpoint stack in `namespace` with `picker_image` (cached
    in `work`: the picker and the one-URL checks share one render)."""
    out = work / "rendered" / "manifests.yaml"
    if not out.exists():
        _render(namespace, picker_image, work)
    return [d for d in yaml.safe_load_all(out.read_text()) if d]


def model_picker_objects(documents: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """`model`'s InferencePool and every object of its picker, from the render."""
    (pool,) = [d for d in documents if d["kind"] == "InferencePool" and d["metadata"]["name"] == f"vllm-{model}"]
    picker = pool["spec"]["endpointPickerRef"]["name"]
    objects = [pool, *(d for d in documents if d["metadata"]["name"] == picker)]
    kinds = sorted(o["kind"] for o in objects)
    require(kinds == sorted(PICKER_KINDS), f"the render of {picker}: {kinds}, not {sorted(PICKER_KINDS)}")
    return objects


def _render(namespace: str, picker_image: str, work: Path) -> None:
    stack = yaml.safe_load(EXAMPLE.read_text())
    cluster = stack["config"]["gpu-serving:cluster"]
    cluster["namespace"] = namespace
    cluster["endpoint"]["pickerImage"] = picker_image
    work.mkdir(parents=True, exist_ok=True)
    (work / "Pulumi.picker.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    render = subprocess.run([sys.executable, "-m", "tools.render", "picker", "--quiet", "--stack-file",
                             str(work / "Pulumi.picker.yaml"), "--out", str(work / "rendered")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    if render.returncode != 0:
        raise CheckError(f"tools.render of the example endpoint stack: {tail(render.stderr)}")


PICKER_KINDS = ("InferencePool", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service", "NetworkPolicy")


def on_the_lab_node(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The one change to the stack's objects: the picker tolerates the GPU taint. In a cluster the picker runs on a node
    without it, as the controllers do; the lab cluster's one node is the tainted GPU node."""
    for obj in objects:
        if obj["kind"] == "Deployment":
            spec = obj["spec"]["template"]["spec"]
            spec["tolerations"] = [*spec.get("tolerations", []), {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return objects


def can_i_rows(table: str) -> set[tuple[str, str]]:
    """(resource, verb) pairs of `kubectl auth can-i --list --no-headers` rows that name a resource with no
    resource names (`pods   []   []   [get list watch]`); rows of non-resource URLs and named objects left out."""
    rows = set()
    for line in table.splitlines():
        match = re.match(r"^([^\s\[]\S*)\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]$", line.strip())
        if match and not match.group(2) and not match.group(3):
            rows |= {(match.group(1), verb) for verb in match.group(4).split()}
    return rows
