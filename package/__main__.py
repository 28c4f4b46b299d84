"""The component package's entry point: Pulumi runs it (`python package/`) to serve the components to any language."""

import sys
from pathlib import Path

# The components live beside this folder, in the repository a consumer's `pulumi package add` cloned.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi import InputPropertiesError
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ComponentInitError

from package.serving import VERSION, ArgumentError, GpuServing


class Provider(ComponentProvider):
    """What `component_provider_host` serves, but an argument the checks refuse is reported the way Pulumi reports
    a bad input, in its one line: the SDK would add the provider's traceback to any other error."""

    def construct(self, name, resource_type, inputs, options=None):  # type: ignore[no-untyped-def]
        try:
            return super().construct(name, resource_type, inputs, options)
        except ComponentInitError as exc:
            if isinstance(exc.inner, ArgumentError):
                # No property errors: the engine would print each one's value, and a secret pasted into a key
                # that names one must not be echoed (stacks/config/load.py never repeats it). An empty list,
                # not None: the SDK (3.272) fails to send an error without one.
                raise InputPropertiesError(str(exc.inner), []) from None
            raise


if __name__ == "__main__":
    main(Provider([GpuServing], "gpu-serving", None, VERSION), sys.argv[1:])
