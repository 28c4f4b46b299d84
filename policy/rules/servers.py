"""Rules for the vLLM server container itself: stopping without cutting streams (and a node drain that keeps
a replica up), offline serving, a read-only root filesystem, and what the config refuses, refused in any YAML too."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence

from . import k8s
from .core import ADVISORY, MANDATORY, Resource, Rule, attempt
from .k8s import GPU, as_list, as_map, container_name, dig, namespace, to_int, workloads

# --- graceful drain ---------------------------------------------------------------------------

DEFAULT_GRACE_S = 30  # Kubernetes' terminationGracePeriodSeconds when unset


def prestop_seconds(container: Mapping) -> int:
    """How long the preStop hook holds SIGTERM back: the kubelet's sleep action, or a `sleep N`
    command (also inside `sh -c`); 0 without a hook or for one it cannot time (httpGet)."""
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
        if not k8s.is_vllm_server(c) or k8s.is_headless_vllm(c):
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
        for flag, env in (("--api-key", "VLLM_API_KEY"), ("--hf-token", "HF_TOKEN")):
            key = k8s.flag_value(tokens, flag)
            if key is not None and not re.fullmatch(r"\$\(\w+\)|\$\{?\w+\}?", key):
                yield (f"container '{name}' passes {flag} literally: the key is in the manifest, in git and in "
                       f"`kubectl get -o yaml`. Set env {env} from a secretKeyRef instead.")
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


# --- LoRA adapters from the model volume -----------------------------------------------------------

def lora_modules(tokens: list[str]) -> list[tuple[str, str]]:
    """(name, path) of every `--lora-modules` value: `name=path`, or the JSON form
    `{"name": …, "path": …}`; the flag takes values up to the next flag, and may repeat."""
    values: list[str] = []
    for i, token in enumerate(tokens):
        if token.startswith("--lora-modules="):
            values.append(token.split("=", 1)[1])
        elif token == "--lora-modules":
            values += itertools.takewhile(lambda t: not t.startswith("-"), tokens[i + 1:])
    found = []
    for value in values:
        try:
            module = json.loads(value) if value.lstrip().startswith("{") else None
        except ValueError:
            module = None
        if isinstance(module, Mapping):
            found.append((str(module.get("name")), str(module.get("path"))))
        else:
            name, _, path = value.partition("=")
            found.append((name, path))
    return found


def lora_tokens(container: Mapping) -> list[str]:
    """The command line as `argv` splits it, but a JSON value kept whole (it holds spaces)."""
    tokens: list[str] = []
    for item in [*as_list(container.get("command")), *as_list(container.get("args"))]:
        text = str(item)
        tokens += [text] if text.lstrip().startswith("{") else k8s.argv({"args": [text]})
    return tokens


def check_lora_modules(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    vols = k8s.volumes(spec or {})
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        for name, path in lora_modules(lora_tokens(c)):
            where = f"container '{container_name(c)}': LoRA adapter '{name}' at {path!r}"
            mount = k8s.mount_for(path, c) if path.startswith("/") else None
            volume = vols.get(str(mount.get("name")), {}) if mount is not None else {}
            if not path.startswith("/"):
                yield (f"{where} is not a path: vLLM fetches it from the Hugging Face hub at every start (an "
                       f"offline server fails). Download it to the model volume and give the snapshot folder.")
            elif mount is None:
                yield (f"{where} is not on a mounted volume: the container layer holds no adapter, so vLLM stops "
                       f"at start. Give a path under the model volume's mount (e.g. /models/hub/...).")
            elif "persistentVolumeClaim" not in volume:
                yield (f"{where} is on volume '{mount.get('name')}', which is not the model volume (a "
                       f"PersistentVolumeClaim): the adapter is gone or differs on another node or after a restart. "
                       f"Download it to the model volume and give its path there.")


# vLLM's LoRAConfig flags (vllm/engine/arg_utils.py): without --enable-lora no LoRAConfig is built and each is ignored.
LORA_ONLY_FLAGS = frozenset({
    "--lora-modules", "--max-loras", "--max-lora-rank", "--max-cpu-loras", "--lora-dtype", "--fully-sharded-loras",
    "--lora-extra-vocab-size", "--enable-lora-bias", "--long-lora-scaling-factors", "--default-mm-loras",
    "--lora-target-modules", "--specialize-active-lora",
})
HUB_FOLDER = re.compile(r"(?:^|/)models--([^/]+)--([^/]+)(?:/|$)")


def hub_repo(path: str) -> str | None:
    """`/models/hub/models--Qwen--Qwen3-8B/snapshots/<sha>` → `Qwen/Qwen3-8B` (the hub cache's folder names)."""
    match = HUB_FOLDER.search(path)
    return f"{match.group(1)}/{match.group(2)}" if match else None


def flag_values(tokens: Sequence[str], name: str) -> list[str]:
    """Every value of a flag that takes several (`--served-model-name a b`)."""
    values: list[str] = []
    for i, token in enumerate(tokens):
        if token.startswith(name + "="):
            values.append(token.split("=", 1)[1])
        elif token == name:
            values += itertools.takewhile(lambda t: not t.startswith("-"), tokens[i + 1:])
    return values


def check_lora_flags(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        name, tokens = container_name(c), lora_tokens(c)
        if "--enable-lora" not in tokens:
            used = sorted({t.split("=", 1)[0] for t in tokens} & LORA_ONLY_FLAGS)
            if used:
                yield (f"container '{name}' sets {', '.join(used)} without --enable-lora: vLLM then builds no LoRA "
                       f"configuration and ignores them, so no adapter is served. Add --enable-lora, or remove them.")
            continue
        model = k8s.vllm_model(tokens)
        served = flag_values(tokens, "--served-model-name") or ([model] if model else [])
        base = hub_repo(model) if model and model.startswith("/") else model
        for adapter, path in lora_modules(tokens):
            if adapter in served:
                # vLLM resolves a request's "model" to the base first: the adapter is never used.
                yield (f"container '{name}': LoRA adapter '{adapter}' has the served model's name, and vLLM answers that "
                       f"name with the base model, so the adapter is never used. Give the adapter a name of its own.")
            if base and hub_repo(path) == base:
                yield (f"container '{name}': LoRA adapter '{adapter}' at {path!r} is the base model's own snapshot "
                       f"({base}), not an adapter: vLLM finds no adapter_config.json there and stops at start. Give the "
                       f"adapter repository's snapshot.")
        max_loras = to_int(k8s.flag_value(tokens, "--max-loras")) or 1
        cpu = to_int(k8s.flag_value(tokens, "--max-cpu-loras"))
        if cpu is not None and cpu < max_loras:
            yield (f"container '{name}' has --max-cpu-loras {cpu} below --max-loras {max_loras}: vLLM refuses to start "
                   f"(\"max_cpu_loras must be >= max_loras\"). Raise --max-cpu-loras or lower --max-loras.")


# --- a drain keeps the model up ----------------------------------------------------------

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


RULES = [
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
    Rule("vllm-server-gpu", "A vLLM server container has an nvidia.com/gpu limit.",
         MANDATORY, check_vllm_server_gpu, k8s.WORKLOADS),
    Rule("vllm-lora-modules-on-volume",
         "A vLLM server loads its --lora-modules from absolute paths on a PersistentVolumeClaim (the model volume).",
         MANDATORY, check_lora_modules, k8s.WORKLOADS),
    Rule("vllm-lora-flags", "A vLLM server's LoRA flags take effect and start: --enable-lora with them, adapters named apart "
         "from the model and not the base's own snapshot, --max-cpu-loras at least --max-loras.", MANDATORY, check_lora_flags,
         k8s.WORKLOADS),
    Rule("vllm-server-flags",
         "A vLLM server has no literal --api-key or --hf-token, no --disable-log-stats, no hand-set CUDA/NVIDIA_VISIBLE_DEVICES, "
         "and a --gpu-memory-utilization in (0, 1].",
         MANDATORY, check_vllm_server_flags, k8s.WORKLOADS),
    Rule("vllm-disruption-budget", "vLLM Deployments and StatefulSets are covered by a PodDisruptionBudget.",
         ADVISORY, check_disruption_budget),
]
