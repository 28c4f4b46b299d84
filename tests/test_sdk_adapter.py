"""The Pulumi SDK internals the offline render relies on (tools/render/sdk.py) are the ones it was written against.

The adapter's docstring names the SDK release it was checked against, requirements.txt pins one and the
venv has one: an upgrade that leaves the adapter unchecked fails here, naming all three, and so does an
internal the adapter uses that is gone or has changed shape.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import re
from typing import Any

import pulumi

from tools.render import ROOT, sdk

PIN = re.search(r"^pulumi==(\S+)$", (ROOT / "requirements.txt").read_text(), re.MULTILINE)
WRITTEN_AGAINST = re.search(r"^Written against pulumi (\d\S*?),", sdk.__doc__ or "", re.MULTILINE)
RECHECK = ("re-check every SDK internal the docstring of tools/render/sdk.py lists against the installed SDK, "
           "then name its release there")


def test_the_installed_sdk_is_the_one_the_adapter_was_written_against() -> None:
    assert PIN, "requirements.txt pins no `pulumi==` release"
    assert WRITTEN_AGAINST, "tools/render/sdk.py's docstring names no `Written against pulumi X.Y.Z,`"
    installed = importlib.metadata.version("pulumi")
    assert installed == PIN[1] == WRITTEN_AGAINST[1], (
        f"pulumi {installed} is installed and requirements.txt pins {PIN[1]}, but tools/render/sdk.py was written "
        f"against {WRITTEN_AGAINST[1]}: {RECHECK} (or `make venv` for the pinned SDK)")


def params(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def shape_problems() -> list[str]:
    """Each internal the adapter uses, as it uses it; what is missing or differs, one entry each."""
    from pulumi.runtime import mocks, rpc, set_mocks, settings, stack, sync_await

    problems = []

    def check(what: str, ok: Any) -> None:
        if not ok:
            problems.append(what)

    check("pulumi.runtime.rpc._special_sig_key is sdk.SIG_KEY", getattr(rpc, "_special_sig_key", None) == sdk.SIG_KEY)
    check("pulumi.runtime.rpc._special_secret_sig is sdk.SECRET_SIG", getattr(rpc, "_special_secret_sig", None) == sdk.SECRET_SIG)
    # The policy pack (the lowest layer: it imports nothing of ours) keeps its own copy of the marker.
    from policy import rules

    check("policy.rules' secret marker is the SDK's", (rules._SIG_KEY, rules._SECRET_SIG) == (sdk.SIG_KEY, sdk.SECRET_SIG))
    check("pulumi.runtime.sync_await._sync_await(awaitable)",
          callable(getattr(sync_await, "_sync_await", None)) and params(sync_await._sync_await) == ["awaitable"])
    check("pulumi.runtime.stack.wait_for_rpcs() is a coroutine function",
          inspect.iscoroutinefunction(getattr(stack, "wait_for_rpcs", None)))
    check("pulumi.runtime.settings.set_root_resource(root)",
          callable(getattr(settings, "set_root_resource", None)) and params(settings.set_root_resource) == ["root"])
    finish = getattr(stack.Stack, "_finish", None)
    check("pulumi.runtime.stack.Stack._finish(self) registers the outputs unless self._outputs_registered",
          callable(finish) and params(finish) == ["self"] and "if self._outputs_registered:" in inspect.getsource(finish))
    check("pulumi.runtime.set_mocks takes project, stack, preview, logger, monitor, organization",
          {"project", "stack", "preview", "logger", "monitor", "organization"} <= set(params(set_mocks)))
    monitor = getattr(mocks, "MockMonitor", None)
    for method in ("RegisterResource", "RegisterResourceOutputs"):
        check(f"pulumi.runtime.mocks.MockMonitor.{method}(self, request)",
              monitor is not None and params(getattr(monitor, method, None) or (lambda: None))[:2] == ["self", "request"])
    check("pulumi.runtime.rpc.deserialize_properties(props_struct, keep_unknowns=...)",
          {"props_struct", "keep_unknowns"} <= set(params(rpc.deserialize_properties)))
    return problems


def test_every_sdk_internal_the_adapter_uses_has_the_shape_it_expects() -> None:
    problems = shape_problems()
    assert not problems, f"the Pulumi SDK no longer is what tools/render/sdk.py expects ({'; '.join(problems)}): {RECHECK}"


class Engine(pulumi.runtime.Mocks):
    """Every resource is created with its inputs as its state; no function call answers anything."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        return {}, []


def quiet_logger() -> logging.Logger:
    logger = logging.getLogger("gpu-serving-test-sdk-adapter")
    logger.propagate = False
    return logger


def test_a_program_under_the_adapter_is_recorded_with_its_options_secrets_and_outputs() -> None:
    """What the render reads through the adapter, end to end on a two-resource program."""

    def program() -> None:
        first = pulumi.CustomResource("test:index:Thing", "first", {"plain": "a"})
        pulumi.CustomResource("test:index:Thing", "second", {"token": pulumi.Output.secret("s3cr3t")},
                              pulumi.ResourceOptions(depends_on=[first], protect=True))
        pulumi.export("answer", 42)

    seen: dict[str, Any] = {}
    outputs: list[dict[str, Any]] = []
    sdk.run_under_mocks(program, Engine(), project="adapter", stack="test", organization="org", logger=quiet_logger(),
                        on_resource=lambda request, urn: seen.update({request.name: (request, urn)}),
                        on_stack_outputs=outputs.append)

    assert sorted(seen) == ["first", "second"], f"{RECHECK}: the monitor saw {sorted(seen)}"
    request, urn = seen["second"]
    assert urn == "urn:pulumi:test::adapter::pulumi:pulumi:Stack$test:index:Thing::second", RECHECK
    assert list(request.dependencies) == [seen["first"][1]] and request.protect, RECHECK
    assert sdk.deserialize(request.object) == {"token": {sdk.SIG_KEY: sdk.SECRET_SIG, "value": "s3cr3t"}}, RECHECK
    assert outputs and outputs[-1] == {"answer": 42}, f"{RECHECK}: the stack's outputs were {outputs}"


def test_each_run_under_the_adapter_gets_a_fresh_root_stack() -> None:
    """Renders run one after another in one process (the tests): each registers its own root stack,
    and each stack's outputs are its own."""
    roots: list[Any] = []
    outputs: list[dict[str, Any]] = []
    for stack in ("one", "two"):
        sdk.run_under_mocks(lambda: pulumi.export("stack", pulumi.get_stack()), Engine(), project="adapter", stack=stack,
                            organization="org", logger=quiet_logger(), on_resource=lambda request, urn: None,
                            on_stack_outputs=outputs.append)
        roots.append(pulumi.runtime.get_root_resource())
    assert roots[0] is not roots[1], f"{RECHECK}: the second run reused the first one's root stack"
    assert outputs[-1] == {"stack": "two"} and {"stack": "one"} in outputs, f"{RECHECK}: the stacks' outputs were {outputs}"
