"""Reading Kubernetes objects (camelCase, as in YAML) through the watched view."""

from __future__ import annotations

import functools
import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .core import EMPTY, Resource, attempt

GPU = "nvidia.com/gpu"
# A time-slice of a card (the device plugin's renameByDefault), and MIG instances (`nvidia.com/mig-3g.40gb`).
GPU_SHARED = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
# The gpu-serving stack's own node labels (stacks/config/cluster.py): GPU Feature Discovery owns nvidia.com/gpu.*.
PROJECT_PRODUCT_LABEL = "gpu-serving/gpu.product"
PROJECT_COUNT_LABEL = "gpu-serving/gpu.count"

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
STATEFULSET = "kubernetes:apps/v1:StatefulSet"
POD = "kubernetes:core/v1:Pod"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
JOB = "kubernetes:batch/v1:Job"
INGRESS = "kubernetes:networking.k8s.io/v1:Ingress"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"
PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
SERVICE = "kubernetes:core/v1:Service"
NODE_PATCH = "kubernetes:core/v1:NodePatch"
NODE = "kubernetes:core/v1:Node"
COMMAND = "command:remote:Command"
LWS = "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"

WORKLOADS = frozenset({DEPLOYMENT, STATEFULSET, POD, JOB, LWS})
SCALABLE = frozenset({DEPLOYMENT, STATEFULSET, LWS})


def as_map(value: Any) -> Mapping:
    return value if isinstance(value, Mapping) else EMPTY


def as_list(value: Any) -> Sequence:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return value
    return ()


def dig(obj: Any, *path: str) -> Any:
    """obj[path0][path1]..., None where a level is missing or not a mapping."""
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def to_int(value: Any) -> int | None:
    """Integers as Kubernetes writes them: 2, 2.0 (protobuf numbers), "2"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        return int(value)
    return None


DURATION_UNITS = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def duration_seconds(value: str) -> float | None:
    """A Go duration as Kubernetes writes them (`600s`, `1h`, `10m30s`, `500ms`, `1.5h`; Gateway API Durations
    are a subset) in seconds; None when malformed."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(n) * DURATION_UNITS[u] for n, u in parts)


# --- objects -----------------------------------------------------------------

def namespace(props: Mapping) -> str:
    return dig(props, "metadata", "namespace") or "default"


def members(resource: Resource) -> list[Resource]:
    """What the rules see of a resource: itself; a LeaderWorkerSet as its two pod templates (`leader`, `workers`), each a
    copy of it whose `spec.template` is that template, so every rule on pods reads both. Without a leaderTemplate the
    leaders run the workerTemplate (LeaderWorkerSet's own default)."""
    if resource.type != LWS:
        return [resource]
    props = dict(resource.props)
    spec = props.get("spec") if isinstance(props.get("spec"), Mapping) else {}
    templates = spec.get("leaderWorkerTemplate") if isinstance(spec.get("leaderWorkerTemplate"), Mapping) else {}
    workers = templates.get("workerTemplate")
    leader = templates.get("leaderTemplate") or workers
    return [replace(resource, member=member, props={**props, "spec": {**spec, "template": template}})
            for member, template in (("leader", leader), ("workers", workers))]


def group_size(resource: Resource) -> int:
    """Pods of one replica of a LeaderWorkerSet (its leader and workers); 1 for anything else."""
    size = to_int(dig(resource.view, "spec", "leaderWorkerTemplate", "size")) if resource.type == LWS else None
    return size if size is not None and size > 0 else 1


def pods_per_replica(resource: Resource) -> int:
    """Pods a resource's template runs per replica: a LeaderWorkerSet group has one leader and size - 1 workers."""
    if resource.member == "workers":
        return group_size(resource) - 1
    return 1


def pod_template(resource: Resource) -> Mapping | None:
    """The pod spec of a workload: spec for a Pod, spec.template.spec else."""
    if resource.type not in WORKLOADS:
        return None
    props = resource.view
    if resource.type == POD:
        return as_map(props.get("spec"))
    return as_map(dig(props, "spec", "template", "spec"))


def pod_labels(resource: Resource) -> Mapping:
    if resource.type == POD:
        return as_map(dig(resource.view, "metadata", "labels"))
    return as_map(dig(resource.view, "spec", "template", "metadata", "labels"))


def containers(spec: Mapping, *, init: bool = False) -> list[Mapping]:
    found = [as_map(c) for c in as_list(spec.get("containers"))]
    if init:
        found += [as_map(c) for c in as_list(spec.get("initContainers"))]
    return found


def container_name(container: Mapping) -> str:
    return str(container.get("name") or "?")


def is_gpu_resource(name: Any) -> bool:
    """Whole cards, time-slices and MIG instances: each is a GPU the device plugin hands out."""
    return isinstance(name, str) and (name in (GPU, GPU_SHARED) or name.startswith(MIG_PREFIX))


def gpu_resource_names(container: Mapping) -> list[str]:
    """The GPU resources a container names under limits or requests, in a stable order."""
    names = {*as_map(dig(container, "resources", "limits")), *as_map(dig(container, "resources", "requests"))}
    return sorted(n for n in names if is_gpu_resource(n))


def gpu_amount(container: Mapping, section: str = "limits", resource: str = GPU) -> Any:
    return as_map(dig(container, "resources", section)).get(resource)


def gpu_amounts(container: Mapping) -> dict[str, int]:
    """GPU resources a container gets, by name: its limits (requests may only repeat them)."""
    found = {}
    for name in gpu_resource_names(container):
        limit = gpu_amount(container, "limits", name)
        found[name] = to_int(gpu_amount(container, "requests", name) if limit is None else limit) or 0
    return found


def gpu_count(container: Mapping) -> int:
    """GPUs a container gets, of every kind."""
    return sum(gpu_amounts(container).values())


def gpu_containers(spec: Mapping) -> list[Mapping]:
    return [c for c in containers(spec) if gpu_count(c) > 0]


def pod_gpu_resources(spec: Mapping) -> dict[str, int]:
    """GPUs one pod holds, by resource: init containers run one at a time before the rest."""
    held: dict[str, int] = {}
    for c in containers(spec):
        for name, amount in gpu_amounts(c).items():
            held[name] = held.get(name, 0) + amount
    for c in as_list(spec.get("initContainers")):
        for name, amount in gpu_amounts(as_map(c)).items():
            held[name] = max(held.get(name, 0), amount)
    return {name: amount for name, amount in held.items() if amount}


def mounts(container: Mapping) -> list[Mapping]:
    return [as_map(m) for m in as_list(container.get("volumeMounts"))]


def volumes(spec: Mapping) -> dict[str, Mapping]:
    return {str(as_map(v).get("name")): as_map(v) for v in as_list(spec.get("volumes"))}


def mount_for(path: str, container: Mapping) -> Mapping | None:
    """The volumeMount holding `path` (deepest mount wins), if any."""
    path = posixpath.normpath(path)
    best: Mapping | None = None
    best_len = -1
    for mount in mounts(container):
        mount_path = mount.get("mountPath")
        if not isinstance(mount_path, str) or not mount_path.startswith("/"):
            continue
        root = posixpath.normpath(mount_path)
        inside = path == root or path.startswith(root.rstrip("/") + "/")
        if inside and len(root) > best_len:
            best, best_len = mount, len(root)
    return best


# --- command lines -------------------------------------------------------------

def argv(container: Mapping) -> list[str]:
    """command + args as tokens; a `sh -c "vllm serve ..."` string is split too."""
    items = [*as_list(container.get("command")), *as_list(container.get("args"))]
    return list(_tokens(tuple(str(item) for item in items)))


# Several rules read each container's command line, and shlex is slow on the Jobs' scripts:
# split each distinct command line once per process.
@functools.lru_cache(maxsize=4096)
def _tokens(items: tuple[str, ...]) -> tuple[str, ...]:
    tokens: list[str] = []
    for text in items:
        if any(ch.isspace() for ch in text):
            try:
                tokens.extend(shlex.split(text))
            except ValueError:
                tokens.extend(text.split())
        else:
            tokens.append(text)
    return tuple(_normalise_flag(t) for t in tokens)


def _normalise_flag(token: str) -> str:
    # vLLM's parser accepts --tensor_parallel_size as --tensor-parallel-size.
    if not token.startswith("--"):
        return token
    head, sep, tail = token.partition("=")
    return head.replace("_", "-") + sep + tail


def flag_value(tokens: Sequence[str], *names: str) -> str | None:
    """Value of `--name=value` or `--name value`; the last occurrence wins."""
    found = None
    for i, token in enumerate(tokens):
        for name in names:
            if token.startswith(name + "="):
                found = token[len(name) + 1:]
            elif token == name and i + 1 < len(tokens):
                found = tokens[i + 1]
    return found


def vllm_image(container: Mapping) -> bool:
    """The image's repository (not its tag or registry port) names vLLM: vllm/vllm-openai,
    registry.lan:5000/ml/VLLM-custom, ghcr.io/org/vllm-tpu@sha256:…"""
    image = container.get("image")
    if not isinstance(image, str):
        return False
    parts = image.split("@", 1)[0].split("/")
    parts[-1] = parts[-1].split(":", 1)[0]
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # the registry host says nothing about what runs
    return "vllm" in "/".join(parts).lower()


# `vllm serve`, `/usr/local/bin/vllm serve`, `python3 -m vllm.entrypoints.cli.main serve`, the
# OpenAI server module run directly (`-m vllm.entrypoints.openai.api_server`), old or new.
_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


def _runs_vllm_server(tokens: Sequence[str]) -> bool:
    for i, token in enumerate(tokens):
        base = token.rsplit("/", 1)[-1]
        if base in ("vllm", "vllm.entrypoints.cli.main") and i + 1 < len(tokens) and tokens[i + 1] == "serve":
            return True
        if base in _SERVER_MODULES or any(token.endswith(m) for m in _SERVER_MODULES):
            return True
    return False


def is_vllm_server(container: Mapping) -> bool:
    """A container that runs vLLM's OpenAI server, however it is written: its command line calls
    the server, or a vLLM image runs its own entrypoint (`vllm serve`) because no command
    replaces it. A vLLM image with another command (a download script) is not a server."""
    if _runs_vllm_server(argv(container)):
        return True
    return vllm_image(container) and not as_list(container.get("command"))


def is_headless_vllm(container: Mapping) -> bool:
    """A vLLM server started `--headless`: a stage of a model spanning nodes that joins its leader and serves no API
    (nothing to probe, no stream to drain; a failure restarts its whole group)."""
    return is_vllm_server(container) and any(t == "--headless" or t.startswith("--headless=") for t in argv(container))


def is_vllm(container: Mapping) -> bool:
    """Anything vLLM: a server, or another container of a vLLM image (it shares the caches)."""
    return vllm_image(container) or is_vllm_server(container) or "vllm.entrypoints" in " ".join(argv(container))


def vllm_model(tokens: Sequence[str]) -> str | None:
    """`--model X`, or the positional model of `vllm serve X`."""
    model = flag_value(tokens, "--model")
    if model:
        return model
    for i, token in enumerate(tokens[:-1]):
        if token == "serve" and i > 0 and tokens[i - 1].endswith("vllm"):
            candidate = tokens[i + 1]
            return None if candidate.startswith("-") else candidate
    return None


def env_literal(container: Mapping, name: str) -> str | None:
    for entry in as_list(container.get("env")):
        entry = as_map(entry)
        if entry.get("name") == name and isinstance(entry.get("value"), str):
            return entry.get("value")
    return None


# --- names that hold secrets ---------------------------------------------------

_SECRET_WORDS = frozenset(
    {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "APIKEY",
     "PRIVATEKEY", "CREDENTIAL", "CREDENTIALS", "PAT"}
)
# A trailing word that makes the variable *about* a secret rather than the
# secret itself: HF_TOKEN_PATH points at a file, AWS_ACCESS_KEY_ID is an id.
_REFERENCE_WORDS = frozenset(
    {"FILE", "PATH", "DIR", "NAME", "ID", "URL", "URI", "REF", "TYPE", "ENDPOINT",
     "HEADER", "FIELD", "LENGTH", "SIZE", "ALGORITHM", "SECRETNAME"}
)


def name_words(name: str) -> list[str]:
    words: list[str] = []
    for part in re.split(r"[^A-Za-z0-9]+", name):
        words += re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", part)
    return [w.upper() for w in words]


def looks_secret(name: str) -> bool:
    words = name_words(name)
    if not words or words[-1] in _REFERENCE_WORDS:
        return False
    return any(w in _SECRET_WORDS for w in words)


# --- label selection -----------------------------------------------------------

def selects(selector: Mapping, labels: Mapping) -> bool:
    """A Service-style equality selector; an empty one selects nothing."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def matches_label_selector(selector: Mapping, labels: Mapping) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) over pod labels; an empty one selects every pod."""
    if any(labels.get(k) != v for k, v in as_map(selector.get("matchLabels")).items()):
        return False
    for expr in as_list(selector.get("matchExpressions")):
        expr = as_map(expr)
        key, operator = str(expr.get("key")), expr.get("operator")
        values = {str(v) for v in as_list(expr.get("values"))}
        present = key in labels
        if operator == "In" and not (present and str(labels.get(key)) in values):
            return False
        if operator == "NotIn" and present and str(labels.get(key)) in values:
            return False
        if (operator == "Exists" and not present) or (operator == "DoesNotExist" and present):
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def required_node_terms(spec: Mapping) -> list[Mapping]:
    required = dig(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    return [as_map(t) for t in as_list(dig(required, "nodeSelectorTerms"))]


def node_label_keys(spec: Mapping) -> set[str]:
    """Node label keys a pod insists on, via nodeSelector or required affinity."""
    keys = set(as_map(spec.get("nodeSelector")))
    for term in required_node_terms(spec):
        for expr in as_list(term.get("matchExpressions")):
            expr = as_map(expr)
            if expr.get("operator") in ("In", "Exists"):
                keys.add(str(expr.get("key")))
    return keys


def node_label_value(spec: Mapping, key: str) -> str | None:
    """The single value a pod requires for node label `key`, if it pins one."""
    value = as_map(spec.get("nodeSelector")).get(key)
    if isinstance(value, str):
        return value
    terms = required_node_terms(spec)
    values: set[str] = set()
    for term in terms:
        for expr in as_list(term.get("matchExpressions")):
            expr = as_map(expr)
            if expr.get("key") == key and expr.get("operator") == "In":
                values |= {str(v) for v in as_list(expr.get("values"))}
    return values.pop() if len(values) == 1 else None


def kinds_in(resources: Sequence[Resource], types: frozenset[str]) -> Iterator[Resource]:
    return (r for r in resources if r.type in types)


def object_key(resource: Resource) -> tuple[str, str]:
    """(namespace, name) of an object."""
    return namespace(resource.view), str(dig(resource.view, "metadata", "name"))


# --- the stack's workloads ----------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    resource: Resource
    namespace: str
    name: str | None
    spec: Mapping
    vllm: bool
    gpu_resources: Mapping[str, int]
    """GPUs one pod holds, by resource (whole cards, time-slices, MIG instances)."""
    pods_per_replica: int = 1
    """Pods of this template per replica (a LeaderWorkerSet's workers: its size - 1)."""

    @property
    def gpus_per_pod(self) -> int:
        return sum(self.gpu_resources.values())


def workloads(resources: Sequence[Resource]) -> list[Workload]:
    """Pod-templating resources whose shape is known (unknown ones are skipped)."""

    def read(r: Resource) -> Workload:
        spec = pod_template(r) or {}
        return Workload(r, namespace(r.view), dig(r.view, "metadata", "name"), spec,
                        any(is_vllm_server(c) for c in containers(spec)), pod_gpu_resources(spec), pods_per_replica(r))

    found = (attempt(read, r) for r in kinds_in(resources, WORKLOADS))
    return [w for w in found if w is not None]
