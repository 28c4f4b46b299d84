"""The Pulumi SDK internals the offline render relies on: the one place an SDK upgrade can break it.

Written against pulumi 3.272.0, the release requirements.txt pins. tests/test_sdk_adapter.py fails
with one message when the installed SDK, that pin and this release are not all the same, or when one
of the internals below is gone or has changed shape: after an upgrade, re-check each of them against
the new SDK, then name its release here.

The SDK's public mock API (`pulumi.runtime.Mocks`, `set_mocks`, `set_all_config`) is made for unit
tests that declare resources inside a test; the render runs the unchanged `__main__.py` and records
everything it declares, which needs more:

- `SIG_KEY`, `SECRET_SIG`: the envelope the SDK's wire format wraps a secret value in
  (`pulumi.runtime.rpc._special_sig_key`, `_special_secret_sig`). Copied rather than imported, so that
  reading a render back (`redact`, `is_secret`) does not load the SDK.
- `settle()`: `pulumi.runtime.sync_await._sync_await` over `pulumi.runtime.stack.wait_for_rpcs`. The
  program runs under runpy, outside the SDK's `run_in_stack`, so nothing else waits for the
  registrations it leaves outstanding.
- `settings.set_root_resource(None)` (not exported by `pulumi.runtime`): `set_mocks` creates a root
  Stack only when none is set, and a second render in one process (the tests) needs a fresh one.
- `Stack._outputs_registered` and `Stack._finish()`: `set_mocks` registers the root Stack's outputs
  before the program has exported any; clearing the flag lets `_finish` register them once more.
- `pulumi.runtime.mocks.MockMonitor` (not exported) and its gRPC-named methods `RegisterResource` and
  `RegisterResourceOutputs`: `Mocks.new_resource` sees neither a resource's options (dependsOn,
  protect, timeouts, provider, ...) nor its parent, and nothing public sees the stack's outputs. The
  requests are the engine's protobuf messages, whose properties `pulumi.runtime.rpc.deserialize_properties`
  reads as plain values, secrets still in their envelope (`deserialize`: unknowns kept too).

The SDK is imported inside the functions: `tools.diff` and most tests import the render package for
`ROOT` alone, and loading the SDK would cost each of them half a second.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"

STACK_TYPE = "pulumi:pulumi:Stack"

T = TypeVar("T")


def sync_await(awaitable: Awaitable[T]) -> T:
    """Wait for `awaitable` on the SDK's event loop, from synchronous code."""
    from pulumi.runtime.sync_await import _sync_await

    return _sync_await(awaitable)


def settle() -> None:
    """Wait until every registration and call the program started has been answered."""
    from pulumi.runtime.stack import wait_for_rpcs

    sync_await(wait_for_rpcs())


def deserialize(struct: Any) -> dict[str, Any]:
    """A registration's protobuf properties as plain values: unknowns kept, secrets left in their envelope."""
    from pulumi.runtime import rpc

    return dict(_plain(rpc.deserialize_properties(struct, keep_unknowns=True)))


def _plain(value: Any) -> Any:
    """Assets and archives as the engine's state keeps a path-based one: its path (the engine adds the hash)."""
    import pulumi

    if isinstance(value, pulumi.FileArchive):
        return {"archive": {"path": value.path}}
    if isinstance(value, pulumi.FileAsset):
        return {"asset": {"path": value.path}}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def run_under_mocks(program: Callable[[], Any], mocks: Any, *, project: str, stack: str, organization: str,
                    logger: logging.Logger, on_resource: Callable[[Any, str], None],
                    on_stack_outputs: Callable[[dict[str, Any]], None]) -> None:
    """Run `program` as `pulumi up` would (not a preview) against `mocks`, in a fresh root stack.

    `on_resource(request, urn)` gets every resource's registration request but the root stack's;
    `on_stack_outputs(outputs)` gets the stack's outputs, deserialized, once the program has run.
    What the program raises (a config error is `pulumi.RunError`) propagates.
    """
    from pulumi.runtime import mocks as sdk_mocks
    from pulumi.runtime import rpc, set_mocks, settings

    class Monitor(sdk_mocks.MockMonitor):
        def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
            response = super().RegisterResource(request)
            if request.type != STACK_TYPE:
                on_resource(request, response.urn)
            return response

        def RegisterResourceOutputs(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
            if request.urn.split("::")[-2] == STACK_TYPE:
                on_stack_outputs(rpc.deserialize_properties(request.outputs))
            return super().RegisterResourceOutputs(request)

    settings.set_root_resource(None)
    set_mocks(mocks, project=project, stack=stack, preview=False, logger=logger, monitor=Monitor(mocks),
              organization=organization)
    program()
    settle()
    # set_mocks registered the root stack before the program exported anything: register its
    # outputs again now that they exist.
    root = settings.get_root_resource()
    root._outputs_registered = False
    root._finish()
    settle()
