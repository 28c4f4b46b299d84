"""Measuring one fleet size: the generated stack and the bare program of as many resources, each previewed,
brought up and brought up again with nothing to do, alternating, on stand-in SSH hosts that run nothing."""

from __future__ import annotations

import json
import os
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
from testbed.bench import generated_stack
from testbed.e2e.run import Run, rendering, stack_yaml
from testbed.standins.ssh import chains, overlapping_nodes, read_log
from tools.render import ROOT

SIZES = [(1, 1), (8, 16), (32, 100)]
"""(nodes, models) of the full run."""
QUICK_SIZES = [(2, 3)]
"""`--quick` (and make e2e's bench-engine-quick): one size shows the machinery works, every step of it (the
stand-in hosts, previews, ups and no-op ups, the replay, both profiles) at two nodes and three models; a second
size only adds the slope between them, which the full run measures and the unit tests compute."""
HOOK = ROOT / "testbed" / "bench_hook"
SYSTEM_PYTHON = os.environ.get("GS_SYSTEM_PYTHON", "/usr/bin/python3")
"""Debian's python3, which has python3-asyncssh for the SSH stand-in."""
REPLAYED = "replay.json"
"""What the offline render declares, for testbed/bench_replay.py (written by `shape_of`)."""
SKIP_CHECKPOINTS = {"PULUMI_SKIP_CHECKPOINTS": "true"}
"""The CLI writes the state once, at the end, instead of after every step (docs/fleets.md, "A large fleet")."""


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
        process = subprocess.Popen([SYSTEM_PYTHON, "-m", "testbed.standins.ssh", "--nodes", ",".join(nodes), "--log", str(log),
                                    "--files", str(log.with_suffix(".files"))],
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



def fleet_key(work: Path) -> str:
    """A throwaway SSH key for the stand-in hosts (which let anyone in), made once per work folder."""
    key_file = work / "fleet-key"
    if not key_file.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
    return key_file.read_text()
