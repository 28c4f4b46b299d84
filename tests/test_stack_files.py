"""Every committed stack file is monitored as the docs say: where it turns monitoring on (the default),
its PodMonitors and PrometheusRules carry the label a kube-prometheus-stack installed with its defaults
selects them by (`release: <its Helm release>`), and a stack that sets no labels is warned at render."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tools.render import ROOT, Render, run_program

POD_MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
# What a kube-prometheus-stack installed with its chart's defaults selects PodMonitors and PrometheusRules
# by (podMonitorSelectorNilUsesHelmValues, ruleSelectorNilUsesHelmValues: true).
DEFAULT_SELECTOR_KEY = "release"


def stack_files() -> list[Path]:
    found = sorted(ROOT.glob("Pulumi.*.yaml")) + sorted((ROOT / "docs" / "examples").glob("*.yaml"))
    return [path for path in found if "config" in (yaml.safe_load(path.read_text()) or {})]


def test_every_stack_file_is_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in stack_files()}
    assert {"Pulumi.prod.yaml", "Pulumi.lab.yaml", "Pulumi.fewgpus.yaml", "docs/examples/Pulumi.sharing.yaml",
            "docs/examples/scale-to-zero.yaml"} <= names


@pytest.mark.parametrize("path", stack_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_monitored_stack_file_carries_the_label_kube_prometheus_stack_selects(path: Path) -> None:
    monitoring = yaml.safe_load(path.read_text())["config"]["gpu-serving:cluster"].get("monitoring") or {}
    if monitoring.get("podMonitor") is False and monitoring.get("alerts") is False:
        return
    assert DEFAULT_SELECTOR_KEY in (monitoring.get("labels") or {}), f"{path.name}: cluster.monitoring.labels has no `release`"
    result = run_program(path.stem.removeprefix("Pulumi."), stack_file=path)
    assert not [w for w in result.warnings if "cluster.monitoring.labels" in w], result.warnings
    objects = result.of_type(POD_MONITOR) + result.of_type(PROMETHEUS_RULE)
    assert objects, f"{path.name}: no PodMonitor or PrometheusRule rendered"
    for resource in objects:
        labels = resource.inputs["metadata"].get("labels") or {}
        assert labels.get(DEFAULT_SELECTOR_KEY) == monitoring["labels"][DEFAULT_SELECTOR_KEY], (path.name, resource.name, labels)


def test_a_stack_without_labels_is_warned_at_render(render: Callable[..., Render]) -> None:
    cluster = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]
    cluster["monitoring"] = {}
    (warning,) = [w for w in render(cluster=cluster).warnings if "cluster.monitoring.labels" in w]
    assert warning.startswith("cluster.monitoring.labels is empty: a kube-prometheus-stack installed with its defaults "
                              "selects PodMonitors and PrometheusRules by `release: <its Helm release name>`"), warning
    assert "`release: kube-prometheus-stack`" in warning and len(warning) <= 300
    # Only what is on is named; with both off there is nothing to select, and nothing to warn about.
    cluster["monitoring"] = {"podMonitor": False}
    (warning,) = [w for w in render(cluster=cluster).warnings if "cluster.monitoring.labels" in w]
    assert "selects PrometheusRules by" in warning
    cluster["monitoring"] = {"podMonitor": False, "alerts": False}
    assert not [w for w in render(cluster=cluster).warnings if "cluster.monitoring.labels" in w]
    # A selector of the user's own (any label) is theirs to know: no warning.
    cluster["monitoring"] = {"labels": {"prometheus": "main"}}
    assert not [w for w in render(cluster=cluster).warnings if "cluster.monitoring.labels" in w]
