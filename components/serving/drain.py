"""Stopping a serving pod without cutting streams: preStop, grace period, vLLM's own drain, PDB.

On deletion (rollout, scale-down, node drain) the pod leaves the Service's endpoints at once, but
kube-proxy and the ingress controller learn it a few seconds later. The preStop hook holds SIGTERM
back for that long, so no new request reaches a server that is shutting down; then vLLM gets
SIGTERM and finishes what it is streaming, for at most DRAIN_S.

Which edge bounds a stream: a Gateway's `timeouts.request` ends every request after PROXY_TIMEOUT_S
in total, so with `edge: gateway` nothing outlives the drain. ingress-nginx's `proxy-read-timeout`
is an idle timeout between two reads: a stream that keeps sending tokens has no total bound there,
so the drain is the bound (`--shutdown-timeout` ends what still runs; docs/failure-modes.md).
"""

from __future__ import annotations

import pulumi_kubernetes as k8s

from components.serving.edge import PROXY_TIMEOUT_S
from components.serving.names import members_selector, selector_labels
from stacks.config import Model
from stacks.config.models import image_version

PRESTOP_S = 15
"""Endpoint removal reaching kube-proxy and ingress-nginx (their sync periods are a few seconds)."""


DRAIN_S = PROXY_TIMEOUT_S
"""How long in-flight requests may still run after SIGTERM: the Gateway's total request timeout, so
no request it admitted is cut; behind ingress-nginx, longer streams are cut here."""


EXIT_S = 15
"""After the drain: engine and worker processes exit, GPU memory is freed."""


SHUTDOWN_TIMEOUT_SINCE = (0, 18)
"""First vLLM release whose `vllm serve` has `--shutdown-timeout` (drain on SIGTERM)."""


def grace_period_seconds() -> int:
    return PRESTOP_S + DRAIN_S + EXIT_S


def shutdown_args(model: Model) -> list[str]:
    # None for a bare digest or a tag that names no release: the flag is then left out (an unknown flag stops vLLM).
    version = image_version(model.image)
    if version is None or version[:2] < SHUTDOWN_TIMEOUT_SINCE:
        return []
    return [f"--shutdown-timeout={DRAIN_S}"]


def lifecycle() -> k8s.core.v1.LifecycleArgs:
    # The kubelet's own sleep action: no `sleep` binary needed in the image, works read-only.
    return k8s.core.v1.LifecycleArgs(pre_stop=k8s.core.v1.LifecycleHandlerArgs(sleep=k8s.core.v1.SleepActionArgs(seconds=PRESTOP_S)))


def disruption_budget_spec(model: Model) -> k8s.policy.v1.PodDisruptionBudgetSpecArgs:
    """One pod at a time: a node drain never takes every replica at once, and with a single
    replica it still proceeds (minAvailable 1 would block the drain forever). A model spanning nodes counts every
    member: evicting one recreates its whole group, whose pods are then unavailable, so a drain takes no member of
    another group until that group is back."""
    return k8s.policy.v1.PodDisruptionBudgetSpecArgs(
        max_unavailable=1,
        selector=members_selector(model) if model.spans_nodes else k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(model)),
        # A pod that never got Ready (still loading, crash-looping) may be evicted regardless.
        unhealthy_pod_eviction_policy="AlwaysAllow",
    )
