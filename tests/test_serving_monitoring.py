"""Issue 15 item 2: metrics reach the autoscaler on the Prometheus Operator stack, and the
alerts an operator needs, tested with `promtool test rules`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from components import serving
from components.serving import monitoring
from tests import checkers
from tests.test_serving import DEPLOYMENT, HPA, SCALED_OBJECT, one, prod_model, prod_raw
from tools.render import Render

POD_MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"


def test_keda_is_the_default_autoscaler(prod: Render) -> None:
    assert prod.config.cluster.autoscaling == "keda"
    assert "autoscaling" not in prod_raw()["cluster"]
    assert prod.of_type(HPA) == []
    trigger = one(prod, SCALED_OBJECT)["spec"]["triggers"][0]["metadata"]
    assert trigger["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"  # the operator's own Service


def test_pod_monitor_scrapes_the_serving_pods(prod: Render) -> None:
    monitor = one(prod, POD_MONITOR)
    assert monitor["metadata"]["name"] == "vllm-qwen3" and monitor["metadata"]["namespace"] == "ai"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # what the operator selects by
    assert monitor["spec"]["selector"]["matchLabels"] == serving.selector_labels(prod.config.models[0])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    ports = one(prod, DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [p["name"] for p in ports] == ["http"]


def test_monitoring_objects_can_be_turned_off(render) -> None:  # type: ignore[no-untyped-def]
    cluster = prod_raw()["cluster"] | {"monitoring": {"podMonitor": False, "alerts": False}}
    result = render(cluster=cluster)
    assert result.of_type(POD_MONITOR) == [] and result.of_type(PROMETHEUS_RULE) == []


def test_prod_custom_resources_fit_their_crd_schemas(prod: Render) -> None:
    checked = set()
    for obj in prod.kubernetes_objects():
        if obj["apiVersion"].split("/")[0] in checkers.CRD_GROUPS:
            checkers.validate(obj)
            checked.add(obj["kind"])
    assert checked >= {"PodMonitor", "PrometheusRule", "ScaledObject"}


def test_schema_check_catches_a_misspelt_field() -> None:
    bad = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
           "spec": {"selector": {}, "podMetricEndpoints": [{"port": "http"}]}}
    with pytest.raises(jsonschema.ValidationError):
        checkers.validate(bad)


# ---------------------------------------------------------------------------- promtool


def rules_file(tmp_path: Path, prod: Render) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(one(prod, PROMETHEUS_RULE)["spec"]))
    return path


def expected(alert: str, labels: dict[str, str], **template: str) -> dict[str, Any]:
    (rule,) = [r for r in monitoring.alert_rules(prod_model_obj(), "ai") if r["alert"] == alert]
    annotations = dict(rule["annotations"])
    for name, value in template.items():
        annotations = {k: v.replace("{{ $labels." + name + " }}", value) for k, v in annotations.items()}
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations}


def prod_model_obj():  # type: ignore[no-untyped-def]
    from stacks.config import Model

    return Model.model_validate(prod_model())


def test_promtool_accepts_the_rules(tmp_path: Path, prod: Render) -> None:
    result = subprocess.run([str(checkers.promtool()), "check", "rules", str(rules_file(tmp_path, prod))],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 rules found" in result.stdout


def test_alerts_fire_when_they_should_and_only_then(tmp_path: Path, prod: Render) -> None:
    model = prod.config.models[0]
    where = 'namespace="ai",model_name="qwen3",pod="vllm-qwen3-a"'
    job = serving.download_job_name(model)
    load_minutes = -(-(serving.startup_budget_seconds(model.weights_gb) + 300) // 60)
    tests = {
        "rule_files": [str(rules_file(tmp_path, prod))],
        "evaluation_interval": "1m",
        "tests": [
            {   # the only replica goes away at minute 2: nothing until the startup budget is over
                "interval": "1m",
                "input_series": [{"series": 'kube_deployment_status_replicas_available{namespace="ai",deployment="vllm-qwen3"}',
                                  "values": "1 1 0x60"}],
                "alert_rule_test": [
                    {"eval_time": f"{load_minutes}m", "alertname": "VllmNoPodReady", "exp_alerts": []},
                    {"eval_time": f"{load_minutes + 3}m", "alertname": "VllmNoPodReady",
                     "exp_alerts": [expected("VllmNoPodReady", {"namespace": "ai", "deployment": "vllm-qwen3"})]},
                ],
            },
            {   # queue > 0 with tokens flowing is busy, not stalled; without tokens it is stalled
                "interval": "1m",
                "input_series": [
                    {"series": f"vllm:num_requests_waiting{{{where}}}", "values": "4x40"},
                    {"series": f"vllm:generation_tokens_total{{{where}}}", "values": "0+100x20 2000x20"},
                ],
                "alert_rule_test": [
                    {"eval_time": "15m", "alertname": "VllmQueueStalled", "exp_alerts": []},
                    {"eval_time": "35m", "alertname": "VllmQueueStalled", "exp_alerts": [expected("VllmQueueStalled", {})]},
                ],
            },
            {   # a queue of 0 with no tokens is idle, not stalled
                "interval": "1m",
                "input_series": [
                    {"series": f"vllm:num_requests_waiting{{{where}}}", "values": "0x40"},
                    {"series": f"vllm:generation_tokens_total{{{where}}}", "values": "5x40"},
                ],
                "alert_rule_test": [{"eval_time": "35m", "alertname": "VllmQueueStalled", "exp_alerts": []}],
            },
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"vllm:kv_cache_usage_perc{{{where}}}", "values": "0.9x30 0.99x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "29m", "alertname": "VllmKvCacheNearlyFull", "exp_alerts": []},
                    {"eval_time": "50m", "alertname": "VllmKvCacheNearlyFull",
                     "exp_alerts": [expected("VllmKvCacheNearlyFull", {"pod": "vllm-qwen3-a"}, pod="vllm-qwen3-a")]},
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'kube_job_failed{{namespace="ai",job_name="{job}",condition="true"}}', "values": "0 0 1x5"},
                    {"series": f'kube_job_failed{{namespace="ai",job_name="{job}",condition="false"}}', "values": "1 1 0x5"},
                    {"series": 'kube_job_failed{namespace="ai",job_name="other-job",condition="true"}', "values": "1x7"},
                ],
                "alert_rule_test": [
                    {"eval_time": "1m", "alertname": "VllmModelDownloadFailed", "exp_alerts": []},
                    {"eval_time": "3m", "alertname": "VllmModelDownloadFailed",
                     "exp_alerts": [expected("VllmModelDownloadFailed", {"namespace": "ai", "job_name": job, "condition": "true"})]},
                ],
            },
        ],
    }
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([str(checkers.promtool()), "test", "rules", str(test_file)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
