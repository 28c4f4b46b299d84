"""Time budgets derived from a model's size: startup probe, rollout and download deadlines, image pull.

They live with the config because the config's own checks need them (a scale-to-zero model's cold start
timeout must cover the startup budget) and the serving component renders them; the component reads
them from here, never the reverse.
"""

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
