"""What a render records: the resources the program declared, its outputs and warnings, and the
order `pulumi up` creates the Kubernetes objects in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tools.render.redaction import redact

# Apply order: what others depend on first (as `kubectl apply -f` of one file would need).
KIND_ORDER = [
    "Namespace", "StorageClass", "RuntimeClass", "PriorityClass", "PersistentVolume", "PersistentVolumeClaim",
    "ServiceAccount", "Secret", "ConfigMap", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding",
    "Node", "DaemonSet", "Job", "Deployment", "StatefulSet", "Service", "Ingress", "HorizontalPodAutoscaler",
    "ScaledObject", "PodDisruptionBudget", "NetworkPolicy",
]


class RenderError(Exception):
    """The program refused to run (a config error): one line for the user."""


@dataclass
class Resource:
    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    options: dict[str, Any]


@dataclass
class Render:
    stack: str
    resources: list[Resource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    config: Any = None
    """The validated StackConfig the program ran with."""
    stack_reads: list[str] = field(default_factory=list)
    """Stack names the program read previous outputs of (a StackReference to itself)."""
    missing_secrets: list[str] = field(default_factory=list)
    """Secret config keys the stack reads that are not set yet (the render used placeholders)."""

    def kubernetes_objects(self) -> list[dict[str, Any]]:
        """Every Kubernetes object, redacted, in apply order (see `apply_order`)."""
        return [redact(r.inputs) for r in self.kubernetes_resources()]

    def kubernetes_resources(self) -> list[Resource]:
        return apply_order(self.resources)

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]


def apply_order(resources: list[Resource]) -> list[Resource]:
    """The Kubernetes objects in the order `pulumi up` can create them: each after every object it
    depends on (explicit `depends_on` and input dependencies; a dependency on a component means
    all the objects in it), ties broken by kind (KIND_ORDER), namespace and name."""
    by_urn = {r.urn: r for r in resources}
    objects = {r.urn: r for r in resources if is_kubernetes_object(r)}
    inside: dict[str, list[str]] = {}
    for urn in objects:
        parent = by_urn[urn].parent
        while parent in by_urn:
            inside.setdefault(parent, []).append(urn)
            parent = by_urn[parent].parent
    waits = {
        urn: {d for dep in r.options.get("dependsOn", []) for d in ([dep] if dep in objects else inside.get(dep, []))} - {urn}
        for urn, r in objects.items()
    }
    key = {urn: (_manifest_key(r.inputs), urn) for urn, r in objects.items()}
    ordered: list[Resource] = []
    while waits:
        ready = [urn for urn, deps in waits.items() if not deps] or list(waits)  # a cycle cannot happen; never hang on one
        first = min(ready, key=key.__getitem__)
        ordered.append(objects[first])
        del waits[first]
        for deps in waits.values():
            deps.discard(first)
    return ordered


def is_kubernetes_object(resource: Resource) -> bool:
    return resource.custom and resource.type.startswith("kubernetes:")


def _manifest_key(obj: dict[str, Any]) -> tuple[Any, ...]:
    kind = obj.get("kind", "")
    meta = obj.get("metadata") or {}
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return (rank, kind, meta.get("namespace") or "", meta.get("name") or "")
