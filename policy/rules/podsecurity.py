"""Rules for how a vLLM server pod is admitted and kept: Pod Security labels on the namespace,
Guaranteed QoS and a priority above batch work, and a non-root user the libraries can resolve."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from . import k8s
from .core import ADVISORY, MANDATORY, Resource, Rule
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


# Kubernetes' Pod Security Standards: what `baseline` lets a container add; `restricted` only NET_BIND_SERVICE.
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})


def pod_security_problems(spec: Mapping, level: str) -> list[str]:
    """What the admission controller refuses of a pod spec at `level` (baseline, or restricted's main controls)."""
    problems = [f"{key}: true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key) is True]
    problems += [f"hostPath volume '{as_map(v).get('name')}'" for v in k8s.as_list(spec.get("volumes")) if "hostPath" in as_map(v)]
    pod_context = as_map(spec.get("securityContext"))
    for c in [*k8s.containers(spec), *k8s.containers(spec, init=True)]:
        context, name = as_map(c.get("securityContext")), container_name(c)
        if context.get("privileged") is True:
            problems.append(f"container '{name}' privileged")
        added = {str(a) for a in k8s.as_list(dig(context, "capabilities", "add"))}
        allowed = BASELINE_CAPABILITIES if level == "baseline" else {"NET_BIND_SERVICE"}
        if added - allowed:
            problems.append(f"container '{name}' adding {', '.join(sorted(added - allowed))}")
        if any(as_map(p).get("hostPort") for p in k8s.as_list(c.get("ports"))):
            problems.append(f"container '{name}' with a hostPort")
        if level != "restricted":
            continue
        if (context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True
                or context.get("runAsUser", pod_context.get("runAsUser")) == 0):
            problems.append(f"container '{name}' not runAsNonRoot")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"container '{name}' without allowPrivilegeEscalation: false")
        if "ALL" not in {str(d) for d in k8s.as_list(dig(context, "capabilities", "drop"))}:
            problems.append(f"container '{name}' not dropping ALL capabilities")
        seccomp = dig(context, "seccompProfile", "type") or dig(pod_context, "seccompProfile", "type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"container '{name}' without a RuntimeDefault seccomp profile")
    return problems


def check_pod_security_admitted(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    levels = {}
    for ns in k8s.kinds_in(resources, frozenset({NAMESPACE})):
        level = as_map(dig(ns.view, "metadata", "labels")).get(f"{POD_SECURITY}/enforce")
        if level in ("baseline", "restricted"):
            levels[str(dig(ns.view, "metadata", "name"))] = str(level)
    for w in k8s.workloads(resources):
        level = levels.get(w.namespace)
        problems = pod_security_problems(w.spec, level) if level else []
        if problems:
            # Refused at admission: the Deployment exists, its ReplicaSet's events say why, and no pod ever runs.
            yield w.resource, (
                f"its pods have {'; '.join(problems)}, which namespace {w.namespace}'s {POD_SECURITY}/enforce: {level} "
                f"refuses at admission: no pod is ever created (only the ReplicaSet's or Job's events say why). Remove "
                f"them (the model volume is a PersistentVolumeClaim, GPUs come from the device plugin), or run it elsewhere.")


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
    Rule("pod-security-admitted", "Workloads in a namespace that enforces a Pod Security level pass it (else no pod is created).",
         MANDATORY, check_pod_security_admitted),
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
