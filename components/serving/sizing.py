"""Memory the serving pod is given: /dev/shm and the container's memory limit.

The time budgets (startup probe, rollout and download deadlines) are the config's: `stacks/config/budgets.py`.
"""

from __future__ import annotations


def shm_size_gi(gpus: int) -> int:
    """/dev/shm (seed scenario 4): the seed's 8Gi for one GPU, +4Gi per extra tensor-parallel
    rank for NCCL's shared-memory transport between ranks (vllm#1710)."""
    return 4 + 4 * gpus


_UNITS = {"Ki": 1, "Mi": 2**10, "Gi": 2**20, "Ti": 2**30}


def memory_limit(memory: str, shm_gi: int) -> str:
    """The request plus the shm size: a memory-backed emptyDir is charged to the container, so
    a limit equal to the request would OOM-kill the engine when NCCL fills /dev/shm."""
    unit = memory[-2:]
    kib = int(memory[:-2]) * _UNITS[unit] + shm_gi * _UNITS["Gi"]
    for name in ("Ti", "Gi", "Mi"):
        if kib % _UNITS[name] == 0:
            return f"{kib // _UNITS[name]}{name}"
    return f"{kib}Ki"
