"""Rules for how the vLLM servers are scraped: once. A PodMonitor and `prometheus.io/*` pod
annotations together make a Prometheus with an annotation-based job scrape every pod twice; every
series doubles, and so does a `sum()` the autoscaler or an alert reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from . import k8s
from .core import MANDATORY, Resource, Rule, Unknown
from .k8s import as_map, dig, namespace, workloads

POD_MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"


def _monitored(monitor: Resource, labels: Mapping, ns: str) -> bool:
    spec = as_map(dig(monitor.view, "spec"))
    selector = as_map(spec.get("selector"))
    if dig(spec, "namespaceSelector", "any") is not True:
        names = [str(n) for n in k8s.as_list(dig(spec, "namespaceSelector", "matchNames"))] or [namespace(monitor.view)]
        if ns not in names:
            return False
    match = as_map(selector.get("matchLabels"))
    if k8s.as_list(selector.get("matchExpressions")):
        raise Unknown
    return all(labels.get(k) == v for k, v in match.items())


def check_scraped_once(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    monitors = list(k8s.kinds_in(resources, frozenset({POD_MONITOR})))
    if not monitors:
        return
    for w in workloads(resources):
        if not w.vllm:
            continue
        try:
            annotations = as_map(dig(w.resource.view, "spec", "template", "metadata", "annotations"))
            if str(annotations.get("prometheus.io/scrape")).lower() != "true":
                continue
            by = [m.display_name for m in monitors if _monitored(m, k8s.pod_labels(w.resource), w.namespace)]
        except Unknown:
            continue
        if by:
            yield w.resource, (
                f"pods carry prometheus.io/scrape and are also scraped by PodMonitor {', '.join(sorted(by))}: where an "
                f"annotation-based scrape job exists too, every vLLM series doubles, and so do the queue sum the "
                f"autoscaler reads and the alerts. Drop the prometheus.io/* annotations (or the PodMonitor).")


RULES = [
    Rule("vllm-scraped-once",
         "vLLM server pods selected by a PodMonitor carry no prometheus.io/scrape annotation (no double scrape).",
         MANDATORY, check_scraped_once),
]
