"""Issue 24 item 1 over plain YAML: a vLLM server is scraped once, by its PodMonitor."""

from __future__ import annotations

from policy_factory import check, good


def findings(*objects):  # type: ignore[no-untyped-def]
    return [v for v in check(*objects) if v.policy == "vllm-scraped-once"]


def annotated():  # type: ignore[no-untyped-def]
    deployment = good("Deployment")
    deployment["spec"]["template"]["metadata"]["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"}
    return deployment


def test_pod_monitor_alone_passes() -> None:
    assert findings(good("Deployment"), good("PodMonitor")) == []


def test_annotations_beside_a_pod_monitor_are_refused() -> None:
    (finding,) = findings(annotated(), good("PodMonitor"))
    assert finding.level == "mandatory" and "PodMonitor vllm-qwen3" in finding.message


def test_annotations_without_a_pod_monitor_are_the_only_scrape() -> None:
    assert findings(annotated()) == []
    other = good("PodMonitor")
    other["spec"]["selector"]["matchLabels"] = {"app": "other"}
    assert findings(annotated(), other) == []
