"""Where the time of the largest size goes: the engine's spans of a preview of both programs, a cProfile of
our program's process, the engine's spans of a no-op `up` of both programs, and the CLI's Go CPU profile of
one more first `up`.

cProfile sees the main thread only, where the program and the SDK's serialisation run; the worker
threads only wait on gRPC calls, whose other end the engine's spans show."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.bench import attribute
from testbed.bench_fleet.measure import fleet_config, hook_env, node_names, ssh_standin
from testbed.e2e.run import Run


@dataclass
class Profile:
    phases: dict[str, dict[str, float]]
    """{phase: {"ours": s, "bare": s}} from the engine's spans."""
    program: list[tuple[str, float]]
    """[(part of our program's process, seconds)] from cProfile."""
    profiled_seconds: float
    engine: list[tuple[str, float]] = field(default_factory=list)
    """[(part of the CLI's CPU time in one `up` of a new stack, seconds)] from its Go profile; the first is the whole."""
    state: list[tuple[str, int, int]] = field(default_factory=list)
    """[(part of the state after a first `up`, resources, bytes)] of each program (`state_parts`)."""
    noop: dict[str, dict[str, float]] = field(default_factory=dict)
    """{phase: {"ours": s, "bare": s}} of a no-op `up` of each program's last stack, from the engine's spans."""


STATE_PARTS = 8
"""Resource types listed one by one in the state's breakdown, largest first; the rest are summed."""


def state_parts(exports: dict[str, dict[str, Any]]) -> list[tuple[str, int, int]]:
    """Where the bytes of each program's exported state (`pulumi stack export`, by side) are: its largest resource
    types, the rest, and across all of them the stack traces the SDK records where each resource was declared."""
    parts: list[tuple[str, int, int]] = []
    for side, exported in exports.items():
        resources = exported["deployment"].get("resources") or []
        by_type: dict[str, list[int]] = {}
        for resource in resources:
            count_size = by_type.setdefault(resource["type"], [0, 0])
            count_size[0] += 1
            count_size[1] += len(json.dumps(resource))
        ordered = sorted(by_type.items(), key=lambda item: -item[1][1])
        parts += [(f"{side}: {kind}", count, size) for kind, (count, size) in ordered[:STATE_PARTS]]
        rest = ordered[STATE_PARTS:]
        if rest:
            parts.append((f"{side}: {len(rest)} other types", sum(c for _, (c, _) in rest), sum(b for _, (_, b) in rest)))
        traces = [len(json.dumps(r["stackTrace"])) for r in resources if r.get("stackTrace")]
        parts.append((f"{side}: of all the above, the SDK's stack traces", len(traces), sum(traces)))
    return parts


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
    "the whole command (the CLI's root span)",
    "CLI start-up, stack and plugins, until the program starts",
    "of which the language host's package checks (GetRequiredPackages, About: each runs Python)",
    "the program's process (language host `execPython`)",
    "during it: the engine handling ≥ 1 registration (RegisterResource in flight)",
    "during it: ≥ 1 provider call in flight (CheckConfig, Check, Diff, Create…)",
    "inside the providers' processes (their own spans, summed)",
    "after the program: the engine's last steps and the CLI's exit",
)


def phases(found: list[dict[str, Any]]) -> dict[str, float]:
    """PHASES of one traced command, in seconds."""
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


def traced(program: Run, bare: Run, args: tuple[str, ...], our_stack: str, bare_stack: str, work: Path) -> dict[str, dict[str, float]]:
    """{phase: {"ours": s, "bare": s}}: PHASES of one traced run of `pulumi <args>` on each program's stack."""
    traces = {}
    for side, run, stack in (("ours", program, our_stack), ("bare", bare, bare_stack)):
        trace = work / f"{args[0]}-{side}.otel.json"
        run.pulumi(*args, "--otel-traces", f"file://{trace}", stack=stack, timeout=3600, env=hook_env(work / "hook-trace.jsonl"))
        traces[side] = phases(spans(trace))
        trace.unlink()  # tens of MB for the largest stack (every span carries a stack trace)
    return {phase: {side: traces[side][phase] for side in traces} for phase in PHASES}


def profile_noop_up(program: Run, bare: Run, our_stack: str, bare_stack: str, work: Path) -> dict[str, dict[str, float]]:
    """PHASES of one more traced no-op `up` of each program's stack (both up already). It runs no Command,
    so the stand-in hosts need not run."""
    return traced(program, bare, ("up", "--yes", "--skip-preview", "--expect-no-changes"), our_stack, bare_stack, work)


def profile_largest(program: Run, bare: Run, our_stack: str, bare_stack: str, work: Path) -> Profile:
    found = traced(program, bare, ("preview",), our_stack, bare_stack, work)
    stats = work / "program.prof"
    program.pulumi("preview", stack=our_stack, timeout=3600, env=hook_env(work / "hook-profile.jsonl", stats))
    group, other = program_parts(program.project)
    spent = attribute(stats, group, other)
    ordered = sorted(spent.items(), key=lambda item: -item[1])
    return Profile(found, ordered, sum(spent.values()))


def profile_largest_up(program: Run, nodes: int, models: int, key: str, work: Path) -> list[tuple[str, float]]:
    """The CLI's CPU profile of one more first `up` of the largest stack, on stand-in hosts of its own."""
    with ssh_standin(node_names(nodes, models), work / "ssh-profiled.jsonl") as ports:
        stack = f"fleet-{nodes}x{models}-profiled"
        program.new_stack(stack, fleet_config(nodes, models, ports, work / "yaml-profiled"), {"sshPrivateKey": key})
        return profile_engine_up(program, stack, work)
