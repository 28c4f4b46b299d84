"""Per-node GPU fit: a stack whose GPUs add up but whose pods the scheduler can strand is refused."""

from __future__ import annotations

from collections import Counter

import pytest

from stacks.config import ConfigError, parse
from stacks.placement import stranded_pod
from tests.test_config import prod_raw


@pytest.mark.parametrize(
    ("nodes", "pods", "stranded"),
    [
        ([2, 2], [2, 1, 1], 2),  # the 1-GPU pods spread one per node: no node keeps 2 free
        ([3, 3], [2, 2, 2], 2),  # one 2-GPU pod per node, the third never fits
        ([2, 2], [1, 1, 1, 1], None),
        ([2, 2], [2, 2], None),
        ([4], [2, 1, 1], None),  # one node: whatever lands there, the rest is free
        ([8, 8], [4, 4, 1, 1, 1, 1], None),
        ([8, 8], [4, 4, 4, 1, 1], 4),
        ([1, 2], [2, 1], 2),  # the 1-GPU pod may take the only node a 2-GPU pod fits
    ],
)
def test_stranded_pod(nodes: list[int], pods: list[int], stranded: int | None) -> None:
    result = stranded_pod(nodes, pods)
    assert (result.size if result else None) == stranded
    if result:
        # The witness is a real placement: the other pods only, no node over its GPUs, none left with room.
        others = list(pods)
        others.remove(result.size)
        assert Counter(p for placed in result.placement for p in placed) <= Counter(others)
        assert all(sum(placed) <= capacity for placed, capacity in zip(result.placement, nodes, strict=True))
        assert all(free < result.size for free in result.free)


def shared_stack(models: list[tuple[int, int]], nodes: int = 2, gpus: int = 2) -> dict:
    raw = prod_raw()
    node = raw["nodes"][0]
    # Each machine its own disks: one by-id name under two nodes is refused (one physical disk).
    raw["nodes"] = [{**node, "name": f"gpu-{i}", "ssh": {"host": f"gpu-{i}"}, "gpu": {"product": "nvidia-a100", "count": gpus},
                     "storage": {**node["storage"], "disks": ["/dev/sda", "/dev/sdb"]}}
                    for i in range(nodes)]
    raw["modelStorage"] = {"type": "nfs", "server": "nas", "path": "/models", "sizeGi": 500}
    base = raw["models"][0]
    raw["models"] = [{**base, "name": f"m{i}", "gpusPerReplica": per, "replicas": {"min": 1, "max": count}, "ingress": None}
                     for i, (per, count) in enumerate(models)]
    for model in raw["models"]:
        del model["ingress"]
    return raw


def test_a_stack_whose_gpus_add_up_but_do_not_fit_per_node_is_refused() -> None:
    # The example: 1- and 2-GPU models on two 2-GPU nodes, the 1-GPU model at 2 replicas.
    with pytest.raises(ConfigError) as error:
        parse(shared_stack([(1, 2), (2, 1)]))
    message = str(error.value)
    assert message.startswith("models[1].gpusPerReplica: its 2-GPU pods can be left Pending although the nvidia-a100 GPUs add up")
    assert "gpu-0: 1 (1 free); gpu-1: 1 (1 free)" in message


def test_stacks_that_fit_whatever_the_order_load() -> None:
    parse(shared_stack([(1, 2), (1, 2)]))
    parse(shared_stack([(2, 1), (2, 1)]))
