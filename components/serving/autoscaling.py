"""Scaling on the queue length: HPA (prometheus-adapter) or KEDA, never CPU."""

from __future__ import annotations

from typing import Any, Literal

import pulumi_kubernetes as k8s
import yaml

from components.serving.hold import wake_trigger
from components.serving.names import workload
from stacks.config import ClusterConfig, Model
from stacks.config.cluster import RequestHold

QUEUE_GAUGE = "vllm:num_requests_waiting"


QUEUE_METRIC = "vllm_num_requests_waiting"  # the name prometheus-adapter gives the gauge


SCALE_DOWN_WINDOW_S = 600
"""A new pod loads for minutes; a short window would start and stop pods in a loop."""


SCALE_UP_PERIOD_S = 120


def autoscaler(cluster: ClusterConfig, model: Model) -> Literal["hpa", "keda", "none"]:
    """One owner of the replica count: with min == max there is nothing to scale."""
    return "none" if model.replicas.min == model.replicas.max else cluster.autoscaling


def hpa_spec(model: Model) -> k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs:
    v2, (api_version, kind, name) = k8s.autoscaling.v2, workload(model)
    return v2.HorizontalPodAutoscalerSpecArgs(
        scale_target_ref=v2.CrossVersionObjectReferenceArgs(api_version=api_version, kind=kind, name=name),
        min_replicas=model.replicas.min,
        max_replicas=model.replicas.max,
        # CPU says nothing about an inference server; its queue does.
        metrics=[
            v2.MetricSpecArgs(
                type="Pods",
                pods=v2.PodsMetricSourceArgs(
                    metric=v2.MetricIdentifierArgs(name=QUEUE_METRIC),
                    target=v2.MetricTargetArgs(type="AverageValue", average_value=str(model.replicas.target_requests_waiting)),
                ),
            )
        ],
        behavior=v2.HorizontalPodAutoscalerBehaviorArgs(**_behavior_args()),
    )


def scaling_behavior() -> dict[str, Any]:
    """HPA `behavior`, shared by the HPA and KEDA's generated HPA. Scale up one pod at a time
    (each needs free GPUs and minutes to load), scale down slowly."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": SCALE_UP_PERIOD_S}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
        },
    }


def _behavior_args() -> dict[str, k8s.autoscaling.v2.HPAScalingRulesArgs]:
    v2 = k8s.autoscaling.v2
    rules = {}
    for key, attr in (("scaleUp", "scale_up"), ("scaleDown", "scale_down")):
        rule = scaling_behavior()[key]
        rules[attr] = v2.HPAScalingRulesArgs(
            stabilization_window_seconds=rule["stabilizationWindowSeconds"],
            select_policy=rule["selectPolicy"],
            policies=[
                v2.HPAScalingPolicyArgs(type=p["type"], value=p["value"], period_seconds=p["periodSeconds"]) for p in rule["policies"]
            ],
        )
    return rules


def queue_query(model: Model, namespace: str) -> str:
    """Total queue of one model; KEDA divides by the threshold (AverageValue), as the HPA does.
    The gauge is labelled `model_name` (= --served-model-name), not `model`. Each pod counts once however many
    scrape jobs see it (the `max by (pod)`): a second job (a PodMonitor of the user's, or the per-model PodMonitors
    an earlier version made, until the `up` that replaced them deletes them) would otherwise double the queue and
    add a GPU replica for nothing."""
    return f'sum(max by (pod) ({QUEUE_GAUGE}{{namespace="{namespace}",model_name="{model.name}"}}))'


def scaled_object(model: Model, namespace: str, prometheus_url: str, hold: RequestHold | None = None) -> dict[str, Any]:
    """The queue trigger scales between 1 and max. A model at `replicas.min: 0` adds the HTTP add-on's trigger,
    which wakes it (0 → 1) and keeps it up while requests are held or in flight; after `idleAfter` with every
    trigger inactive KEDA takes the last pod (`cooldownPeriod` applies to that step only)."""
    spec: dict[str, Any] = {
        # A LeaderWorkerSet's scale subresource counts groups, and selects their leaders for the queue metric.
        "scaleTargetRef": dict(zip(("apiVersion", "kind", "name"), workload(model), strict=True)),
        "minReplicaCount": model.replicas.min,
        "maxReplicaCount": model.replicas.max,
    }
    if model.scales_to_zero:
        spec["cooldownPeriod"] = model.idle_seconds
    spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": scaling_behavior()}}
    spec["triggers"] = [
        {
            "type": "prometheus",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": prometheus_url,
                "query": queue_query(model, namespace),
                "threshold": str(model.replicas.target_requests_waiting),
            },
        }
    ]
    if model.scales_to_zero:
        assert hold is not None
        spec["triggers"].append(wake_trigger(model, hold))
    return spec


def adapter_rules() -> str:
    """prometheus-adapter `config.yaml`: the per-pod queue gauge as the Pods metric the HPAs read.

    Needs the scrape to attach `namespace` and `pod` labels (the usual kubernetes-pods job does).
    """
    rule = {
        "seriesQuery": f'{{__name__="{QUEUE_GAUGE}",namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{QUEUE_GAUGE}$", "as": QUEUE_METRIC},
        # The HPA reads it per pod (GroupBy: pod): max, not sum, so a pod seen by two scrape jobs counts once.
        "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }
    return yaml.safe_dump({"rules": [rule]}, sort_keys=False, width=200)


def needs_adapter_rules(cluster: ClusterConfig, models: list[Model]) -> bool:
    return any(autoscaler(cluster, m) == "hpa" for m in models)
