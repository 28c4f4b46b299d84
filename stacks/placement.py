"""Per-node GPU fit: can the scheduler strand a pod even though the GPUs add up?

The scheduler places pods one at a time, in no order this program controls, and does not score
`nvidia.com/gpu` (its default fit scoring weighs CPU and memory), so it may spread small pods over
the nodes until no node has room for a large one; it never moves a running pod to make room. A
stack is only safe when no such placement exists: for every pod, there is no way of placing some
of the other pods that leaves every node with fewer free GPUs than that pod needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

# Beyond this many search states the answer is "cannot tell": the stack is then accepted (the
# GPU total was already checked), rather than refused on a guess.
MAX_STATES = 200_000


Pod = tuple[int, frozenset[int]]
"""A pod: its GPUs, and the indexes of the nodes it may run on (its product's nodes, or those holding its weights)."""


@dataclass(frozen=True)
class Stranding:
    """A pod of `size` GPUs, allowed on `allowed`, that a placement of the other pods (sizes, by node) leaves without a node."""

    size: int
    placement: tuple[tuple[int, ...], ...]
    free: tuple[int, ...]
    allowed: frozenset[int] = frozenset()


def stranded_pod(nodes: Sequence[int], pods: Sequence[int]) -> Stranding | None:
    """The first pod size (largest first) that some placement of the other pods strands, or None.

    `nodes` are the GPU counts of one product's nodes, `pods` the GPUs of every pod at max replicas,
    each allowed on every node.
    """
    every = frozenset(range(len(nodes)))
    return stranded_pod_among(nodes, [(size, every) for size in pods])


def stranded_pod_among(nodes: Sequence[int], pods: Sequence[Pod]) -> Stranding | None:
    """As `stranded_pod`, with each pod allowed only on its own nodes (a model on the nodes that hold its weights)."""
    for size, allowed in sorted(set(pods), key=lambda pod: (-pod[0], sorted(pod[1]))):
        others = list(pods)
        others.remove((size, allowed))
        found = _blocking_placement(tuple(nodes), tuple(sorted(others, key=lambda pod: -pod[0])), size, allowed)
        if found is not None:
            return found
    return None


def _blocking_placement(nodes: tuple[int, ...], others: tuple[Pod, ...], size: int, allowed: frozenset[int]) -> Stranding | None:
    """Place a subset of `others` so that every node the pod may use and that could hold `size` has fewer than `size` free."""
    candidates = [i for i, capacity in enumerate(nodes) if capacity >= size and i in allowed]
    if not candidates:
        return None  # it can never run: the demand checks say so
    reaching = [pod for pod in others if pod[1] & set(candidates)]
    # To strand it, the other pods must fill every node that could hold it past `capacity - size`:
    # when the ones that may use those nodes do not add up to that, no placement does (the common
    # case, decided without a search).
    if sum(gpus for gpus, _ in reaching) < sum(nodes[i] - size + 1 for i in candidates):
        return None
    # Nodes with the same free GPUs that the same pods may use are interchangeable: the search tries one of them.
    sets = sorted({pod[1] for pod in others}, key=sorted)
    kind = [(*(i in s for s in sets), i in candidates) for i in range(len(nodes))]
    states = 0

    @cache
    def search(index: int, free: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
        nonlocal states
        states += 1
        if states > MAX_STATES:
            raise _TooLargeError
        if all(free[i] < size for i in candidates):
            return ()
        if index == len(others):
            return None
        pod, may = others[index]
        tried: set[tuple[int, tuple[bool, ...]]] = set()
        for i in candidates:
            if i in may and free[i] >= pod and free[i] >= size and (free[i], kind[i]) not in tried:
                tried.add((free[i], kind[i]))
                rest = search(index + 1, (*free[:i], free[i] - pod, *free[i + 1:]))
                if rest is not None:
                    return ((index, i), *rest)
        return search(index + 1, free)  # this pod stays Pending or went to a node that does not matter

    try:
        steps = search(0, nodes)
    except _TooLargeError:
        return None
    if steps is None:
        return None
    per_node: list[list[int]] = [[] for _ in nodes]
    for index, node in steps:
        per_node[node].append(others[index][0])
    free = tuple(capacity - sum(placed) for capacity, placed in zip(nodes, per_node, strict=True))
    return Stranding(size, tuple(tuple(p) for p in per_node), free, allowed)


class _TooLargeError(Exception):
    pass
