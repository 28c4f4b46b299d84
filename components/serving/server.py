"""The vLLM server: container arguments, probes, environment, pod, and the Deployment or (for a model spanning
nodes) the LeaderWorkerSet that runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.serving.autoscaling import autoscaler
from components.serving.drain import grace_period_seconds, lifecycle, shutdown_args
from components.serving.lora import download_repos, lora_args, lora_env
from components.serving.names import (
    DOWNLOAD_DIR,
    MARKER_DIR,
    MODEL_MOUNT,
    PORT,
    WEIGHTS_VERIFIED,
    WORKER_COMPONENT,
    labels,
    secret_name,
    selector_labels,
    weights_label,
)
from components.serving.profile import container_security_context, pod_security_context, profile_env, scratch_volumes
from components.serving.sizing import memory_limit, shm_size_gi
from stacks.config import ClusterConfig, Model
from stacks.config.budgets import PROBE_PERIOD_S, deployment_timeout_seconds, startup_budget_seconds
from stacks.config.cluster import GFD_PRODUCT_LABEL
from stacks.config.sharing import resource_name

SERVE_COMMAND = ["vllm", "serve"]
"""Set, never left to the image: an image whose entrypoint is the older `python3 -m vllm.entrypoints.openai.api_server`
would read the positional model differently (it wants `--model`), so what runs would depend on the tag."""


def container_args(model: Model) -> list[str]:
    """Arguments to `vllm serve`. The model is the positional argument: `--model` is deprecated in `vllm serve`."""
    return [
        model.hugging_face_id,
        f"--revision={model.revision}",
        f"--served-model-name={model.name}",  # also the `model_name` label of every vLLM metric
        "--host=0.0.0.0",
        f"--port={PORT}",
        f"--download-dir={DOWNLOAD_DIR}",
        # Exactly the pod's GPUs: a larger size makes vLLM look for Ray and time out (vllm#25775).
        f"--tensor-parallel-size={model.gpus_per_replica}",
        f"--gpu-memory-utilization={model.gpu_memory_utilization:g}",
        f"--max-model-len={model.max_model_len}",
        *shutdown_args(model),
        *lora_args(model),
        *model.extra_args,
    ]


MASTER_PORT = 29501
"""Where a group's leader listens for its workers (torch.distributed's store; vLLM's default `--master-port`)."""

LEADER_ADDRESS, WORKER_INDEX = "$(LWS_LEADER_ADDRESS)", "$(LWS_WORKER_INDEX)"
"""Set in every member's environment by LeaderWorkerSet's pod webhook (the leader's DNS name in the group's headless
Service, the member's index: 0 for the leader); the kubelet expands `$(NAME)` in the arguments."""


def group_args(model: Model, worker: bool) -> list[str]:
    """A member of a group spanning `nodesPerReplica` nodes: one pipeline stage per node, tensor parallelism within it,
    joined by vLLM's own multi-node launcher (`mp`, no Ray cluster to run beside it). The leader (rank 0) serves the API;
    the workers run `--headless` and join it. Empty for a model on one node."""
    if not model.spans_nodes:
        return []
    rank = WORKER_INDEX if worker else "0"
    return [
        f"--pipeline-parallel-size={model.nodes_per_replica}",
        "--distributed-executor-backend=mp",
        f"--nnodes={model.nodes_per_replica}",
        f"--node-rank={rank}",
        f"--master-addr={LEADER_ADDRESS}",
        f"--master-port={MASTER_PORT}",
        *(["--headless"] if worker else []),
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


def secret_env(name: str, secret: str, key: str) -> k8s.core.v1.EnvVarArgs:
    return k8s.core.v1.EnvVarArgs(
        name=name,
        value_from=k8s.core.v1.EnvVarSourceArgs(secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=secret, key=key)),
    )


def token_env(model: Model) -> list[k8s.core.v1.EnvVarArgs]:
    # HF_TOKEN is current; HUGGING_FACE_HUB_TOKEN is what older images and vLLM's k8s doc read.
    return [secret_env(name, secret_name(model), "hf-token") for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")]


# vLLM reports usage to its maintainers unless told not to; DO_NOT_TRACK covers the libraries
# that honour the convention. The egress NetworkPolicy would block the report anyway: this keeps
# the pod from trying (and logging the failure) in the first place.
NO_TELEMETRY = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def server_env(model: Model, api_key: bool) -> list[k8s.core.v1.EnvVarArgs]:
    # No HF_TOKEN: the download Job fetched the revision, and a pod that never reaches the hub
    # has no use for the credential (a compromised server cannot leak what it never held).
    env = [
        k8s.core.v1.EnvVarArgs(name="HF_HUB_CACHE", value=DOWNLOAD_DIR),
        # The Job downloaded the revision; a restart must never reach the hub (seed scenario 3).
        k8s.core.v1.EnvVarArgs(name="HF_HUB_OFFLINE", value="1"),
        *(k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in NO_TELEMETRY.items()),
        *(k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in profile_env(model).items()),
        *(k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in lora_env(model).items()),
    ]
    if api_key:
        env.append(secret_env("VLLM_API_KEY", secret_name(model), "api-key"))
    env += [k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in sorted(model.env.items())]
    return env


def node_selector(model: Model, cluster: ClusterConfig, cached: bool = False) -> dict[str, str]:
    """The GPU product; from a node cache, also the label that says the node holds this revision's weights (the gate:
    a pod never starts on a node whose copy is not complete)."""
    product = {GFD_PRODUCT_LABEL: model.gfd_product} if model.gfd_product is not None else {cluster.gpu_product_label: model.gpu_product}
    return product | ({weights_label(model, cluster.namespace): WEIGHTS_VERIFIED} if cached else {})


NODE_LOSS_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def node_loss_tolerations(cluster: ClusterConfig) -> list[k8s.core.v1.TolerationArgs]:
    """How long a pod stays bound to a lost node before it is evicted and rescheduled on another holder. Eviction by
    these taints does not consult the PodDisruptionBudget (a drain does); Kubernetes would wait 300 s."""
    return [k8s.core.v1.TolerationArgs(key=key, operator="Exists", effect="NoExecute",
                                       toleration_seconds=cluster.node_loss_eviction_seconds) for key in NODE_LOSS_TAINTS]


def spread(model: Model) -> list[k8s.core.v1.TopologySpreadConstraintArgs]:
    """One replica per node while there are nodes to spare. ScheduleAnyway: a full or lost node never leaves a replica
    Pending; `pod-template-hash` counts only the pods of the same rollout."""
    return [k8s.core.v1.TopologySpreadConstraintArgs(
        max_skew=1, topology_key="kubernetes.io/hostname", when_unsatisfiable="ScheduleAnyway",
        label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(model)), match_label_keys=["pod-template-hash"],
    )]


def gpu_toleration(cluster: ClusterConfig) -> k8s.core.v1.TolerationArgs:
    taint = cluster.gpu_taint
    return k8s.core.v1.TolerationArgs(key=taint.key, operator="Equal", value=taint.value, effect=taint.effect)


def model_volume(claim_name: pulumi.Input[str]) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name="models", persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(claim_name=claim_name)
    )


# Read-write even for the server: vLLM takes a file lock inside the download dir before loading.
MODEL_MOUNT_ARGS = k8s.core.v1.VolumeMountArgs(name="models", mount_path=MODEL_MOUNT)


def resources(model: Model, shm_gi: int) -> k8s.core.v1.ResourceRequirementsArgs:
    """Guaranteed QoS: requests equal limits for CPU and memory, so under node pressure the kubelet
    evicts a GPU pod last, never before a best-effort batch pod. The memory includes /dev/shm (a
    memory-backed emptyDir is charged to the container). GPUs only as a limit (the request is
    defaulted equal): a card is shared only through a resource that says so (`gpuResource`: a time-slice,
    `nvidia.com/gpu.shared`, or a MIG instance)."""
    memory = memory_limit(model.memory, shm_gi)
    return k8s.core.v1.ResourceRequirementsArgs(
        limits={resource_name(model.gpu_resource): str(model.gpus_per_replica), "cpu": model.cpu, "memory": memory},
        requests={"cpu": model.cpu, "memory": memory},
    )


VERIFY_RESOURCES = {"cpu": "100m", "memory": "128Mi"}
VERIFY_WEIGHTS = (Path(__file__).resolve().parent / "programs" / "verify_weights.py").read_text()


def verify_weights(model: Model) -> k8s.core.v1.ContainerArgs:
    """On a node cache, before the server: the node's array holds what its weights label says (a tripwire for a
    label that outlived its data, e.g. a disk replaced under a node that kept its name; not the gate, the label is).
    One `ERROR:` line and the pod never starts, rather than a server crashing on missing files with the hub offline."""
    return k8s.core.v1.ContainerArgs(
        name="verify-weights",
        image=model.image,  # python3 is there: the download Job runs in it
        image_pull_policy="IfNotPresent",
        command=["python3", "-c", VERIFY_WEIGHTS],
        env=[
            k8s.core.v1.EnvVarArgs(name="GS_MARKER_DIR", value=MARKER_DIR),
            k8s.core.v1.EnvVarArgs(name="GS_REPOS", value=json.dumps([list(r) for r in download_repos(model)], separators=(",", ":"))),
            k8s.core.v1.EnvVarArgs(name="GS_NODE", value_from=k8s.core.v1.EnvVarSourceArgs(
                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName"))),
        ],
        # Requests equal to limits: the pod's Guaranteed QoS counts its init containers too.
        resources=k8s.core.v1.ResourceRequirementsArgs(limits=VERIFY_RESOURCES, requests=VERIFY_RESOURCES),
        volume_mounts=[k8s.core.v1.VolumeMountArgs(name="models", mount_path=MODEL_MOUNT, read_only=True)],
        security_context=container_security_context(model),
    )


def pod_spec(
    model: Model, cluster: ClusterConfig, claim_name: pulumi.Input[str], api_key: bool, cached: bool = False, worker: bool = False,
) -> k8s.core.v1.PodSpecArgs:
    """`cached`: the claim is the stack's node cache (modelStorage.type nodeCache): the pods run only on nodes that hold
    the weights, spread over them, and leave a lost node after `cluster.nodeLossEvictionSeconds`. `worker`: a group's
    member other than its leader, which serves no API, so nothing probes it (a dead worker restarts the group)."""
    shm = shm_size_gi(model.gpus_per_replica)
    scratch, scratch_mounts = scratch_volumes(model)
    serves = not worker
    return k8s.core.v1.PodSpecArgs(
        init_containers=[verify_weights(model)] if cached else None,
        containers=[
            k8s.core.v1.ContainerArgs(
                name="vllm",
                image=model.image,
                # Restarts must not depend on the registry, as they must not depend on the hub.
                image_pull_policy="IfNotPresent",
                command=SERVE_COMMAND,
                args=[*container_args(model), *group_args(model, worker)],
                ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=PORT, protocol="TCP")] if serves else None,
                env=server_env(model, api_key),
                resources=resources(model, shm),
                volume_mounts=[MODEL_MOUNT_ARGS, k8s.core.v1.VolumeMountArgs(name="dshm", mount_path="/dev/shm"), *scratch_mounts],
                startup_probe=startup_probe(model.weights_gb) if serves else None,
                readiness_probe=readiness_probe() if serves else None,
                liveness_probe=liveness_probe() if serves else None,
                lifecycle=lifecycle() if serves else None,
                security_context=container_security_context(model),
            )
        ],
        volumes=[
            model_volume(claim_name),
            k8s.core.v1.VolumeArgs(name="dshm", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium="Memory", size_limit=f"{shm}Gi")),
            *scratch,
        ],
        node_selector=node_selector(model, cluster, cached),
        tolerations=[gpu_toleration(cluster), *(node_loss_tolerations(cluster) if cached else [])],
        # A group's members each take a whole node: the GPUs spread them.
        topology_spread_constraints=spread(model) if cached and not model.spans_nodes else None,
        runtime_class_name=cluster.runtime_class_name,
        # Service links would put e.g. VLLM_PORT=tcp://… into the env for a Service named `vllm`,
        # which vLLM reads as its own setting and refuses to start.
        enable_service_links=False,
        automount_service_account_token=False,
        security_context=pod_security_context(model),
        termination_grace_period_seconds=grace_period_seconds(),
        priority_class_name=cluster.priority_class.name if cluster.priority_class else None,
    )


def scrape_annotations(cluster: ClusterConfig) -> dict[str, str] | None:
    """`prometheus.io/*` only for a Prometheus without the operator's PodMonitor: with both, an
    annotation-based scrape job and the PodMonitor each scrape the pod, every series doubles, and
    so does KEDA's `sum()` of the queue."""
    if cluster.monitoring.pod_monitor:
        return None
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"}


def deployment_spec(
    model: Model, cluster: ClusterConfig, claim_name: pulumi.Input[str], api_key: bool,
    rollout_annotations: dict[str, pulumi.Input[str]] | None = None, cached: bool = False,
) -> k8s.apps.v1.DeploymentSpecArgs:
    """`rollout_annotations` go on the pod template: a change rolls the pods (credentials.api_key_annotation)."""
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
                annotations={**(scrape_annotations(cluster) or {}), **(rollout_annotations or {})} or None,
            ),
            spec=pod_spec(model, cluster, claim_name, api_key, cached),
        ),
    )


def leader_worker_set_spec(
    model: Model, cluster: ClusterConfig, claim_name: pulumi.Input[str], api_key: bool,
    rollout_annotations: dict[str, pulumi.Input[str]] | None = None, cached: bool = False,
) -> dict[str, Any]:
    """A model spanning nodes: `replicas` groups of `nodesPerReplica` pods, a leader (the serving pod: the Service, the
    PodMonitor and the pool select it alone) and its workers, one whole node each. A group is the unit: its pods start
    together (the leader waits for every stage), a member that fails or is evicted recreates the whole group, and a
    rollout replaces one group at a time without a spare group's GPUs (as a Deployment's does)."""
    scaled = autoscaler(cluster, model) != "none"

    def template(component: str, worker: bool) -> dict[str, Any]:
        annotations = {**((scrape_annotations(cluster) or {}) if not worker else {}), **(rollout_annotations or {})}
        return {
            "metadata": k8s.meta.v1.ObjectMetaArgs(labels=labels(model, component), annotations=annotations or None),
            "spec": pod_spec(model, cluster, claim_name, api_key, cached, worker=worker),
        }

    return {
        # An autoscaler owns the group count (the LeaderWorkerSet's scale subresource), as for a Deployment.
        **({} if scaled else {"replicas": model.replicas.max}),
        # The leader waits for its workers, which need its address: all of a group's pods start at once.
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
        "leaderWorkerTemplate": {
            "size": model.nodes_per_replica,
            # One stage lost stops the whole pipeline: the group restarts as one, never half-joined.
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": template("inference-server", worker=False),
            "workerTemplate": template(WORKER_COMPONENT, worker=True),
        },
    }


LWS_WAIT = "condition=Available"
"""`pulumi.com/waitFor` of a LeaderWorkerSet: the provider awaits no custom resource by itself, and Available is what
LeaderWorkerSet sets once every group is ready (its leader passed its probes, which only happens with every stage
joined). The provider compares conditions, not generations: an update's wait may end before the controller began."""
