"""Rules for whether the GPU pods fit the GPUs the stack's nodes declare through their labels: in number at max
replicas, per product and resource, and in memory where pods time-share a card."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from . import k8s
from .autoscaling import max_replicas, scalers
from .core import ADVISORY, MANDATORY, Resource, Rule, attempt
from .k8s import GPU, Workload, as_map, dig, to_int, workloads


@dataclass(frozen=True)
class DeclaredNode:
    """A GPU node as the pack sees it: the labels the stack declares on it (a NodePatch or Node), not the machine."""

    resource: Resource
    product: str
    cards: int
    replicas: int
    """Pods that may share one card (time-slicing); 1 otherwise."""
    advertised: Mapping[str, int]


def declared_nodes(resources: Sequence[Resource], product_label: str, count_label: str) -> list[DeclaredNode]:
    """The stack's nodes that declare a product and a card count through labels, with what each advertises.

    The count is of physical cards. In the count label's own prefix (`nvidia.com/`, GPU Feature Discovery's, or
    `gpu-serving/`, the stack's copies) `mig-<profile>.count` gives the MIG instances, and `gpu.replicas` > 1 the
    time-slices: named `nvidia.com/gpu.shared`, unless GFD marked the product `-SHARED` (slices left as nvidia.com/gpu).
    """
    prefix = count_label.removesuffix("gpu.count") if count_label.endswith("gpu.count") else None
    found = []
    for node in k8s.kinds_in(resources, frozenset({k8s.NODE_PATCH, k8s.NODE})):
        labels = as_map(dig(node.view, "metadata", "labels"))
        product, cards = labels.get(product_label), to_int(labels.get(count_label))
        if not isinstance(product, str) or cards is None:
            continue
        replicas = (to_int(labels.get(f"{prefix}gpu.replicas")) if prefix else None) or 1
        mig = {f"{k8s.MIG_PREFIX}{key[len(prefix) + 4:-6]}": to_int(value) or 0 for key, value in labels.items()
               if prefix and key.startswith(f"{prefix}mig-") and key.endswith(".count")}
        if mig:
            advertised, replicas = mig, 1
        elif replicas > 1:
            advertised = {GPU if product.endswith("-SHARED") else k8s.GPU_SHARED: cards * replicas}
        else:
            advertised = {GPU: cards}
        found.append(DeclaredNode(node, product, cards, replicas, advertised))
    return found


def declared_gpus(nodes: Sequence[DeclaredNode]) -> dict[tuple[str, str], int]:
    """What the stack's nodes advertise, per (product, resource)."""
    supply: dict[tuple[str, str], int] = defaultdict(int)
    for node in nodes:
        for name, amount in node.advertised.items():
            supply[(node.product, name)] += amount
    return dict(supply)


def labelled_nodes(resources: Sequence[Resource], cfg: Mapping) -> tuple[str, list[DeclaredNode]]:
    """(product label, nodes): the configured labels (GFD's by default), else the ones the gpu-serving stack sets itself."""
    for product_label, count_label in ((str(cfg["gpuProductLabel"]), str(cfg["gpuCountLabel"])),
                                       (k8s.PROJECT_PRODUCT_LABEL, k8s.PROJECT_COUNT_LABEL)):
        nodes = declared_nodes(resources, product_label, count_label)
        if nodes:
            return product_label, nodes
    return str(cfg["gpuProductLabel"]), []


def check_gpu_capacity(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    # An unknown node label could hide any amount of capacity: say nothing.
    product_label, nodes = labelled_nodes(resources, cfg)
    if not nodes:
        return  # the nodes are not part of this stack (e.g. plain manifests)
    supply = declared_gpus(nodes)
    products = {product for product, _ in supply}
    all_scalers = scalers(resources)
    demand: list[tuple[Workload, str | None, str, int]] = []
    for w in workloads(resources):
        product = k8s.node_label_value(w.spec, product_label) if w.gpu_resources else None
        for name, per_pod in w.gpu_resources.items():
            demand.append((w, product, name, per_pod * max_replicas(w, all_scalers) * w.pods_per_replica))
    wanted: dict[tuple[str | None, str], int] = defaultdict(int)
    for _, product, name, gpus in demand:
        wanted[(product, name)] += gpus
    for w, product, name, gpus in demand:
        per_pod = w.gpu_resources[name]
        asks = f"asks for up to {gpus // per_pod} pod(s) x {per_pod} {name} = {gpus}"
        total_supply = sum(n for (_, r), n in supply.items() if r == name)
        total_demand = sum(n for (_, r), n in wanted.items() if r == name)
        if product is not None and product not in products:
            yield w.resource, (
                f"{asks} on nodes labelled {product_label}={product}, but no node in the stack carries "
                f"that label (declared: {_fmt(supply)}): the pods stay Pending with 'didn't match Pod's "
                f"node affinity/selector'. Fix the nodeSelector or label the node (NodePatch).")
        elif product is not None and wanted[(product, name)] > supply.get((product, name), 0):
            yield w.resource, (
                f"{asks} of {product}; all workloads together want {wanted[(product, name)]} but the "
                f"stack's nodes declare only {supply.get((product, name), 0)}: the extra pods stay Pending with "
                f"'Insufficient {name}' (scaling works only while cards are free). Lower replicas/"
                f"maxReplicas or add nodes.")
        elif product is None and total_demand > total_supply:
            yield w.resource, (
                f"{asks}; all GPU workloads together want {total_demand} but the stack's nodes declare "
                f"only {total_supply} ({_fmt(supply)}): the extra pods stay Pending with 'Insufficient "
                f"{name}'. Lower replicas/maxReplicas or add nodes.")


# --- memory of a time-sliced card ---------------------------------------------------------

VLLM_DEFAULT_UTILIZATION = 0.9


def memory_share(w: Workload) -> float | None:
    """The --gpu-memory-utilization of the workload's vLLM server (vLLM's default when unset)."""
    for c in k8s.containers(w.spec):
        if k8s.is_vllm_server(c):
            value = k8s.flag_value(k8s.argv(c), "--gpu-memory-utilization")
            try:
                return VLLM_DEFAULT_UTILIZATION if value is None else float(value)
            except ValueError:
                return None  # vllm-server-flags says it
    return None


def check_shared_memory(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    product_label, nodes = labelled_nodes(resources, cfg)
    shared = [n for n in nodes if n.advertised.get(k8s.GPU_SHARED)]
    if not shared:
        return
    all_scalers = scalers(resources)
    pods: list[tuple[float, str | None, Workload]] = []
    for w in workloads(resources):
        share = memory_share(w) if w.gpu_resources.get(k8s.GPU_SHARED) else None
        if share is not None:
            product = k8s.node_label_value(w.spec, product_label)
            pods += [(share, product, w)] * attempt(max_replicas, w, all_scalers, default=1)
    reported: set[tuple[str, str]] = set()
    for node in shared:
        # The device plugin, not the scheduler, picks the card behind a slice: any `replicas` of the pods
        # that may land on the node can meet on one card.
        candidates = sorted((p for p in pods if p[1] in (None, node.product)), key=lambda p: -p[0])[:node.replicas]
        total = sum(share for share, _, _ in candidates)
        if round(total, 6) <= 1 or not candidates or (candidates[0][2].resource.urn, node.product) in reported:
            continue
        reported.add((candidates[0][2].resource.urn, node.product))
        shares = " + ".join(f"{share:g} ({w.name})" for share, _, w in candidates)
        yield candidates[0][2].resource, (
            f"vLLM pods sharing {node.product} cards by time-slicing ({node.replicas} per card) may meet on one card: "
            f"{shares} = {total:g} of its memory, and time-slicing isolates none (--gpu-memory-utilization is a share of "
            f"the whole card, taken at start): the later pod fails to start. Lower --gpu-memory-utilization until any "
            f"{node.replicas} of them add up to 1.0 or less, or share the card among fewer pods.")


def check_nodes_declared(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    # Hand-written YAML seldom holds Node objects: say what went unchecked rather than pass in silence.
    product_label, nodes = labelled_nodes(resources, cfg)
    if nodes:
        return
    all_scalers = scalers(resources)
    gpu_pods = [(w, attempt(max_replicas, w, all_scalers, default=1)) for w in workloads(resources) if w.gpu_resources]
    shares = sorted((share for w, pods in gpu_pods if w.gpu_resources.get(k8s.GPU_SHARED)
                     for share in [memory_share(w)] if share is not None for _ in range(pods)), reverse=True)
    for w, pods in gpu_pods:
        asks = " + ".join(f"{n} {name}" for name, n in sorted(w.gpu_resources.items()))
        message = (f"asks for {asks} per pod on up to {pods} pod(s), but no Node or NodePatch here declares "
                   f"{product_label} and {cfg['gpuCountLabel']}: gpu-capacity and gpu-shared-memory cannot tell whether "
                   f"the GPUs, time-slices or MIG instances exist (pass the nodes too, e.g. `kubectl get nodes -o yaml`).")
        share = memory_share(w) if w.gpu_resources.get(k8s.GPU_SHARED) else None
        if share is not None and len(shares) > 1 and round(shares[0] + shares[1], 6) > 1:
            # Any two time-slices may be one card: the device plugin picks it, and every time-sliced card has 2 or more.
            message += (f" Time-slicing isolates no memory, and two of the time-sliced pods here take "
                        f"{shares[0]:g} + {shares[1]:g} = {shares[0] + shares[1]:g} of a card if they meet on one: the later "
                        f"fails to start unless the nodes have enough cards to keep them apart.")
        yield w.resource, message


def _fmt(supply: Mapping[tuple[str, str], int]) -> str:
    return ", ".join(f"{p}{'' if r == GPU else ' ' + r}: {n}" for (p, r), n in sorted(supply.items())) or "none"


GPU_NODE_LABELS = {
    "gpuProductLabel": {"type": "string", "default": "nvidia.com/gpu.product", "description": "Node label naming the GPU product."},
    "gpuCountLabel": {"type": "string", "default": "nvidia.com/gpu.count",
                      "description": "Node label with the number of physical GPUs (string integer); `gpu.replicas` and "
                                     "`mig-<profile>.count` in its prefix give the sharing."},
}

RULES = [
    Rule("gpu-capacity", "GPUs demanded at max replicas fit the GPUs the stack's nodes declare, per product and resource.",
         MANDATORY, check_gpu_capacity, config=GPU_NODE_LABELS),
    Rule("gpu-shared-memory", "vLLM pods that may meet on one time-sliced card add up to at most all of its memory.",
         MANDATORY, check_shared_memory, config=GPU_NODE_LABELS),
    Rule("gpu-nodes-declared", "GPU workloads come with the nodes' labels, without which their capacity and shared memory "
         "go unchecked (advisory: hand-written YAML seldom holds Nodes).", ADVISORY, check_nodes_declared, config=GPU_NODE_LABELS),
]
