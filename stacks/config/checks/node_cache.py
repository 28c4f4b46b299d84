"""`modelStorage.type: nodeCache`: every cache node's array holds the weights of the models it may run.
Which nodes are caches, which hold each model, whether each node's array fits what it holds, and the
`cluster.surviveNodeLoss` promise (checked for every storage type)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from stacks.config.base import _at
from stacks.config.sharing import GPU, resource_name
from stacks.config.storage import compile_cache_gb, usable_gib
from stacks.placement import stranded_pod_among

if TYPE_CHECKING:
    from stacks.config.models import Model
    from stacks.config.nodes import Node
    from stacks.config.stack import StackConfig


def check_cache_nodes(stack: StackConfig) -> None:
    storage = stack.model_storage
    if storage.type != "nodeCache":
        return
    for j, name in enumerate(storage.nodes or []):
        node = stack.node(name)
        if node is None:
            names = ", ".join(n.name for n in stack.nodes)
            raise _at(f"modelStorage.nodes[{j}]", f"{name!r} is not a configured node (configured: {names})")
        if not node.prepares_disks:
            raise _at(f"modelStorage.nodes[{j}]", f"{name} has no `storage.disks`, so there is no array to cache models on")
        if name in storage.nodes[:j]:
            raise _at(f"modelStorage.nodes[{j}]", f"{name!r} is listed twice")
    caches = stack.cache_nodes()
    if not caches:
        raise _at("modelStorage.type", "nodeCache, but no node prepares disks (`storage.disks`): there is no array to cache models on")
    first = caches[0]
    for node in caches[1:]:
        assert node.storage is not None and first.storage is not None
        if node.storage.mountpoint != first.storage.mountpoint:
            # One PersistentVolume for every cache node: one `local.path`.
            i = stack.nodes.index(node)
            raise _at(f"nodes[{i}].storage.mountpoint",
                      f"{node.name} mounts its array at {node.storage.mountpoint}, {first.name} at {first.storage.mountpoint}; "
                      "the cache volume has one path on every node: give the cache nodes the same mountpoint")


def check_model_nodes(stack: StackConfig, i: int) -> None:
    model = stack.models[i]
    if model.nodes is None:
        if stack.model_storage.type == "nodeCache" and not stack.holders(model):
            raise _at(f"models[{i}].gpuProduct", f"{model.gpu_product!r}, but no cache node of that product advertises "
                      f"{resource_name(model.gpu_resource)}: no node would hold its weights (modelStorage.nodes)")
        return
    if stack.model_storage.type != "nodeCache":
        raise _at(f"models[{i}].nodes", f"only with modelStorage.type nodeCache (it is {stack.model_storage.type}): "
                  "the nodes that hold a model's weights")
    caches = {n.name for n in stack.cache_nodes()}
    for j, name in enumerate(model.nodes):
        node = stack.node(name)
        where = f"models[{i}].nodes[{j}]"
        if name in model.nodes[:j]:
            raise _at(where, f"{name!r} is listed twice")
        if node is None or name not in caches:
            raise _at(where, f"{name!r} is not a cache node (cache nodes: {', '.join(sorted(caches))})")
        if node.gpu.product != model.gpu_product:
            raise _at(where, f"{name} is a {node.gpu.product} node, the model asks for {model.gpu_product}: its pods could never run there")
        if not node.gpu.advertised.get(model.gpu_resource):
            raise _at(where, f"{name} does not advertise {resource_name(model.gpu_resource)}, which the model's pods ask for")


def held_gb(model: Model) -> float:
    """What a model takes on each node that holds it: its weights and adapters, and its compile caches."""
    return model.disk_gb + compile_cache_gb(model.weights_gb)


def check_capacity(stack: StackConfig) -> None:
    """Each cache node's array must fit the models it holds (with nodeCache the stack-wide volume size means nothing)."""
    if stack.model_storage.type != "nodeCache":
        return
    holding = {m.name: {n.name for n in stack.holders(m)} for m in stack.models}
    for node in stack.cache_nodes():
        assert node.storage is not None
        held = [m for m in stack.models if node.name in holding[m.name]]
        total = sum(held_gb(m) for m in held)
        gib = usable_gib(node.storage.size_gb)
        if total > gib * 2**30 / 10**9:
            i = stack.nodes.index(node)
            models = " + ".join(f"{m.name} ({held_gb(m):g} GB)" for m in held)
            raise _at(f"nodes[{i}].storage.sizeGb",
                      f"{node.storage.size_gb}: {node.name} holds {models} = {total:g} GB with their compile caches, but its "
                      f"array holds {gib * 2**30 / 10**9:.0f} GB ({gib} GiB) — raise sizeGb or leave {node.name} out of a "
                      "model's nodes (models[].nodes)")


def check_survive_node_loss(stack: StackConfig) -> None:
    """With any one node gone, every model keeps a node to run on and its `replicas.min` pods still fit (a group of a model
    spanning nodes counted as its pods: whole nodes, so losing a member's node costs that group one node)."""
    if not stack.cluster.survive_node_loss or not stack.models:
        return
    storage = stack.model_storage
    if storage.type == "local":
        raise _at("cluster.surviveNodeLoss", f"modelStorage.type local keeps every model on {storage.node}: losing it stops "
                  "them all; use nodeCache (every node serves from its own array) or shared storage")
    holders = {m.name: stack.holders(m) for m in stack.models}
    for lost in stack.nodes:
        _check_without(stack, holders, lost)


def _check_without(stack: StackConfig, holders: dict[str, list[Node]], lost: Node) -> None:
    left = {name: [n for n in nodes if n is not lost] for name, nodes in holders.items()}
    for i, model in enumerate(stack.models):
        if not left[model.name]:
            raise _at("cluster.surviveNodeLoss", f"without {lost.name}, models[{i}] ({model.name}) has no node left that can "
                      "run it — hold it on another node (models[].nodes, modelStorage.nodes) or add one")
    demand: Counter[tuple[str, str]] = Counter()
    for model in stack.models:
        demand[(model.gpu_product, model.gpu_resource)] += model.pods(model.replicas.min) * model.gpus_per_replica
    for (product, resource), wanted in sorted(demand.items()):
        nodes = [n for n in stack.nodes if n is not lost and n.gpu.product == product and n.gpu.advertised.get(resource)]
        have = sum(n.gpu.advertised[resource] for n in nodes)
        unit = f"{product} GPUs" if resource == GPU else f"{resource_name(resource)} on {product} nodes"
        if wanted > have:
            raise _at("cluster.surviveNodeLoss", f"without {lost.name}, the models' replicas.min need {wanted} {unit} but "
                      f"{have} are left — add a node or lower replicas.min")
        models = [(i, m) for i, m in enumerate(stack.models) if (m.gpu_product, m.gpu_resource) == (product, resource)]
        for i, model in models:
            room = sum(n.gpu.advertised[resource] for n in left[model.name])
            if model.pods(model.replicas.min) * model.gpus_per_replica > room:
                raise _at("cluster.surviveNodeLoss", f"without {lost.name}, models[{i}] ({model.name}) needs "
                          f"{model.pods(model.replicas.min) * model.gpus_per_replica} {unit} for replicas.min but the nodes left that hold "
                          f"it have {room} — hold it on more nodes (models[].nodes) or lower replicas.min")
        index = {n.name: k for k, n in enumerate(nodes)}
        pods = [(m.gpus_per_replica, frozenset(index[n.name] for n in left[m.name] if n.name in index))
                for _, m in models for _ in range(m.pods(m.replicas.min))]
        stranding = stranded_pod_among([n.gpu.advertised[resource] for n in nodes], pods)
        if stranding is not None:
            placed = "; ".join(f"{n.name}: {' + '.join(map(str, there)) or 'nothing'} ({free} free)"
                               for n, there, free in zip(nodes, stranding.placement, stranding.free, strict=True))
            raise _at("cluster.surviveNodeLoss", f"without {lost.name}, a {stranding.size}-GPU pod can be left Pending: "
                      f"the scheduler may place the others as {placed} — add a node or lower replicas.min")
