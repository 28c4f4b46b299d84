"""Grafana dashboards as ConfigMaps for the Grafana sidecar of kube-prometheus-stack (`grafana.sidecar.dashboards`:
it loads every ConfigMap labelled `grafana_dashboard: "1"`, in all namespaces). The dashboards are the JSON files
beside this module; the render fills in only the stack's namespace and a uid and title of the stack's own, so two
stacks' dashboards do not replace each other. Nothing of a model or a node is in them (the models are listed from
their Deployments, the arrays by their md devices): adding a model or a node changes only its own objects.

One dashboard for the models, with a `model_name` variable, rather than one per model: a fleet of many models
would otherwise fill Grafana's list with identical dashboards, and comparing two models is a variable switch.
One for the nodes, with a `node` variable."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacks.config import Node

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models.json"
NODES = HERE / "nodes.json"


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


def models_dashboard(namespace: str) -> dict[str, Any]:
    return _render(MODELS, "models", namespace, {"namespace": namespace})


def nodes_dashboard(namespace: str) -> dict[str, Any]:
    return _render(NODES, "nodes", namespace, {})


def dashboards(namespace: str, models: Sequence[str], nodes: Sequence[Node]) -> dict[str, tuple[str, str]]:
    """kind → (file name, dashboard JSON) for the stack's models and nodes (none without them). The stack's
    namespace is in the name: the sidecar writes every dashboard into one folder by its file name."""
    docs = {}
    if models:
        docs["models"] = models_dashboard(namespace)
    if nodes:
        docs["nodes"] = nodes_dashboard(namespace)
    return {kind: (f"gpu-serving-{namespace}-{kind}.json", json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
            for kind, doc in docs.items()}
