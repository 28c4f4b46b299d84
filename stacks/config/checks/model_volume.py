"""The model volume: a node-local one lives on a node that prepares disks, holds every model's files, and
keeps every pod that mounts it on that node."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacks.config.base import _at
from stacks.config.sharing import GPU, resource_name

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_home_node(stack: StackConfig) -> None:
    storage = stack.model_storage
    if storage.type != "local":
        return
    node = stack.node(storage.node)
    if node is None:
        names = ", ".join(n.name for n in stack.nodes)
        raise _at("modelStorage.node", f"{storage.node!r} is not a configured node (configured: {names})")
    if not node.prepares_disks:
        raise _at("modelStorage.node", f"node {storage.node!r} has no `storage.disks`, so there is no RAID mount to serve models from")


def check_size(stack: StackConfig) -> None:
    if stack.model_storage.type == "nodeCache":
        return  # each cache node against what it holds: checks.node_cache.check_capacity
    total = sum(m.disk_gb for m in stack.models)
    capacity_gb = stack.capacity_gib * 2**30 / 10**9
    weights = "weights and adapters" if any(m.lora for m in stack.models) else "weights"
    if total > capacity_gb:
        raise _at(
            "models",
            f"the {weights} add up to {total:g} GB but the model volume holds {capacity_gb:.0f} GB "
            f"({stack.capacity_gib} GiB) — raise the partition size or the shared volume's sizeGi",
        )


def check_local_pins(stack: StackConfig) -> None:
    if stack.model_storage.type != "local" or not stack.models:
        return
    # A local PV pins every pod that mounts it to the storage node: the scheduler never
    # places them elsewhere, so that node alone must hold every replica.
    home = stack.node(stack.model_storage.node)
    assert home is not None
    for i, model in enumerate(stack.models):
        if model.gpu_product != home.gpu.product:
            raise _at(
                f"models[{i}].gpuProduct",
                f"{model.gpu_product!r}, but node-local model storage lives on {home.name} ({home.gpu.product}); "
                "its pods could never schedule — use shared storage (modelStorage.type: nfs or storageClass)",
            )
    for resource in sorted({m.gpu_resource for m in stack.models}):
        wanted = sum(m.pods(m.replicas.max) * m.gpus_per_replica for m in stack.models if m.gpu_resource == resource)
        have = home.gpu.advertised.get(resource, 0)
        if wanted > have:
            unit = "GPUs" if resource == GPU else resource_name(resource)
            raise _at(
                "models",
                f"at max replicas the models need {wanted} {unit}, but node-local storage keeps every pod on "
                f"{home.name} ({have} {unit}) and a ReadWriteOnce volume cannot attach to a second node — "
                "use shared storage (modelStorage.type: nfs or storageClass) or lower replicas.max",
            )
