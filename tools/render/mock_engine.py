"""The program under Pulumi's mock engine: `__main__.py` runs unchanged, and every resource it
declares is recorded with the options that matter."""

from __future__ import annotations

import logging
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.render import sdk
from tools.render.result import Render, RenderError, Resource
from tools.render.stack_file import ROOT, add_missing_secrets, parsed_config, stack_config


def run_program(stack: str, root: Path = ROOT, overrides: dict[str, str] | None = None,
                secret_values: dict[str, str] | None = None, stack_file: Path | None = None,
                deployed: dict[str, Any] | None = None, program: Callable[[], Any] | None = None) -> Render:
    """Run `__main__.py` once under mocks and record everything it declares.

    `overrides` replaces config values (tests); `secret_values` sets secret keys to real
    values (the secret canary test); other secrets the stack reads get placeholders.
    `deployed` is what the stack's previous `pulumi up` exported (default: nothing yet). `program` runs instead of
    `__main__.py` (the component package's tests: a program declaring its component).
    """
    import pulumi

    from stacks import READ_STACK_OUTPUTS

    project, values, secrets = stack_config(stack, root, stack_file)
    values.update(overrides or {})
    for key, value in (secret_values or {}).items():
        values[f"{project}:{key}"] = value
        secrets.add(f"{project}:{key}")
    config = parsed_config(project, values, secrets)
    missing = add_missing_secrets(project, config, values, secrets)

    render = Render(stack, config=config, missing_secrets=missing)

    class Engine(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
            if args.token == READ_STACK_OUTPUTS:
                render.stack_reads.append(args.args["name"])
                return {"name": args.args["name"], "outputs": deployed or {}, "secretOutputNames": []}, []
            return {}, []

    class Warnings(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                render.warnings.append(record.getMessage())

    def record_outputs(outputs: dict[str, Any]) -> None:
        render.outputs = outputs

    logger = logging.getLogger(f"gpu-serving-render-{id(render)}")
    logger.propagate = False
    logger.addHandler(Warnings())
    pulumi.runtime.set_all_config(values, sorted(secrets))

    sys.path.insert(0, str(root))
    try:
        sdk.run_under_mocks(program or (lambda: runpy.run_path(str(root / "__main__.py"), run_name="__main__")), Engine(),
                            project=project, stack=stack, organization="organization", logger=logger,
                            on_resource=lambda request, urn: render.resources.append(_resource(request, urn)),
                            on_stack_outputs=record_outputs)
    except pulumi.RunError as exc:
        raise RenderError(str(exc)) from None
    finally:
        sys.path.remove(str(root))
    render.resources.sort(key=lambda r: r.urn)
    return render


def _resource(request: Any, urn: str) -> Resource:
    timeouts = request.customTimeouts
    options = {
        "protect": bool(request.protect),
        "retainOnDelete": bool(request.retainOnDelete),
        "dependsOn": sorted(request.dependencies),
        "deleteBeforeReplace": bool(request.deleteBeforeReplace),
        "additionalSecretOutputs": sorted(request.additionalSecretOutputs),
        "ignoreChanges": sorted(request.ignoreChanges),
        "replaceOnChanges": sorted(request.replaceOnChanges),
        "customTimeouts": {k: v for k, v in (("create", timeouts.create), ("update", timeouts.update),
                                             ("delete", timeouts.delete)) if v},
        "provider": request.provider.rsplit("::", 1)[0] if request.provider else "",
    }
    return Resource(
        urn=urn,
        type=request.type,
        name=request.name,
        parent=request.parent,
        custom=bool(request.custom),
        inputs=sdk.deserialize(request.object),
        options={k: v for k, v in options.items() if v not in (False, [], {}, "")},
    )
