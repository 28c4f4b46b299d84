"""Grafana dashboards as ConfigMaps for the Grafana sidecar of kube-prometheus-stack (`grafana.sidecar.dashboards`:
it loads every ConfigMap labelled `grafana_dashboard: "1"`, in all namespaces). The dashboards are the JSON files
beside this module; the render fills in only their hidden constants (the stack's namespace, nodes, mountpoints),
the model list, and a uid and title of the stack's own, so two stacks' dashboards do not replace each other.

One dashboard for the models, with a `model_name` variable, rather than one per model: a fleet of many models
would otherwise fill Grafana's list with identical dashboards, and comparing two models is a variable switch.
One for the nodes, with a `node` variable."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacks.config import Node

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models.json"
NODES = HERE / "nodes.json"


def promql_regex(values: Sequence[str]) -> str:
    """An alternation matching exactly `values`, as it goes inside a PromQL double-quoted string: regex
    metacharacters escaped with a backslash that is itself escaped for the string. Nothing matches an empty list."""
    escaped = [re.sub(r"([.+*?()|\[\]{}^$\\])", r"\\\\\1", value) for value in values]
    return "|".join(escaped) if escaped else "$^"


def _uid(kind: str, namespace: str) -> str:
    """Grafana's uid is at most 40 characters: the namespace (up to 63) goes in as a digest."""
    return f"gpu-serving-{kind}-{hashlib.sha256(namespace.encode()).hexdigest()[:12]}"


def _set(dashboard: dict[str, Any], variable: str, value: str) -> None:
    (found,) = [v for v in dashboard["templating"]["list"] if v["name"] == variable]
    found["query"] = value
    found["current"] = {"selected": False, "text": value, "value": value}


def _render(path: Path, kind: str, namespace: str, constants: dict[str, str]) -> dict[str, Any]:
    dashboard = json.loads(path.read_text())
    dashboard["uid"] = _uid(kind, namespace)
    dashboard["title"] = f"{dashboard['title']} ({namespace})"
    for name, value in constants.items():
        _set(dashboard, name, value)
    return dashboard


def models_dashboard(namespace: str, models: Sequence[str]) -> dict[str, Any]:
    """The models' dashboard: a custom `model_name` variable of the stack's served model names (a model at
    zero replicas has no series to list it by), the first selected."""
    dashboard = _render(MODELS, "models", namespace, {"namespace": namespace})
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "model_name"]
    variable["query"] = ",".join(models)
    variable["options"] = [{"selected": i == 0, "text": m, "value": m} for i, m in enumerate(models)]
    variable["current"] = {"selected": True, "text": models[0], "value": models[0]} if models else {}
    return dashboard


def nodes_dashboard(namespace: str, nodes: Sequence[Node]) -> dict[str, Any]:
    mountpoints = sorted({node.storage.mountpoint for node in nodes if node.storage is not None})
    return _render(NODES, "nodes", namespace, {
        "nodes": promql_regex([node.name for node in nodes]),
        "mountpoints": promql_regex(mountpoints),
    })


def dashboards(namespace: str, models: Sequence[str], nodes: Sequence[Node]) -> dict[str, tuple[str, str]]:
    """kind → (file name, dashboard JSON) for the stack's models and nodes (none without them). The stack's
    namespace is in the name: the sidecar writes every dashboard into one folder by its file name."""
    docs = {}
    if models:
        docs["models"] = models_dashboard(namespace, models)
    if nodes:
        docs["nodes"] = nodes_dashboard(namespace, nodes)
    return {kind: (f"gpu-serving-{namespace}-{kind}.json", json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
            for kind, doc in docs.items()}
