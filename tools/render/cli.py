"""Offline render: run the unchanged `__main__.py` under Pulumi's own mock engine.

    python -m tools.render prod            # writes rendered/prod/
    python -m tools.render prod --out DIR
    python -m tools.render prod --deployed outputs.json   # as if the stack's last up left these outputs

Config comes from `Pulumi.<stack>.yaml` exactly as the CLI would pass it; secrets that are
`secure:` or missing become placeholders that stay marked secret. No Pulumi CLI, provider
plugin or cluster is needed, so reviewers can run this in a pull request. The program reads
its own stack's previous outputs (to refuse shrinking a partition); the render answers with
none, as on a first `pulumi up`, or with `--deployed FILE` (`pulumi stack output --json`).

Writes `manifests.yaml` (every Kubernetes object in the order `pulumi up` creates them, objects
holding a secret value left out and named in its header), `resources.json` (every Pulumi resource
with the options that matter), `outputs.json` (stack outputs), `nodes/<node>/NN-<step>.sh` (the
exact scripts `pulumi up` sends to each node) and `policy.txt` (the policy pack's findings; a
mandatory one fails the render and leaves only that file). Everything is written into a fresh
folder that replaces the previous one; a failed render leaves no manifests for the stack. Secret
values are written as `[secret]`. Two renders of one config are byte-identical. After the count of what
was written it prints the plan (tools/render/plan.py: each node's array, runtime, labels, taint and GPUs,
each model's nodes, GPUs, replicas, URLs and startup budget, the policy pack's verdict); the last line
lists the secrets still to set (`needs: …`). `--quiet` prints only errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tools.render.files import check_replaceable, remove_render, write
from tools.render.mock_engine import run_program
from tools.render.plan import plan
from tools.render.result import Render, RenderError
from tools.render.stack_file import ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("stack", nargs="?", default="prod")
    parser.add_argument("--out", type=Path, help="output folder (default rendered/<stack>)")
    parser.add_argument("--stack-file", type=Path, help="read the stack config from this file instead of Pulumi.<stack>.yaml")
    parser.add_argument("--deployed", type=Path, metavar="FILE",
                        help="the stack's outputs from its last pulumi up (`pulumi stack output --json`), for the checks against it")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only errors (for scripts); the exit code is the same")
    args = parser.parse_args(argv)
    out = args.out or ROOT / "rendered" / args.stack
    try:
        check_replaceable(out)
        deployed = _read_deployed(args.deployed) if args.deployed else None
        render = run_program(args.stack, stack_file=args.stack_file, deployed=deployed)
        files = write(render, out)
    except RenderError as exc:
        remove_render(out)
        print(f"render {args.stack}: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        for warning in render.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    policy = (out / "policy.txt").read_text().splitlines()
    mandatory = [line for line in policy if line.startswith("mandatory ")]
    if mandatory:
        print("\n".join(mandatory), file=sys.stderr)
        print(f"render {args.stack}: {len(mandatory)} mandatory policy violation(s); see {out / 'policy.txt'} "
              "(no manifests were written)", file=sys.stderr)
        return 1
    if args.quiet:
        return 0
    kinds = len(render.kubernetes_objects())
    where = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"rendered {args.stack}: {len(render.resources)} resources, {kinds} Kubernetes objects, {len(files)} files in {where}")
    print(plan(render, policy, str(where / "policy.txt")), end="")
    print(needs_line(render))
    return 0


def needs_line(render: Render) -> str:
    """What still has to be set before `pulumi up`: the secrets the render used placeholders for."""
    if not render.missing_secrets:
        return "needs: nothing (every secret the stack reads is set)"
    return (f"needs: {', '.join(render.missing_secrets)} "
            "(set each with `pulumi config set --secret <key>` before `pulumi up`)")


def _read_deployed(path: Path) -> dict[str, Any]:
    try:
        outputs = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RenderError(f"--deployed {path}: {exc}") from None
    if not isinstance(outputs, dict):
        raise RenderError(f"--deployed {path}: expected a JSON object of stack outputs (`pulumi stack output --json`)")
    return outputs
