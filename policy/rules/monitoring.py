"""Rules for how the vLLM servers are scraped: once. A PodMonitor and `prometheus.io/*` pod
annotations together make a Prometheus with an annotation-based job scrape every pod twice; every
series doubles, and so does a `sum()` the autoscaler or an alert reads."""

from __future__ import annotations

import re
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


# --- queries that find the vLLM series --------------------------------------------------------------

PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
# vLLM exports its series as `vllm:<name>` (vllm/v1/metrics/loggers.py); `vllm_<name>` exists only where a
# prometheus-adapter rule renames one for an HPA, never in Prometheus, so a query of it finds nothing.
UNDERSCORED = re.compile(r"(?<![\w:])vllm_(num_requests_\w+|gpu_cache_usage_perc|kv_cache_usage_perc|num_preemptions\w*|"
                         r"prompt_tokens\w*|generation_tokens\w*|time_to_first_token\w*|time_per_output_token\w*|"
                         r"inter_token_latency\w*|e2e_request_latency\w*|request_\w+|iteration_tokens\w*|"
                         r"\w*prefix_cache\w*|lora_requests_info|cache_config_info)\b")
LOOPBACK = re.compile(r"^(localhost|127(\.[0-9]{1,3}){3}|\[::1\]|0\.0\.0\.0)$", re.IGNORECASE)


def _queries(resource: Resource) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of a KEDA ScaledObject's prometheus triggers and a PrometheusRule's rules."""
    if resource.type == k8s.SCALED_OBJECT:
        for i, trigger in enumerate(k8s.as_list(dig(resource.view, "spec", "triggers"))):
            trigger = as_map(trigger)
            if trigger.get("type") == "prometheus":
                yield f"triggers[{i}].metadata.query", str(dig(trigger, "metadata", "query"))
        return
    for group in k8s.as_list(dig(resource.view, "spec", "groups")):
        for rule in k8s.as_list(as_map(group).get("rules")):
            rule = as_map(rule)
            yield f"rule {rule.get('alert') or rule.get('record')}", str(rule.get("expr"))


def check_metric_queries(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    for where, query in _queries(resource):
        for match in dict.fromkeys(m.group(0) for m in UNDERSCORED.finditer(query)):
            yield (f"{where} reads {match}, which Prometheus does not have: vLLM exports {match.replace('vllm_', 'vllm:', 1)} "
                   f"(the underscore name exists only behind prometheus-adapter), so the query returns nothing and the "
                   f"{'autoscaler never scales on it' if resource.type == k8s.SCALED_OBJECT else 'rule never fires'}. "
                   f"Write {match.replace('vllm_', 'vllm:', 1)}.")
    if resource.type != k8s.SCALED_OBJECT:
        return
    for i, trigger in enumerate(k8s.as_list(dig(resource.view, "spec", "triggers"))):
        trigger = as_map(trigger)
        address = dig(trigger, "metadata", "serverAddress")
        if trigger.get("type") != "prometheus" or not isinstance(address, str):
            continue
        authority, _, path = address.split("://", 1)[-1].partition("/")
        host = authority[: authority.find("]") + 1] if authority.startswith("[") else authority.split(":", 1)[0]
        if "api" in path.split("/"):
            # KEDA's Prometheus scaler appends /api/v1/query itself.
            yield (f"triggers[{i}].metadata.serverAddress {address} holds the API path, which KEDA appends itself "
                   f"(/api/v1/query): every query gets 404 and the workload is never scaled. Give the server's base URL.")
        if LOOPBACK.match(host):
            yield (f"triggers[{i}].metadata.serverAddress {address} is loopback, but KEDA's operator sends the query from "
                   f"its own pod, where nothing listens there. Give the Prometheus Service's cluster DNS name.")


# --- the PodMonitor names a port the pods have ---------------------------------------------------------------


def check_podmonitor_port(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    for monitor in k8s.kinds_in(resources, frozenset({POD_MONITOR})):
        for w in workloads(resources):
            if not w.vllm:
                continue
            try:
                if not _monitored(monitor, k8s.pod_labels(w.resource), w.namespace):
                    continue
                names = {str(as_map(p).get("name")) for c in k8s.containers(w.spec) for p in k8s.as_list(c.get("ports"))}
                wanted = [str(as_map(e).get("port")) for e in k8s.as_list(dig(monitor.view, "spec", "podMetricsEndpoints"))
                          if as_map(e).get("port") is not None]
            except Unknown:
                continue
            for port in wanted:
                if port not in names:
                    # The Prometheus Operator makes a target only for a container port of that name.
                    yield monitor, (
                        f"scrapes port '{port}', but the pods of {w.resource.kind} {w.name} name no container port "
                        f"'{port}' ({', '.join(sorted(names)) or 'none named'}): the Prometheus Operator makes no target, so "
                        f"nothing is scraped and autoscaling and alerts read nothing. Name the vLLM port '{port}' "
                        f"(ports: - name: {port}, containerPort: 8000), or scrape the name it has.")


RULES = [
    Rule("vllm-metric-queries",
         "Autoscaler and alert queries read vLLM's series by their Prometheus names (vllm:…) from a reachable base URL.",
         MANDATORY, check_metric_queries, frozenset({k8s.SCALED_OBJECT, PROMETHEUS_RULE})),
    Rule("vllm-podmonitor-port", "A PodMonitor of vLLM pods scrapes a container port they name.",
         MANDATORY, check_podmonitor_port),
    Rule("vllm-scraped-once",
         "vLLM server pods selected by a PodMonitor carry no prometheus.io/scrape annotation (no double scrape).",
         MANDATORY, check_scraped_once),
]
