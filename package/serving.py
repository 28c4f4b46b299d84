"""The components the package serves to programs in any Pulumi language.

`GpuServing` is a whole stack under one component: its arguments are the stack file's document (package/args.py,
generated from the same models), validated by the same code, and it declares what `__main__.py` declares, through
the same function (`components.stack.declare`). Secrets come from the consumer program instead of the stack's
secret config: `secrets` maps each secret key the document names to its value.
"""

# No `from __future__ import annotations`: Pulumi infers the schema from these annotations as types.
from typing import Any, NotRequired

import pulumi

from components.stack import declare
from package.args import StackConfigArgs
from stacks.config import ConfigError, parse

VERSION = "0.1.0"
"""The package's version (docs/package.md says what a minor and a major change may do to its schema)."""


class ArgumentError(ValueError):
    """An argument the stack file's checks refuse: one line naming the key (package/__main__.py reports it as
    Pulumi reports a bad input, without a traceback)."""


class GpuServingArgs(StackConfigArgs):
    secrets: NotRequired[dict[str, pulumi.Input[str]]]
    """The value of every secret key the document names (`nodes[].ssh.privateKeySecret`, `hfTokenSecret`, ...), by key."""


class GpuServing(pulumi.ComponentResource):
    """GPU nodes prepared over SSH, their model storage and a vLLM bundle per model: one gpu-serving stack."""

    namespace: pulumi.Output[str]
    """The namespace the models run in."""
    nodes: pulumi.Output[dict[str, Any]]
    """Each node's array: device, partition and usable bytes, UUIDs, mountpoint, health."""
    modelStorage: pulumi.Output[dict[str, Any]]  # noqa: N815 (the stack's output names)
    """The model volume: claim, volume, capacity, access mode."""
    models: pulumi.Output[dict[str, Any]]
    """Each model's URL, ingress URL, served name, GPUs per replica and replicas."""

    def __init__(self, name: str, args: GpuServingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-serving:index:GpuServing", name, None, opts)
        document = {key: value for key, value in args.items() if key != "secrets"}
        secrets = dict(args.get("secrets") or {})
        try:
            config = parse(document)
        except ConfigError as exc:
            raise ArgumentError(f"config error: {exc}") from None
        for warning in config.warnings():
            pulumi.log.warn(warning, resource=self)
        missing = sorted(set(config.secret_keys()) - set(secrets))
        if missing:
            raise ArgumentError(f"secrets.{missing[0]}: not given; pass the value of the secret key {missing[0]} in `secrets`")

        outputs = declare(config, lambda key: pulumi.Output.secret(secrets[key]), parent=self)
        self.namespace = outputs["namespace"]
        self.nodes = pulumi.Output.from_input(outputs["nodes"])
        self.modelStorage = pulumi.Output.from_input(outputs["modelStorage"])
        self.models = pulumi.Output.from_input(outputs["models"])
        self.register_outputs({"namespace": self.namespace, "nodes": self.nodes, "modelStorage": self.modelStorage,
                               "models": self.models})
