"""make bench-engine: the program's cost under the real Pulumi engine, into bench-out/benchmarks-engine.md.

    python -m testbed.bench_engine                 # make bench-engine (needs make engine; boots lab VMs)
    python -m testbed.bench_engine --update-docs   # into docs/ (tracked); --out F: elsewhere
    python -m testbed.bench_engine --quick         # 1 run, fleet size 2×3, no VM (~2 min): checks
                                                   # the benchmark works, figures too noisy to publish

Measured in one run, so the ratios hold on any machine:
- `pulumi preview` of the prod stack against a bare program that declares the same number of
  resources (ConfigMaps, same engine, same kubernetes provider writing YAML) with no logic;
- `pulumi up` with nothing to do, of the lab stack (its node is a throwaway VM) against the bare
  program again;
- fleet scale (testbed/bench_fleet/): generated stacks of 1×1, 8×16 and 32×100 nodes × models,
  preview, up and no-op up against a bare program, the largest preview profiled, and a chart; then
  the same with PULUMI_SKIP_CHECKPOINTS=true (as pull requests preview), previews also against a
  replay of our resources (testbed/bench_replay.py), into a file of its own;
- node steps of two lab VMs under one `pulumi up`, and under `--parallel 1` (testbed/bench_parallel.py).
`make bench` includes the file this writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed import bench_fleet, bench_parallel, bench_replay
from testbed.bench import BENCH_OUT, output_folder
from testbed.e2e.run import Run, copy_project, engine_env, rendering, stack_raw
from tools.render import run_program

NAME = "benchmarks-engine.md"
CLUSTER_NAME = "benchmarks-engine-cluster.md"
SKIP_NAME = "benchmarks-engine-skip-checkpoints.md"
VMS_NAME = "benchmarks-engine-two-vms.md"
LINKS = (("The largest stack against the loopback cluster instead of YAML", CLUSTER_NAME),
         ("Node steps of two real machines (lab VMs) at once", VMS_NAME),
         ("The same stacks with `PULUMI_SKIP_CHECKPOINTS=true`, as pull requests preview them", SKIP_NAME))
SKIP_CHART = "benchmarks-engine-scaling-skip-checkpoints.png"
BARE_PROGRAM = '''\
import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

config = pulumi.Config()
count, commands = int(config.require("count")), int(config.require("commands"))
provider = k8s.Provider("yaml", render_yaml_to_directory=config.require("folder"))
for i in range(commands):
    command.local.Command(f"cmd-{i}", create="true")
for i in range(count - commands):
    k8s.core.v1.ConfigMap(f"cm-{i}", metadata={"name": f"cm-{i}"}, data={"i": str(i)},
                          opts=pulumi.ResourceOptions(provider=provider))
'''


def bare_project(folder: Path) -> Path:
    """A program with no logic and the same providers: `commands` local Commands (each runs `true`),
    the rest of `count` ConfigMaps on a YAML-writing kubernetes provider."""
    return bench_fleet.bare_project(folder, BARE_PROGRAM)


def shape(render: Any) -> tuple[int, int]:
    """(resources, of which SSH Commands) a render declares."""
    return len(render.resources), len(render.of_type("command:remote:Command"))


def seconds(run: Run, *args: str, stack: str) -> float:
    start = time.monotonic()
    run.pulumi(*args, stack=stack, timeout=3600)
    return time.monotonic() - start


def median_pair(first: tuple[Run, tuple[str, ...], str], second: tuple[Run, tuple[str, ...], str], runs: int) -> tuple[float, float]:
    """Alternate the two commands, so a slow minute of the machine hits both alike."""
    a, b = [], []
    for _ in range(runs):
        a.append(seconds(first[0], *first[1], stack=first[2]))
        b.append(seconds(second[0], *second[1], stack=second[2]))
    return statistics.median(a), statistics.median(b)


def markdown(resources: int, preview: tuple[float, float], lab: tuple[int, int] | None, noop: tuple[float, float] | None,
             versions: str, runs: int) -> str:
    rows = [
        f"| `pulumi preview` of the prod stack ({resources} resources, policy pack off) | {preview[0]:.2f} | {preview[1]:.2f} | "
        f"**{preview[0] / preview[1]:.2f}×** (target ≤ 1.3×) |",
    ]
    if lab is not None and noop is not None:
        rows.append(f"| `pulumi up` with nothing to do, lab stack ({lab[0]} resources, {lab[1]} node steps) | {noop[0]:.2f} | "
                    f"{noop[1]:.2f} | {noop[0] / noop[1]:.2f}× |")
    return "\n".join([
        f"Written by `make bench-engine` (`python -m testbed.bench_engine`); median of {runs} runs each, alternating, "
        f"on {os.cpu_count()} cores; engine: {versions}.",
        "",
        "| command | this program (s) | bare program, same resource count (s) | ratio |",
        "|---|---|---|---|",
        *rows,
        "",
        "The bare program declares as many resources as the stack (components included), as many of them Commands "
        "as the stack has node steps (local ones that run `true`, through the same command provider) and the rest "
        "ConfigMaps on the same YAML-writing kubernetes provider, through the same CLI and language host. A no-op "
        "`pulumi up` runs no Command: the node steps' inputs are unchanged, so the engine only diffs them.",
    ])


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`1x1,8x16`: (nodes, models) pairs."""
    return [(int(nodes), int(models)) for nodes, models in (size.split("x") for size in text.split(","))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.bench_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, help="runs of each command (default 5; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="1 run, small fleet sizes, no VM: checks the benchmark works")
    parser.add_argument("--sizes", type=parse_sizes, help="fleet sizes, nodes x models: 1x1,8x16,32x100 (the default)")
    parser.add_argument("--update-docs", action="store_true", help=f"write docs/{NAME} (tracked) instead of bench-out/{NAME}")
    parser.add_argument("--out", type=Path, help=f"markdown file (default bench-out/{NAME}); the chart goes beside it")
    parser.add_argument("--cluster-only", action="store_true",
                        help=f"only the largest size's up on the loopback cluster, into {CLUSTER_NAME} beside --out "
                             "(a full run does it after the rest)")
    parser.add_argument("--two-vms-only", action="store_true",
                        help=f"only the node steps of two lab VMs under one up, into {VMS_NAME} beside --out "
                             "(a full run does it after the cluster)")
    parser.add_argument("--main-only", action="store_true",
                        help=f"only the prod figures and the fleet table, chart and profiles into --out: not {CLUSTER_NAME}, "
                             f"{VMS_NAME} or {SKIP_NAME} (each has its -only option)")
    parser.add_argument("--skip-checkpoints-only", action="store_true",
                        help=f"only the fleet section with PULUMI_SKIP_CHECKPOINTS=true, into {SKIP_NAME} beside --out "
                             "(every run does it after the rest)")
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.sizes = args.sizes or (bench_fleet.QUICK_SIZES if args.quick else bench_fleet.SIZES)
    args.out = args.out or output_folder(None, args.update_docs) / NAME
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from testbed.vm import DEFAULT_DISKS, Vm, ensure_image

    if args.cluster_only:
        return cluster_only(args)
    if args.skip_checkpoints_only:
        skip_checkpoints(args)
        return 0
    if args.two_vms_only:
        two_vms(args)
        return 0
    tmp, program = scratch()
    env = program.env
    bare = Run(tmp / "bare-run", env, tmp)
    bare_project(bare.project)
    vm = None if args.quick else Vm(tmp / "vm", DEFAULT_DISKS, image=ensure_image())
    lab = noop = None
    try:
        versions = engine_versions(program)
        prod = rendering(stack_raw("prod"), tmp / "yaml-prod")
        # Two roles may not share a value (the program refuses it): distinct placeholders, never dialled by a preview.
        program.new_stack("prod", prod, {"sshPrivateKey": "unused-private-key", "sshHostKeyWorker02": "unused-host-key"})
        resources, commands = shape(run_program("prod", stack_file=program.project / "Pulumi.prod.yaml"))
        bare.pulumi("stack", "init", "bare", "--secrets-provider", "passphrase")
        for key, value in (("count", str(resources)), ("commands", str(commands)), ("folder", str(tmp / "yaml-bare"))):
            bare.pulumi("config", "set", key, value, stack="bare")
        for run, stack in ((program, "prod"), (bare, "bare")):
            run.pulumi("preview", stack=stack, timeout=3600)  # untimed: writes the bytecode caches (bench_fleet.bench_env)
        preview = median_pair((program, ("preview",), "prod"), (bare, ("preview",), "bare"), args.runs)
        if vm is not None:
            lab, noop = lab_noop_up(program, bare, vm, tmp, args.runs)
            vm.stop()  # the fleet section needs no VM: its CPU goes back to the engine
        fleet_bare = Run(tmp / "fleet-bare-run", env, tmp)
        bench_fleet.bare_project(fleet_bare.project)
        rows, profile = bench_fleet.fleet(program, fleet_bare, args.sizes, args.runs, tmp, profile=True)
        if not args.quick and not args.main_only:
            on_cluster = bench_fleet.cluster_up(program, *args.sizes[-1], bench_fleet.fleet_key(tmp), tmp)
            (args.out.parent / CLUSTER_NAME).write_text(bench_fleet.cluster_markdown(on_cluster) + "\n")
    finally:
        if vm is not None:
            vm.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    chart = args.out.parent / bench_fleet.CHART
    bench_fleet.chart(rows, chart)
    report = markdown(resources, preview, lab, noop, versions, args.runs)
    fleet = bench_fleet.markdown(rows, profile, args.runs, versions, chart.name, LINKS[2:] if args.quick else LINKS)
    args.out.write_text(f"{report}\n\n{fleet}\n")
    raw = BENCH_OUT / "benchmarks-engine-fleet.json"  # the figures behind the section, to read or re-render
    raw.parent.mkdir(exist_ok=True)
    raw.write_text(json.dumps({"rows": [dataclasses.asdict(row) for row in rows],
                               "profile": dataclasses.asdict(profile) if profile else None}, indent=1))
    largest = rows[-1]
    print(f"wrote {args.out} and {chart.name}: prod preview {preview[0] / preview[1]:.2f}x the bare program; "
          f"{largest.label}: preview {largest.preview.ratio:.2f}x, up {largest.up.ratio:.2f}x, no-op up {largest.noop.ratio:.2f}x, "
          f"{largest.noop_commands} Commands run by the no-op ups")
    if args.main_only:
        return 0
    if not args.quick:
        two_vms(args)
    skip_checkpoints(args)
    return 0


def two_vms(args: argparse.Namespace) -> None:
    """testbed/bench_parallel.py in a scratch of its own: into VMS_NAME beside --out."""
    tmp, program = scratch()
    try:
        runs = bench_parallel.measure(program, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = args.out.parent / VMS_NAME
    out.write_text(bench_parallel.markdown(runs) + "\n")
    print(f"wrote {out}: " + "; ".join(f"--parallel {up.parallel}: both VMs ran a step for {up.together:.0f} of {up.seconds:.0f} s"
                                         for up in runs))


def skip_checkpoints(args: argparse.Namespace) -> None:
    """The fleet section again, every command with PULUMI_SKIP_CHECKPOINTS=true (as `preview.yml` previews), in a
    scratch of its own, previews also against the replay (testbed/bench_replay.py): into SKIP_NAME and SKIP_CHART
    beside --out."""
    tmp, program = scratch(bench_fleet.SKIP_CHECKPOINTS)
    try:
        versions = engine_versions(program)
        bare = Run(tmp / "fleet-bare-run", program.env, tmp)
        bench_fleet.bare_project(bare.project)
        replay = Run(tmp / "fleet-replay-run", program.env, tmp)
        bench_fleet.bare_project(replay.project, bench_replay.PROGRAM)
        rows, profile = bench_fleet.fleet(program, bare, args.sizes, args.runs, tmp, profile=True, replay=replay)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    chart = args.out.parent / SKIP_CHART
    bench_fleet.chart(rows, chart, "Real engine, PULUMI_SKIP_CHECKPOINTS=true: generated stacks against a bare program")
    out = args.out.parent / SKIP_NAME
    out.write_text(bench_fleet.markdown(rows, profile, args.runs, versions, chart.name, skip_checkpoints=True) + "\n")
    largest = rows[-1]
    print(f"wrote {out} and {chart.name}: with PULUMI_SKIP_CHECKPOINTS=true, {largest.label}: preview "
          f"{largest.preview.ratio:.2f}x, up {largest.up.ratio:.2f}x, no-op up {largest.noop.ratio:.2f}x the bare program; "
          f"preview {largest.replay.ratio if largest.replay else 0:.2f}x the replay")


def engine_versions(program: Run) -> str:
    env = program.env
    return ", ".join(f"{k} {v}" for k, v in (("pulumi", program.pulumi("version").stdout.strip()),
                                             ("kubernetes", env["KUBERNETES_VERSION"]), ("command", env["COMMAND_VERSION"])))


def scratch(extra: dict[str, str] | None = None) -> tuple[Path, Run]:
    """A temporary project copy with its own file backend, and the Run that drives the engine in it (with `extra`
    in its environment)."""
    tmp = Path(tempfile.mkdtemp(prefix="gs-bench-engine-"))
    inherited = {key: value for key, value in os.environ.items() if key not in bench_fleet.SKIP_CHECKPOINTS}
    env = bench_fleet.bench_env({**inherited, **engine_env(), "PULUMI_BACKEND_URL": f"file://{tmp / 'state'}",
                                 "PULUMI_CONFIG_PASSPHRASE": secrets.token_urlsafe(24), **(extra or {})}, tmp)
    env.pop("SSH_AUTH_SOCK", None)
    (tmp / "state").mkdir()
    (tmp / "project").mkdir()
    copy_project(tmp / "project")
    return tmp, Run(tmp, env, tmp)


def cluster_only(args: argparse.Namespace) -> int:
    tmp, program = scratch()
    try:
        result = bench_fleet.cluster_up(program, *args.sizes[-1], bench_fleet.fleet_key(tmp), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = args.out.parent / CLUSTER_NAME
    out.write_text(bench_fleet.cluster_markdown(result) + "\n")
    print(f"wrote {out}: {result.label} on the loopback cluster, up {result.up_seconds:.0f} s, no-op up {result.noop_seconds:.0f} s, "
          f"{result.noop_commands} Commands run by the no-op up")
    return 0


def lab_noop_up(program: Run, bare: Run, vm: Any, tmp: Path, runs: int) -> tuple[tuple[int, int], tuple[float, float]]:
    """((resources, node steps) of the lab stack, no-op up seconds (ours, bare)) on the lab VM."""
    vm.start()
    lab = rendering(stack_raw("lab"), tmp / "yaml-lab")
    lab["nodes"][0]["ssh"]["port"] = vm.port
    program.new_stack("lab", lab, {"sshPrivateKey": vm.key_path.read_text()})
    lab_resources, lab_commands = shape(run_program("lab", stack_file=program.project / "Pulumi.lab.yaml"))
    bare.pulumi("config", "set", "count", str(lab_resources), stack="bare")
    bare.pulumi("config", "set", "commands", str(lab_commands), stack="bare")
    program.pulumi("up", "--yes", "--skip-preview", stack="lab", timeout=3600)
    bare.pulumi("up", "--yes", "--skip-preview", stack="bare")
    noop = median_pair((program, ("up", "--yes", "--skip-preview", "--expect-no-changes"), "lab"),
                       (bare, ("up", "--yes", "--skip-preview", "--expect-no-changes"), "bare"), runs)
    return (lab_resources, lab_commands), noop


if __name__ == "__main__":
    sys.exit(main())
