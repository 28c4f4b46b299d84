"""Rules for what scales a GPU workload: an autoscaler reads the request queue, scales down slowly, is the only
one on its workload, and takes a vLLM workload to zero only where something holds its requests and wakes it.

Also the reading of those autoscalers (HPAs, KEDA ScaledObjects, the HTTP add-on's) and of the most pods a workload
can run with them (`max_replicas`), which the GPU capacity and claim rules count with."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from . import k8s
from .core import MANDATORY, Resource, Rule, attempt
from .holds import HTTP_SCALED_OBJECT, SKIP_SCALED_OBJECT, hold_named, holds, replicas, woken_by
from .k8s import Workload, as_list, as_map, dig, namespace, to_int, workloads

# KEDA's defaults when a ScaledObject does not set maxReplicaCount / minReplicaCount.
KEDA_DEFAULT_MAX = 100
KEDA_DEFAULT_MIN = 0
# Kubernetes' default HPA scale-down stabilization window.
HPA_DEFAULT_SCALE_DOWN_WINDOW = 300


# --- reading the autoscalers -------------------------------------------------------

@dataclass(frozen=True)
class Scaler:
    resource: Resource
    namespace: str
    target_kind: str
    target_name: str
    max_replicas: int | None


def scalers(resources: Sequence[Resource]) -> list[Scaler]:
    """HPAs and KEDA ScaledObjects with the workload they drive, and the HTTPScaledObjects for which the HTTP
    add-on makes a ScaledObject itself (those without `skip-scaledobject-creation`)."""

    def read(r: Resource) -> Scaler:
        spec = as_map(r.view.get("spec"))
        ref = as_map(spec.get("scaleTargetRef"))
        key, default = ("maxReplicas", None) if r.type == k8s.HPA else ("maxReplicaCount", KEDA_DEFAULT_MAX)
        maximum = to_int(spec.get(key, default))
        return Scaler(r, namespace(r.view), str(ref.get("kind") or "Deployment"), str(ref.get("name")), maximum)

    found = [attempt(read, r) for r in k8s.kinds_in(resources, frozenset({k8s.HPA, k8s.SCALED_OBJECT}))]
    found += [Scaler(h.resource, h.namespace, h.target_kind, h.target_name, attempt(replicas, h.resource, default=(0, None))[1])
              for h in holds(resources) if h.makes_scaled_object]
    return [s for s in found if s is not None]


def drives(scaler: Scaler, workload: Workload) -> bool:
    return (workload.resource.type in k8s.SCALABLE and scaler.namespace == workload.namespace
            and scaler.target_kind == workload.resource.kind and scaler.target_name == workload.name)


def max_replicas(workload: Workload, all_scalers: Sequence[Scaler]) -> int:
    """Most pods the workload can ever run; an autoscaler overrides replicas."""
    r = workload.resource
    if r.type == k8s.POD:
        return 1
    if r.type == k8s.JOB:
        return to_int(dig(r.view, "spec", "parallelism")) or 1
    limits = [s.max_replicas for s in all_scalers if drives(s, workload) and s.max_replicas is not None]
    if limits:
        return max(limits)
    replicas = to_int(dig(r.view, "spec", "replicas"))
    return 1 if replicas is None else replicas


def min_replicas(workload: Workload, all_scalers: Sequence[Scaler]) -> int:
    """Fewest pods the workload runs while it is up: an autoscaler's minimum (HPA `minReplicas`, default 1; KEDA
    `minReplicaCount`, default 0; an HTTPScaledObject's `replicas.min`) overrides replicas; with several, the
    highest (each keeps at least its own)."""
    r = workload.resource
    if r.type in (k8s.POD, k8s.JOB):
        return max_replicas(workload, all_scalers)
    minimums = [_min_replicas(s.resource) for s in all_scalers if drives(s, workload)]
    known = [m for m in minimums if m is not None]
    if minimums:
        return max(known, default=0)
    replicas = to_int(dig(r.view, "spec", "replicas"))
    return 1 if replicas is None else replicas


# --- the rules ---------------------------------------------------------------------

CPU_MEMORY = ("cpu", "memory")


def _only_cpu_memory(metrics: Sequence) -> bool:
    names = []
    for metric in metrics:
        metric = as_map(metric)
        kind = metric.get("type")
        if kind not in ("Resource", "ContainerResource"):
            return False
        key = "resource" if kind == "Resource" else "containerResource"
        names.append(dig(metric, key, "name"))
    return all(n in CPU_MEMORY for n in names)


def check_gpu_hpa(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    minimum = int(cfg["minScaleDownWindowSeconds"])
    gpu_workloads = [w for w in workloads(resources) if w.gpus_per_pod]
    for s in scalers(resources):
        if s.resource.type != k8s.HPA or not any(drives(s, w) for w in gpu_workloads):
            continue
        found = attempt(_hpa_problems, s.resource, minimum, default=[])
        for message in found:
            yield s.resource, message


def _hpa_problems(hpa: Resource, minimum: int) -> list[str]:
    spec = as_map(hpa.view.get("spec"))
    problems = []
    metrics = as_list(spec.get("metrics"))
    if _only_cpu_memory(metrics):
        what = "no metrics (defaults to 80% CPU)" if not metrics else "CPU/memory only"
        problems.append(
            f"HPA on a GPU workload scales on {what}: inference load shows up in the request queue, "
            f"not in CPU, so it scales at the wrong time or never. Scale on a Pods metric such as "
            f"vllm_num_requests_waiting (via prometheus-adapter).")
    window = to_int(dig(spec, "behavior", "scaleDown", "stabilizationWindowSeconds"))
    window = HPA_DEFAULT_SCALE_DOWN_WINDOW if window is None else window
    if window < minimum:
        problems.append(
            f"HPA scale-down stabilization window is {window}s (< {minimum}s): a new pod needs minutes "
            f"to load its model, so a short window removes and re-adds GPU pods in a loop. Set "
            f"behavior.scaleDown.stabilizationWindowSeconds >= {minimum}.")
    return problems


def check_single_autoscaler(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    all_scalers = scalers(resources)
    keda = [s for s in all_scalers if s.resource.type == k8s.SCALED_OBJECT]
    for hpa in (s for s in all_scalers if s.resource.type == k8s.HPA):
        for so in keda:
            same = (hpa.namespace, hpa.target_kind, hpa.target_name) == (so.namespace, so.target_kind,
                                                                         so.target_name)
            if same:
                yield hpa.resource, (
                    f"{hpa.target_kind} {hpa.target_name} is scaled by this HPA and by KEDA "
                    f"ScaledObject {so.resource.display_name}, which creates its own HPA "
                    f"keda-hpa-{so.resource.display_name}: the two fight over replicas and pods "
                    f"(each minutes to load) come and go. Keep one of them.")
    for hold in (s for s in all_scalers if s.resource.type == HTTP_SCALED_OBJECT):
        for other in (s for s in all_scalers if s.resource.type != HTTP_SCALED_OBJECT):
            if (hold.namespace, hold.target_kind, hold.target_name) == (other.namespace, other.target_kind, other.target_name):
                name = hold.resource.display_name
                yield other.resource, (
                    f"{other.target_kind} {other.target_name} is scaled by this {other.resource.kind} and by HTTPScaledObject "
                    f"{name}, for which the HTTP add-on creates ScaledObject {name}: the two fight over replicas. Keep one: "
                    f"annotate the HTTPScaledObject {SKIP_SCALED_OBJECT}: \"true\" (and wake the workload with an "
                    f"external-push trigger naming it), or drop this {other.resource.kind}.")


def _min_replicas(scaler: Resource) -> int | None:
    spec = as_map(scaler.view.get("spec"))
    if scaler.type == k8s.HPA:
        return to_int(spec.get("minReplicas", 1))  # the API defaults it to 1
    if scaler.type == HTTP_SCALED_OBJECT:
        return replicas(scaler)[0]
    return to_int(spec.get("minReplicaCount", KEDA_DEFAULT_MIN))


def _hold_problem(scaler: Scaler, resources: Sequence[Resource]) -> str | None:
    """Why nothing holds the requests of this scaler's workload at zero; None when something does: the HTTP add-on's
    own ScaledObject, or a ScaledObject whose `external-push` trigger names an HTTPScaledObject or InterceptorRoute for
    the workload (one that is not in view is trusted: a rule may only fail on what it saw)."""
    if scaler.resource.type == HTTP_SCALED_OBJECT:
        return None
    named = woken_by(scaler.resource) if scaler.resource.type == k8s.SCALED_OBJECT else []
    if not named:
        return "nothing holds its requests"
    all_holds = holds(resources)
    for kind, name in named:
        hold = hold_named(all_holds, scaler.namespace, kind, name)
        if hold is None or hold.holds_for(scaler.namespace, scaler.target_kind, scaler.target_name):
            return None
    return (f"its external-push trigger names {', '.join(f'{kind} {name}' for kind, name in named)}, which holds the requests "
            "of another workload")


def check_vllm_scale_to_zero(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    servers = [w for w in workloads(resources) if w.vllm]
    for s in scalers(resources):
        if not any(drives(s, w) for w in servers):
            continue
        minimum = attempt(_min_replicas, s.resource)
        if minimum != 0:
            continue
        problem = attempt(_hold_problem, s, resources)
        if problem is None:
            continue
        shown = "minReplicaCount is 0 (KEDA's default)" if "minReplicaCount" not in as_map(
            s.resource.props.get("spec")) and s.resource.type == k8s.SCALED_OBJECT else "its minimum is 0"
        yield s.resource, (
            f"{s.target_kind} {s.target_name} runs vLLM and {shown}, but {problem}: the queue gauge "
            f"vllm:num_requests_waiting comes from the vLLM pods themselves, so at zero pods no metric moves and nothing "
            f"scales it up again. Keep at least 1 replica, or hold the requests with KEDA's HTTP add-on: an "
            f"InterceptorRoute (an HTTPScaledObject before v0.14) for this workload's Service, woken by an external-push "
            f"trigger naming it in this ScaledObject.")


RULES = [
    Rule("gpu-hpa-scaling",
         "An HPA on a GPU workload scales on more than CPU/memory and scales down slowly.",
         MANDATORY, check_gpu_hpa,
         config={"minScaleDownWindowSeconds": {"type": "integer", "minimum": 0, "default": 300,
                                               "description": "Minimum behavior.scaleDown window."}}),
    Rule("single-autoscaler", "A workload is not scaled by both an HPA and a KEDA ScaledObject.",
         MANDATORY, check_single_autoscaler),
    Rule("vllm-scale-to-zero", "An autoscaler of a vLLM workload keeps at least one replica (the queue metric comes from the "
         "pods), unless KEDA's HTTP add-on holds its requests and wakes it.",
         MANDATORY, check_vllm_scale_to_zero),
]
