"""Rules that need several resources of the stack at once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from . import k8s
from .core import ADVISORY, MANDATORY, Resource, Rule, Unknown, attempt
from .holds import HTTP_SCALED_OBJECT, SKIP_SCALED_OBJECT, hold_named, holds, replicas, woken_by
from .k8s import GPU, as_list, as_map, dig, namespace, to_int

# KEDA's defaults when a ScaledObject does not set maxReplicaCount / minReplicaCount.
KEDA_DEFAULT_MAX = 100
KEDA_DEFAULT_MIN = 0
# Kubernetes' default HPA scale-down stabilization window.
HPA_DEFAULT_SCALE_DOWN_WINDOW = 300
# ingress-nginx's default proxy timeouts.
NGINX_DEFAULT_TIMEOUT = 60


@dataclass(frozen=True)
class Workload:
    resource: Resource
    namespace: str
    name: str | None
    spec: Mapping
    vllm: bool
    gpu_resources: Mapping[str, int]
    """GPUs one pod holds, by resource (whole cards, time-slices, MIG instances)."""

    @property
    def gpus_per_pod(self) -> int:
        return sum(self.gpu_resources.values())


def workloads(resources: Sequence[Resource]) -> list[Workload]:
    """Pod-templating resources whose shape is known (unknown ones are skipped)."""

    def read(r: Resource) -> Workload:
        spec = k8s.pod_template(r) or {}
        return Workload(r, namespace(r.view), dig(r.view, "metadata", "name"), spec,
                        any(k8s.is_vllm_server(c) for c in k8s.containers(spec)), k8s.pod_gpu_resources(spec))

    found = (attempt(read, r) for r in k8s.kinds_in(resources, k8s.WORKLOADS))
    return [w for w in found if w is not None]


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


# --- GPU capacity ----------------------------------------------------------------

@dataclass(frozen=True)
class GpuNode:
    resource: Resource
    product: str
    cards: int
    replicas: int
    """Pods that may share one card (time-slicing); 1 otherwise."""
    advertised: Mapping[str, int]


def gpu_nodes(resources: Sequence[Resource], product_label: str, count_label: str) -> list[GpuNode]:
    """The stack's nodes that declare a product and a card count through labels, with what each advertises.

    The count is of physical cards. In the count label's own prefix (`nvidia.com/`, GPU Feature Discovery's, or
    `gpu-serving/`, the stack's copies) `mig-<profile>.count` gives the MIG instances, and `gpu.replicas` > 1 the
    time-slices: named `nvidia.com/gpu.shared`, unless GFD marked the product `-SHARED` (slices left as nvidia.com/gpu).
    """
    prefix = count_label.removesuffix("gpu.count") if count_label.endswith("gpu.count") else None
    found = []
    for node in k8s.kinds_in(resources, frozenset({k8s.NODE_PATCH, k8s.NODE})):
        labels = as_map(dig(node.view, "metadata", "labels"))
        product, cards = labels.get(product_label), to_int(labels.get(count_label))
        if not isinstance(product, str) or cards is None:
            continue
        replicas = (to_int(labels.get(f"{prefix}gpu.replicas")) if prefix else None) or 1
        mig = {f"{k8s.MIG_PREFIX}{key[len(prefix) + 4:-6]}": to_int(value) or 0 for key, value in labels.items()
               if prefix and key.startswith(f"{prefix}mig-") and key.endswith(".count")}
        if mig:
            advertised, replicas = mig, 1
        elif replicas > 1:
            advertised = {GPU if product.endswith("-SHARED") else k8s.GPU_SHARED: cards * replicas}
        else:
            advertised = {GPU: cards}
        found.append(GpuNode(node, product, cards, replicas, advertised))
    return found


def declared_gpus(nodes: Sequence[GpuNode]) -> dict[tuple[str, str], int]:
    """What the stack's nodes advertise, per (product, resource)."""
    supply: dict[tuple[str, str], int] = defaultdict(int)
    for node in nodes:
        for name, amount in node.advertised.items():
            supply[(node.product, name)] += amount
    return dict(supply)


def labelled_nodes(resources: Sequence[Resource], cfg: Mapping) -> tuple[str, list[GpuNode]]:
    """(product label, nodes): the configured labels (GFD's by default), else the ones the gpu-serving stack sets itself."""
    for product_label, count_label in ((str(cfg["gpuProductLabel"]), str(cfg["gpuCountLabel"])),
                                       (k8s.PROJECT_PRODUCT_LABEL, k8s.PROJECT_COUNT_LABEL)):
        nodes = gpu_nodes(resources, product_label, count_label)
        if nodes:
            return product_label, nodes
    return str(cfg["gpuProductLabel"]), []


def check_gpu_capacity(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    # An unknown node label could hide any amount of capacity: say nothing.
    product_label, nodes = labelled_nodes(resources, cfg)
    if not nodes:
        return  # the nodes are not part of this stack (e.g. plain manifests)
    supply = declared_gpus(nodes)
    products = {product for product, _ in supply}
    all_scalers = scalers(resources)
    demand: list[tuple[Workload, str | None, str, int]] = []
    for w in workloads(resources):
        product = k8s.node_label_value(w.spec, product_label) if w.gpu_resources else None
        for name, per_pod in w.gpu_resources.items():
            demand.append((w, product, name, per_pod * max_replicas(w, all_scalers)))
    wanted: dict[tuple[str | None, str], int] = defaultdict(int)
    for _, product, name, gpus in demand:
        wanted[(product, name)] += gpus
    for w, product, name, gpus in demand:
        per_pod = w.gpu_resources[name]
        asks = f"asks for up to {gpus // per_pod} pod(s) x {per_pod} {name} = {gpus}"
        total_supply = sum(n for (_, r), n in supply.items() if r == name)
        total_demand = sum(n for (_, r), n in wanted.items() if r == name)
        if product is not None and product not in products:
            yield w.resource, (
                f"{asks} on nodes labelled {product_label}={product}, but no node in the stack carries "
                f"that label (declared: {_fmt(supply)}): the pods stay Pending with 'didn't match Pod's "
                f"node affinity/selector'. Fix the nodeSelector or label the node (NodePatch).")
        elif product is not None and wanted[(product, name)] > supply.get((product, name), 0):
            yield w.resource, (
                f"{asks} of {product}; all workloads together want {wanted[(product, name)]} but the "
                f"stack's nodes declare only {supply.get((product, name), 0)}: the extra pods stay Pending with "
                f"'Insufficient {name}' (scaling works only while cards are free). Lower replicas/"
                f"maxReplicas or add nodes.")
        elif product is None and total_demand > total_supply:
            yield w.resource, (
                f"{asks}; all GPU workloads together want {total_demand} but the stack's nodes declare "
                f"only {total_supply} ({_fmt(supply)}): the extra pods stay Pending with 'Insufficient "
                f"{name}'. Lower replicas/maxReplicas or add nodes.")


# --- memory of a time-sliced card ---------------------------------------------------------

VLLM_DEFAULT_UTILIZATION = 0.9


def memory_share(w: Workload) -> float | None:
    """The --gpu-memory-utilization of the workload's vLLM server (vLLM's default when unset)."""
    for c in k8s.containers(w.spec):
        if k8s.is_vllm_server(c):
            value = k8s.flag_value(k8s.argv(c), "--gpu-memory-utilization")
            try:
                return VLLM_DEFAULT_UTILIZATION if value is None else float(value)
            except ValueError:
                return None  # vllm-server-flags says it
    return None


def check_shared_memory(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    product_label, nodes = labelled_nodes(resources, cfg)
    shared = [n for n in nodes if n.advertised.get(k8s.GPU_SHARED)]
    if not shared:
        return
    all_scalers = scalers(resources)
    pods: list[tuple[float, str | None, Workload]] = []
    for w in workloads(resources):
        share = memory_share(w) if w.gpu_resources.get(k8s.GPU_SHARED) else None
        if share is not None:
            product = k8s.node_label_value(w.spec, product_label)
            pods += [(share, product, w)] * attempt(max_replicas, w, all_scalers, default=1)
    reported: set[tuple[str, str]] = set()
    for node in shared:
        # The device plugin, not the scheduler, picks the card behind a slice: any `replicas` of the pods
        # that may land on the node can meet on one card.
        candidates = sorted((p for p in pods if p[1] in (None, node.product)), key=lambda p: -p[0])[:node.replicas]
        total = sum(share for share, _, _ in candidates)
        if round(total, 6) <= 1 or not candidates or (candidates[0][2].resource.urn, node.product) in reported:
            continue
        reported.add((candidates[0][2].resource.urn, node.product))
        shares = " + ".join(f"{share:g} ({w.name})" for share, _, w in candidates)
        yield candidates[0][2].resource, (
            f"vLLM pods sharing {node.product} cards by time-slicing ({node.replicas} per card) may meet on one card: "
            f"{shares} = {total:g} of its memory, and time-slicing isolates none (--gpu-memory-utilization is a share of "
            f"the whole card, taken at start): the later pod fails to start. Lower --gpu-memory-utilization until any "
            f"{node.replicas} of them add up to 1.0 or less, or share the card among fewer pods.")


def _fmt(supply: Mapping[tuple[str, str], int]) -> str:
    return ", ".join(f"{p}{'' if r == GPU else ' ' + r}: {n}" for (p, r), n in sorted(supply.items())) or "none"


# --- autoscaling ---------------------------------------------------------------------

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
    own ScaledObject, or a ScaledObject whose `external-push` trigger names an HTTPScaledObject for the workload
    (one that is not in view is trusted: a rule may only fail on what it saw)."""
    if scaler.resource.type == HTTP_SCALED_OBJECT:
        return None
    named = woken_by(scaler.resource) if scaler.resource.type == k8s.SCALED_OBJECT else []
    if not named:
        return "nothing holds its requests"
    all_holds = holds(resources)
    for name in named:
        hold = hold_named(all_holds, scaler.namespace, name)
        if hold is None or hold.holds_for(scaler.namespace, scaler.target_kind, scaler.target_name):
            return None
    return (f"its external-push trigger names HTTPScaledObject {', '.join(named)}, which holds the requests of another "
            "workload")


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
            f"HTTPScaledObject for this workload, woken by an external-push trigger naming it in this ScaledObject.")


PDB = "kubernetes:policy/v1:PodDisruptionBudget"


def check_disruption_budget(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    budgets = []
    for pdb in k8s.kinds_in(resources, frozenset({PDB})):
        selector = attempt(lambda r: as_map(dig(r.view, "spec", "selector", "matchLabels")), pdb)
        if selector is None:
            return  # an unknown selector could cover anything
        budgets.append((namespace(pdb.view), selector))
    # Judged only with the Service in view: a Deployment checked alone may have its PDB elsewhere.
    served = []
    for service in k8s.kinds_in(resources, frozenset({k8s.SERVICE})):
        selector = attempt(lambda r: as_map(dig(r.view, "spec", "selector")), service)
        if selector is not None:
            served.append((namespace(service.view), selector))
    for w in workloads(resources):
        if not w.vllm or w.resource.type not in k8s.SCALABLE:
            continue
        labels = attempt(k8s.pod_labels, w.resource)
        if labels is None or any(ns == w.namespace and k8s.selects(sel, labels) for ns, sel in budgets):
            continue
        if not any(ns == w.namespace and k8s.selects(sel, labels) for ns, sel in served):
            continue
        yield w.resource, (
            "no PodDisruptionBudget selects these vLLM pods: a node drain evicts every replica at once and the "
            "model is down until they have reloaded (minutes). Add a PodDisruptionBudget with maxUnavailable: 1.")


# --- ReadWriteOnce claims ---------------------------------------------------------------

def single_node_volumes(resources: Sequence[Resource]) -> set[str]:
    """PVs whose required node affinity names exactly one node: every pod using them runs there."""

    def pinned(r: Resource) -> bool:
        terms = as_list(dig(r.view, "spec", "nodeAffinity", "required", "nodeSelectorTerms"))
        expressions = [e for t in terms for e in as_list(as_map(t).get("matchExpressions"))]
        if len(terms) != 1 or len(expressions) != 1:
            return False
        expression = as_map(expressions[0])
        return (expression.get("key") == "kubernetes.io/hostname" and expression.get("operator") == "In"
                and len(as_list(expression.get("values"))) == 1)

    return {str(dig(r.view, "metadata", "name")) for r in k8s.kinds_in(resources, frozenset({k8s.PV})) if attempt(pinned, r)}


def rwo_claims(resources: Sequence[Resource]) -> dict[tuple[str, str], list[str]]:
    """ReadWriteOnce claims that could be asked to attach on two nodes.

    A claim bound to a single-node PV is left out: ReadWriteOnce is per node, and that PV's
    affinity already keeps every replica on its node (ReadWriteOncePod stays in: it is per pod).
    """

    def read(r: Resource) -> tuple[tuple[str, str], list[str], str]:
        modes = [str(m) for m in as_list(dig(r.view, "spec", "accessModes"))]
        return _object_key(r), modes, str(dig(r.view, "spec", "volumeName") or "")

    pinned = single_node_volumes(resources)
    claims = {}
    for r in k8s.kinds_in(resources, frozenset({k8s.PVC})):
        found = attempt(read, r)
        if not found or "ReadWriteMany" in found[1] or not any(m.startswith("ReadWriteOnce") for m in found[1]):
            continue
        if found[2] in pinned and "ReadWriteOncePod" not in found[1]:
            continue
        claims[found[0]] = found[1]
    return claims


def check_rwo_claims(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    claims = rwo_claims(resources)
    all_scalers = scalers(resources)
    for w in workloads(resources):
        if w.resource.type != k8s.DEPLOYMENT:
            continue
        replicas = attempt(max_replicas, w, all_scalers, default=1)
        if replicas <= 1:
            continue
        for volume in k8s.volumes(w.spec).values():
            claim = dig(volume, "persistentVolumeClaim", "claimName")
            modes = claims.get((w.namespace, str(claim)))
            if modes:
                yield w.resource, (
                    f"mounts claim {claim} ({', '.join(modes)}) but may run {replicas} replicas: the "
                    f"second pod lands on another node and hangs in ContainerCreating with "
                    f"'Multi-Attach error'. Use a ReadWriteMany claim (NFS) shared by all replicas, a "
                    f"StatefulSet with volumeClaimTemplates, or a single replica.")


# --- Ingress in front of vLLM --------------------------------------------------------------

def nginx_class(props: Mapping, class_names: Sequence[str]) -> bool:
    name = dig(props, "spec", "ingressClassName")
    if name is None:
        name = as_map(dig(props, "metadata", "annotations")).get("kubernetes.io/ingress.class")
    return name in class_names


def backend_services(props: Mapping) -> set[str]:
    spec = as_map(props.get("spec"))
    backends = [spec.get("defaultBackend")]
    for rule in as_list(spec.get("rules")):
        backends += [as_map(p).get("backend") for p in as_list(dig(rule, "http", "paths"))]
    return {str(dig(b, "service", "name")) for b in backends if dig(b, "service", "name")}


def _object_key(resource: Resource) -> tuple[str, str]:
    return namespace(resource.view), str(dig(resource.view, "metadata", "name"))


def _serves_vllm(service: Resource, candidates: Sequence[Workload]) -> bool:
    if dig(service.view, "spec", "type") == "ExternalName":
        return True  # a name for something elsewhere (the HTTP add-on's interceptor, say): it may be vLLM
    selector = as_map(dig(service.view, "spec", "selector"))
    ns = namespace(service.view)
    return any(w.namespace == ns and k8s.selects(selector, k8s.pod_labels(w.resource)) for w in candidates)


def stack_services(resources: Sequence[Resource]) -> dict[tuple[str, str], Resource]:
    services = {}
    for service in k8s.kinds_in(resources, frozenset({k8s.SERVICE})):
        key = attempt(_object_key, service)
        if key:
            services[key] = service
    return services


def fronts_vllm(ingress: Resource, services: Mapping[tuple[str, str], Resource], model_pods: Sequence[Workload]) -> bool:
    """An Ingress counts as "in front of vLLM" unless every backend is a Service
    of this stack that selects no GPU/vLLM pod: the policy cannot see pods that
    live elsewhere, and a streaming API behind buffering is the costly mistake."""
    ns = namespace(ingress.view)
    for name in backend_services(ingress.view):
        service = services.get((ns, name))
        if service is None or attempt(_serves_vllm, service, model_pods, default=True):
            return True
    return False


def _timeout_problem(annotations: Mapping, key: str, minimum: int) -> str | None:
    raw = annotations.get(f"nginx.ingress.kubernetes.io/{key}")
    value = NGINX_DEFAULT_TIMEOUT if raw is None else to_int(raw)
    if value is None:
        return f"{key} {raw!r} is not a number of seconds"
    if value < minimum:
        return f"{key} is {value}s{' (nginx default)' if raw is None else ''}"
    return None


def check_ingress_streaming(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    minimum, classes = int(cfg["minProxyTimeoutSeconds"]), list(cfg["ingressClassNames"])
    # Read once for all Ingresses: per Ingress it made the rule quadratic in the stack's size.
    services = stack_services(resources)
    model_pods = [w for w in workloads(resources) if w.gpus_per_pod or w.vllm]
    for ingress in k8s.kinds_in(resources, frozenset({k8s.INGRESS})):
        try:
            if not nginx_class(ingress.view, classes) or not fronts_vllm(ingress, services, model_pods):
                continue
            annotations = as_map(dig(ingress.view, "metadata", "annotations"))
            buffering = annotations.get("nginx.ingress.kubernetes.io/proxy-buffering")
            timeouts = [_timeout_problem(annotations, k, minimum) for k in ("proxy-read-timeout",
                                                                         "proxy-send-timeout")]
        except Unknown:
            continue
        if buffering != "off":
            yield ingress, (
                "nginx buffers the upstream response (proxy-buffering is not \"off\"): streamed tokens "
                "arrive all at once at the end, so streaming looks broken. Add annotation "
                "nginx.ingress.kubernetes.io/proxy-buffering: \"off\".")
        problems = [t for t in timeouts if t]
        if problems:
            yield ingress, (
                f"{'; '.join(problems)} (< {minimum}s): long generations and a slow first token are cut "
                f"off with 504 Gateway Time-out. Set nginx.ingress.kubernetes.io/proxy-read-timeout and "
                f"proxy-send-timeout to \"{minimum}\" or more.")


GPU_NODE_LABELS = {
    "gpuProductLabel": {"type": "string", "default": "nvidia.com/gpu.product", "description": "Node label naming the GPU product."},
    "gpuCountLabel": {"type": "string", "default": "nvidia.com/gpu.count",
                      "description": "Node label with the number of physical GPUs (string integer); `gpu.replicas` and "
                                     "`mig-<profile>.count` in its prefix give the sharing."},
}

RULES = [
    Rule("gpu-capacity", "GPUs demanded at max replicas fit the GPUs the stack's nodes declare, per product and resource.",
         MANDATORY, check_gpu_capacity, config=GPU_NODE_LABELS),
    Rule("gpu-shared-memory", "vLLM pods that may meet on one time-sliced card add up to at most all of its memory.",
         MANDATORY, check_shared_memory, config=GPU_NODE_LABELS),
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
    Rule("vllm-disruption-budget", "vLLM Deployments and StatefulSets are covered by a PodDisruptionBudget.",
         ADVISORY, check_disruption_budget),
    Rule("rwo-claim-single-replica",
         "A Deployment that may run more than one replica mounts no ReadWriteOnce claim.",
         MANDATORY, check_rwo_claims),
    Rule("ingress-vllm-streaming",
         "nginx Ingresses in front of vLLM disable proxy buffering and allow long proxy timeouts.",
         MANDATORY, check_ingress_streaming,
         config={"minProxyTimeoutSeconds": {"type": "integer", "minimum": 0, "default": 600,
                                            "description": "Minimum proxy-read/send-timeout."},
                 "ingressClassNames": {"type": "array", "items": {"type": "string"}, "default": ["nginx"],
                                       "description": "Ingress classes served by ingress-nginx."}}),
]
