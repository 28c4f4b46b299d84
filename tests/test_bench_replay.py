"""testbed/bench_replay.py: the payload-equivalent bare program declares exactly what our program declares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testbed import bench_fleet, bench_replay
from testbed.e2e.run import stack_yaml
from tools.render import ROOT, redact, run_program


def test_the_replay_declares_our_resources_with_their_inputs_and_options(tmp_path: Path) -> None:
    ports = {name: 20000 + i for i, name in enumerate(bench_fleet.node_names(2, 3))}
    raw = bench_fleet.fleet_config(2, 3, ports, tmp_path / "yaml")
    stack_file = tmp_path / "Pulumi.ours.yaml"
    stack_file.write_text(stack_yaml({"config": {f"gpu-serving:{key}": value for key, value in raw.items()}}))
    dumped = tmp_path / "replay.json"
    count = subprocess.run([sys.executable, "-m", "testbed.bench_replay", str(stack_file), str(dumped)], cwd=ROOT,
                           check=True, capture_output=True, text=True, timeout=600).stdout
    ours = run_program("ours", stack_file=stack_file)
    assert int(count) == len(ours.resources) > 50

    # Declared after what each names: the parent, the provider, dependsOn.
    resources = json.loads(dumped.read_text())
    seen: set[str] = set()
    for r in resources:
        named = {r["parent"], r["options"].get("provider"), *r["options"].get("dependsOn", [])} & {x["urn"] for x in resources}
        assert named <= seen, (r["urn"], named - seen)
        seen.add(r["urn"])

    # The replay under the same mock engine as `make render`: a project of its own, the same stack name.
    project = tmp_path / "replay"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: gpu-serving\nruntime: python\n")
    (project / "__main__.py").write_text(bench_replay.PROGRAM)
    (project / "Pulumi.ours.yaml").write_text(f"config:\n  gpu-serving:resources: {json.dumps(str(dumped))}\n")
    replayed = run_program("ours", root=project)

    def declared(render: object) -> dict[str, tuple[object, ...]]:
        return {r.urn: (r.type, r.parent, r.custom, json.dumps(redact(r.inputs), sort_keys=True),
                        json.dumps(r.options, sort_keys=True)) for r in render.resources}  # type: ignore[attr-defined]

    assert declared(replayed) == declared(ours)
    # Secrets stay secret: the SSH connection of every node step.
    steps = [r for r in replayed.resources if r.type == "command:remote:Command"]
    assert steps and all(redact(r.inputs)["connection"]["privateKey"] == "[secret]" for r in steps)
