"""VllmService: one model served by vLLM on the GPU nodes.

Every pitfall of the seed's troubleshooting section is a default here, not advice:
Pending pods (GPU demand checked at load, rollouts that need no spare GPU), restart loops
(a startup probe sized from the weights), downloads on every start (a pre-download Job and
`HF_HUB_OFFLINE=1`), the shared-memory crash (/dev/shm sized by tensor parallelism), two pods
on one card (GPUs only through `nvidia.com/gpu`, device env vars refused in config) and broken
streaming (ingress buffering off, long timeouts).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
import yaml

from stacks.config import Cluster as ClusterConfig
from stacks.config import Model

PORT = 8000
MODEL_MOUNT = "/models"
# huggingface_hub's cache layout (models--org--name/snapshots/<commit>/...). vLLM passes
# `--download-dir` to `snapshot_download(cache_dir=...)`, so the Job and the server share it.
DOWNLOAD_DIR = f"{MODEL_MOUNT}/hub"
STATE_DIR = f"{MODEL_MOUNT}/.gpu-serving"
QUEUE_GAUGE = "vllm:num_requests_waiting"
QUEUE_METRIC = "vllm_num_requests_waiting"  # the name prometheus-adapter gives the gauge

# --- startup probe budget (seed scenario 2) -------------------------------------------------
PROBE_PERIOD_S = 10
MIN_STARTUP_S = 600
"""The seed's 60 × 10 s: never less, whatever the model size."""
ENGINE_INIT_S = 300
"""Size-independent start work: CUDA init, torch.compile, CUDA-graph capture, KV-cache profiling."""
LOAD_MB_PER_S = 100
"""Assumed weight read throughput: a RAID1 of spinning disks or a 1 GbE NFS link (~110 MB/s)."""

# --- download Job ---------------------------------------------------------------------------
DOWNLOAD_MB_PER_S = 20
"""Assumed Hugging Face download throughput (~160 Mbit/s); retries resume, so twice this is budgeted."""
MIN_DOWNLOAD_S = 1800
IMAGE_PULL_S = 1200
"""Allowance for pulling the multi-GB vLLM image on a fresh node, on top of every wait."""
JOB_TTL_S = 7 * 24 * 3600

# --- autoscaling ----------------------------------------------------------------------------
SCALE_DOWN_WINDOW_S = 600
"""A new pod loads for minutes; a short window would start and stop pods in a loop."""
SCALE_UP_PERIOD_S = 120

PROXY_TIMEOUT_S = 600

# --- smoke test -----------------------------------------------------------------------------
SMOKE_IMAGE = "curlimages/curl:8.11.1"
SMOKE_DEADLINE_S = 900
"""The Deployment is Ready before the Job starts; this covers a slow first request and retries."""
# `/health` can be green while inference fails (vllm#24207): ask for one real token. Values
# arrive as env vars; the API key, when set, comes from the Secret and is never echoed.
SMOKE_SCRIPT = r"""set -eu
set -- -fsS --max-time 300
if [ -n "${VLLM_API_KEY:-}" ]; then set -- "$@" -H "Authorization: Bearer ${VLLM_API_KEY}"; fi
tries=0
until curl -fsS -o /dev/null --max-time 10 "$BASE/health"; do
  tries=$((tries + 1))
  [ "$tries" -lt 60 ] || { echo "$BASE/health did not answer within 5 minutes" >&2; exit 1; }
  sleep 5
done
models=$(curl "$@" "$BASE/v1/models")
case "$models" in
  *"\"id\":\"$MODEL\""*) echo "served: $MODEL" ;;
  *) echo "/v1/models does not list $MODEL: $models" >&2; exit 1 ;;
esac
answer=$(curl "$@" -H "Content-Type: application/json" \
  -d "{\"model\":\"$MODEL\",\"prompt\":\"Hello\",\"max_tokens\":1}" "$BASE/v1/completions")
case "$answer" in
  *'"choices"'*) echo "inference answered: $answer" ;;
  *) echo "no completion from $MODEL: $answer" >&2; exit 1 ;;
esac
"""

# Runs inside the vLLM image (it ships huggingface_hub). Values arrive as env vars, never
# spliced into the code. The marker is written only after a complete download, so an
# interrupted run is resumed rather than mistaken for done, and a finished one costs seconds.
DOWNLOAD_SCRIPT = """\
import os, pathlib, sys
from huggingface_hub import HfApi, snapshot_download
repo, revision = os.environ["GS_REPO"], os.environ["GS_REVISION"]
cache, marker = os.environ["HF_HUB_CACHE"], pathlib.Path(os.environ["GS_MARKER"])
if marker.exists():
    print(f"{repo}@{revision} is already in {cache}: nothing to do")
    sys.exit(0)
ignore = ["original/*"]  # vLLM ignores these too
if any(f.endswith(".safetensors") for f in HfApi().list_repo_files(repo, revision=revision)):
    ignore += ["*.bin", "*.pt", "*.pth"]  # vLLM loads safetensors when both exist
path = snapshot_download(repo, revision=revision, cache_dir=cache, ignore_patterns=ignore)
marker.parent.mkdir(parents=True, exist_ok=True)
marker.write_text(path + "\\n")
print(f"{repo}@{revision} ready in {path}")
"""


@dataclass(frozen=True)
class VllmServiceArgs:
    model: Model
    cluster: ClusterConfig
    claim_name: pulumi.Input[str]
    """The shared model volume's claim (ModelStorage.claim_name)."""
    storage_is_local: bool
    """Node-local storage lives on a (tainted) GPU node: the download Job must tolerate the taint."""
    hf_token: pulumi.Input[str] | None
    """None when the stack renders YAML: the Secret is then left to the cluster (see `credentials_note`)."""
    api_key: pulumi.Input[str] | None = None


# ---------------------------------------------------------------------------- names and labels


def object_name(model: Model) -> str:
    return f"vllm-{model.name}"


def instance_labels(model: Model) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": model.name}


def selector_labels(model: Model) -> dict[str, str]:
    """The serving pods only: the download Job's pods share the instance labels."""
    return {**instance_labels(model), "app.kubernetes.io/component": "inference-server"}


def labels(model: Model, component: str) -> dict[str, str]:
    image = model.image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    version = last.rsplit(":", 1)[1] if ":" in last else "digest"
    return {
        **instance_labels(model),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "gpu-serving",
        "app.kubernetes.io/managed-by": "pulumi",
        "app.kubernetes.io/version": re.sub(r"[^A-Za-z0-9_.-]", "-", version)[:63],
    }


def smoke_job_name(model: Model) -> str:
    """A new name whenever what serves changes (image, args, env), so each rollout is tested once."""
    served = "\n".join([model.image, *container_args(model), *(f"{k}={v}" for k, v in sorted(model.env.items()))])
    return f"{object_name(model)}-smoke-{hashlib.sha256(served.encode()).hexdigest()[:8]}"


def download_job_name(model: Model) -> str:
    """Jobs are immutable: a new (id, revision) gets a new name, so Pulumi creates a new Job."""
    digest = hashlib.sha256(f"{model.hugging_face_id}@{model.revision}".encode()).hexdigest()[:8]
    return f"{object_name(model)}-dl-{digest}"


def marker_path(model: Model) -> str:
    return f"{STATE_DIR}/downloads/{download_job_name(model)}.done"


def secret_name(model: Model) -> str:
    return f"{object_name(model)}-secrets"


# ---------------------------------------------------------------------------- sizing


def startup_budget_seconds(weights_gb: float) -> int:
    """How long `/health` may stay silent after start: engine init plus reading the weights
    at LOAD_MB_PER_S, never below the seed's 10 minutes, rounded up to whole probe periods."""
    seconds = max(MIN_STARTUP_S, ENGINE_INIT_S + weights_gb * 1000 / LOAD_MB_PER_S)
    return math.ceil(seconds / PROBE_PERIOD_S) * PROBE_PERIOD_S


def deployment_timeout_seconds(weights_gb: float) -> int:
    """Pulumi's await and the rollout's progress deadline: image pull plus the startup budget."""
    return IMAGE_PULL_S + startup_budget_seconds(weights_gb) + 5 * 60


def download_deadline_seconds(weights_gb: float) -> int:
    return max(MIN_DOWNLOAD_S, math.ceil(600 + 2 * weights_gb * 1000 / DOWNLOAD_MB_PER_S))


def shm_size_gi(gpus: int) -> int:
    """/dev/shm (seed scenario 4): the seed's 8Gi for one GPU, +4Gi per extra tensor-parallel
    rank for NCCL's shared-memory transport between ranks (vllm#1710)."""
    return 4 + 4 * gpus


_UNITS = {"Ki": 1, "Mi": 2**10, "Gi": 2**20, "Ti": 2**30}


def memory_limit(memory: str, shm_gi: int) -> str:
    """The request plus the shm size: a memory-backed emptyDir is charged to the container, so
    a limit equal to the request would OOM-kill the engine when NCCL fills /dev/shm."""
    unit = memory[-2:]
    kib = int(memory[:-2]) * _UNITS[unit] + shm_gi * _UNITS["Gi"]
    for name in ("Ti", "Gi", "Mi"):
        if kib % _UNITS[name] == 0:
            return f"{kib // _UNITS[name]}{name}"
    return f"{kib}Ki"


# ---------------------------------------------------------------------------- container


def container_args(model: Model) -> list[str]:
    return [
        f"--model={model.hugging_face_id}",
        f"--revision={model.revision}",
        f"--served-model-name={model.name}",  # also the `model_name` label of every vLLM metric
        "--host=0.0.0.0",
        f"--port={PORT}",
        f"--download-dir={DOWNLOAD_DIR}",
        # Exactly the pod's GPUs: a larger size makes vLLM look for Ray and time out (vllm#25775).
        f"--tensor-parallel-size={model.gpus_per_replica}",
        f"--gpu-memory-utilization={model.gpu_memory_utilization:g}",
        f"--max-model-len={model.max_model_len}",
        *model.extra_args,
    ]


def _health(period: int, failures: int) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path="/health", port="http"),
        period_seconds=period,
        failure_threshold=failures,
        timeout_seconds=5,
    )


def startup_probe(weights_gb: float) -> k8s.core.v1.ProbeArgs:
    return _health(PROBE_PERIOD_S, startup_budget_seconds(weights_gb) // PROBE_PERIOD_S)


def readiness_probe() -> k8s.core.v1.ProbeArgs:
    return _health(10, 3)


def liveness_probe() -> k8s.core.v1.ProbeArgs:
    # Only after the startup probe passed; a busy engine may answer slowly, so allow 90 s.
    return _health(30, 3)


def _secret_env(name: str, secret: str, key: str) -> k8s.core.v1.EnvVarArgs:
    return k8s.core.v1.EnvVarArgs(
        name=name,
        value_from=k8s.core.v1.EnvVarSourceArgs(secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=secret, key=key)),
    )


def token_env(model: Model) -> list[k8s.core.v1.EnvVarArgs]:
    # HF_TOKEN is current; HUGGING_FACE_HUB_TOKEN is what older images and vLLM's k8s doc read.
    return [_secret_env(name, secret_name(model), "hf-token") for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")]


def server_env(model: Model, api_key: bool) -> list[k8s.core.v1.EnvVarArgs]:
    env = [
        *token_env(model),
        k8s.core.v1.EnvVarArgs(name="HF_HUB_CACHE", value=DOWNLOAD_DIR),
        # The Job downloaded the revision; a restart must never reach the hub (seed scenario 3).
        k8s.core.v1.EnvVarArgs(name="HF_HUB_OFFLINE", value="1"),
    ]
    if api_key:
        env.append(_secret_env("VLLM_API_KEY", secret_name(model), "api-key"))
    env += [k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in sorted(model.env.items())]
    return env


def pod_security_context() -> k8s.core.v1.PodSecurityContextArgs:
    return k8s.core.v1.PodSecurityContextArgs(seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"))


def container_security_context() -> k8s.core.v1.SecurityContextArgs:
    # The vLLM image runs as root and writes caches (torch.compile, triton, vllm) under its
    # home: no runAsNonRoot or read-only root, but nothing beyond plain root either.
    return k8s.core.v1.SecurityContextArgs(
        allow_privilege_escalation=False,
        privileged=False,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
    )


def gpu_toleration(cluster: ClusterConfig) -> k8s.core.v1.TolerationArgs:
    taint = cluster.gpu_taint
    return k8s.core.v1.TolerationArgs(key=taint.key, operator="Equal", value=taint.value, effect=taint.effect)


def model_volume(claim_name: pulumi.Input[str]) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name="models", persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(claim_name=claim_name)
    )


# Read-write even for the server: vLLM takes a file lock inside the download dir before loading.
MODEL_MOUNT_ARGS = k8s.core.v1.VolumeMountArgs(name="models", mount_path=MODEL_MOUNT)


def pod_spec(model: Model, cluster: ClusterConfig, claim_name: pulumi.Input[str], api_key: bool) -> k8s.core.v1.PodSpecArgs:
    shm = shm_size_gi(model.gpus_per_replica)
    return k8s.core.v1.PodSpecArgs(
        containers=[
            k8s.core.v1.ContainerArgs(
                name="vllm",
                image=model.image,
                # Restarts must not depend on the registry, as they must not depend on the hub.
                image_pull_policy="IfNotPresent",
                args=container_args(model),
                ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=PORT, protocol="TCP")],
                env=server_env(model, api_key),
                resources=k8s.core.v1.ResourceRequirementsArgs(
                    # GPUs only as a limit (the request is defaulted equal): a card is never shared.
                    limits={"nvidia.com/gpu": str(model.gpus_per_replica), "memory": memory_limit(model.memory, shm)},
                    requests={"cpu": model.cpu, "memory": model.memory},
                ),
                volume_mounts=[MODEL_MOUNT_ARGS, k8s.core.v1.VolumeMountArgs(name="dshm", mount_path="/dev/shm")],
                startup_probe=startup_probe(model.weights_gb),
                readiness_probe=readiness_probe(),
                liveness_probe=liveness_probe(),
                security_context=container_security_context(),
            )
        ],
        volumes=[
            model_volume(claim_name),
            k8s.core.v1.VolumeArgs(name="dshm", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium="Memory", size_limit=f"{shm}Gi")),
        ],
        node_selector={cluster.gpu_product_label: model.gpu_product},
        tolerations=[gpu_toleration(cluster)],
        runtime_class_name=cluster.runtime_class_name,
        # Service links would put e.g. VLLM_PORT=tcp://… into the env for a Service named `vllm`,
        # which vLLM reads as its own setting and refuses to start.
        enable_service_links=False,
        automount_service_account_token=False,
        security_context=pod_security_context(),
        termination_grace_period_seconds=60,
    )


def deployment_spec(model: Model, cluster: ClusterConfig, claim_name: pulumi.Input[str], api_key: bool) -> k8s.apps.v1.DeploymentSpecArgs:
    scaled = autoscaler(cluster, model) != "none"
    return k8s.apps.v1.DeploymentSpecArgs(
        # An autoscaler owns the replica count: setting it here would make every `pulumi up` fight it.
        replicas=None if scaled else model.replicas.max,
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(model)),
        # No surge: a rollout never needs a spare GPU (with a single replica this is Recreate).
        strategy=k8s.apps.v1.DeploymentStrategyArgs(
            type="RollingUpdate",
            rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(max_surge=0, max_unavailable=1),
        ),
        # The default 600 s would mark a big model's rollout failed while it is still loading.
        progress_deadline_seconds=deployment_timeout_seconds(model.weights_gb),
        revision_history_limit=3,
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(
                labels=labels(model, "inference-server"),
                annotations={"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"},
            ),
            spec=pod_spec(model, cluster, claim_name, api_key),
        ),
    )


# ---------------------------------------------------------------------------- download Job


def run_once_job(
    model: Model, component: str, *, backoff: int, deadline_s: int, container: k8s.core.v1.ContainerArgs, **pod: Any
) -> k8s.batch.v1.JobSpecArgs:
    """A Job that runs one container to completion, with the pod hardening every Job here shares.
    Finished Jobs keep their logs a week; once one is gone, `pulumi refresh` + `up` re-creates it."""
    return k8s.batch.v1.JobSpecArgs(
        backoff_limit=backoff,
        active_deadline_seconds=deadline_s,
        ttl_seconds_after_finished=JOB_TTL_S,
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels(model, component)),
            spec=k8s.core.v1.PodSpecArgs(
                restart_policy="Never",
                containers=[container],
                enable_service_links=False,
                automount_service_account_token=False,
                security_context=pod_security_context(),
                **pod,
            ),
        ),
    )


def read_only_security_context(**extra: Any) -> k8s.core.v1.SecurityContextArgs:
    return k8s.core.v1.SecurityContextArgs(
        allow_privilege_escalation=False,
        privileged=False,
        read_only_root_filesystem=True,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        **extra,
    )


def job_spec(model: Model, cluster: ClusterConfig, claim_name: pulumi.Input[str], storage_is_local: bool) -> k8s.batch.v1.JobSpecArgs:
    """The download Job. The marker file makes a re-run of a finished download a no-op."""
    download = k8s.core.v1.ContainerArgs(
        name="download",
        image=model.image,  # ships huggingface_hub, and warms the image cache on the node
        image_pull_policy="IfNotPresent",
        command=["python3", "-c", DOWNLOAD_SCRIPT],
        env=[
            *token_env(model),
            k8s.core.v1.EnvVarArgs(name="HF_HUB_CACHE", value=DOWNLOAD_DIR),
            # Token and xet chunk caches on the volume, not on the node's small root disk.
            k8s.core.v1.EnvVarArgs(name="HF_HOME", value=f"{STATE_DIR}/hf-home"),
            k8s.core.v1.EnvVarArgs(name="GS_REPO", value=model.hugging_face_id),
            k8s.core.v1.EnvVarArgs(name="GS_REVISION", value=model.revision),
            k8s.core.v1.EnvVarArgs(name="GS_MARKER", value=marker_path(model)),
        ],
        resources=k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "4Gi"}),
        volume_mounts=[MODEL_MOUNT_ARGS, k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp")],
        # The downloader writes only to the volume (HF_HOME and the cache are there).
        security_context=read_only_security_context(),
    )
    return run_once_job(
        model,
        "model-download",
        backoff=3,
        deadline_s=download_deadline_seconds(model.weights_gb),
        container=download,
        volumes=[
            model_volume(claim_name),
            k8s.core.v1.VolumeArgs(name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="1Gi")),
        ],
        # No GPU. Node-local storage: the PV's node affinity already picks the storage
        # node, which is a GPU node, so only its taint needs tolerating.
        tolerations=[gpu_toleration(cluster)] if storage_is_local else None,
    )


def smoke_job_spec(model: Model, namespace: str, api_key: bool) -> k8s.batch.v1.JobSpecArgs:
    """Runs on any ordinary node (no GPU, no toleration) against the Service, as a client would."""
    env = [
        k8s.core.v1.EnvVarArgs(name="BASE", value=f"http://{object_name(model)}.{namespace}.svc:{PORT}"),
        k8s.core.v1.EnvVarArgs(name="MODEL", value=model.name),
    ]
    if api_key:
        env.append(_secret_env("VLLM_API_KEY", secret_name(model), "api-key"))
    smoke = k8s.core.v1.ContainerArgs(
        name="smoke-test",
        image=SMOKE_IMAGE,
        image_pull_policy="IfNotPresent",
        command=["/bin/sh", "-c", SMOKE_SCRIPT],
        env=env,
        resources=k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "10m", "memory": "16Mi"}, limits={"cpu": "200m", "memory": "64Mi"}),
        security_context=read_only_security_context(run_as_non_root=True, run_as_user=100),
    )
    return run_once_job(model, "smoke-test", backoff=2, deadline_s=SMOKE_DEADLINE_S, container=smoke)


# ---------------------------------------------------------------------------- network


def service_spec(model: Model) -> k8s.core.v1.ServiceSpecArgs:
    return k8s.core.v1.ServiceSpecArgs(
        type="ClusterIP",
        selector=selector_labels(model),
        ports=[k8s.core.v1.ServicePortArgs(name="http", port=PORT, target_port="http", protocol="TCP")],
    )


def ingress_route(path: str) -> tuple[str, str, str | None]:
    """(path, pathType, rewrite target). vLLM serves /v1/... at its root, so a model under a
    sub-path needs the prefix stripped; ImplementationSpecific because the path is a regex."""
    path = path.rstrip("/")
    if not path:
        return "/", "Prefix", None
    return f"{path}(/|$)(.*)", "ImplementationSpecific", "/$2"


def ingress_annotations(model: Model, cluster: ClusterConfig) -> dict[str, str]:
    assert model.ingress is not None
    timeout = str(PROXY_TIMEOUT_S)
    annotations = {
        # Without these, tokens arrive in one lump at the end (seed scenario 6).
        "nginx.ingress.kubernetes.io/proxy-buffering": "off",
        "nginx.ingress.kubernetes.io/proxy-request-buffering": "off",
        "nginx.ingress.kubernetes.io/proxy-http-version": "1.1",
        # Time to first token on a long queue, and long non-streamed answers.
        "nginx.ingress.kubernetes.io/proxy-read-timeout": timeout,
        "nginx.ingress.kubernetes.io/proxy-send-timeout": timeout,
        # nginx's 1m default rejects long prompts with 413.
        "nginx.ingress.kubernetes.io/proxy-body-size": "32m",
    }
    _, _, rewrite = ingress_route(model.ingress.path)
    if rewrite:
        annotations["nginx.ingress.kubernetes.io/use-regex"] = "true"
        annotations["nginx.ingress.kubernetes.io/rewrite-target"] = rewrite
    if model.ingress.tls_secret and cluster.cluster_issuer:
        annotations["cert-manager.io/cluster-issuer"] = cluster.cluster_issuer
    return annotations


def ingress_spec(model: Model, cluster: ClusterConfig) -> k8s.networking.v1.IngressSpecArgs:
    assert model.ingress is not None
    path, path_type, _ = ingress_route(model.ingress.path)
    backend = k8s.networking.v1.IngressBackendArgs(
        service=k8s.networking.v1.IngressServiceBackendArgs(
            name=object_name(model), port=k8s.networking.v1.ServiceBackendPortArgs(name="http")
        )
    )
    tls = None
    if model.ingress.tls_secret:
        tls = [k8s.networking.v1.IngressTLSArgs(hosts=[model.ingress.host], secret_name=model.ingress.tls_secret)]
    return k8s.networking.v1.IngressSpecArgs(
        ingress_class_name=cluster.ingress_class,
        tls=tls,
        rules=[
            k8s.networking.v1.IngressRuleArgs(
                host=model.ingress.host,
                http=k8s.networking.v1.HTTPIngressRuleValueArgs(
                    paths=[k8s.networking.v1.HTTPIngressPathArgs(path=path, path_type=path_type, backend=backend)]
                ),
            )
        ],
    )


def network_policy_spec(model: Model) -> k8s.networking.v1.NetworkPolicySpecArgs:
    """Only the API port is reachable (ingress controller, in-cluster clients, Prometheus);
    the download Job's pods match too and listen on nothing. Egress stays open for the hub."""
    return k8s.networking.v1.NetworkPolicySpecArgs(
        pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=instance_labels(model)),
        policy_types=["Ingress"],
        ingress=[
            k8s.networking.v1.NetworkPolicyIngressRuleArgs(ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=PORT, protocol="TCP")])
        ],
    )


def in_cluster_url(model: Model, namespace: str) -> str:
    """OpenAI base URL inside the cluster."""
    return f"http://{object_name(model)}.{namespace}.svc:{PORT}/v1"


def ingress_url(model: Model) -> str | None:
    if model.ingress is None:
        return None
    scheme = "https" if model.ingress.tls_secret else "http"
    return f"{scheme}://{model.ingress.host}{model.ingress.path.rstrip('/')}/v1"


# ---------------------------------------------------------------------------- autoscaling


def autoscaler(cluster: ClusterConfig, model: Model) -> Literal["hpa", "keda", "none"]:
    """One owner of the replica count: with min == max there is nothing to scale."""
    return "none" if model.replicas.min == model.replicas.max else cluster.autoscaling


def hpa_spec(model: Model) -> k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs:
    v2 = k8s.autoscaling.v2
    return v2.HorizontalPodAutoscalerSpecArgs(
        scale_target_ref=v2.CrossVersionObjectReferenceArgs(api_version="apps/v1", kind="Deployment", name=object_name(model)),
        min_replicas=model.replicas.min,
        max_replicas=model.replicas.max,
        # CPU says nothing about an inference server; its queue does.
        metrics=[
            v2.MetricSpecArgs(
                type="Pods",
                pods=v2.PodsMetricSourceArgs(
                    metric=v2.MetricIdentifierArgs(name=QUEUE_METRIC),
                    target=v2.MetricTargetArgs(type="AverageValue", average_value=str(model.replicas.target_requests_waiting)),
                ),
            )
        ],
        behavior=v2.HorizontalPodAutoscalerBehaviorArgs(**_behavior_args()),
    )


def scaling_behavior() -> dict[str, Any]:
    """HPA `behavior`, shared by the HPA and KEDA's generated HPA. Scale up one pod at a time
    (each needs free GPUs and minutes to load), scale down slowly."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": SCALE_UP_PERIOD_S}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
        },
    }


def _behavior_args() -> dict[str, k8s.autoscaling.v2.HPAScalingRulesArgs]:
    v2 = k8s.autoscaling.v2
    rules = {}
    for key, attr in (("scaleUp", "scale_up"), ("scaleDown", "scale_down")):
        rule = scaling_behavior()[key]
        rules[attr] = v2.HPAScalingRulesArgs(
            stabilization_window_seconds=rule["stabilizationWindowSeconds"],
            select_policy=rule["selectPolicy"],
            policies=[
                v2.HPAScalingPolicyArgs(type=p["type"], value=p["value"], period_seconds=p["periodSeconds"]) for p in rule["policies"]
            ],
        )
    return rules


def queue_query(model: Model, namespace: str) -> str:
    """Total queue of one model; KEDA divides by the threshold (AverageValue), as the HPA does.
    The gauge is labelled `model_name` (= --served-model-name), not `model`."""
    return f'sum({QUEUE_GAUGE}{{namespace="{namespace}",model_name="{model.name}"}})'


def scaled_object(model: Model, namespace: str, prometheus_url: str) -> dict[str, Any]:
    return {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": object_name(model)},
        "minReplicaCount": model.replicas.min,
        "maxReplicaCount": model.replicas.max,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": scaling_behavior()}},
        "triggers": [
            {
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": prometheus_url,
                    "query": queue_query(model, namespace),
                    "threshold": str(model.replicas.target_requests_waiting),
                },
            }
        ],
    }


def adapter_rules() -> str:
    """prometheus-adapter `config.yaml`: the per-pod queue gauge as the Pods metric the HPAs read.

    Needs the scrape to attach `namespace` and `pod` labels (the usual kubernetes-pods job does).
    """
    rule = {
        "seriesQuery": f'{{__name__="{QUEUE_GAUGE}",namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{QUEUE_GAUGE}$", "as": QUEUE_METRIC},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }
    return yaml.safe_dump({"rules": [rule]}, sort_keys=False, width=200)


def credentials_note(model: Model, namespace: str) -> str:
    """What to create by hand when the stack renders YAML: the provider would write the Secret's
    values in plain text into the folder that Argo CD or Flux reads (and teams commit)."""
    keys = "hf-token" + (", api-key" if model.api_key_secret else "")
    files = "--from-file=hf-token=hf-token.txt" + (" --from-file=api-key=api-key.txt" if model.api_key_secret else "")
    return (
        f"renderYamlTo: Secret {namespace}/{secret_name(model)} (keys {keys}) is not written, its values would be plain "
        f"text in the YAML; create it in the cluster (sealed-secrets, external-secrets, or "
        f"`kubectl -n {namespace} create secret generic {secret_name(model)} {files}`)"
    )


def needs_adapter_rules(cluster: ClusterConfig, models: list[Model]) -> bool:
    return any(autoscaler(cluster, m) == "hpa" for m in models)


# ---------------------------------------------------------------------------- the component


class VllmService(pulumi.ComponentResource):
    """Secret, pre-download Job, Deployment, Service, NetworkPolicy, a smoke-test Job, and when
    configured an Ingress and an autoscaler, for one model."""

    url: pulumi.Output[str]
    """OpenAI base URL inside the cluster."""
    ingress_url: pulumi.Output[str | None]
    served_model_name: pulumi.Output[str]
    gpus_per_replica: pulumi.Output[int]
    replicas: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, args: VllmServiceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-serving:serving:VllmService", name, None, opts)
        model, cluster, namespace = args.model, args.cluster, args.cluster.namespace
        base = object_name(model)

        def meta(object_name: str, component: str) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace, labels=labels(model, component))

        child = pulumi.ResourceOptions(parent=self)
        uses_api_key = model.api_key_secret is not None
        secrets: list[pulumi.Resource] = []
        if args.hf_token is None:
            pulumi.log.warn(credentials_note(model, namespace), resource=self)
        else:
            string_data: dict[str, pulumi.Input[str]] = {"hf-token": args.hf_token}
            if args.api_key is not None:
                string_data["api-key"] = args.api_key
            secrets.append(k8s.core.v1.Secret(
                f"{name}-secrets", metadata=meta(secret_name(model), "credentials"), type="Opaque", string_data=string_data, opts=child
            ))

        pull_and_download = IMAGE_PULL_S + download_deadline_seconds(model.weights_gb)
        job = k8s.batch.v1.Job(
            f"{name}-download",
            metadata=meta(download_job_name(model), "model-download"),
            spec=job_spec(model, cluster, args.claim_name, args.storage_is_local),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=secrets,
                # Any other change to an immutable Job replaces it under the same name.
                delete_before_replace=True,
                # Pulumi waits for completion (the Deployment must not start before the files exist).
                custom_timeouts=pulumi.CustomTimeouts(create=f"{pull_and_download}s", update=f"{pull_and_download}s"),
            ),
        )

        rollout = f"{deployment_timeout_seconds(model.weights_gb)}s"
        deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta(base, "inference-server"),
            spec=deployment_spec(model, cluster, args.claim_name, uses_api_key),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[job, *secrets],
                custom_timeouts=pulumi.CustomTimeouts(create=rollout, update=rollout),
            ),
        )
        service = k8s.core.v1.Service(f"{name}-service", metadata=meta(base, "inference-server"), spec=service_spec(model), opts=child)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy", metadata=meta(base, "inference-server"), spec=network_policy_spec(model), opts=child
        )

        if model.ingress is not None:
            metadata = meta(base, "inference-server")
            k8s.networking.v1.Ingress(
                f"{name}-ingress",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=metadata.name,
                    namespace=metadata.namespace,
                    labels=metadata.labels,
                    annotations=ingress_annotations(model, cluster),
                ),
                spec=ingress_spec(model, cluster),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[service]),
            )

        if model.smoke_test:
            k8s.batch.v1.Job(
                f"{name}-smoke-test",
                metadata=meta(smoke_job_name(model), "smoke-test"),
                spec=smoke_job_spec(model, namespace, uses_api_key),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[deployment, service],
                    delete_before_replace=True,
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{SMOKE_DEADLINE_S + 300}s", update=f"{SMOKE_DEADLINE_S + 300}s"),
                ),
            )

        scaler = autoscaler(cluster, model)
        after_deployment = pulumi.ResourceOptions(parent=self, depends_on=[deployment])
        if scaler == "hpa":
            k8s.autoscaling.v2.HorizontalPodAutoscaler(
                f"{name}-hpa", metadata=meta(base, "autoscaler"), spec=hpa_spec(model), opts=after_deployment
            )
        elif scaler == "keda":
            k8s.apiextensions.CustomResource(
                f"{name}-scaled-object",
                api_version="keda.sh/v1alpha1",
                kind="ScaledObject",
                metadata=meta(base, "autoscaler"),
                spec=scaled_object(model, namespace, cluster.prometheus_url),
                opts=after_deployment,
            )

        self.url = pulumi.Output.from_input(in_cluster_url(model, namespace))
        self.ingress_url = pulumi.Output.from_input(ingress_url(model))
        self.served_model_name = pulumi.Output.from_input(model.name)
        self.gpus_per_replica = pulumi.Output.from_input(model.gpus_per_replica)
        self.replicas = pulumi.Output.from_input({"min": model.replicas.min, "max": model.replicas.max, "autoscaler": scaler})
        self.register_outputs(
            {
                "url": self.url,
                "ingressUrl": self.ingress_url,
                "servedModelName": self.served_model_name,
                "gpusPerReplica": self.gpus_per_replica,
                "replicas": self.replicas,
                "deployment": deployment.metadata.apply(lambda m: m.name),
            }
        )
