"""Prometheus Operator objects: one PodMonitor for every model's serving pods (the operator ignores
`prometheus.io/*` annotations, so without it neither KEDA nor the adapter ever sees the queue) and a
PrometheusRule per model with the alerts an operator of a model server needs."""

from __future__ import annotations

from typing import Any

import pulumi_kubernetes as k8s

from components.cluster import PART_OF, applied_annotations
from components.serving.autoscaling import QUEUE_GAUGE
from components.serving.names import SERVER_LABELS, download_job_name, object_name, workload
from stacks.config import ClusterConfig, Model
from stacks.config.budgets import deployment_timeout_seconds

SCRAPE_INTERVAL = "15s"

SERVERS_MONITOR = "gpu-serving-servers"
"""The namespace's one PodMonitor (`gpu-serving-`: no model's objects can take the name)."""


PREEMPTIONS_PER_S = 0.1
"""Sustained preemptions per second per pod (6 a minute) above which requests are recomputed
instead of served: a full KV cache alone is vLLM working as designed under load, preemption is
the cost users feel."""


def servers_pod_monitor(cluster: ClusterConfig, models: list[Model]) -> dict[str, Any] | None:
    """Scrapes the `http` port of every model's serving pods; the operator adds `namespace` and `pod` labels, which
    the adapter rule and the KEDA query rely on, and vLLM labels each series with `model_name`. Every model is scraped
    alike, so one object for the namespace selects them all by label, as a PodMonitor per model would each (a model
    added or removed changes nothing here). None without models, or with `monitoring.podMonitor` off."""
    if not models or not cluster.monitoring.pod_monitor:
        return None
    return dict(
        api_version="monitoring.coreos.com/v1",
        kind="PodMonitor",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=SERVERS_MONITOR, namespace=cluster.namespace,
                                            labels={**PART_OF, **cluster.monitoring.labels}, annotations=applied_annotations(cluster)),
        spec={
            "selector": {"matchLabels": dict(SERVER_LABELS)},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": SCRAPE_INTERVAL}],
        },
    )


def _minutes(seconds: int) -> str:
    return f"{-(-seconds // 60)}m"


def alert_rules(model: Model, namespace: str) -> list[dict[str, Any]]:
    """The alerts, as Prometheus rule entries. `kube_*` series come from kube-state-metrics
    (part of kube-prometheus-stack); `vllm:*` from the servers' PodMonitor."""
    where = f'namespace="{namespace}",model_name="{model.name}"'
    deployment = workload(model)[2]
    # A LeaderWorkerSet's leaders are one StatefulSet of its name (kube-state-metrics has no series of the set itself):
    # a group is available when its leader is, and the leader is Ready only with every stage joined.
    kind = "statefulset" if model.spans_nodes else "deployment"
    selector = f'namespace="{namespace}",{kind}="{deployment}"'
    available = f"kube_{kind}_status_replicas_available{{{selector}}}"
    # A rollout without surge takes the only replica down while the new pod pulls the image and
    # loads: alert only when that overran the whole rollout budget (pull + startup + margin,
    # the Deployment's own progress deadline).
    # A held model woken by a request must be up within the cold start timeout, or the interceptor answers 502:
    # that is the model being down for its callers, and KEDA keeps the wanted replica at least that long again.
    allowed_s = model.cold_start_seconds if model.scales_to_zero else deployment_timeout_seconds(model.weights_gb)
    labels = {"model": model.name}

    def alert(name: str, expr: str, duration: str, severity: str, summary: str, description: str) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": expr,
            "for": duration,
            "labels": {**labels, "severity": severity},
            "annotations": {"summary": summary, "description": description},
        }

    down = f"{available} < 1"
    if model.scales_to_zero:
        # Idling at zero is the design: down only while a pod is wanted (woken) and none came up.
        down = f"({down} and kube_deployment_spec_replicas{{{selector}}} > 0)"
    return [
        alert(
            "VllmNoPodReady",
            # absent(): a vanished series (kube-state-metrics down, Deployment deleted) is no all-clear.
            f"{down} or absent({available})",
            _minutes(allowed_s),
            "critical",
            f"{model.name}: no vLLM pod is ready",
            (f"LeaderWorkerSet {namespace}/{deployment} has had no group with its leader available" if model.spans_nodes else
             f"Deployment {namespace}/{deployment} has had no available replica") + " (or no metric) for longer than "
            + ("its cold start timeout while one was wanted: held requests get 502" if model.scales_to_zero else
               "a rollout may take (image pull + startup budget)")
            + ": the model is down. Look at `kubectl describe pod` "
            "(Pending: GPUs) and `kubectl logs` (load errors).",
        ),
        alert(
            "VllmQueueStalled",
            # Per pod: one hung engine beside a healthy one must not hide in a sum.
            f"max by (namespace, pod) ({QUEUE_GAUGE}{{{where}}}) > 0 "
            f"and on (namespace, pod) sum by (namespace, pod) (rate(vllm:generation_tokens_total{{{where}}}[5m])) == 0",
            "5m",
            "critical",
            f"{model.name}: requests wait but no token is generated",
            "Requests are queued on {{ $labels.pod }} while its generation throughput is zero: the engine is hung "
            "or every request is stuck. /health may still be green; restart the pod after collecting its logs.",
        ),
        alert(
            "VllmPreempting",
            f"sum by (namespace, pod) (rate(vllm:num_preemptions_total{{{where}}}[5m])) > {PREEMPTIONS_PER_S:g}",
            "15m",
            "warning",
            f"{model.name}: requests are being preempted",
            "{{ $labels.pod }} preempts running requests (KV cache exhausted; their work is recomputed and latency "
            "grows). Add replicas, lower maxModelLen, or raise gpuMemoryUtilization.",
        ),
        alert(
            "VllmModelDownloadFailed",
            f'kube_job_failed{{namespace="{namespace}",job_name="{download_job_name(model)}",condition="true"}} > 0',
            "0m",
            "critical",
            f"{model.name}: the model download Job failed",
            f"Job {namespace}/{download_job_name(model)} gave up: the model files are incomplete and no pod can start. "
            "Check the Hugging Face token, the revision and the volume's free space in the Job's logs.",
        ),
    ]


def prometheus_rule_spec(model: Model, namespace: str) -> dict[str, Any]:
    return {"groups": [{"name": f"gpu-serving.{object_name(model)}", "rules": alert_rules(model, namespace)}]}
