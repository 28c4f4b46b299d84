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


# KEDA's HTTP add-on chart (kedacore/charts http-add-on: values.yaml, templates/interceptor/service-*.yaml,
# templates/scaler/service.yaml): each Service is `<chart>-<values name>`; only the proxy takes held requests,
# only the scaler speaks KEDA's external-push gRPC.
ADD_ON_SERVICES = {
    "interceptor-proxy": "the interceptor's proxy (held requests, port interceptor.proxy.port 8080)",
    "interceptor-admin": "the interceptor's admin Service (its debugging API, interceptor.admin.port 9090)",
    "interceptor-metrics": "the interceptor's metrics Service",
    "external-scaler": "the external scaler (KEDA's gRPC, scaler.grpcPort 9090, and health 9091)",
}
ADMIN_PORT, SCALER_HEALTH_PORT = 9090, 9091


def _add_on_role(service: str) -> str | None:
    return next((role for role in ADD_ON_SERVICES if service.endswith(f"-{role}")), None)


def check_hold_services(stack: StackConfig) -> None:
    hold = stack.cluster.request_hold
    if hold is None:
        return
    role = _add_on_role(hold.interceptor_service)
    if role not in (None, "interceptor-proxy"):
        raise _at("cluster.requestHold.interceptorService",
                  f"{hold.interceptor_service} is {ADD_ON_SERVICES[role]}, not the proxy: held requests would never reach "
                  f"the interceptor's queue (and nothing wakes the model); use the ...-interceptor-proxy Service")
    role = _add_on_role(hold.scaler_service)
    if role not in (None, "external-scaler") or hold.scaler_service == hold.interceptor_service:
        what = ADD_ON_SERVICES[role] if role else "the interceptor Service"
        raise _at("cluster.requestHold.scalerService",
                  f"{hold.scaler_service} is {what}, not the external scaler: KEDA's external-push trigger would get no "
                  "gRPC answer and never wake the model; use the ...-external-scaler Service")


def hold_port_warnings(stack: StackConfig) -> list[str]:
    """Ports of the chart's other endpoints on the chart's Services: wrong unless the chart's ports were moved there."""
    hold = stack.cluster.request_hold
    if hold is None:
        return []
    warned = []
    if _add_on_role(hold.interceptor_service) == "interceptor-proxy" and hold.interceptor_port == ADMIN_PORT:
        warned.append(f"cluster.requestHold.interceptorPort: {ADMIN_PORT} is the add-on chart's interceptor admin port; its proxy "
                      "listens on interceptor.proxy.port (8080 unless your chart values moved it): check the proxy Service's port")
    if _add_on_role(hold.scaler_service) == "external-scaler" and hold.scaler_port == SCALER_HEALTH_PORT:
        warned.append(f"cluster.requestHold.scalerPort: {SCALER_HEALTH_PORT} is the add-on chart's scaler health port, which "
                      "answers no gRPC; the trigger needs scaler.grpcPort (9090 unless your chart values moved it)")
    return warned
