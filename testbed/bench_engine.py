"""make bench-engine: the program's cost under the real Pulumi engine, into bench-out/benchmarks-engine.md.

    python -m testbed.bench_engine                 # make bench-engine (needs make engine; boots the lab VM)
    python -m testbed.bench_engine --update-docs   # into docs/ (tracked); --out F: elsewhere

Measured in one run, so the ratios hold on any machine:
- `pulumi preview` of the prod stack against a bare program that declares the same number of
  resources (ConfigMaps, same engine, same kubernetes provider writing YAML) with no logic;
- `pulumi up` with nothing to do, of the lab stack (its node is a throwaway VM) against the bare
  program again.
`make bench` includes the file this writes.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.bench import output_folder
from testbed.e2e.run import Run, copy_project, engine_env, rendering, stack_raw
from tools.render import ROOT, run_program

NAME = "benchmarks-engine.md"
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
    folder.mkdir(parents=True)
    (folder / "Pulumi.yaml").write_text(
        "name: bare\nruntime:\n  name: python\n  options:\n    toolchain: pip\n    virtualenv: venv\n")
    (folder / "__main__.py").write_text(BARE_PROGRAM)
    (folder / "venv").symlink_to(ROOT / "venv")
    return folder


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


def markdown(resources: int, preview: tuple[float, float], lab: tuple[int, int], noop: tuple[float, float],
             versions: dict[str, str], runs: int) -> str:
    return "\n".join([
        f"Written by `make bench-engine` (`python -m testbed.bench_engine`); median of {runs} runs each, alternating, "
        f"on {os.cpu_count()} cores; engine: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        "| command | this program (s) | bare program, same resource count (s) | ratio |",
        "|---|---|---|---|",
        f"| `pulumi preview` of the prod stack ({resources} resources, policy pack off) | {preview[0]:.2f} | {preview[1]:.2f} | "
        f"**{preview[0] / preview[1]:.2f}×** (target ≤ 1.3×) |",
        f"| `pulumi up` with nothing to do, lab stack ({lab[0]} resources, {lab[1]} node steps) | {noop[0]:.2f} | {noop[1]:.2f} | "
        f"{noop[0] / noop[1]:.2f}× |",
        "",
        "The bare program declares as many resources as the stack (components included), as many of them Commands "
        "as the stack has node steps (local ones that run `true`, through the same command provider) and the rest "
        "ConfigMaps on the same YAML-writing kubernetes provider, through the same CLI and language host. A no-op "
        "`pulumi up` runs no Command: the node steps' inputs are unchanged, so the engine only diffs them.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.bench_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--update-docs", action="store_true", help=f"write docs/{NAME} (tracked) instead of bench-out/{NAME}")
    parser.add_argument("--out", type=Path, help=f"markdown file (default bench-out/{NAME})")
    args = parser.parse_args(argv)
    args.out = args.out or output_folder(None, args.update_docs) / NAME
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from tests.vm.harness import DEFAULT_DISKS, Vm, ensure_image

    tmp = Path(tempfile.mkdtemp(prefix="gs-bench-engine-"))
    env = {**os.environ, **engine_env(), "PULUMI_BACKEND_URL": f"file://{tmp / 'state'}",
           "PULUMI_CONFIG_PASSPHRASE": secrets.token_urlsafe(24)}
    env.pop("SSH_AUTH_SOCK", None)
    (tmp / "state").mkdir()
    (tmp / "project").mkdir()
    copy_project(tmp / "project")
    program = Run(tmp, env, tmp)
    bare = Run(tmp / "bare-run", env, tmp)
    bare_project(bare.project)
    vm = Vm(tmp / "vm", DEFAULT_DISKS, image=ensure_image())
    try:
        prod = rendering(stack_raw("prod"), tmp / "yaml-prod")
        program.new_stack("prod", prod, {"sshPrivateKey": "unused", "sshHostKeyWorker02": "unused"})
        resources, commands = shape(run_program("prod", stack_file=program.project / "Pulumi.prod.yaml"))
        bare.pulumi("stack", "init", "bare", "--secrets-provider", "passphrase")
        for key, value in (("count", str(resources)), ("commands", str(commands)), ("folder", str(tmp / "yaml-bare"))):
            bare.pulumi("config", "set", key, value, stack="bare")
        preview = median_pair((program, ("preview",), "prod"), (bare, ("preview",), "bare"), args.runs)

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
                           (bare, ("up", "--yes", "--skip-preview", "--expect-no-changes"), "bare"), args.runs)
        versions = {"pulumi": program.pulumi("version").stdout.strip(), "kubernetes": env["KUBERNETES_VERSION"],
                    "command": env["COMMAND_VERSION"]}
    finally:
        vm.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.write_text(markdown(resources, preview, (lab_resources, lab_commands), noop, versions, args.runs) + "\n")
    print(f"wrote {args.out}: preview {preview[0] / preview[1]:.2f}x the bare program, no-op up {noop[0]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
