"""`make cluster STACK=<stack>`'s simulated nodes: one per node of the stack, named as the stack
names it, advertising what its device plugin would (`--node NAME:GPUS` arguments for cluster.sh start).

    python -m testbed.cluster.nodes prod     # --node k8s-worker-02:2
    python -m testbed.cluster.nodes sharing --stack-file docs/examples/Pulumi.sharing.yaml
        # --node gpu-l40s-1:gpu.shared=2 --node gpu-a100-1:mig-3g.40gb=2,mig-2g.20gb=2,mig-1g.10gb=4

GPUS is the number of `nvidia.com/gpu` for a node that does not share its cards; with `gpu.sharing`
it lists what the node advertises instead: time-slices (`gpu.shared=<cards × replicas>`) or MIG
instances (`mig-<profile>=<cards × per card>`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stacks.config import Node
from tools.render import ROOT, RenderError, parsed_config, stack_config


def gpus(node: Node) -> str:
    advertised = node.gpu.advertised
    if list(advertised) == ["gpu"]:
        return str(advertised["gpu"])
    return ",".join(f"{name}={count}" for name, count in advertised.items())


def node_args(stack: str, stack_file: Path | None = None) -> list[str]:
    config = parsed_config(*stack_config(stack, ROOT, stack_file))
    if config is None:
        raise RenderError(f"{(stack_file or Path(f'Pulumi.{stack}.yaml')).name} has a config error: `make render STACK={stack}` names it")
    return [arg for node in config.nodes for arg in ("--node", f"{node.name}:{gpus(node)}")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.cluster.nodes", description=__doc__.split("\n")[0])
    parser.add_argument("stack", nargs="?", default="prod")
    parser.add_argument("--stack-file", type=Path, help="read the stack config from this file instead of Pulumi.<stack>.yaml")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        print(" ".join(node_args(args.stack, args.stack_file)))
    except RenderError as exc:
        print(f"cluster nodes: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
