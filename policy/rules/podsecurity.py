"""Rules for how a vLLM server pod is admitted and kept: Pod Security labels on the namespace,
Guaranteed QoS and a priority above batch work, and a non-root user the libraries can resolve."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from . import k8s
from .core import ADVISORY, Resource, Rule
from .k8s import as_map, container_name, dig, to_int

NAMESPACE = "kubernetes:core/v1:Namespace"
POD_SECURITY = "pod-security.kubernetes.io"
LEVELS = ("privileged", "baseline", "restricted")


def check_namespace_pod_security(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    labels = as_map(dig(resource.view, "metadata", "labels"))
    enforce, warn = labels.get(f"{POD_SECURITY}/enforce"), labels.get(f"{POD_SECURITY}/warn")
    if enforce not in ("baseline", "restricted"):
        yield (f"namespace enforces no Pod Security level ({POD_SECURITY}/enforce is {enforce or 'unset'}): any pod, "
               f"privileged or with hostPath, is admitted next to the models. Label it {POD_SECURITY}/enforce: baseline "
               f"(or restricted).")
    enforced = LEVELS.index(str(enforce)) if enforce in LEVELS else 0
    if warn not in ("baseline", "restricted") or LEVELS.index(str(warn)) < enforced:
        yield (f"namespace has no {POD_SECURITY}/warn level at or above its enforce level: nobody sees what a "
               f"stricter level would refuse. Label it {POD_SECURITY}/warn: restricted.")


def _quantity(value: object) -> str | None:
    return None if value is None else str(value)


def check_guaranteed_qos(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        requests, limits = as_map(dig(c, "resources", "requests")), as_map(dig(c, "resources", "limits"))
        # A request left out defaults to the limit.
        unequal = [r for r in ("cpu", "memory")
                   if limits.get(r) is None or _quantity(requests.get(r, limits.get(r))) != _quantity(limits.get(r))]
        if unequal:
            yield (f"container '{container_name(c)}' is not Guaranteed QoS ({', '.join(unequal)}: request ≠ limit or "
                   f"no limit): under node pressure the kubelet evicts it before Guaranteed pods, and a model takes "
                   f"minutes to load again. Set requests equal to limits for cpu and memory.")


def check_priority_class(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    if spec is None or not any(k8s.is_vllm_server(c) for c in k8s.containers(spec)):
        return
    if not spec.get("priorityClassName"):
        yield ("vLLM server pods have no priorityClassName: they run at the default priority, the same as batch "
               "pods, so the scheduler may preempt a model server (minutes to reload) for a batch pod. Give them a "
               "PriorityClass above batch workloads.")


def check_non_root_identity(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        uid = to_int(dig(c, "securityContext", "runAsUser"))
        uid = to_int(dig(spec, "securityContext", "runAsUser")) if uid is None else uid
        if uid in (None, 0):
            continue
        missing = [name for name in ("HOME", "USER", "LOGNAME") if k8s.env_literal(c, name) is None]
        if missing:
            yield (f"container '{container_name(c)}' runs as UID {uid} without {', '.join(missing)}: torch and Triton "
                   f"call getpass.getuser(), which asks /etc/passwd when USER/LOGNAME are unset and fails with "
                   f"'getpwuid(): uid not found' for a UID the image does not list; HOME decides where caches go. "
                   f"Set HOME (a writable mount), USER and LOGNAME.")


RULES = [
    Rule("namespace-pod-security",
         "Namespaces enforce Pod Security baseline or restricted and warn at restricted.",
         ADVISORY, check_namespace_pod_security, frozenset({NAMESPACE})),
    Rule("vllm-guaranteed-qos", "vLLM server containers have cpu and memory requests equal to their limits (Guaranteed QoS).",
         ADVISORY, check_guaranteed_qos, k8s.WORKLOADS),
    Rule("vllm-priority-class", "vLLM server pods name a PriorityClass (above batch workloads).",
         ADVISORY, check_priority_class, k8s.WORKLOADS),
    Rule("vllm-non-root-identity", "A vLLM server running as a non-root UID sets HOME, USER and LOGNAME.",
         ADVISORY, check_non_root_identity, k8s.WORKLOADS),
]
