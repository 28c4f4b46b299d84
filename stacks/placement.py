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


@dataclass(frozen=True)
class Stranding:
    """A pod of `size` GPUs that a placement of `others` (pod sizes, by node) leaves without a node."""

    size: int
    placement: tuple[tuple[int, ...], ...]
    free: tuple[int, ...]


def stranded_pod(nodes: Sequence[int], pods: Sequence[int]) -> Stranding | None:
    """The first pod size (largest first) that some placement of the other pods strands, or None.

    `nodes` are the GPU counts of one product's nodes, `pods` the GPUs of every pod at max replicas.
    """
    for size in sorted(set(pods), reverse=True):
        others = list(pods)
        others.remove(size)
        found = _blocking_placement(tuple(nodes), tuple(sorted(others, reverse=True)), size)
        if found is not None:
            return found
    return None


def _blocking_placement(nodes: tuple[int, ...], others: tuple[int, ...], size: int) -> Stranding | None:
    """Place a subset of `others` so that every node that could hold `size` has fewer than `size` free."""
    candidates = [i for i, capacity in enumerate(nodes) if capacity >= size]
    # To strand it, the other pods must fill every node that could hold it past `capacity - size`:
    # when they do not add up to that, no placement does (the common case, decided without a search).
    if sum(others) < sum(nodes[i] - size + 1 for i in candidates):
        return None
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
        pod = others[index]
        tried: set[int] = set()
        for i in candidates:
            # Nodes with the same free GPUs are interchangeable: try one of them.
            if free[i] >= pod and free[i] >= size and free[i] not in tried:
                tried.add(free[i])
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
        per_node[node].append(others[index])
    free = tuple(capacity - sum(placed) for capacity, placed in zip(nodes, per_node, strict=True))
    return Stranding(size, tuple(tuple(p) for p in per_node), free)


class _TooLargeError(Exception):
    pass
