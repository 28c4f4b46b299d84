"""Per-resource rules for pods and the controllers that template them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from . import k8s
from .core import MANDATORY, Resource, Rule
from .k8s import GPU, as_list, as_map, container_name, dig, to_int


def _gpu_pod(resource: Resource) -> Mapping | None:
    spec = k8s.pod_template(resource)
    return spec if spec is not None and k8s.gpu_containers(spec) else None


# --- nvidia.com/gpu only under limits ------------------------------------------

def check_gpu_limits(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}, init=True):
        name = container_name(c)
        for gpu in k8s.gpu_resource_names(c):
            limit, request = k8s.gpu_amount(c, "limits", gpu), k8s.gpu_amount(c, "requests", gpu)
            if request is not None and limit is None:
                yield (f"container '{name}' puts {gpu} only under requests: the API server rejects the pod "
                       f"(extended resources need a limit). Move it to resources.limits.{gpu}.")
            elif request is not None and to_int(request) != to_int(limit):
                yield (f"container '{name}' requests {request} but limits {limit} {gpu}: an extended resource cannot "
                       f"be overcommitted, so Kubernetes rejects the pod. Drop the request; the limit fills it in.")
            for amount in (limit, request):
                if amount is not None and to_int(amount) is None:
                    yield (f"container '{name}' asks for {amount!r} {gpu}: a GPU is indivisible, only whole "
                           f"numbers are accepted (share a card with {k8s.GPU_SHARED} or a MIG instance). Use an integer limit.")
                    break


# --- one time-slice, one MIG instance ------------------------------------------------

def check_gpu_one_slice(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}, init=True):
        amounts = k8s.gpu_amounts(c)
        name = container_name(c)
        shared = amounts.get(k8s.GPU_SHARED, 0)
        if shared > 1:
            yield (f"container '{name}' asks for {shared} {k8s.GPU_SHARED}: a time-slice is access to a shared card, not a "
                   f"share of its compute; two may be one card twice, and with failRequestsGreaterThanOne the device plugin "
                   f"refuses the pod (UnexpectedAdmissionError). Ask for 1, or for whole cards ({GPU}) to run tensor parallel.")
        mig = {n: a for n, a in amounts.items() if n.startswith(k8s.MIG_PREFIX)}
        if sum(mig.values()) > 1:
            asked = " + ".join(f"{a} {n}" for n, a in mig.items())
            yield (f"container '{name}' asks for {asked}: a CUDA process uses one MIG instance, and MIG instances have no "
                   f"peer-to-peer link for tensor parallelism, so the rest sit idle. Ask for one instance of a larger profile, "
                   f"or for whole cards ({GPU}).")


# --- probes ----------------------------------------------------------------------

def probe_budget(probe: Mapping) -> int:
    """Seconds a startupProbe lets a pod load before the kubelet kills it."""
    threshold = to_int(probe.get("failureThreshold"))
    period = to_int(probe.get("periodSeconds"))
    return (3 if threshold is None else threshold) * (10 if period is None else period)


def check_gpu_probes(resource: Resource, cfg: Mapping) -> Iterator[str]:
    spec = _gpu_pod(resource)
    minimum = int(cfg["minStartupSeconds"])
    for c in k8s.gpu_containers(spec or {}):
        if k8s.is_headless_vllm(c):
            continue
        name = container_name(c)
        startup = c.get("startupProbe")
        if not isinstance(startup, Mapping):
            yield (f"container '{name}' has no startupProbe: loading a model takes minutes, the "
                   f"livenessProbe kills the pod mid-load and it restarts in a loop (logs stop in the "
                   f"middle of loading). Add a startupProbe on /health with failureThreshold x "
                   f"periodSeconds >= {minimum}s.")
        elif probe_budget(startup) < minimum:
            yield (f"container '{name}' startupProbe allows only {probe_budget(startup)}s "
                   f"(failureThreshold x periodSeconds, defaults 3 x 10) but at least {minimum}s is "
                   f"required: a slow download or load gets the pod killed and restarted in a loop. "
                   f"Raise failureThreshold (e.g. {-(-minimum // 10)} with periodSeconds 10).")
        missing = [p for p in ("readinessProbe", "livenessProbe") if not isinstance(c.get(p), Mapping)]
        if missing:
            yield (f"container '{name}' has no {' or '.join(missing)}: without readiness the Service "
                   f"sends requests to a pod that is still loading; without liveness a hung engine is "
                   f"never restarted. Add both on /health.")


# --- /dev/shm ----------------------------------------------------------------------

def _has_memory_shm(container: Mapping, spec: Mapping) -> bool:
    vols = k8s.volumes(spec)
    for mount in k8s.mounts(container):
        if mount.get("mountPath") in ("/dev/shm", "/dev/shm/"):
            empty_dir = vols.get(str(mount.get("name")), {}).get("emptyDir")
            if isinstance(empty_dir, Mapping) and empty_dir.get("medium") == "Memory":
                return True
    return False


def check_gpu_shm(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = _gpu_pod(resource)
    for c in k8s.gpu_containers(spec or {}):
        if not _has_memory_shm(c, spec):
            yield (f"container '{container_name(c)}' has no memory-backed emptyDir on /dev/shm: the "
                   f"container gets 64 MiB of shared memory and vLLM/NCCL crash while loading with a "
                   f"shared-memory error that points nowhere. Mount an emptyDir {{medium: Memory, "
                   f"sizeLimit: 8Gi}} at /dev/shm (the Kubernetes form of docker --ipc=host).")


# --- download dir on a volume -------------------------------------------------------

# The vllm/vllm-openai image runs as root; without --download-dir or HF_* the
# hub cache lands here, inside the container layer.
DEFAULT_HF_CACHE = "/root/.cache/huggingface"


def download_targets(container: Mapping) -> list[tuple[str, str]]:
    tokens = k8s.argv(container)
    targets = []
    download_dir = k8s.flag_value(tokens, "--download-dir")
    if download_dir:
        targets.append(("--download-dir", download_dir))
    for var in ("HF_HOME", "HF_HUB_CACHE"):
        value = k8s.env_literal(container, var)
        if value:
            targets.append((var, value))
    if targets:
        return targets
    model = k8s.vllm_model(tokens)
    if model and model.startswith("/"):
        return [("--model", model)]
    return [("the default Hugging Face cache", DEFAULT_HF_CACHE)]


def check_download_dir(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    if spec is None:
        return
    vols = k8s.volumes(spec)
    for c in k8s.containers(spec):
        if not k8s.is_vllm(c):
            continue
        for what, path in download_targets(c):
            mount = k8s.mount_for(path, c)
            where = f"container '{container_name(c)}': {what} {path}"
            if mount is None:
                yield (f"{where} is not on a mounted volume: the model (tens of GB) is written into the "
                       f"container layer, fills the node's disk and is downloaded again on every "
                       f"restart. Point it at a volumeMount backed by a PVC (e.g. /models).")
            elif "emptyDir" in vols.get(str(mount.get("name")), {}):
                yield (f"{where} is on emptyDir '{mount.get('name')}': it dies with the pod, so every "
                       f"reschedule downloads the model again. Back it with a PersistentVolumeClaim.")


# --- secrets in env ---------------------------------------------------------------------

def check_env_secrets(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}, init=True):
        for entry in as_list(c.get("env")):
            entry = as_map(entry)
            name = str(entry.get("name", ""))
            if not k8s.looks_secret(name):
                continue
            source = as_map(entry.get("valueFrom"))
            if isinstance(entry.get("value"), str) and entry.get("value"):
                yield (f"container '{container_name(c)}' sets {name} as a literal value: it ends up in "
                       f"git, in the Pulumi state and in `kubectl get -o yaml` for anyone who can read "
                       f"the workload. Create a Secret and use valueFrom.secretKeyRef.")
            elif source and "secretKeyRef" not in source:
                yield (f"container '{container_name(c)}' reads {name} from "
                       f"{', '.join(source) or 'valueFrom'} instead of a Secret: ConfigMaps are not "
                       f"access-controlled as secrets. Use valueFrom.secretKeyRef.")


# --- tensor parallel ------------------------------------------------------------------------

PARALLEL_FLAGS = (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp"))


def check_tensor_parallel(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        tokens = k8s.argv(c)
        sizes = [k8s.flag_value(tokens, *names) for names in PARALLEL_FLAGS]
        parsed = [1 if s is None else to_int(s) for s in sizes]
        gpus = k8s.gpu_count(c)
        if any(p is None for p in parsed):
            yield f"container '{container_name(c)}' has a non-integer parallel size {sizes}."
            continue
        world = parsed[0] * parsed[1]
        if gpus == 0 and world == 1:
            continue
        # Spanning nodes (vLLM's own launcher), each of the --nnodes pods holds its share of the world.
        nodes = to_int(k8s.flag_value(tokens, "--nnodes", "-n") or 1) or 1
        if world != gpus * nodes:
            spans = f" over {nodes} pods (--nnodes)" if nodes > 1 else ""
            yield (f"container '{container_name(c)}' runs vLLM with tensor-parallel x pipeline-parallel "
                   f"= {world}{spans} but gets {gpus} {GPU}{' each' if nodes > 1 else ''}: with fewer GPUs vLLM falls back "
                   f"to Ray and times out, with more the extra cards sit idle. Make --tensor-parallel-size equal the GPU "
                   f"limit (all on one node: a pod never spans two servers; across nodes, one pipeline stage per pod).")


# --- placement ---------------------------------------------------------------------------------

def check_gpu_node_selector(resource: Resource, cfg: Mapping) -> Iterator[str]:
    spec = _gpu_pod(resource)
    if spec is None:
        return
    product_label = str(cfg["gpuProductLabel"])
    keys = k8s.node_label_keys(spec)
    if not any(k == product_label or re.search(r"gpu|nvidia|accelerator", k, re.I) for k in keys):
        yield (f"GPU pod selects no GPU nodes (no nodeSelector or required node affinity on "
               f"{product_label} or another GPU label): in a mixed cluster it lands on whichever card "
               f"is free, e.g. a 24 GB card for a model that needs 80 GB. Add "
               f"nodeSelector {{{product_label}: <product>}}.")


def tolerates(toleration: Mapping, key: str) -> bool:
    operator = toleration.get("operator") or "Equal"
    effect = toleration.get("effect") or ""
    if effect not in ("", "NoSchedule"):
        return False
    if operator == "Exists" and not toleration.get("key"):
        return True  # an empty key with Exists tolerates every taint
    return toleration.get("key") == key


def check_gpu_toleration(resource: Resource, cfg: Mapping) -> Iterator[str]:
    spec = _gpu_pod(resource)
    if spec is None:
        return
    key = str(cfg["gpuTaintKey"])
    if not any(tolerates(as_map(t), key) for t in as_list(spec.get("tolerations"))):
        yield (f"GPU pod does not tolerate the GPU taint '{key}': it stays Pending with "
               f"'0/N nodes are available: ... untolerated taint {{{key}: ...}}'. Add a toleration "
               f"{{key: {key}, operator: Exists, effect: NoSchedule}}.")


# --- rollout ----------------------------------------------------------------------------------------

def _is_zero(value: Any) -> bool:
    return to_int(value) == 0 or value == "0%"


def check_gpu_rollout(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = _gpu_pod(resource)
    if spec is None:
        return
    strategy = as_map(dig(resource.view, "spec", "strategy"))
    if strategy.get("type") == "Recreate":
        return
    surge = dig(strategy, "rollingUpdate", "maxSurge")
    if surge is not None and _is_zero(surge):
        return
    shown = "default 25%, rounded up to 1 pod" if surge is None else repr(surge)
    yield (f"rolling update surges ({shown}): every rollout starts a new GPU pod before stopping an "
           f"old one, which needs a spare card; on a full node the new pod stays Pending "
           f"(Insufficient {GPU}) and the rollout never finishes. Use strategy Recreate or "
           f"RollingUpdate with maxSurge: 0 and maxUnavailable: 1.")


# --- images -------------------------------------------------------------------------------------------

# A release version: at least major.minor.patch, an optional pre-release or build suffix (v0.11.0,
# 8.11.1, v0.17.0-ubi9, v0.10.1.1, v0.11.0rc1). Anything else (latest, nightly, main, v0, 0.11,
# a branch or commit name) is re-pointed by its publisher, so two pulls of it can differ.
RELEASE_TAG = re.compile(r"^v?[0-9]+(\.[0-9]+){2,3}([-.+]?[A-Za-z0-9][A-Za-z0-9._-]*)?$")
MOVING_WORDS = re.compile(r"(^|[-._])(latest|nightly|dev|develop|edge|main|master|stable|head|canary|snapshot|unstable|"
                          r"rolling|current|next|trunk)([-._]|$)", re.IGNORECASE)


def image_problem(image: str) -> str | None:
    """Why the image can change under the same name (None: pinned by a digest or a release version).

    The stack config (`stacks/config/base.py`) refuses images by this same function."""
    if "@" in image:  # a digest pins the exact bytes, whatever the tag says
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (means :latest)"
    tag = last.rsplit(":", 1)[1]
    if tag == "latest":
        return "uses :latest"
    if not RELEASE_TAG.match(tag) or MOVING_WORDS.search(tag):
        return f"has tag {tag!r}, which is not a release version (its publisher moves it to new builds)"
    return None


def _unpinned(resource: Resource, vllm: bool) -> Iterator[str]:
    # DaemonSets too: the device plugin runs on every GPU node.
    spec = as_map(dig(resource.view, "spec", "template", "spec")) if resource.type == k8s.DAEMONSET else k8s.pod_template(resource)
    for c in k8s.containers(spec or {}, init=True):
        if k8s.is_vllm(c) != vllm:
            continue
        image = c.get("image")
        problem = image_problem(image) if isinstance(image, str) else None
        if problem:
            yield (f"container '{container_name(c)}' image {image} {problem}: each node pulls "
                   f"whatever is newest when the pod restarts, so replicas run different versions and "
                   f"a new release with renamed flags crash-loops the pod out of nowhere. Pin a version "
                   f"tag or a digest (image@sha256:...).")


def check_image_pinned(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    return _unpinned(resource, vllm=False)


def check_vllm_image_pinned(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    # Mandatory for vLLM, as the config refuses `:latest`: vLLM renames and removes flags between
    # releases, so an unpinned server crash-loops on the next pull.
    return _unpinned(resource, vllm=True)


RULES = [
    Rule("gpu-limit-only", "GPU resources (nvidia.com/gpu, gpu.shared, mig-*) are set under resources.limits (requests only if equal).",
         MANDATORY, check_gpu_limits, k8s.WORKLOADS),
    Rule("gpu-one-slice", "A container asks for at most one time-slice (nvidia.com/gpu.shared) and one MIG instance.",
         MANDATORY, check_gpu_one_slice, k8s.WORKLOADS),
    Rule("gpu-startup-probe",
         "GPU containers have a startupProbe long enough to load the model, plus readiness and liveness.",
         MANDATORY, check_gpu_probes, k8s.WORKLOADS,
         {"minStartupSeconds": {"type": "integer", "minimum": 0, "default": 600,
                                "description": "Minimum failureThreshold x periodSeconds of the startupProbe."}}),
    Rule("gpu-shm-volume", "GPU containers mount a memory-backed emptyDir at /dev/shm.",
         MANDATORY, check_gpu_shm, k8s.WORKLOADS),
    Rule("vllm-download-dir-on-volume",
         "vLLM's --download-dir (and HF_HOME/HF_HUB_CACHE) lie on a persistent volume, not the container layer.",
         MANDATORY, check_download_dir, k8s.WORKLOADS),
    Rule("env-secret-from-secret-ref",
         "Env vars named like tokens, keys or passwords come from secretKeyRef, never a literal value.",
         MANDATORY, check_env_secrets, k8s.WORKLOADS),
    Rule("vllm-tensor-parallel-matches-gpus",
         "vLLM --tensor-parallel-size (x --pipeline-parallel-size) equals the container's GPU limit.",
         MANDATORY, check_tensor_parallel, k8s.WORKLOADS),
    Rule("gpu-node-selector", "GPU pods select GPU nodes by nodeSelector or required node affinity.",
         MANDATORY, check_gpu_node_selector, k8s.WORKLOADS,
         {"gpuProductLabel": {"type": "string", "default": "nvidia.com/gpu.product",
                              "description": "Node label that names the GPU product."}}),
    Rule("gpu-taint-toleration", "GPU pods tolerate the taint that keeps other pods off GPU nodes.",
         MANDATORY, check_gpu_toleration, k8s.WORKLOADS,
         {"gpuTaintKey": {"type": "string", "default": "nvidia.com/gpu",
                          "description": "Key of the NoSchedule taint on GPU nodes."}}),
    Rule("gpu-rollout-without-spare-gpu",
         "GPU Deployments roll out with Recreate or maxSurge 0, so no spare GPU is needed.",
         MANDATORY, check_gpu_rollout, frozenset({k8s.DEPLOYMENT})),
    Rule("vllm-image-pinned", "vLLM images carry a release version tag or a digest, never a moving tag (the config refuses it too).",
         MANDATORY, check_vllm_image_pinned, k8s.WORKLOADS | {k8s.DAEMONSET}),
    Rule("image-pinned", "Other container images (the device plugin's too) carry a release version tag or a digest, never a moving tag.",
         MANDATORY, check_image_pinned, k8s.WORKLOADS | {k8s.DAEMONSET}),
]
