"""The fleet-scale section of `make bench-engine`: generated stacks up to 32 nodes and 100 models on the
real engine, each against a bare program of the same resources and providers, measured in one run.

For each size (nodes × models, generated as the offline scaling benchmark generates them:
testbed.bench.generated_stack), with the Kubernetes provider writing YAML (renderYamlTo) and every
node's SSH host a stand-in that runs nothing (testbed/standins/ssh.py):
- `pulumi preview`, `pulumi up` of a new stack, and a no-op `pulumi up --expect-no-changes`;
- the same for a bare program: as many components, remote Commands (to the same stand-in hosts,
  chained per node) and ConfigMaps on a YAML-writing provider as the stack has resources, no logic;
- the peak memory of the process that runs the program (testbed/bench_hook);
- the Commands the stand-in was asked to run (0 for a no-op up) and how many nodes had one in
  flight at once during the first up.
For the largest size, where the time goes: the engine's OpenTelemetry spans (`--otel-traces file://`)
of a preview of both programs, a cProfile of our program's process, and the CLI's Go CPU profile of
one more first `up` (`--profiling`). Then (`cluster_up`, not with --quick) the largest stack brought
up once against the loopback cluster (testbed/cluster, one kwok node per stack node) instead of YAML.

cProfile sees the main thread only, where the program and the SDK's serialisation run; the worker
threads only wait on gRPC calls, whose other end the engine's spans show.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.node import DISK_STEPS
from stacks.config import parse
from testbed.bench import attribute, generated_stack
from testbed.e2e.run import Run, rendering, stack_yaml
from testbed.standins.ssh import chains, overlapping_nodes, read_log
from tools.render import ROOT

SIZES = [(1, 1), (8, 16), (32, 100)]
"""(nodes, models) of the full run."""
QUICK_SIZES = [(1, 1), (2, 3)]
HOOK = ROOT / "testbed" / "bench_hook"
SYSTEM_PYTHON = os.environ.get("GS_SYSTEM_PYTHON", "/usr/bin/python3")
"""Debian's python3, which has python3-asyncssh for the SSH stand-in."""
CHART = "benchmarks-engine-scaling.png"
REPLAYED = "replay.json"
"""What the offline render declares, for testbed/bench_replay.py (written by `shape_of`)."""
SKIP_CHECKPOINTS = {"PULUMI_SKIP_CHECKPOINTS": "true"}
"""The CLI writes the state once, at the end, instead of after every step (README "A large fleet")."""

BARE_PROGRAM = '''\
import json
import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

config = pulumi.Config()
count, components, commands = (int(config.require(key)) for key in ("count", "components", "commands"))
ports, key = json.loads(config.require("ports")), config.require_secret("key")
provider = k8s.Provider("yaml", render_yaml_to_directory=config.require("folder"))
for i in range(components):
    pulumi.ComponentResource("bare:index:Group", f"group-{i}").register_outputs({})
last = {}
for i in range(commands):
    node = i % len(ports)
    connection = command.remote.ConnectionArgs(host="127.0.0.1", port=ports[node], user="root", private_key=key)
    last[node] = command.remote.Command(f"cmd-{i}", connection=connection, create="true",
                                        opts=pulumi.ResourceOptions(depends_on=[last[node]] if node in last else []))
for i in range(count - components - commands - 1):
    k8s.core.v1.ConfigMap(f"cm-{i}", metadata={"name": f"cm-{i}"}, data={"i": str(i)},
                          opts=pulumi.ResourceOptions(provider=provider))
'''


@dataclass(frozen=True)
class Shape:
    """What the offline render of a stack declares (the bare program declares as many of each)."""

    resources: int
    components: int
    commands: int


@dataclass(frozen=True)
class Sample:
    seconds: float
    peak_mib: float
    """Peak resident memory of the process that ran the program (0 when it reported none)."""
    window: tuple[float, float] = (0.0, 0.0)
    """When it ran (epoch seconds), to find its sessions in the SSH stand-in's log."""


@dataclass
class Pair:
    """One command's samples for our program and the bare one."""

    ours: list[Sample] = field(default_factory=list)
    bare: list[Sample] = field(default_factory=list)

    def seconds(self, side: str) -> float:
        return statistics.median(s.seconds for s in getattr(self, side))

    def peak_mib(self, side: str) -> float:
        return statistics.median(s.peak_mib for s in getattr(self, side))

    @property
    def ratio(self) -> float:
        return self.seconds("ours") / self.seconds("bare")


@dataclass
class SizeResult:
    nodes: int
    models: int
    shape: Shape
    preview: Pair
    up: Pair
    noop: Pair
    noop_commands: int
    """Commands the stand-in ran during the no-op ups (ours and bare)."""
    noop_changes: dict[str, int]
    """The last no-op up's resource changes (ours), from the stack's history."""
    up_overlap: int
    """The most nodes whose disk steps ran side by side during one of our first ups (median of the runs)."""
    state_mib: tuple[float, float] = (0.0, 0.0)
    """The size of the state file after the last first up (ours, bare): what the file backend writes after every step."""
    replay: Pair | None = None
    """Previews of ours against the payload-equivalent bare program (testbed/bench_replay.py), when measured."""

    @property
    def label(self) -> str:
        return f"{self.nodes} × {self.models}"


# ---------------------------------------------------------------------------- stacks


def fleet_config(nodes: int, models: int, ports: dict[str, int], yaml_folder: Path) -> dict[str, Any]:
    """The generated stack (gpu-serving: keys stripped), rendering YAML, each node's SSH at its stand-in port."""
    document = generated_stack(models, nodes)["config"]
    raw = rendering({key.split(":", 1)[1]: value for key, value in document.items()}, yaml_folder)
    for node in raw["nodes"]:
        node["ssh"] = {"host": "127.0.0.1", "port": ports[node["name"]], "user": "root"}
    return raw


def node_names(nodes: int, models: int) -> list[str]:
    return [node["name"] for node in generated_stack(models, nodes)["config"]["gpu-serving:nodes"]]


def shape_of(raw: dict[str, Any], work: Path) -> Shape:
    """What the offline render declares, counted from the file it writes for the replaying program
    (`python -m testbed.bench_replay`, into work/replay.json)."""
    stack_file = work / "Pulumi.shape.yaml"
    stack_file.write_text(stack_yaml({"config": {f"gpu-serving:{key}": value for key, value in raw.items()}}))
    subprocess.run([sys.executable, "-m", "testbed.bench_replay", str(stack_file), str(work / REPLAYED)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    resources = json.loads((work / REPLAYED).read_text())
    return Shape(resources=len(resources), components=sum(1 for r in resources if not r["custom"]),
                 commands=sum(1 for r in resources if r["type"] == "command:remote:Command"))


def bare_config(shape: Shape, ports: list[int], key: str, folder: Path) -> dict[str, str]:
    return {"count": str(shape.resources), "components": str(shape.components), "commands": str(shape.commands),
            "ports": json.dumps(ports), "key": key, "folder": str(folder)}


def bare_project(folder: Path, program: str = BARE_PROGRAM) -> Path:
    """A Pulumi project running `program` in the project's venv (a bare program of the benchmarks)."""
    folder.mkdir(parents=True)
    (folder / "Pulumi.yaml").write_text(
        "name: bare\nruntime:\n  name: python\n  options:\n    toolchain: pip\n    virtualenv: venv\n")
    (folder / "__main__.py").write_text(program)
    (folder / "venv").symlink_to(ROOT / "venv")
    return folder


def new_bare_stack(bare: Run, name: str, config: dict[str, str]) -> None:
    """Plain config written as the CLI writes it: one CLI call instead of one per key (the key is a
    throwaway one for the stand-in, which lets anyone in)."""
    bare.pulumi("stack", "init", name, "--secrets-provider", "passphrase")
    path = bare.project / f"Pulumi.{name}.yaml"
    document = yaml.safe_load(path.read_text()) or {}
    document["config"] = {f"bare:{k}": v for k, v in config.items()}
    path.write_text(stack_yaml(document))


# ---------------------------------------------------------------------------- measuring


def bench_env(env: dict[str, str], work: Path) -> dict[str, str]:
    """The engine's environment with Python's bytecode cached under `work`, as a user's venv has it cached
    (pip compiles at install; uv and a first run write it). PYTHONDONTWRITEBYTECODE, if the caller's
    environment has it, would make every run compile each module it imports from source: about 440
    modules, 1.6 s of a 2 × 3 preview, more for our program (it imports more) than for the bare one."""
    env = {**env, "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def hook_env(out: Path, profile: Path | None = None) -> dict[str, str]:
    """The environment that makes testbed/bench_hook report on the program's process."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])), "GS_BENCH_HOOK_OUT": str(out)}
    return env | ({"GS_BENCH_PROFILE": str(profile)} if profile else {})


def peak_mib(hook_out: Path) -> float:
    """The largest peak of the program processes that reported into `hook_out` (one per command)."""
    if not hook_out.exists():
        return 0.0
    reports = [json.loads(line) for line in hook_out.read_text().splitlines() if line.strip()]
    return max((r["peakKib"] for r in reports), default=0) / 1024


def sample(run: Run, args: tuple[str, ...], stack: str, hook_out: Path) -> Sample:
    hook_out.unlink(missing_ok=True)
    start, began = time.monotonic(), time.time()
    run.pulumi(*args, stack=stack, timeout=3600, env=hook_env(hook_out))
    return Sample(time.monotonic() - start, peak_mib(hook_out), (began, time.time()))


def alternate(ours: tuple[Run, tuple[str, ...], Any], bare: tuple[Run, tuple[str, ...], Any], runs: int, work: Path) -> Pair:
    """Both commands `runs` times, alternating, so a slow minute of the machine hits both alike. The
    stack is a name, or a function of the run's index that makes a new stack and returns its name."""
    pair = Pair()
    for i in range(runs):
        for side, (run, args, stack) in (("ours", ours), ("bare", bare)):
            name = stack(i) if callable(stack) else stack
            getattr(pair, side).append(sample(run, args, name, work / f"hook-{side}.jsonl"))
    return pair


@contextmanager
def ssh_standin(nodes: list[str], log: Path) -> Iterator[dict[str, int]]:
    """The stand-in SSH hosts for these nodes: {node: port} while it runs. Its stderr goes to a file
    beside the log: a pipe nobody reads would stop it once full."""
    errors = log.with_suffix(".err")
    with errors.open("w") as stderr:
        process = subprocess.Popen([SYSTEM_PYTHON, "-m", "testbed.standins.ssh", "--nodes", ",".join(nodes), "--log", str(log)],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            raise SystemExit(f"the SSH stand-in did not start ({SYSTEM_PYTHON} needs python3-asyncssh: "
                             f"bash testbed/vm/install-host-deps.sh): {errors.read_text()}")
        yield json.loads(line)
    finally:
        process.terminate()
        process.wait(timeout=30)


def measure_size(nodes: int, models: int, program: Run, bare: Run, runs: int, key: str, work: Path,
                 warm_up: bool = False, replay: Run | None = None) -> SizeResult:
    """Preview, first up (a new stack each run) and no-op up of one size, ours against bare; with `replay` (a
    project for testbed/bench_replay.py), previews against it too. `warm_up`: an untimed preview of each first,
    which writes the bytecode caches every later run reads (see `bench_env`)."""
    name = f"fleet-{nodes}x{models}"
    folder = work / name
    folder.mkdir()
    log = folder / "ssh-sessions.jsonl"
    with ssh_standin(node_names(nodes, models), log) as ports:
        def ours_config(i: int | str) -> dict[str, Any]:
            return fleet_config(nodes, models, ports, folder / f"yaml-ours-{i}")

        shape = shape_of(ours_config("shape"), folder)
        ordered_ports = [ports[n] for n in node_names(nodes, models)]

        def bare_stack(i: int | str) -> str:
            stack = f"{name}-bare-{i}"
            new_bare_stack(bare, stack, bare_config(shape, ordered_ports, key, folder / f"yaml-bare-{i}"))
            return stack

        def our_stack(i: int | str) -> str:
            stack = f"{name}-{i}"
            program.new_stack(stack, ours_config(i), {"sshPrivateKey": key})
            return stack

        previews = our_stack("preview"), bare_stack("preview")
        if warm_up:
            program.pulumi("preview", stack=previews[0], timeout=3600)
            bare.pulumi("preview", stack=previews[1], timeout=3600)
        preview = alternate((program, ("preview",), previews[0]), (bare, ("preview",), previews[1]), runs, folder)
        replayed = None
        if replay is not None:
            replay_stack = replay_of(replay, name, folder)
            replay.pulumi("preview", stack=replay_stack, timeout=3600)  # untimed, as the others' first
            replayed = alternate((program, ("preview",), previews[0]), (replay, ("preview",), replay_stack), runs, folder)
        up = alternate((program, ("up", "--yes", "--skip-preview"), our_stack),
                       (bare, ("up", "--yes", "--skip-preview"), bare_stack), runs, folder)
        first_up_sessions = read_log(log)
        side_by_side = statistics.median_low([disk_chains_overlapping(first_up_sessions, sample.window) for sample in up.ours])
        last = runs - 1
        noop = alternate((program, ("up", "--yes", "--skip-preview", "--expect-no-changes"), f"{name}-{last}"),
                         (bare, ("up", "--yes", "--skip-preview", "--expect-no-changes"), f"{name}-bare-{last}"), runs, folder)
        noop_changes = program.last_update_changes(f"{name}-{last}")
        ran_by_noop = len(read_log(log)) - len(first_up_sessions)
        state = exported(program, f"{name}-{last}")[1], exported(bare, f"{name}-bare-{last}")[1]
    return SizeResult(nodes, models, shape, preview, up, noop, ran_by_noop, noop_changes, side_by_side, state, replayed)


def replay_of(replay: Run, name: str, folder: Path) -> str:
    """A stack of the replaying program declaring what `shape_of` found in `folder`; its name."""
    stack = f"{name}-replay"
    replay.pulumi("stack", "init", stack, "--secrets-provider", "passphrase")
    replay.pulumi("config", "set", "resources", str(folder / REPLAYED), stack=stack)
    return stack


def exported(run: Run, stack: str) -> tuple[int, float]:
    """(resources in the state, providers included; the state file's size in MiB) of a stack on the run's file
    backend (`pulumi stack export` writes the same JSON)."""
    text = run.pulumi("stack", "export", stack=stack, timeout=600).stdout
    return len(json.loads(text)["deployment"].get("resources") or []), len(text.encode()) / 2**20


def disk_chains_overlapping(sessions: list[dict[str, Any]], window: tuple[float, float]) -> int:
    """How many nodes' disk steps ran side by side in the `up` that ran during `window` (the runtime steps
    are left out: they wait for each other by design)."""
    during = [s for s in sessions if window[0] <= s["start"] <= window[1] and s["step"] in DISK_STEPS]
    return overlapping_nodes(chains(during))


# ---------------------------------------------------------------------------- on the loopback cluster

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


def cluster_markdown(result: ClusterResult) -> str:
    same = result.noop_changes.get("same", 0)
    return "\n".join([
        f"#### {result.label} on the loopback cluster",
        "",
        f"The same stack against a real API server instead of YAML ({result.server}, controllers and scheduler, "
        f"{result.nodes} kwok nodes standing in for kubelets: they mark pods Ready and Job pods complete; no ingress "
        "controller, so the models go without their Ingress), every object created and awaited as on a real cluster, "
        "one run each:",
        "",
        "| command | seconds | what happened |",
        "|---|---|---|",
        f"| first `pulumi up` | {result.up_seconds:.1f} | {result.resources} resources in the state (providers included); "
        "the disk steps of "
        f"**{result.up_overlap}** of {result.nodes} nodes ran side by side |",
        f"| no-op `pulumi up --expect-no-changes` | {result.noop_seconds:.1f} | **{result.noop_commands} Commands** ran; "
        f"changes {json.dumps(result.noop_changes, sort_keys=True)} ({same} the same) |",
        "",
        f"The state after the first `up`: {result.state_mib:.1f} MiB.",
    ])


# ---------------------------------------------------------------------------- where the time goes


@dataclass
class Profile:
    phases: dict[str, dict[str, float]]
    """{phase: {"ours": s, "bare": s}} from the engine's spans."""
    program: list[tuple[str, float]]
    """[(part of our program's process, seconds)] from cProfile."""
    profiled_seconds: float
    engine: list[tuple[str, float]] = field(default_factory=list)
    """[(part of the CLI's CPU time in one `up` of a new stack, seconds)] from its Go profile; the first is the whole."""


def spans(path: Path) -> list[dict[str, Any]]:
    """Every span of an OTLP JSON file (`--otel-traces file://`, one export per line), flattened."""
    found = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        for resource_spans in json.loads(line).get("resourceSpans", []):
            attributes = {a["key"]: a["value"].get("stringValue") for a in resource_spans.get("resource", {}).get("attributes", [])}
            for scope in resource_spans.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    found.append({"service": attributes.get("service.name", "?"), "name": span["name"],
                                  "start": int(span["startTimeUnixNano"]) / 1e9, "end": int(span["endTimeUnixNano"]) / 1e9})
    return found


def busy(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of the intervals was open (their union)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


PHASES = (
    "whole `pulumi preview` (the CLI's root span)",
    "CLI start-up, stack and plugins, until the program starts",
    "of which the language host's package checks (GetRequiredPackages, About: each runs Python)",
    "the program's process (language host `execPython`)",
    "during it: the engine handling ≥ 1 registration (RegisterResource in flight)",
    "during it: ≥ 1 provider call in flight (CheckConfig, Check, Diff, Create…)",
    "inside the providers' processes (their own spans, summed)",
    "after the program: the engine's last steps and the CLI's exit",
)


def phases(found: list[dict[str, Any]]) -> dict[str, float]:
    """PHASES of one traced preview, in seconds."""
    def one(name: str, service: str = "pulumi-cli") -> dict[str, Any]:
        return next(s for s in found if s["name"] == name and s["service"] == service)

    root, program = one("pulumi"), one("run-program")
    cli = [s for s in found if s["service"] == "pulumi-cli"]
    packages = [(s["start"], s["end"]) for s in cli if s["name"] in ("pulumirpc.LanguageRuntime/GetRequiredPackages",
                                                                     "pulumirpc.LanguageRuntime/About")]
    registering = [(s["start"], s["end"]) for s in cli if s["name"] == "pulumirpc.ResourceMonitor/RegisterResource"]
    calling = [(s["start"], s["end"]) for s in cli if s["name"].startswith("pulumirpc.ResourceProvider/")]
    inside = sum(s["end"] - s["start"] for s in found if s["service"] == "pulumi-resource-provider")
    return dict(zip(PHASES, (
        root["end"] - root["start"], program["start"] - root["start"], busy(packages), program["end"] - program["start"],
        busy(registering), busy(calling), inside, root["end"] - program["end"],
    ), strict=True))


def program_parts(project: Path) -> tuple[Any, str]:
    """The group function for testbed.bench.attribute over our program's process, and its catch-all."""
    ours = str(project) + "/"
    groups = [
        ("import machinery (a module's top-level code counts for its package)", ("<frozen importlib", "importlib/")),
        ("our program: config load and validation (stacks/, pydantic)", (ours + "stacks/", "site-packages/pydantic")),
        ("our program: spec building (components/, __main__.py)", (ours + "components/", ours + "__main__.py", ours + "policy/")),
        ("Pulumi SDK: registration, input serialisation, outputs", ("site-packages/pulumi/",)),
        ("generated provider SDKs (pulumi_kubernetes, pulumi_command argument classes)",
         ("site-packages/pulumi_kubernetes/", "site-packages/pulumi_command/")),
        ("protobuf and gRPC (the wire to the engine)", ("site-packages/google/", "site-packages/grpc/")),
    ]
    waiting = "waiting: the event loop idle until the engine answers (epoll), or for a worker thread"
    placement = "our program: placement check (stacks/placement.py)"

    def group(function: Any) -> str | None:
        filename, _, name = function
        if "select.epoll" in name or "_thread.lock" in name:
            return waiting
        if filename.startswith(ours + "stacks/placement"):
            return placement
        for label, markers in groups:
            if any(marker in filename for marker in markers) and not (label.startswith("our") and "/venv/" in filename):
                return label
        return None

    return group, "the rest: asyncio and the standard library called from the event loop itself, the exec shim"


# Where the CLI's CPU goes in an `up`, by the cumulative time of these functions in its Go profile
# (`pulumi up --profiling`, read with `go tool pprof -top -cum`).
ENGINE_PARTS = (
    ("saving the whole state (SnapshotManager.saveSnapshot)", "backend.(*SnapshotManager).saveSnapshot"),
    ("of which encoding it as JSON", "diy.compactJSONMarshaler.Marshal"),
    ("of which the MD5 sum of every write (the file backend's .attrs sidecar)", "crypto/md5.(*digest).Write"),
    ("of which copying the previous state to .bak", "diy.backupTarget"),
)


def pprof_seconds(text: str) -> float:
    """`450ms`, `17.02s`, `2.5mins`, `1.1hrs` (pprof's units) in seconds."""
    number, unit = re.fullmatch(r"([0-9.]+)([a-z]+)", text).groups()  # type: ignore[union-attr]
    return float(number) * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "min": 60, "mins": 60, "hr": 3600, "hrs": 3600}[unit]


def engine_parts(top: str) -> list[tuple[str, float]]:
    """ENGINE_PARTS' seconds from `go tool pprof -top -cum` text; first the profile's total samples."""
    total = re.search(r"Total samples = ([0-9.]+[a-z]+)", top)
    if not total:
        raise ValueError("no 'Total samples' line in the profile's top")
    found = [("the CLI's CPU time in the whole `up`", pprof_seconds(total[1]))]
    for label, function in ENGINE_PARTS:
        # flat flat% sum% cum cum% name
        row = next((line.split(None, 5) for line in top.splitlines() if line.rstrip().endswith(function)), None)
        found.append((label, pprof_seconds(row[3]) if row and len(row) == 6 else 0.0))
    return found


def profile_engine_up(program: Run, stack: str, work: Path) -> list[tuple[str, float]]:
    """The CLI's CPU profile of one `up` of `stack` (new), by ENGINE_PARTS; empty without `go` to read it."""
    prefix = work / "cli-profile"
    program.pulumi("up", "--yes", "--skip-preview", "--profiling", str(prefix), stack=stack, timeout=3600)
    cpu = next(work.glob("cli-profile.*.cpu"), None)
    go, pulumi = shutil.which("go", path=program.env.get("PATH")), shutil.which("pulumi", path=program.env.get("PATH"))
    if cpu is None or not go or not pulumi:
        return []
    top = subprocess.run([go, "tool", "pprof", "-top", "-cum", "-nodecount=400", pulumi, str(cpu)],
                         capture_output=True, text=True, check=True, timeout=600, env=program.env).stdout
    return engine_parts(top)


def profile_largest(program: Run, bare: Run, our_stack: str, bare_stack: str, work: Path) -> Profile:
    traces = {}
    for side, run, stack in (("ours", program, our_stack), ("bare", bare, bare_stack)):
        trace = work / f"preview-{side}.otel.json"
        run.pulumi("preview", "--otel-traces", f"file://{trace}", stack=stack, timeout=3600, env=hook_env(work / "hook-trace.jsonl"))
        traces[side] = phases(spans(trace))
        trace.unlink()  # tens of MB for the largest stack (every span carries a stack trace)
    stats = work / "program.prof"
    program.pulumi("preview", stack=our_stack, timeout=3600, env=hook_env(work / "hook-profile.jsonl", stats))
    group, other = program_parts(program.project)
    spent = attribute(stats, group, other)
    ordered = sorted(spent.items(), key=lambda item: -item[1])
    return Profile({phase: {side: traces[side][phase] for side in traces} for phase in PHASES}, ordered, sum(spent.values()))


def profile_largest_up(program: Run, nodes: int, models: int, key: str, work: Path) -> list[tuple[str, float]]:
    """The CLI's CPU profile of one more first `up` of the largest stack, on stand-in hosts of its own."""
    with ssh_standin(node_names(nodes, models), work / "ssh-profiled.jsonl") as ports:
        stack = f"fleet-{nodes}x{models}-profiled"
        program.new_stack(stack, fleet_config(nodes, models, ports, work / "yaml-profiled"), {"sshPrivateKey": key})
        return profile_engine_up(program, stack, work)


# ---------------------------------------------------------------------------- report


def per_resource_above_smallest(rows: list[SizeResult], side: str = "ours") -> list[float | None]:
    """Preview ms per resource above the smallest size (None for the smallest): the slope without the fixed cost."""
    base = rows[0]
    return [None if r is base else
            (r.preview.seconds(side) - base.preview.seconds(side)) * 1000 / (r.shape.resources - base.shape.resources)
            for r in rows]


def growth(rows: list[SizeResult]) -> float | None:
    """The two largest sizes' per-resource preview time above the smallest, larger over smaller (goal ≤ 1.2)."""
    slopes = per_resource_above_smallest(rows)
    if len(rows) < 3 or slopes[-2] is None or slopes[-1] is None or slopes[-2] <= 0:
        return None
    return slopes[-1] / slopes[-2]


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    return f"{os.cpu_count()} cores ({model}), Linux {platform.release()}, Python {platform.python_version()}"


def fmt(pair: Pair) -> tuple[str, str]:
    return f"{pair.seconds('ours'):.2f} / {pair.seconds('bare'):.2f}", f"**{pair.ratio:.2f}×**"


def markdown(rows: list[SizeResult], profile: Profile | None, runs: int, versions: str, chart: str | None,
             links: tuple[tuple[str, str], ...] = (), skip_checkpoints: bool = False) -> str:
    """The section's markdown; `links`: (what, file) of the measurements written beside it."""
    largest = rows[-1]
    replayed = all(row.replay for row in rows)
    lines = [
        "### Fleet scale with `PULUMI_SKIP_CHECKPOINTS=true`" if skip_checkpoints else
        "### Fleet scale: generated stacks on the real engine",
        "",
        *(["Every command below ran with `PULUMI_SKIP_CHECKPOINTS=true`, ours and bare alike: the CLI writes the "
           "state once, at the end, instead of after every step. That is how `preview.yml` runs a pull request's "
           "preview; for `up` it is a trade (README, \"A large fleet\").", ""] if skip_checkpoints else []),
        f"Median of {runs} runs each, ours and bare alternating, on {machine()}; engine: {versions}. Generated as the "
        "offline scaling benchmark generates them (`testbed.bench.generated_stack`: NFS model storage, two disks per "
        "node), the Kubernetes provider writing YAML (`renderYamlTo`), every node's SSH host a stand-in that runs "
        "nothing (`testbed/standins/ssh.py`). The bare program declares as many components, remote Commands (to the "
        "same stand-in hosts, chained per node) and ConfigMaps on a YAML-writing provider as the stack has resources.",
        "",
        "| nodes × models | resources (Commands) | preview: ours / bare (s) | ratio | `up`, new stack: ours / bare (s) | ratio "
        "| no-op `up`: ours / bare (s) | ratio | Commands run by the no-op ups | program's peak memory in preview: ours / bare (MiB) "
        "| state after `up`: ours / bare (MiB) |" + (" preview: ours / the replay (s) | ratio |" if replayed else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if replayed else ""),
    ]
    for row in rows:
        lines.append(
            f"| {row.label} | {row.shape.resources} ({row.shape.commands}) | {' | '.join(fmt(row.preview))} | {' | '.join(fmt(row.up))} "
            f"| {' | '.join(fmt(row.noop))} | {row.noop_commands} "
            f"| {row.preview.peak_mib('ours'):.0f} / {row.preview.peak_mib('bare'):.0f} "
            f"| {row.state_mib[0]:.1f} / {row.state_mib[1]:.1f} |" + (f" {' | '.join(fmt(row.replay))} |" if row.replay else ""))
    slope = growth(rows)
    slopes = per_resource_above_smallest(rows)
    same = largest.noop_changes.get("same", 0)
    lines += [
        "",
        f"- **Preview of {largest.label}: {largest.preview.ratio:.2f}×** the bare program (goal ≤ 1.3×: "
        f"{'met' if largest.preview.ratio <= 1.3 else 'missed'}).",
        "- **Growth**: preview ms per resource above the smallest stack, "
        + ", ".join(f"{r.label}: {s:.1f}" for r, s in zip(rows, slopes, strict=True) if s is not None)
        + (f"; the largest over the next: **{slope:.2f}** (goal ≤ 1.2: {'met' if slope <= 1.2 else 'missed'})."
           if slope is not None else " (needs three sizes for the ratio)."),
        *([f"- **Preview of {largest.label} against the replay: {largest.replay.ratio:.2f}×** (goal ≤ 1.3×: "
           f"{'met' if largest.replay.ratio <= 1.3 else 'missed'}). The replay (`testbed/bench_replay.py`) is the other bare "
           "program: it declares the very resources our program declares (types, names, parents, inputs, secrets, "
           "options), read from a file, and does nothing else; what ours costs above it is our program itself (config, "
           "placement, spec building, imports), what the small bare program saves beside it is the size of our objects."]
          if largest.replay else []),
        f"- **No-op `up` of {largest.label}**: {largest.noop_commands} Commands ran (the stand-in's log), changes "
        f"{json.dumps(largest.noop_changes, sort_keys=True)} ({same} resources left the same; goal: 0 Commands, nothing changed).",
        f"- **Node steps in parallel**: during a first `up` of {largest.label}, the disk steps of **{largest.up_overlap}** of "
        f"{largest.nodes} nodes ran side by side (from each node's first step to its last, in the stand-in's log; median of "
        f"the runs). The engine runs at most `--parallel` operations at once: 4 × the CPUs by default, {4 * (os.cpu_count() or 1)} here.",
        "- Peak memory is that of the process running `__main__.py` (`pulumi-language-python-exec`, measured at its exit "
        "by `testbed/bench_hook`), not the CLI's or the providers'.",
        "- State: `pulumi stack export` of the last new stack's state, written once at the end of the `up`."
        if skip_checkpoints else
        "- State: `pulumi stack export` of the last new stack's state. On a file (or any DIY) backend the CLI writes the "
        "whole state after every step of an `up`, waiting for each write, so an `up` costs about resources × state size "
        "more than a preview; the profile below measures it.",
    ]
    lines += [f"- {what}: [{file}]({file})." for what, file in links]
    if chart:
        lines += ["", f"![real-engine time against stack size]({chart})"]
    if profile is not None:
        lines += profile_markdown(profile, largest.label, "as above, the state written once at the end" if skip_checkpoints
                                  else "the state on the file backend, as in every run above")
    return "\n".join(lines)


def profile_markdown(profile: Profile, label: str, state: str) -> list[str]:
    lines = [
        "",
        f"#### Where the {label} preview's time goes",
        "",
        "One traced preview of each program (`pulumi preview --otel-traces file://…`: the CLI's, the language host's, "
        "the Python SDK's and the providers' spans), wall seconds:",
        "",
        "| phase | ours (s) | bare (s) |",
        "|---|---|---|",
        *[f"| {phase} | {times['ours']:.2f} | {times['bare']:.2f} |" for phase, times in profile.phases.items()],
        "",
        f"Our program's process under cProfile (one more preview, {profile.profiled_seconds:.1f} s of its main thread under "
        "the profiler, which slows the Python side; shares are what counts). Time in built-ins and the standard library "
        "counts for the code that called them:",
        "",
        "| part | seconds | share |",
        "|---|---|---|",
        *[f"| {part} | {seconds:.2f} | {seconds / profile.profiled_seconds:.0%} |" for part, seconds in profile.program],
    ]
    if profile.engine:
        whole = profile.engine[0][1]
        lines += [
            "",
            f"The CLI's CPU in one more `up` of a new {label} stack (`pulumi up --profiling`, its Go CPU profile read with "
            f"`go tool pprof -top -cum`; {state}):",
            "",
            "| part | CPU seconds | share |",
            "|---|---|---|",
            *[f"| {part} | {seconds:.2f} | {seconds / whole:.0%} |" for part, seconds in profile.engine],
        ]
    return lines


def chart(rows: list[SizeResult], path: Path, title: str = "Real engine: generated stacks against a bare program") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=100)
    resources = [r.shape.resources for r in rows]
    for label, attr, colour in (("preview", "preview", "tab:blue"), ("up, new stack", "up", "tab:orange"),
                                ("no-op up", "noop", "tab:green")):
        axis.plot(resources, [getattr(r, attr).seconds("ours") for r in rows], marker="o", color=colour, label=f"{label}: ours")
        axis.plot(resources, [getattr(r, attr).seconds("bare") for r in rows], marker="x", linestyle="--", color=colour,
                  label=f"{label}: bare")
    axis.set_xscale("log")
    axis.set_xlabel("resources declared (log scale)")
    axis.set_ylabel("wall time, s (median)")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, metadata={"Software": None})
    plt.close(figure)


# ---------------------------------------------------------------------------- the section


def fleet_key(work: Path) -> str:
    """A throwaway SSH key for the stand-in hosts (which let anyone in), made once per work folder."""
    key_file = work / "fleet-key"
    if not key_file.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
    return key_file.read_text()


def fleet(program: Run, bare: Run, sizes: list[tuple[int, int]], runs: int, work: Path,
          *, profile: bool, replay: Run | None = None) -> tuple[list[SizeResult], Profile | None]:
    """Every size, smallest first; then the profile of the largest preview."""
    key = fleet_key(work)
    rows = []
    for nodes, models in sizes:
        print(f"fleet {nodes}x{models}: preview, up, no-op up, {runs} runs each", flush=True)
        rows.append(measure_size(nodes, models, program, bare, runs, key, work, warm_up=not rows, replay=replay))
    found = None
    if profile:
        nodes, models = sizes[-1]
        name = f"fleet-{nodes}x{models}"
        # Preview dials no node: the stand-in the stacks name is gone by now, and not needed.
        found = profile_largest(program, bare, f"{name}-preview", f"{name}-bare-preview", work / name)
        found.engine = profile_largest_up(program, nodes, models, key, work / name)
    return rows, found
