"""The fleet section of `make bench-engine` (testbed/bench_fleet/) and what it stands on: node steps of
different nodes wait for each other only where the runtime chain says so, the SSH stand-in runs nothing,
the hook reports only on the program's process, and the report's arithmetic. The quick benchmark itself
needs the built engine: `make e2e` runs it (check bench-engine-quick, GS_ENGINE_TESTS=1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.node.steps import RUNTIME_STEP
from stacks.config import parse
from testbed import bench_engine
from testbed.bench import generated_stack
from testbed.bench_fleet.loopback import CLUSTER_NODE, ClusterResult, cluster_config
from testbed.bench_fleet.measure import (
    QUICK_SIZES,
    SYSTEM_PYTHON,
    Pair,
    Sample,
    Shape,
    SizeResult,
    bench_env,
    disk_chains_overlapping,
    hook_env,
    node_names,
    peak_mib,
    ssh_standin,
)
from testbed.bench_fleet.profiling import (
    PHASES,
    STATE_PARTS,
    Profile,
    busy,
    engine_parts,
    phases,
    pprof_seconds,
    program_parts,
    spans,
    state_parts,
)
from testbed.bench_fleet.report import CHART, cluster_markdown, growth, markdown
from testbed.e2e.run import rendering
from testbed.standins.ssh import chains, overlapping_nodes, read_log, step_of
from tools.render import ROOT, Render, run_program

# ---------------------------------------------------------------------------- node steps in parallel


def render_generated(nodes: int, models: int, tmp_path: Path, without_runtime: tuple[int, ...] = ()) -> Render:
    """The generated stack, the nodes at `without_runtime` with no runtime step (containerRuntime: none)."""
    document = generated_stack(models, nodes)
    for i in without_runtime:
        document["config"]["gpu-serving:nodes"][i]["containerRuntime"] = "none"
    stack_file = tmp_path / "Pulumi.fleet.yaml"
    stack_file.write_text(yaml.safe_dump(document))
    return run_program("fleet", stack_file=stack_file)


def waits_for(render: Render) -> dict[str, set[str]]:
    """Each resource's URN → every resource it waits for, directly or through others (a dependency on a
    component is one on everything inside it, as the engine has it)."""
    children: dict[str, list[str]] = {}
    for r in render.resources:
        children.setdefault(r.parent, []).append(r.urn)

    def inside(urn: str) -> set[str]:
        found = {urn}
        for child in children.get(urn, []):
            found |= inside(child)
        return found

    direct = {r.urn: {d for dep in r.options.get("dependsOn", []) for d in inside(dep)} for r in render.resources}
    closed: dict[str, set[str]] = {}

    def close(urn: str) -> set[str]:
        if urn not in closed:
            closed[urn] = set()
            for dep in direct.get(urn, ()):
                closed[urn] |= {dep} | close(dep)
        return closed[urn]

    return {urn: close(urn) for urn in direct}


def node_and_step(command: Any) -> tuple[str, str]:
    node, _, step = command.name.partition(":")
    return node, step


@pytest.mark.parametrize("without_runtime", [(), (1,)], ids=["every node", "the second node without a runtime step"])
def test_node_steps_of_different_nodes_wait_only_on_the_runtime_chain(without_runtime: tuple[int, ...], tmp_path: Path) -> None:
    render = render_generated(4, 2, tmp_path, without_runtime)
    commands = {c.urn: c for c in render.of_type("command:remote:Command")}
    nodes = sorted({node_and_step(c)[0] for c in commands.values()})
    assert len(nodes) >= 2, "the check needs two nodes at least"
    runtime = {node_and_step(c)[0]: urn for urn, c in commands.items() if node_and_step(c)[1] == RUNTIME_STEP}
    waits = waits_for(render)
    for urn, command in commands.items():
        node, step = node_and_step(command)
        others = {d for d in waits[urn] if d in commands and node_and_step(commands[d])[0] != node}
        if step != RUNTIME_STEP:
            assert not others, f"{command.name} waits for {sorted(commands[o].name for o in others)} of other nodes"
            continue
        # By design: one node's runtime restart at a time, in node-name order, and nothing else of other nodes.
        previous = [n for n in nodes if n < node and n in runtime]
        assert others == {runtime[n] for n in previous}, f"{command.name} waits for {sorted(commands[o].name for o in others)}"
        direct = {d for d in command.options.get("dependsOn", []) if d in commands and node_and_step(commands[d])[0] != node}
        assert direct == ({runtime[previous[-1]]} if previous else set())


def test_a_models_deployment_waits_for_the_labels_of_the_nodes_it_selects_and_no_node_waits_for_a_model(tmp_path: Path) -> None:
    # Without it a fleet's first up stalled: 8 Deployments awaiting pods no unlabelled node would take held
    # all 8 of the engine's slots, and the node steps that label the nodes waited behind them.
    document = generated_stack(3, 3)
    document["config"]["gpu-serving:nodes"][2]["gpu"]["product"] = "nvidia-l4"
    document["config"]["gpu-serving:models"][2]["gpuProduct"] = "nvidia-l4"
    stack_file = tmp_path / "Pulumi.fleet.yaml"
    stack_file.write_text(yaml.safe_dump(document))
    render = run_program("fleet", stack_file=stack_file)
    patches = {r.name.removesuffix("-gpu"): r.urn for r in render.of_type("kubernetes:core/v1:NodePatch")}
    deployments = {r.name.removesuffix("-deployment"): r for r in render.of_type("kubernetes:apps/v1:Deployment")}
    assert sorted(patches) == ["gpu-00", "gpu-01", "gpu-02"] and len(deployments) == 3
    for model, nodes in (("model-000", {"gpu-00", "gpu-01"}), ("model-001", {"gpu-00", "gpu-01"}), ("model-002", {"gpu-02"})):
        direct = set(deployments[model].options.get("dependsOn", []))
        assert {n for n, urn in patches.items() if urn in direct} == nodes, model
    waits = waits_for(render)
    for command in render.of_type("command:remote:Command"):
        assert not waits[command.urn] & {d.urn for d in deployments.values()}, command.name


# ---------------------------------------------------------------------------- the SSH stand-in


def test_overlap_counts_nodes_not_sessions() -> None:
    def s(node: str, start: float, end: float) -> dict[str, Any]:
        return {"node": node, "step": "-", "start": start, "end": end}

    assert overlapping_nodes([s("a", 0, 2), s("b", 1, 3), s("a", 2.5, 4), s("c", 4.5, 5)]) == 2
    assert overlapping_nodes([s("a", 0, 3), s("a", 1, 2)]) == 1  # two sessions of one node are one node
    assert overlapping_nodes([s("a", 0, 1), s("b", 1, 2)]) == 1  # touching is not overlapping
    assert overlapping_nodes([]) == 0


def test_disk_steps_side_by_side_are_counted_per_node_within_one_up() -> None:
    def s(node: str, step: str, start: float) -> dict[str, Any]:
        return {"node": node, "step": step, "start": start, "end": start + 0.01}

    # gpu-00 and gpu-01 interleave, gpu-02 starts after both finished; the runtime steps and the
    # sessions of another up (outside the window) do not count.
    sessions = [s("gpu-00", "10-preflight", 1), s("gpu-01", "10-preflight", 1.5), s("gpu-00", "20-partition", 2),
                s("gpu-01", "20-partition", 2.5), s("gpu-02", "10-preflight", 3), s("gpu-02", "80-runtime", 1.2),
                s("gpu-02", "20-partition", 3.5), s("gpu-03", "10-preflight", 20), s("gpu-00", "30-raid", 21)]
    assert disk_chains_overlapping(sessions, (0, 10)) == 2
    assert [c["node"] for c in chains(sessions[:2])] == ["gpu-00", "gpu-01"]


def test_step_names_come_from_the_rendered_script_header(prod: Render) -> None:
    command = prod.of_type("command:remote:Command")[0]
    assert step_of(command.inputs["create"]) == command.name.partition(":")[2]
    assert step_of("true") == "-"


def system_python_has_asyncssh() -> bool:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import asyncssh"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists() or not system_python_has_asyncssh(),
                    reason="needs Debian's python3-asyncssh (bash testbed/vm/install-host-deps.sh)")
def test_ssh_standin_answers_every_exec_and_runs_nothing(tmp_path: Path, prod: Render) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    log, marker = tmp_path / "sessions.jsonl", tmp_path / "ran"
    script = prod.of_type("command:remote:Command")[0].inputs["create"] + f"\ntouch {marker}\n"
    with ssh_standin(["gpu-00", "gpu-01"], log) as ports:
        assert set(ports) == {"gpu-00", "gpu-01"}
        proc = subprocess.run(["ssh", "-p", str(ports["gpu-01"]), "-i", str(tmp_path / "key"), "-o", "BatchMode=yes",
                               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "root@127.0.0.1", script],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert not marker.exists()
    [session] = read_log(log)
    assert (session["node"], session["step"]) == ("gpu-01", step_of(script))
    assert session["end"] >= session["start"]


# ---------------------------------------------------------------------------- the program's process


def test_hook_reports_peak_memory_and_a_profile_of_the_program_process_only(tmp_path: Path) -> None:
    program = tmp_path / "pulumi-language-python-exec"  # the name the language host runs the program under
    program.write_text("x = bytearray(64 * 1024 * 1024)\n")
    other = tmp_path / "something-else.py"
    other.write_text("pass\n")
    out, stats = tmp_path / "hook.jsonl", tmp_path / "program.prof"
    env = {**os.environ, **hook_env(out, stats)}
    for script in (program, other):
        subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    [report] = [json.loads(line) for line in out.read_text().splitlines()]
    assert peak_mib(out) >= 64
    assert report["peakKib"] / 1024 == peak_mib(out)
    assert stats.stat().st_size > 0


def test_bench_environment_caches_bytecode_outside_the_venv(tmp_path: Path) -> None:
    env = bench_env({"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}, tmp_path)
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")


# ---------------------------------------------------------------------------- where the time goes


def span(name: str, start: float, end: float, service: str = "pulumi-cli") -> dict[str, Any]:
    return {"service": service, "name": name, "start": start, "end": end}


def test_busy_time_is_the_union_of_intervals() -> None:
    assert busy([(0, 2), (1, 3), (5, 6)]) == 4
    assert busy([(0, 4), (1, 2)]) == 4
    assert busy([]) == 0


def test_phases_of_a_traced_preview(tmp_path: Path) -> None:
    found = [
        span("pulumi", 0, 10), span("run-program", 2, 9), span("pulumirpc.LanguageRuntime/GetRequiredPackages", 1, 1.5),
        span("pulumirpc.ResourceMonitor/RegisterResource", 3, 5), span("pulumirpc.ResourceMonitor/RegisterResource", 4, 6),
        span("pulumirpc.ResourceProvider/Check", 3, 4), span("/pulumirpc.ResourceProvider/Check", 3.2, 3.7, "pulumi-resource-provider"),
    ]
    trace = tmp_path / "trace.json"
    trace.write_text("\n".join(json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": s["service"]}}]},
        "scopeSpans": [{"spans": [{"name": s["name"], "startTimeUnixNano": str(int(s["start"] * 1e9)),
                                   "endTimeUnixNano": str(int(s["end"] * 1e9))}]}]}]}) for s in found) + "\n")
    assert spans(trace) == found
    seconds = list(phases(found).values())
    assert seconds == pytest.approx([10, 2, 0.5, 7, 3, 1, 0.5, 1])


def test_program_profile_groups_our_code_by_part(tmp_path: Path) -> None:
    group, _ = program_parts(tmp_path)
    assert group((f"{tmp_path}/stacks/placement.py", 1, "check")).startswith("our program: placement")
    assert group((f"{tmp_path}/stacks/config/load.py", 1, "load")).startswith("our program: config")
    assert group((f"{tmp_path}/components/node/steps.py", 1, "steps")).startswith("our program: spec building")
    assert group((f"{tmp_path}/venv/lib/python3.11/site-packages/pulumi/output.py", 1, "apply")).startswith("Pulumi SDK")
    assert group(("~", 0, "<method 'poll' of 'select.epoll' objects>")).startswith("waiting")
    assert group(("/usr/lib/python3.11/json/decoder.py", 1, "decode")) is None  # counts for its caller


# ---------------------------------------------------------------------------- the report


def result(nodes: int, models: int, resources: int, preview: tuple[float, float]) -> SizeResult:
    def pair(ours: float, bare: float) -> Pair:
        return Pair([Sample(ours, 150)], [Sample(bare, 140)])

    return SizeResult(nodes, models, Shape(resources, 5, 8 * nodes), pair(*preview), pair(6, 5), pair(4, 3),
                      noop_commands=0, noop_changes={"same": resources + 2}, up_overlap=nodes)


def test_report_has_a_row_per_size_and_the_goals() -> None:
    rows = [result(1, 1, 28, (3.0, 2.5)), result(8, 16, 300, (8.0, 6.0)), result(32, 100, 1100, (24.0, 19.0))]
    report = markdown(rows, None, 5, "pulumi v0", "chart.png")
    assert "| 1 × 1 | 28 (8) | 3.00 / 2.50 | **1.20×** |" in report
    assert "| 32 × 100 | 1100 (256) | 24.00 / 19.00 | **1.26×** |" in report
    # ms per resource above the 1×1 stack: (8-3)/272 and (24-3)/1072; the largest over the next.
    assert "8 × 16: 18.4, 32 × 100: 19.6; the largest over the next: **1.07** (goal ≤ 1.2: met)" in report
    assert "**Preview of 32 × 100: 1.26×**" in report
    assert '0 Commands ran (the stand-in\'s log), changes {"same": 1102}' in report
    assert "![real-engine time against stack size](chart.png)" in report
    assert "(fleets.md#the-goals-one-by-one)" in report  # where each miss is explained (a heading of docs/fleets.md)
    assert "\n### The goals, one by one\n" in (Path(__file__).parents[1] / "docs" / "fleets.md").read_text()


PPROF_TOP = """\
File: pulumi
Type: cpu
Duration: 23.13s, Total samples = 20.66s (89.34%)
      flat  flat%   sum%        cum   cum%
         0     0%     0%     17.02s 82.38%  github.com/pulumi/pulumi/pkg/v3/backend.(*SnapshotManager).saveSnapshot
         0     0%     0%      7.79s 37.71%  github.com/pulumi/pulumi/pkg/v3/backend/diy.compactJSONMarshaler.Marshal
     4.87s 23.57% 23.57%      4.87s 23.57%  crypto/md5.block
         0     0% 23.81%      4.87s 23.57%  crypto/md5.(*digest).Write
         0     0% 37.27%      450ms  2.18%  github.com/pulumi/pulumi/pkg/v3/backend/diy.backupTarget
"""


def test_engine_profile_parts_come_from_pprofs_cumulative_column() -> None:
    parts = dict(engine_parts(PPROF_TOP))
    assert list(parts.values()) == pytest.approx([20.66, 17.02, 7.79, 4.87, 0.45])
    assert pprof_seconds("2.5mins") == 150
    missing = dict(engine_parts(PPROF_TOP.replace("diy.backupTarget", "diy.somethingElse")))
    assert missing["of which copying the previous state to .bak"] == 0
    with pytest.raises(ValueError, match="Total samples"):
        engine_parts("File: pulumi\n")


def test_report_shows_the_engines_cpu_shares_when_profiled() -> None:
    rows = [result(1, 1, 28, (3.0, 2.5)), result(2, 3, 60, (4.0, 3.0))]
    profile = Profile({phase: {"ours": 1.0, "bare": 1.0} for phase in PHASES}, [("x", 1.0)], 1.0,
                                  engine_parts(PPROF_TOP))
    report = markdown(rows, profile, 1, "pulumi v0", None)
    assert "| saving the whole state (SnapshotManager.saveSnapshot) | 17.02 | 82% |" in report


def test_report_shows_the_no_op_ups_phases_only_when_traced() -> None:
    rows = [result(1, 1, 28, (3.0, 2.5)), result(2, 3, 60, (4.0, 3.0))]
    profile = Profile({phase: {"ours": 1.0, "bare": 1.0} for phase in PHASES}, [("x", 1.0)], 1.0)
    assert "no-op `up` of each program" not in markdown(rows, profile, 1, "pulumi v0", None)
    profile.noop = {phase: {"ours": 2.5 + i, "bare": 1.25} for i, phase in enumerate(PHASES)}
    report = markdown(rows, profile, 1, "pulumi v0", None)
    assert "no-op `up` of each program's last 2 × 3 stack" in report
    assert f"| {PHASES[0]} | 2.50 | 1.25 |" in report and f"| {PHASES[-1]} | {2.5 + len(PHASES) - 1:.2f} | 1.25 |" in report


def test_the_states_breakdown_sums_each_programs_resources_by_type_and_counts_stack_traces_apart() -> None:
    def resource(kind: str, inputs: str, trace: bool = True) -> dict[str, Any]:
        return {"type": kind, "inputs": {"x": inputs}, **({"stackTrace": {"frames": ["f"]}} if trace else {})}

    ours = [resource("Job", "a" * 1000), resource("Job", "b" * 1000), resource("Deployment", "c" * 500, trace=False)]
    ours += [resource(f"Kind{i}", "") for i in range(STATE_PARTS - 1)]  # one type more than listed
    bare = [resource("ConfigMap", "")]
    parts = {part: (count, size) for part, count, size in
             state_parts({"ours": {"deployment": {"resources": ours}}, "bare": {"deployment": {"resources": bare}}})}
    assert parts["ours: Job"] == (2, sum(len(json.dumps(r)) for r in ours[:2]))
    assert next(iter(parts)) == "ours: Job"  # largest first
    assert parts["ours: 1 other types"][0] == 1  # beyond the STATE_PARTS largest
    assert parts["ours: of all the above, the SDK's stack traces"] == (len(ours) - 1, (len(ours) - 1) * len('{"frames": ["f"]}'))
    assert parts["bare: ConfigMap"][0] == 1
    profile = Profile({phase: {"ours": 1.0, "bare": 1.0} for phase in PHASES}, [("x", 1.0)], 1.0, [],
                      state_parts({"ours": {"deployment": {"resources": ours}}, "bare": {"deployment": {"resources": bare}}}))
    report = markdown([result(1, 1, 28, (3.0, 2.5)), result(2, 3, 60, (4.0, 3.0))], profile, 1, "pulumi v0", None)
    job_share = parts["ours: Job"][1] / sum(size for part, (_, size) in parts.items() if part.startswith("ours") and "traces" not in part)
    assert "| ours: Job | 2 |" in report and f"| {job_share:.0%} |" in report


def test_the_cluster_run_is_the_generated_stack_without_what_no_controller_here_serves() -> None:
    ports = {name: 20000 + i for i, name in enumerate(node_names(3, 5))}
    raw = cluster_config(3, 5, ports, "/tmp/kubeconfig")
    config = parse(raw)  # still a stack the program takes
    assert [m.name for m in config.models] == [f"model-{i:03d}" for i in range(5)]
    assert all(m.ingress is None for m in config.models)
    assert raw["cluster"] == {"namespace": "bench", "kubeconfig": {"path": "/tmp/kubeconfig"}}
    assert [(n["ssh"]["host"], n["ssh"]["port"]) for n in raw["nodes"]] == [("127.0.0.1", 20000 + i) for i in range(3)]
    gpus = CLUSTER_NODE.split(":")[0]
    assert max(n.gpu.count for n in config.nodes) <= int(gpus)
    largest = generated_stack(100, 32)["config"]["gpu-serving:nodes"]
    assert max(n["gpu"]["count"] for n in largest) <= int(gpus)


def test_cluster_report_says_what_ran_and_what_the_no_op_did() -> None:
    result = ClusterResult(32, 100, 1400, "v1.37.2", 300.0, 40.0, 0, {"same": 1400}, 32, 12.5)
    report = cluster_markdown(result)
    assert "#### 32 × 100 on the loopback cluster" in report
    assert ("| first `pulumi up` | 300.0 | 1400 resources in the state (providers included); "
            "the disk steps of **32** of 32 nodes ran side by side |") in report
    assert "**0 Commands** ran; changes {\"same\": 1400} (1400 the same)" in report


def test_growth_needs_three_sizes() -> None:
    assert growth([result(1, 1, 28, (3, 2)), result(2, 3, 60, (4, 3))]) is None


def test_one_size_reports_no_slope() -> None:
    report = markdown([result(2, 3, 60, (4.0, 3.0))], None, 1, "pulumi v0", None)
    assert "| 2 × 3 | 60 (" in report
    assert "- **Growth**: one size measured, so no slope" in report


# ---------------------------------------------------------------------------- the quick run, on the real engine


def offline_count(nodes: int, models: int, tmp_path: Path) -> int:
    """What the offline render declares for the generated stack as the benchmark configures it (YAML, no Secrets)."""
    document = generated_stack(models, nodes)["config"]
    raw = rendering({key.split(":", 1)[1]: value for key, value in document.items()}, tmp_path / "yaml")
    stack_file = tmp_path / f"Pulumi.count-{nodes}x{models}.yaml"
    stack_file.write_text(yaml.safe_dump({"config": {f"gpu-serving:{key}": value for key, value in raw.items()}}))
    return len(run_program("count", stack_file=stack_file).resources)


@pytest.mark.skipif(os.environ.get("GS_ENGINE_TESTS") != "1",
                    reason="needs the built engine: make e2e runs it (or GS_ENGINE_TESTS=1 after make engine)")
def test_quick_engine_bench_writes_its_fleet_table_chart_and_profile(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks-engine.md"
    proc = subprocess.run([sys.executable, "-m", "testbed.bench_engine", "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = out.read_text()
    assert "`pulumi preview` of the prod stack" in report
    for nodes, models in QUICK_SIZES:
        row = re.search(rf"^\| {nodes} × {models} \| (\d+) \((\d+)\) \|(.*)$", report, flags=re.MULTILINE)
        assert row, f"no row for {nodes} × {models}"
        assert int(row.group(1)) == offline_count(nodes, models, tmp_path)
        ratios = [float(r) for r in re.findall(r"\*\*([\d.]+)×\*\*", row.group(3))]
        assert len(ratios) == 3 and all(r > 0 for r in ratios), row.group(0)
        assert row.group(3).split("|")[-4].strip() == "0", "a no-op up ran Commands"
    assert (tmp_path / CHART).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    program, engine = report.split("The CLI's CPU in one more `up`", 1)
    shares = [int(s) for s in re.findall(r"^\| [^|]+ \| [\d.]+ \| (\d+)% \|$", program, flags=re.MULTILINE)]
    assert len(shares) >= 5 and 97 <= sum(shares) <= 103
    assert "| the program's process (language host `execPython`) |" in report
    saving = re.search(r"^\| saving the whole state \S+ \| ([\d.]+) \| (\d+)% \|$", engine, flags=re.MULTILINE)
    assert saving and float(saving.group(1)) > 0, engine
    # The same section with PULUMI_SKIP_CHECKPOINTS=true, in a file of its own: the CLI then writes the state
    # once, so saving it is a far smaller share of the same up (64 % against 5 % when written).
    skipped = (tmp_path / bench_engine.SKIP_NAME).read_text()
    assert skipped.startswith("### Fleet scale with `PULUMI_SKIP_CHECKPOINTS=true`")
    for nodes, models in QUICK_SIZES:
        row = re.search(rf"^\| {nodes} × {models} \| {offline_count(nodes, models, tmp_path)} \(\d+\) \|(.*)$", skipped, flags=re.MULTILINE)
        assert row, f"no row for {nodes} × {models}"
        # preview, up and no-op up against the small bare program, and the preview against the replay
        assert len([float(r) for r in re.findall(r"\*\*([\d.]+)×\*\*", row.group(1))]) == 4, row.group(0)
    assert "against the replay: " in skipped
    saved_once = re.search(r"^\| saving the whole state \S+ \| [\d.]+ \| (\d+)% \|$", skipped, flags=re.MULTILINE)
    assert saved_once and int(saved_once.group(1)) * 2 < int(saving.group(2)), (saved_once, saving.group(0))
    assert (tmp_path / bench_engine.SKIP_CHART).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
