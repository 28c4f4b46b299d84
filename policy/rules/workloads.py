"""Per-resource rules for pods and the controllers that template them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from . import k8s
from .core import ADVISORY, MANDATORY, Resource, Rule
from .k8s import GPU, as_list, as_map, container_name, dig, to_int


def _gpu_pod(resource: Resource) -> Mapping | None:
    spec = k8s.pod_template(resource)
    return spec if spec is not None and k8s.gpu_containers(spec) else None


# --- nvidia.com/gpu only under limits ------------------------------------------

def check_gpu_limits(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}, init=True):
        limit, request = k8s.gpu_amount(c, "limits"), k8s.gpu_amount(c, "requests")
        name = container_name(c)
        if request is not None and limit is None:
            yield (f"container '{name}' puts {GPU} only under requests: the API server rejects the pod "
                   f"(extended resources need a limit). Move it to resources.limits.{GPU}.")
        elif request is not None and to_int(request) != to_int(limit):
            yield (f"container '{name}' requests {request} but limits {limit} {GPU}: a card cannot be "
                   f"shared, so Kubernetes rejects the pod. Drop the request; the limit fills it in.")
        for amount in (limit, request):
            if amount is not None and to_int(amount) is None:
                yield (f"container '{name}' asks for {amount!r} {GPU}: a GPU is indivisible, only whole "
                       f"numbers are accepted. Use an integer limit.")
                break


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


def _download_targets(container: Mapping) -> list[tuple[str, str]]:
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
        for what, path in _download_targets(c):
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
        if world != gpus:
            yield (f"container '{container_name(c)}' runs vLLM with tensor-parallel x pipeline-parallel "
                   f"= {world} but gets {gpus} {GPU}: with fewer GPUs vLLM falls back to Ray and times "
                   f"out, with more the extra cards sit idle. Make --tensor-parallel-size equal the GPU "
                   f"limit (all on one node: a pod never spans two servers).")


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


# --- graceful drain ---------------------------------------------------------------------------

DEFAULT_GRACE_S = 30  # Kubernetes' terminationGracePeriodSeconds when unset


def prestop_seconds(container: Mapping) -> int:
    """How long the preStop hook holds SIGTERM back: the kubelet's sleep action, or a `sleep N`
    command (also inside `sh -c`); 0 without a hook, None-like 0 for a hook it cannot time."""
    hook = as_map(dig(container, "lifecycle", "preStop"))
    seconds = to_int(dig(hook, "sleep", "seconds"))
    if seconds is not None:
        return seconds
    tokens = k8s.argv({"command": dig(hook, "exec", "command") or []})
    for i, token in enumerate(tokens[:-1]):
        if token.rsplit("/", 1)[-1] == "sleep":
            return to_int(tokens[i + 1].rstrip(";")) or 0
    return 0


def check_graceful_drain(resource: Resource, cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    if spec is None:
        return
    grace = to_int(spec.get("terminationGracePeriodSeconds"))
    grace = DEFAULT_GRACE_S if grace is None else grace
    for c in k8s.containers(spec):
        if not k8s.is_vllm_server(c):
            continue
        name = container_name(c)
        pre_stop = prestop_seconds(c)
        shutdown = k8s.flag_value(k8s.argv(c), "--shutdown-timeout")
        drain = to_int(shutdown) if shutdown is not None else None
        drain = int(cfg["drainSeconds"]) if drain is None else drain
        if pre_stop < int(cfg["minPreStopSeconds"]):
            yield (f"container '{name}' has no preStop that holds SIGTERM back (found {pre_stop}s): on a rollout or "
                   f"scale-down the ingress and kube-proxy keep sending new requests for a few seconds to a server "
                   f"that is shutting down, and they fail. Add lifecycle.preStop.sleep.seconds: "
                   f"{int(cfg['minPreStopSeconds'])} or more.")
        if grace < pre_stop + drain:
            yield (f"terminationGracePeriodSeconds is {grace}{' (default)' if 'terminationGracePeriodSeconds' not in spec else ''} "
                   f"but container '{name}' needs preStop {pre_stop}s + drain {drain}s "
                   f"({'--shutdown-timeout' if shutdown is not None else 'the longest stream'}) = {pre_stop + drain}s: "
                   f"every rollout and scale-down kills streams mid-answer. Raise terminationGracePeriodSeconds to "
                   f"{pre_stop + drain} or more.")


# --- offline serving ------------------------------------------------------------------------------

HUB_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def check_offline_server(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        names = {str(as_map(e).get("name")) for e in as_list(c.get("env"))}
        offline = k8s.env_literal(c, "HF_HUB_OFFLINE") in ("1", "true", "True", "YES", "yes")
        held = sorted(names & set(HUB_TOKENS))
        if offline and held:
            yield (f"container '{container_name(c)}' runs offline (HF_HUB_OFFLINE) yet holds {', '.join(held)}: a "
                   f"credential it never uses, which a compromised server can leak. Give it to the download Job only.")
        if k8s.env_literal(c, "VLLM_NO_USAGE_STATS") != "1" and k8s.env_literal(c, "DO_NOT_TRACK") != "1":
            yield (f"container '{container_name(c)}' reports usage statistics to vLLM's maintainers (no "
                   f"VLLM_NO_USAGE_STATS=1 or DO_NOT_TRACK=1): an offline server should not phone home.")


# --- read-only root filesystem ----------------------------------------------------------------------

def _home(container: Mapping, spec: Mapping) -> str | None:
    home = k8s.env_literal(container, "HOME")
    if home:
        return home
    uid = to_int(dig(container, "securityContext", "runAsUser"))
    if uid is None:
        uid = to_int(dig(spec, "securityContext", "runAsUser"))
    return "/root" if uid in (None, 0) else None  # another user's home is the image's business


def writable_paths(container: Mapping, spec: Mapping) -> list[tuple[str, str]]:
    """(what, path) a vLLM server writes at start: its caches (each setting or its default under
    HOME), HOME itself, the temp dir, the download dir."""
    home = _home(container, spec)
    env = {name: k8s.env_literal(container, name) for name in (
        "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "HF_HUB_CACHE", "HF_HOME", "TMPDIR")}
    xdg = env["XDG_CACHE_HOME"] or (f"{home}/.cache" if home else None)
    defaults = {
        "VLLM_CACHE_ROOT": f"{xdg}/vllm" if xdg else None,
        "TRITON_CACHE_DIR": f"{home}/.triton" if home else None,
        "TORCHINDUCTOR_CACHE_DIR": None,  # under the temp dir by default, checked with it
        "XDG_CACHE_HOME": xdg,
        "HF_HUB_CACHE": None,
        "HF_HOME": None,
        "TMPDIR": "/tmp",
    }
    paths = [(name, env[name] or defaults[name]) for name in env]
    if home:
        paths.append(("HOME", home))
    download_dir = k8s.flag_value(k8s.argv(container), "--download-dir")
    if download_dir:
        paths.append(("--download-dir", download_dir))
    return [(what, path) for what, path in paths if path]


def check_writable_paths(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c) or dig(c, "securityContext", "readOnlyRootFilesystem") is not True:
            continue
        for what, path in writable_paths(c, spec):
            mount = k8s.mount_for(path, c)
            if mount is None or mount.get("readOnly") is True:
                yield (f"container '{container_name(c)}' has a read-only root filesystem but {what} ({path}) is not on "
                       f"a writable volumeMount: vLLM fails at start writing its caches, or every compile cache is "
                       f"lost. Mount an emptyDir (HOME, /tmp) or the model volume (caches) there.")


# --- images -------------------------------------------------------------------------------------------

def image_problem(image: str) -> str | None:
    if "@" in image:  # a digest pins the exact bytes, whatever the tag says
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (means :latest)"
    if last.rsplit(":", 1)[1] == "latest":
        return "uses :latest"
    return None


def _unpinned(resource: Resource, vllm: bool) -> Iterator[str]:
    spec = k8s.pod_template(resource)
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


# --- the pack as strict as the config -------------------------------------------------------------

def check_vllm_server_gpu(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if k8s.is_vllm_server(c) and k8s.gpu_count(c) == 0:
            yield (f"container '{container_name(c)}' runs the vLLM server with no {GPU} limit: the device plugin "
                   f"gives it no GPU, so vLLM stops at start ('No CUDA GPUs are available' / no platform detected), "
                   f"or sees every card of the node when the runtime exposes them all. Set resources.limits."
                   f"{GPU} to the tensor-parallel size.")


# Env the device plugin owns: set by hand, two pods share one card.
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def check_vllm_server_flags(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    """What stacks/config refuses in extraArgs and env, refused in anyone's YAML too."""
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        name, tokens = container_name(c), k8s.argv(c)
        key = k8s.flag_value(tokens, "--api-key")
        if key is not None and not re.fullmatch(r"\$\(\w+\)|\$\{?\w+\}?", key):
            yield (f"container '{name}' passes --api-key literally: the key is in the manifest, in git and in "
                   f"`kubectl get -o yaml`. Set env VLLM_API_KEY from a secretKeyRef instead.")
        if "--disable-log-stats" in tokens:
            yield (f"container '{name}' runs with --disable-log-stats: vLLM then exports no "
                   f"vllm:num_requests_waiting, so autoscaling and the alerts read nothing. Remove the flag.")
        for var in DEVICE_ENV:
            if any(as_map(e).get("name") == var for e in as_list(c.get("env"))):
                yield (f"container '{name}' sets {var}: the device plugin chooses the pod's GPUs, and a hand-set "
                       f"list makes two pods use one card. Remove it; request {GPU} instead.")
        utilization = k8s.flag_value(tokens, "--gpu-memory-utilization")
        if utilization is not None:
            try:
                value = float(utilization)
            except ValueError:
                value = -1.0
            if not 0 < value <= 1:
                yield (f"container '{name}' has --gpu-memory-utilization {utilization}: it is a share of the "
                       f"GPU's memory, above 0 and at most 1 (e.g. 0.90).")


RULES = [
    Rule("gpu-limit-only", "nvidia.com/gpu is set under resources.limits (requests only if equal).",
         MANDATORY, check_gpu_limits, k8s.WORKLOADS),
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
    Rule("vllm-graceful-drain",
         "vLLM server pods hold SIGTERM back with a preStop and get a grace period ≥ preStop + drain time.",
         MANDATORY, check_graceful_drain, k8s.SCALABLE,
         {"drainSeconds": {"type": "integer", "minimum": 0, "default": 600,
                           "description": "Longest request to let finish when vLLM has no --shutdown-timeout (the edge's stream timeout)."},
          "minPreStopSeconds": {"type": "integer", "minimum": 0, "default": 5,
                                "description": "Shortest preStop delay that lets endpoint removal propagate."}}),
    Rule("vllm-server-offline",
         "A vLLM server sends no usage statistics, and one that runs offline holds no Hugging Face token.",
         ADVISORY, check_offline_server, k8s.WORKLOADS),
    Rule("vllm-writable-paths",
         "A vLLM server with a read-only root filesystem has HOME, the temp dir, its caches and the download dir on writable mounts.",
         MANDATORY, check_writable_paths, k8s.WORKLOADS),
    Rule("vllm-image-pinned", "vLLM images carry a version tag or digest, never :latest or no tag (the config refuses it too).",
         MANDATORY, check_vllm_image_pinned, k8s.WORKLOADS),
    Rule("vllm-server-gpu", "A vLLM server container has an nvidia.com/gpu limit.",
         MANDATORY, check_vllm_server_gpu, k8s.WORKLOADS),
    Rule("vllm-server-flags",
         "A vLLM server has no literal --api-key, no --disable-log-stats, no hand-set CUDA/NVIDIA_VISIBLE_DEVICES, "
         "and a --gpu-memory-utilization in (0, 1].",
         MANDATORY, check_vllm_server_flags, k8s.WORKLOADS),
    Rule("image-pinned", "Other container images carry a version tag or digest, never :latest or no tag.",
         ADVISORY, check_image_pinned, k8s.WORKLOADS),
]
