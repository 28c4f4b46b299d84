"""Replicas against the cluster's autoscaling: a range only where something scales, and zero only where
something holds the requests and wakes the model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacks.config.base import _at

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_replicas(stack: StackConfig, i: int) -> None:
    model, cluster = stack.models[i], stack.cluster
    if model.scales_to_zero:
        _check_hold(stack, i)
    if cluster.autoscaling == "none" and model.replicas.min != model.replicas.max:
        raise _at(
            f"models[{i}].replicas",
            f"min {model.replicas.min} ≠ max {model.replicas.max} but cluster.autoscaling is none, so nothing "
            "would ever scale between them — set min == max or choose hpa or keda",
        )


def _check_hold(stack: StackConfig, i: int) -> None:
    """`replicas.min: 0` only where something receives the requests and wakes the model."""
    if stack.cluster.autoscaling != "keda":
        raise _at(f"models[{i}].replicas.min",
                  f"0 needs cluster.autoscaling keda (it is {stack.cluster.autoscaling}): only KEDA scales a Deployment to zero "
                  "and back (an HPA stops at 1), and only its HTTP add-on holds the requests meanwhile; set keda, or min: 1")
    if stack.cluster.request_hold is None:
        # The queue gauge is exported by the vLLM pods themselves: at zero pods no metric moves.
        raise _at(f"models[{i}].replicas.min",
                  "0, but cluster.requestHold is unset: the queue metric comes from the vLLM pods, so at zero nothing would "
                  "see a request or wake the model; install KEDA's HTTP add-on and set cluster.requestHold: {} "
                  "(its interceptor holds requests while the model starts), or use min: 1")
