"""Issue 15 item 2: metrics reach the autoscaler on the Prometheus Operator stack, and the
alerts an operator needs, tested with `promtool test rules`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from components.serving import monitoring
from components.serving.autoscaling import adapter_rules
from components.serving.names import download_job_name, selector_labels
from stacks.config.budgets import deployment_timeout_seconds, startup_budget_seconds
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
    assert monitor["metadata"]["name"] == "gpu-serving-servers" and monitor["metadata"]["namespace"] == "ai"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # what the operator selects by
    selector = monitor["spec"]["selector"]["matchLabels"]
    pod_labels = one(prod, DEPLOYMENT)["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= selector_labels(prod.config.models[0]).items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    ports = one(prod, DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [p["name"] for p in ports] == ["http"]


def test_one_pod_monitor_selects_every_model_and_no_other_pod(render) -> None:  # type: ignore[no-untyped-def]
    """Two models: one PodMonitor whose selector matches both models' serving pods and neither's Job pods. On the real
    API server, with the pickers and holds too: the e2e's servers-scraped check."""
    one_each = {"replicas": {"min": 1, "max": 1}}
    result = render(models=[prod_model() | one_each, prod_model() | one_each | {"name": "qwen3-b", "ingress": None}])
    selector = one(result, POD_MONITOR)["spec"]["selector"]["matchLabels"]
    pods = {f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]["metadata"].get("labels", {})
            for o in result.kubernetes_objects() if o["kind"] in {"Deployment", "Job", "StatefulSet", "DaemonSet"}}
    selected = sorted(name for name, labels in pods.items() if selector.items() <= labels.items())
    assert selected == ["Deployment/vllm-qwen3", "Deployment/vllm-qwen3-b"]
    assert len(pods) == 6, sorted(pods)  # each model's download and smoke Jobs: the same name and instance labels, not selected


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


def run_promtool_tests(tmp_path: Path, prod: Render, tests: list[dict[str, Any]]) -> None:
    spec = {"rule_files": [str(rules_file(tmp_path, prod))], "evaluation_interval": "1m", "tests": tests}
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run([str(checkers.promtool()), "test", "rules", str(test_file)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# Samples every minute, evaluations at whole minutes plus 30 s: no sample sits on a window's edge,
# so the cases read the same on promtool 2.x (closed ranges) and 3.x (left-open ranges).
def at(minutes: int) -> str:
    return f"{minutes}m30s"


AVAILABLE = 'kube_deployment_status_replicas_available{namespace="ai",deployment="vllm-qwen3"}'


def test_no_pod_ready_waits_out_a_rollout_and_fires_after_it(tmp_path: Path, prod: Render) -> None:
    model = prod.config.models[0]
    budget = -(-deployment_timeout_seconds(model.weights_gb) // 60)  # pull + startup + margin
    assert budget > -(-(startup_budget_seconds(model.weights_gb) + 300) // 60)  # longer than before issue 24
    down = expected("VllmNoPodReady", {"namespace": "ai", "deployment": "vllm-qwen3"})
    run_promtool_tests(tmp_path, prod, [
        {   # a one-replica rollout: the old pod goes, the new one pulls and loads for most of the budget, then is ready
            "interval": "1m",
            "input_series": [{"series": AVAILABLE, "values": f"1 1 0x{budget - 3} 1x30"}],
            "alert_rule_test": [{"eval_time": at(t), "alertname": "VllmNoPodReady", "exp_alerts": []}
                                for t in (5, budget - 2, budget + 5)],
        },
        {   # the only replica never comes back
            "interval": "1m",
            "input_series": [{"series": AVAILABLE, "values": f"1 1 0x{budget + 20}"}],
            "alert_rule_test": [
                {"eval_time": at(budget), "alertname": "VllmNoPodReady", "exp_alerts": []},
                {"eval_time": at(budget + 4), "alertname": "VllmNoPodReady", "exp_alerts": [down]},
            ],
        },
        {   # the metric vanishes (kube-state-metrics gone, Deployment deleted): absent() fires too
            "interval": "1m",
            "input_series": [{"series": AVAILABLE, "values": "1 1 " + " ".join(["_"] * (budget + 20))}],
            "alert_rule_test": [
                {"eval_time": at(budget), "alertname": "VllmNoPodReady", "exp_alerts": []},
                {"eval_time": at(budget + 12), "alertname": "VllmNoPodReady", "exp_alerts": [down]},
            ],
        },
        {   # a second healthy replica: one pod missing is no page
            "interval": "1m",
            "input_series": [{"series": AVAILABLE, "values": f"2 1x{budget + 20}"}],
            "alert_rule_test": [{"eval_time": at(budget + 12), "alertname": "VllmNoPodReady", "exp_alerts": []}],
        },
    ])


def pod(name: str) -> str:
    return f'namespace="ai",model_name="qwen3",pod="{name}"'


def test_the_queue_counts_each_pod_once_however_many_jobs_scrape_it(tmp_path: Path, prod: Render) -> None:
    """While an upgrade replaces the per-model PodMonitors by the namespace's one, both scrape a pod (two `job`s):
    KEDA's query and the adapter's read its queue once, not twice."""
    a, b = pod("vllm-qwen3-a"), pod("vllm-qwen3-b")
    keda = one(prod, SCALED_OBJECT)["spec"]["triggers"][0]["metadata"]["query"]
    adapter = yaml.safe_load(adapter_rules())["rules"][0]["metricsQuery"]
    per_pod = (adapter.replace("<<.Series>>", "vllm:num_requests_waiting")
               .replace("<<.LabelMatchers>>", 'namespace="ai",pod=~"vllm-qwen3-a|vllm-qwen3-b"').replace("<<.GroupBy>>", "pod"))
    run_promtool_tests(tmp_path, prod, [{
        "interval": "1m",
        "input_series": [
            {"series": f'vllm:num_requests_waiting{{{a},job="ai/vllm-qwen3"}}', "values": "4x5"},
            {"series": f'vllm:num_requests_waiting{{{a},job="ai/gpu-serving-servers"}}', "values": "4x5"},
            {"series": f'vllm:num_requests_waiting{{{b},job="ai/gpu-serving-servers"}}', "values": "2x5"},
        ],
        "promql_expr_test": [
            {"expr": keda, "eval_time": "3m", "exp_samples": [{"labels": "{}", "value": 6}]},
            {"expr": per_pod, "eval_time": "3m", "exp_samples": [{"labels": '{pod="vllm-qwen3-a"}', "value": 4},
                                                                 {"labels": '{pod="vllm-qwen3-b"}', "value": 2}]},
        ],
    }])


def test_queue_stalled_fires_per_pod(tmp_path: Path, prod: Render) -> None:
    hung, healthy = pod("vllm-qwen3-hung"), pod("vllm-qwen3-ok")
    stalled = expected("VllmQueueStalled", {"namespace": "ai", "pod": "vllm-qwen3-hung"}, pod="vllm-qwen3-hung")
    run_promtool_tests(tmp_path, prod, [
        {   # one hung pod (queue, no tokens) beside a busy healthy one: the sum over both never stalls
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:num_requests_waiting{{{hung}}}", "values": "4x40"},
                {"series": f"vllm:generation_tokens_total{{{hung}}}", "values": "0+100x10 1000x30"},
                {"series": f"vllm:num_requests_waiting{{{healthy}}}", "values": "2x40"},
                {"series": f"vllm:generation_tokens_total{{{healthy}}}", "values": "0+100x40"},
            ],
            "alert_rule_test": [
                {"eval_time": at(8), "alertname": "VllmQueueStalled", "exp_alerts": []},
                {"eval_time": at(25), "alertname": "VllmQueueStalled", "exp_alerts": [stalled]},
            ],
        },
        {   # a queue with tokens flowing is busy; no queue and no tokens is idle
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:num_requests_waiting{{{hung}}}", "values": "0x40"},
                {"series": f"vllm:generation_tokens_total{{{hung}}}", "values": "5x40"},
                {"series": f"vllm:num_requests_waiting{{{healthy}}}", "values": "9x40"},
                {"series": f"vllm:generation_tokens_total{{{healthy}}}", "values": "0+100x40"},
            ],
            "alert_rule_test": [{"eval_time": at(30), "alertname": "VllmQueueStalled", "exp_alerts": []}],
        },
    ])


def test_preemptions_warn_and_a_full_cache_alone_does_not(tmp_path: Path, prod: Render) -> None:
    busy, other = pod("vllm-qwen3-a"), pod("vllm-qwen3-b")
    per_minute = int(monitoring.PREEMPTIONS_PER_S * 60)
    preempting = expected("VllmPreempting", {"namespace": "ai", "pod": "vllm-qwen3-a"}, pod="vllm-qwen3-a")
    assert not [r for r in monitoring.alert_rules(prod.config.models[0], "ai") if "kv_cache_usage" in r["expr"]]
    run_promtool_tests(tmp_path, prod, [
        {
            "interval": "1m",
            "input_series": [
                # steady preemption well above the threshold from minute 10 on
                {"series": f"vllm:num_preemptions_total{{{busy}}}", "values": f"0x10 0+{per_minute * 3}x40"},
                # a few preemptions now and then, below it; its KV cache is full all along
                {"series": f"vllm:num_preemptions_total{{{other}}}", "values": f"0+{max(1, per_minute // 4)}x50"},
                {"series": f"vllm:kv_cache_usage_perc{{{other}}}", "values": "0.99x50"},
            ],
            "alert_rule_test": [
                {"eval_time": at(20), "alertname": "VllmPreempting", "exp_alerts": []},
                {"eval_time": at(40), "alertname": "VllmPreempting", "exp_alerts": [preempting]},
            ],
        },
    ])


def test_download_failed_fires_for_this_job_only(tmp_path: Path, prod: Render) -> None:
    job = download_job_name(prod.config.models[0])
    run_promtool_tests(tmp_path, prod, [
        {
            "interval": "1m",
            "input_series": [
                {"series": f'kube_job_failed{{namespace="ai",job_name="{job}",condition="true"}}', "values": "0 0 1x5"},
                {"series": f'kube_job_failed{{namespace="ai",job_name="{job}",condition="false"}}', "values": "1 1 0x5"},
                {"series": 'kube_job_failed{namespace="ai",job_name="other-job",condition="true"}', "values": "1x7"},
            ],
            "alert_rule_test": [
                {"eval_time": at(1), "alertname": "VllmModelDownloadFailed", "exp_alerts": []},
                {"eval_time": at(3), "alertname": "VllmModelDownloadFailed",
                 "exp_alerts": [expected("VllmModelDownloadFailed", {"namespace": "ai", "job_name": job, "condition": "true"})]},
            ],
        },
    ])
