"""Which nodes a model's pods fit on: nodes of its product that advertise what it asks for (GFD's label only
with GFD, MIG only with the GPU Operator's plugin), enough GPUs at max replicas, no placement that strands a
pod, and time-shared cards whose memory shares add up."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from policy.rules.mig import product_contradicts, profile_gb
from stacks.config.base import _at
from stacks.config.models import Model
from stacks.config.nodes import Node
from stacks.config.sharing import GPU, SHARED, resource_name
from stacks.placement import stranded_pod_among

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_gfd_label(stack: StackConfig, i: int) -> None:
    if stack.models[i].gfd_product is not None and not stack.cluster.gpu_feature_discovery:
        raise _at(
            f"models[{i}].gfdProduct",
            "selects on GPU Feature Discovery's label, but cluster.gpuFeatureDiscovery is false: no node would carry it",
        )


def check_mig_model(stack: StackConfig, i: int) -> None:
    """A model on MIG instances: GFD's product of its nodes names their MIG card, and its weights fit one instance."""
    model = stack.models[i]
    if model.gfd_product is not None:
        for node in stack.nodes:
            mig = node.gpu.sharing.mig if node.gpu.product == model.gpu_product and node.gpu.sharing else None
            why = product_contradicts(mig.card, model.gfd_product) if mig is not None else None
            if mig is not None and why:
                # GFD labels the real card: either this value selects no node, or the node's MIG card is wrong.
                raise _at(f"models[{i}].gfdProduct", f"{model.gfd_product!r} {why}, but {node.name} is declared "
                          f"with MIG card {mig.card}: GFD labels the card that is there, so either the pods match no node "
                          "or the node's gpu.sharing.mig.card is wrong; make them agree")
    if model.gpu_resource.startswith("mig-"):
        # A MIG instance's memory is its own (the name's `<n>gb`): vLLM takes gpuMemoryUtilization of it,
        # and the weights alone must fit that before any KV cache.
        usable = profile_gb(model.gpu_resource) * model.gpu_memory_utilization
        if model.weights_gb >= usable:
            raise _at(f"models[{i}].weightsGb", f"{model.weights_gb:g} GB of weights, but one {model.gpu_resource.removeprefix('mig-')} "
                      f"instance gives vLLM {usable:g} GB (gpuMemoryUtilization {model.gpu_memory_utilization:g} of "
                      f"{profile_gb(model.gpu_resource)} GB) and leaves nothing for the KV cache: the server fails at start; "
                      "ask for a larger profile (gpuResource) or whole cards")


def check_groups(stack: StackConfig, i: int) -> None:
    """A model spanning nodes (`nodesPerReplica`): every member on a whole node of its own, each node able to read the
    weights, and enough such nodes for `replicas.max` groups."""
    model = stack.models[i]
    if not model.spans_nodes:
        return
    storage = stack.model_storage
    if storage.type == "local":
        raise _at(f"models[{i}].nodesPerReplica", f"{model.nodes_per_replica}, but modelStorage.type local keeps the weights on "
                  f"{storage.node} alone, which the group's other members cannot read: use nodeCache (each member reads its "
                  "own node's copy) or shared storage (nfs, storageClass)")
    nodes = stack.holders(model)
    other = [n for n in nodes if n.gpu.count != model.gpus_per_replica]
    if other:
        found = ", ".join(f"{n.name} ({n.gpu.count})" for n in other)
        raise _at(f"models[{i}].gpusPerReplica", f"{model.gpus_per_replica}, but a group's members take whole nodes and these "
                  f"{model.gpu_product} nodes it may run on have another number of GPUs: {found}; set gpusPerReplica to their "
                  "count, or leave them out (models[].nodes with nodeCache)")
    wanted = model.pods(model.replicas.max)
    if wanted > len(nodes):
        where = "hold its weights" if storage.type == "nodeCache" else f"are {model.gpu_product} nodes"
        raise _at(f"models[{i}].nodesPerReplica", f"{model.nodes_per_replica} nodes per replica × replicas.max "
                  f"{model.replicas.max} = {wanted} whole nodes, but {len(nodes)} {where} ({', '.join(n.name for n in nodes)}): "
                  "add nodes, or lower replicas.max")


def check_demand(stack: StackConfig) -> None:
    # Counted per product and per resource a node advertises: whole cards, time-slices, each MIG profile.
    demand: Counter[tuple[str, str]] = Counter()
    for i, model in enumerate(stack.models):
        nodes = [n for n in stack.nodes if n.gpu.product == model.gpu_product]
        if not nodes:
            products = sorted({n.gpu.product for n in stack.nodes})
            raise _at(f"models[{i}].gpuProduct", f"{model.gpu_product!r} matches no node (products: {', '.join(products)})")
        resource = model.gpu_resource
        largest = max(n.gpu.advertised.get(resource, 0) for n in nodes)
        if largest == 0:
            raise _at(f"models[{i}].gpuResource", missing_resource(model, nodes))
        holders = stack.holders(model)
        if stack.model_storage.type == "nodeCache" and len(holders) < len(nodes):
            # Only the nodes that hold its weights count (models[].nodes): the demand there, then the product's.
            _check_holders(i, model, holders)
            largest = max(n.gpu.advertised.get(resource, 0) for n in holders)
        if model.gpus_per_replica > largest:
            raise _at(
                f"models[{i}].gpusPerReplica",
                f"{model.gpus_per_replica} GPUs, but the largest {model.gpu_product} node has {largest}; "
                "one pod cannot span nodes (tensor parallelism needs all its GPUs on one node)",
            )
        demand[(model.gpu_product, resource)] += model.pods(model.replicas.max) * model.gpus_per_replica
    for (product, resource), wanted in demand.items():
        have = sum(n.gpu.advertised.get(resource, 0) for n in stack.nodes if n.gpu.product == product)
        if wanted > have:
            what = f"{product} GPUs" if resource == GPU else f"{resource_name(resource)} on {product} nodes"
            raise _at(
                "models",
                f"at max replicas the models need {wanted} {what} but the nodes declare {have}; "
                f"the extra pods would stay Pending with 'Insufficient {resource_name(resource)}' — lower replicas.max or add nodes",
            )


def _check_holders(i: int, model: Model, holders: list[Node]) -> None:
    resource = model.gpu_resource
    have = sum(n.gpu.advertised.get(resource, 0) for n in holders)
    largest = max(n.gpu.advertised.get(resource, 0) for n in holders)
    names = ", ".join(n.name for n in holders)
    if model.gpus_per_replica > largest:
        raise _at(f"models[{i}].nodes", f"{model.gpus_per_replica} GPUs per pod, but the largest node that holds its weights "
                  f"({names}) has {largest}: add a larger node of its product to models[].nodes")
    if model.pods(model.replicas.max) * model.gpus_per_replica > have:
        raise _at(f"models[{i}].nodes", f"at max replicas it needs {model.pods(model.replicas.max) * model.gpus_per_replica} "
                  f"{resource_name(resource)} but the nodes that hold its weights ({names}) have {have}: list more nodes "
                  "or lower replicas.max")


def missing_resource(model: Model, nodes: list[Node]) -> str:
    """Why no node of the model's product can run its pods: none advertises what the pods ask for."""
    resource = model.gpu_resource
    offered = sorted({name for n in nodes for name in n.gpu.advertised})
    if resource == GPU:
        fix = ("set gpuResource to what they advertise (a shared card is never given to a model that did not ask for one), "
               "or remove gpu.sharing from a node")
    elif resource == SHARED:
        fix = "give a node gpu.sharing.timeSlicing, or ask for gpu"
    else:
        fix = f"add {resource.removeprefix('mig-')} to a node's gpu.sharing.mig.profiles, or ask for what they advertise"
    return (f"{resource}, but no {model.gpu_product} node advertises {resource_name(resource)} (they advertise "
            f"{', '.join(resource_name(o) for o in offered)}): its pods would stay Pending; {fix}")


def check_per_node_fit(stack: StackConfig) -> None:
    for product, resource in sorted({(m.gpu_product, m.gpu_resource) for m in stack.models}):
        nodes = [n for n in stack.nodes if n.gpu.product == product and n.gpu.advertised.get(resource)]
        models = [(i, m) for i, m in enumerate(stack.models) if (m.gpu_product, m.gpu_resource) == (product, resource)]
        # Each pod on the nodes it may run on: every node of the product, or with nodeCache those holding its weights.
        index = {n.name: k for k, n in enumerate(nodes)}
        allowed = {i: frozenset(index[n.name] for n in (stack.holders(m) if stack.model_storage.type == "nodeCache" else nodes))
                   for i, m in models}
        pods = [(m.gpus_per_replica, allowed[i]) for i, m in models for _ in range(m.pods(m.replicas.max))]
        stranding = stranded_pod_among([n.gpu.advertised[resource] for n in nodes], pods)
        if stranding is None:
            continue
        i = next(i for i, m in models if (m.gpus_per_replica, allowed[i]) == (stranding.size, stranding.allowed))
        placed = "; ".join(
            f"{node.name}: {' + '.join(map(str, pods_there)) or 'nothing'} ({free} free)"
            for node, pods_there, free in zip(nodes, stranding.placement, stranding.free, strict=True)
        )
        raise _at(
            f"models[{i}].gpusPerReplica",
            f"its {stranding.size}-GPU pods can be left Pending although the {product} GPUs add up: the scheduler may "
            f"place the other pods as {placed}, and it never moves a running pod to make room — give the models on "
            "these nodes the same gpusPerReplica, lower replicas.max, or add a node",
        )


def check_time_sliced_memory(stack: StackConfig) -> None:
    # vLLM's --gpu-memory-utilization is a share of the whole card's memory, taken at start, and
    # time-slicing isolates no memory: pods on one card must add up to 1.0 at most. The device plugin,
    # not the scheduler, picks the card behind a slice, and which pods meet on one changes as they
    # restart, so any `replicas` of the pods that may land on the node can meet on one card.
    for node in stack.nodes:
        sharing = node.gpu.sharing
        if sharing is None or sharing.time_slicing is None:
            continue
        replicas = sharing.time_slicing.replicas
        pods = sorted(((m.gpu_memory_utilization, i) for i, m in enumerate(stack.models)
                       if m.gpu_product == node.gpu.product and m.gpu_resource == SHARED for _ in range(m.replicas.max)),
                      key=lambda pod: (-pod[0], pod[1]))
        worst = pods[:replicas]
        total = sum(share for share, _ in worst)
        if round(total, 6) <= 1:
            continue
        shares = " + ".join(f"{share:g} (models[{i}])" for share, i in worst)
        raise _at(
            f"models[{worst[0][1]}].gpuMemoryUtilization",
            f"{worst[0][0]:g}, but on {node.name} up to {replicas} of the shared pods can run on one card "
            f"(timeSlicing.replicas; the device plugin picks the card, not the scheduler): {shares} = {total:g} of its "
            "memory, which is not isolated, so the later pod fails at start — lower gpuMemoryUtilization until any "
            f"{replicas} of them add up to 1.0 or less, or lower timeSlicing.replicas",
        )


def check_mig_plugin(stack: StackConfig) -> None:
    if not stack.cluster.device_plugin.enabled:
        return
    for i, node in enumerate(stack.nodes):
        if node.gpu.sharing is not None and node.gpu.sharing.mig is not None:
            raise _at(
                f"nodes[{i}].gpu.sharing.mig",
                "not with cluster.devicePlugin.enabled: the stack's device plugin does not run MIG (the cards need "
                "NVIDIA's MIG manager to create the instances, and the plugin CAP_SYS_ADMIN to list them): use the "
                "GPU Operator's (devicePlugin.enabled: false)",
            )
