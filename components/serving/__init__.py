"""One model served by vLLM on the GPU nodes: the `VllmService` component and the pure
functions that build its objects, one module per concern.

Every pitfall of the seed's troubleshooting section is a default here, not advice:
Pending pods (GPU demand checked at load, rollouts that need no spare GPU), restart loops
(a startup probe sized from the weights, `sizing`), downloads on every start (a pre-download
Job and `HF_HUB_OFFLINE=1`, `jobs`), the shared-memory crash (/dev/shm sized by tensor
parallelism), two pods on one card (GPUs only through the device plugin's resources, a shared card
only for a model that asks for one, device env vars refused in config, `server`) and broken
streaming (ingress buffering off, long timeouts, `edge`).

Exported here is what callers outside the package use (`__main__.py`, the prerequisites check, the
test bed); everything else is imported from the module that defines it.
"""

from components.serving.autoscaling import adapter_rules, autoscaler, needs_adapter_rules
from components.serving.component import VllmService, VllmServiceArgs
from components.serving.drain import PRESTOP_S
from components.serving.edge import servers_egress_policy
from components.serving.hold import reference_grant
from components.serving.jobs import DOWNLOAD_SCRIPT, SMOKE_SCRIPT
from components.serving.monitoring import servers_pod_monitor
from components.serving.profile import NON_ROOT_UID

__all__ = [
    "DOWNLOAD_SCRIPT",
    "NON_ROOT_UID",
    "PRESTOP_S",
    "SMOKE_SCRIPT",
    "VllmService",
    "VllmServiceArgs",
    "adapter_rules",
    "autoscaler",
    "needs_adapter_rules",
    "reference_grant",
    "servers_egress_policy",
    "servers_pod_monitor",
]
