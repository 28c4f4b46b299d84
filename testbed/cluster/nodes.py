"""`make cluster STACK=<stack>`'s simulated nodes: one per node of the stack, named as the stack
names it, with its GPU count (`--node NAME:GPUS` arguments for cluster.sh start).

    python -m testbed.cluster.nodes prod     # --node k8s-worker-02:2
"""

from __future__ import annotations

import sys

from tools.render import RenderError, parsed_config, stack_config


def node_args(stack: str) -> list[str]:
    config = parsed_config(*stack_config(stack))
    if config is None:
        raise RenderError(f"Pulumi.{stack}.yaml has a config error: `make render STACK={stack}` names it")
    return [arg for node in config.nodes for arg in ("--node", f"{node.name}:{node.gpu.count}")]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        print(" ".join(node_args(args[0] if args else "prod")))
    except RenderError as exc:
        print(f"cluster nodes: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
