"""The fleet section's markdown and chart, from what measure.py, loopback.py and profiling.py found."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from testbed.bench_fleet.loopback import ClusterResult
from testbed.bench_fleet.measure import Pair, SizeResult
from testbed.bench_fleet.profiling import Profile

CHART = "benchmarks-engine-scaling.png"


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
           "preview; for `up` it is a trade (docs/fleets.md, \"A large fleet\").", ""] if skip_checkpoints else []),
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
        ("- **Growth**: preview ms per resource above the smallest stack, "
         + ", ".join(f"{r.label}: {s:.1f}" for r, s in zip(rows, slopes, strict=True) if s is not None)
         + (f"; the largest over the next: **{slope:.2f}** (goal ≤ 1.2: {'met' if slope <= 1.2 else 'missed'})."
            if slope is not None else " (needs three sizes for the ratio).")) if len(rows) > 1 else
        "- **Growth**: one size measured, so no slope (it needs two sizes, the ratio three).",
        *([f"- **Preview of {largest.label} against the replay: {largest.replay.ratio:.2f}×** (goal ≤ 1.3×: "
           f"{'met' if largest.replay.ratio <= 1.3 else 'missed'}). The replay (`testbed/bench_replay.py`) is the other bare "
           "program: it declares the very resources our program declares (types, names, parents, inputs, secrets, "
           "options), read from a file, and does nothing else; what ours costs above it is our program itself (config, "
           "placement, spec building, imports), what the small bare program saves beside it is the size of our objects."]
          if largest.replay else []),
        f"- **No-op `up` of {largest.label}**: {largest.noop_commands} Commands ran (the stand-in's log), changes "
        f"{json.dumps(largest.noop_changes, sort_keys=True)} ({same} resources left the same; goal: 0 Commands, nothing changed).",
        "- Each goal, what a miss comes from (the profiles below) and what would close it: "
        "[docs/fleets.md](fleets.md#the-goals-one-by-one).",
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
    if profile.noop:
        lines += [
            "",
            f"One more no-op `up` of each program's last {label} stack, traced the same way (`--expect-no-changes`; it runs "
            "no Command), wall seconds:",
            "",
            "| phase | ours (s) | bare (s) |",
            "|---|---|---|",
            *[f"| {phase} | {times['ours']:.2f} | {times['bare']:.2f} |" for phase, times in profile.noop.items()],
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
    if profile.state:
        totals = {side: sum(size for part, _, size in profile.state if part.startswith(f"{side}: ") and "stack traces" not in part)
                  for side in ("ours", "bare")}
        lines += [
            "",
            f"The state after the last first `up` of {label}, each program's (`pulumi stack export`; a resource's bytes are its "
            "inputs, its outputs, its dependencies and the stack trace of where it was declared):",
            "",
            "| part | resources | KiB each | MiB | share of that program's state |",
            "|---|---|---|---|---|",
            *[f"| {part} | {count} | {size / max(count, 1) / 1024:.1f} | {size / 2**20:.2f} | "
              f"{size / max(totals[part.split(':')[0]], 1):.0%} |" for part, count, size in profile.state],
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
