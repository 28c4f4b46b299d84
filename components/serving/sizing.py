"""Time and memory budgets derived from the model: startup probe, rollout and download deadlines, /dev/shm."""

from __future__ import annotations

import math

PROBE_PERIOD_S = 10


MIN_STARTUP_S = 600
"""The seed's 60 × 10 s: never less, whatever the model size."""


ENGINE_INIT_S = 300
"""Size-independent start work: CUDA init, torch.compile, CUDA-graph capture, KV-cache profiling."""


LOAD_MB_PER_S = 100
"""Assumed weight read throughput: a RAID1 of spinning disks or a 1 GbE NFS link (~110 MB/s)."""


DOWNLOAD_MB_PER_S = 20
"""Assumed Hugging Face download throughput (~160 Mbit/s); retries resume, so twice this is budgeted."""


MIN_DOWNLOAD_S = 1800


IMAGE_PULL_S = 1200
"""Allowance for pulling the multi-GB vLLM image on a fresh node, on top of every wait."""


def startup_budget_seconds(weights_gb: float) -> int:
    """How long `/health` may stay silent after start: engine init plus reading the weights
    at LOAD_MB_PER_S, never below the seed's 10 minutes, rounded up to whole probe periods."""
    seconds = max(MIN_STARTUP_S, ENGINE_INIT_S + weights_gb * 1000 / LOAD_MB_PER_S)
    return math.ceil(seconds / PROBE_PERIOD_S) * PROBE_PERIOD_S


def deployment_timeout_seconds(weights_gb: float) -> int:
    """Pulumi's await and the rollout's progress deadline: image pull plus the startup budget."""
    return IMAGE_PULL_S + startup_budget_seconds(weights_gb) + 5 * 60


def download_deadline_seconds(weights_gb: float) -> int:
    return max(MIN_DOWNLOAD_S, math.ceil(600 + 2 * weights_gb * 1000 / DOWNLOAD_MB_PER_S))


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
