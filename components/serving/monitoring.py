"""Prometheus Operator objects per model: a PodMonitor (the operator ignores `prometheus.io/*`
annotations, so without it neither KEDA nor the adapter ever sees the queue) and a
PrometheusRule with the alerts an operator of a model server needs."""

from __future__ import annotations

from typing import Any

from components.serving.autoscaling import QUEUE_GAUGE
from components.serving.names import download_job_name, object_name, selector_labels
from components.serving.sizing import startup_budget_seconds
from stacks.config import Model

SCRAPE_INTERVAL = "15s"


KV_CACHE_FULL = 0.95
"""Share of the KV cache above which new requests queue or preempt running ones."""


def pod_monitor_spec(model: Model) -> dict[str, Any]:
    """Scrapes the serving pods' `http` port; the operator adds `namespace` and `pod` labels,
    which the adapter rule and the KEDA query rely on."""
    return {
        "selector": {"matchLabels": selector_labels(model)},
        "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": SCRAPE_INTERVAL}],
    }


def _minutes(seconds: int) -> str:
    return f"{-(-seconds // 60)}m"


def alert_rules(model: Model, namespace: str) -> list[dict[str, Any]]:
    """The alerts, as Prometheus rule entries. `kube_*` series come from kube-state-metrics
    (part of kube-prometheus-stack); `vllm:*` from the PodMonitor."""
    where = f'namespace="{namespace}",model_name="{model.name}"'
    deployment = object_name(model)
    # A fresh pod is unready for its whole startup budget; alert only when it overran that.
    load = startup_budget_seconds(model.weights_gb) + 5 * 60
    labels = {"model": model.name}

    def alert(name: str, expr: str, duration: str, severity: str, summary: str, description: str) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": expr,
            "for": duration,
            "labels": {**labels, "severity": severity},
            "annotations": {"summary": summary, "description": description},
        }

    return [
        alert(
            "VllmNoPodReady",
            f'kube_deployment_status_replicas_available{{namespace="{namespace}",deployment="{deployment}"}} < 1',
            _minutes(load),
            "critical",
            f"{model.name}: no vLLM pod is ready",
            f"Deployment {namespace}/{deployment} has had no available replica for longer than its startup budget: "
            "the model is down. Look at `kubectl describe pod` (Pending: GPUs) and `kubectl logs` (load errors).",
        ),
        alert(
            "VllmQueueStalled",
            f"sum({QUEUE_GAUGE}{{{where}}}) > 0 and sum(rate(vllm:generation_tokens_total{{{where}}}[5m])) == 0",
            "5m",
            "critical",
            f"{model.name}: requests wait but no token is generated",
            "Requests are queued while generation throughput is zero: the engine is hung or every request is "
            "stuck. /health may still be green; restart the pod after collecting its logs.",
        ),
        alert(
            "VllmKvCacheNearlyFull",
            f"max by (pod) (vllm:kv_cache_usage_perc{{{where}}}) > {KV_CACHE_FULL}",
            "15m",
            "warning",
            f"{model.name}: GPU KV cache nearly full",
            "The KV cache has stayed above 95% on {{ $labels.pod }}: requests queue or get preempted. Add replicas, "
            "lower maxModelLen, or raise gpuMemoryUtilization.",
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
