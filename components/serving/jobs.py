"""The run-once Jobs around the server: the pre-download Job and the post-rollout smoke test."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.serving.hold import held_base_url
from components.serving.lora import adapters, download_repos, served_names
from components.serving.names import DOWNLOAD_DIR, MARKER_DIR, PORT, STATE_DIR, labels, object_name, secret_name
from components.serving.profile import NON_ROOT_UID, identity_env, non_root, pod_security_context
from components.serving.server import (
    MODEL_MOUNT_ARGS,
    container_args,
    gpu_toleration,
    model_volume,
    secret_env,
    token_env,
)
from stacks.config import ClusterConfig, Model
from stacks.config.budgets import download_deadline_seconds
from stacks.config.cluster import RequestHold

JOB_TTL_S = 7 * 24 * 3600


HEALTH_WAIT_S = 300
"""How long the smoke test waits for `/health` (the Deployment is Ready before the Job starts)."""


REQUEST_TIMEOUT_S = 300
"""Each of the smoke test's two API calls: a slow first request on a cold engine."""


SMOKE_DEADLINE_S = HEALTH_WAIT_S + 3 * REQUEST_TIMEOUT_S + 60
"""The Job's activeDeadlineSeconds: the health wait, /v1/models and one completion at their longest,
plus one more request timeout and a minute for pulling the image and starting the pod, so the
deadline never cuts the script off before it can say what failed."""


def wake_timeout_seconds(model: Model) -> int:
    """The first request to a held model: the cold start, then the answer."""
    return model.cold_start_seconds + REQUEST_TIMEOUT_S


def smoke_deadline_seconds(model: Model) -> int:
    """SMOKE_DEADLINE_S, with the waking request in place of the health wait and /v1/models for a held model."""
    if not model.scales_to_zero:
        return SMOKE_DEADLINE_S
    return wake_timeout_seconds(model) + 2 * REQUEST_TIMEOUT_S + 60


PROGRAMS = Path(__file__).resolve().parent / "programs"
"""The programs the Jobs run, kept as files so the linters read them; sent as their text."""

PART_LINE = re.compile(r"^#: ([a-z]+)\b.*\n", re.MULTILINE)


def program_parts(text: str) -> dict[str, str]:
    """A program cut at its `#: <part>` lines, by part name; the lines before the first one and the
    `#:` lines themselves are not part of any."""
    marks = list(PART_LINE.finditer(text))
    return {mark.group(1): text[mark.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
            for i, mark in enumerate(marks)}


SMOKE_PARTS = program_parts((PROGRAMS / "smoke.sh").read_text())


def smoke_parts(held: bool, with_adapters: bool) -> str:
    """The smoke test a model gets: through the hold for a model at `replicas.min: 0`, each adapter listed when it has some."""
    names = ["curl", "wake" if held else "health", "listed", *(["adapters"] if with_adapters else []), "completion"]
    return "".join(SMOKE_PARTS[name] for name in names)


SMOKE_SCRIPT = smoke_parts(held=False, with_adapters=False)
"""The smoke test of a model that is always up and has no adapters."""


def smoke_script(model: Model) -> str:
    return smoke_parts(model.scales_to_zero, bool(adapters(model)))


EXIT_AUTH = 10
"""The download script's exit code when the hub refuses the token (401/403, a gated repository)."""


EXIT_NOT_FOUND = 11
"""The download script's exit code when the repository or revision does not exist."""


# Runs inside the vLLM image (it ships huggingface_hub). Values arrive as env vars, never
# spliced into the code. The marker is keyed by the resolved commit and written only after a
# complete download, so an interrupted run is resumed rather than mistaken for done, a finished
# one costs seconds, and a branch that moved is downloaded again. Errors that no retry heals exit
# with their own codes, which the Job's podFailurePolicy turns into an immediate failure.
DOWNLOAD_SCRIPT = (PROGRAMS / "download.py").read_text()
if not DOWNLOAD_SCRIPT.startswith(f"EXIT_AUTH, EXIT_NOT_FOUND = {EXIT_AUTH}, {EXIT_NOT_FOUND}\n"):
    raise ValueError(f"programs/download.py must start by setting EXIT_AUTH, EXIT_NOT_FOUND = {EXIT_AUTH}, {EXIT_NOT_FOUND}")


# With adapters, the one-repository program above runs once per repository (the adapters, then the
# model), each with its own marker, resume and exit codes; the first failure stops the Job with its code.
EACH_REPO_SCRIPT = (PROGRAMS / "each_repo.py").read_text()


def download_command(model: Model) -> tuple[list[str], list[k8s.core.v1.EnvVarArgs]]:
    """The download container's command and the env it adds: the one-repository script as it is
    for a model alone, looped over the adapters and the model otherwise."""
    if not adapters(model):
        return ["python3", "-c", DOWNLOAD_SCRIPT], []
    repos = json.dumps([list(repo) for repo in download_repos(model)], separators=(",", ":"))
    return ["python3", "-c", EACH_REPO_SCRIPT, DOWNLOAD_SCRIPT], [k8s.core.v1.EnvVarArgs(name="GS_REPOS", value=repos)]


def smoke_job_name(model: Model) -> str:
    """A new name whenever what serves changes (image, args, env), so each rollout is tested once."""
    served = "\n".join([model.image, *container_args(model), *(f"{k}={v}" for k, v in sorted(model.env.items()))])
    return f"{object_name(model)}-smoke-{hashlib.sha256(served.encode()).hexdigest()[:8]}"


def run_once_job(
    model: Model, component: str, *, backoff: int, deadline_s: int, container: k8s.core.v1.ContainerArgs,
    as_server: bool = False, pod_failure_policy: k8s.batch.v1.PodFailurePolicyArgs | None = None,
    annotations: dict[str, pulumi.Input[str]] | None = None, **pod: Any,
) -> k8s.batch.v1.JobSpecArgs:
    """A Job that runs one container to completion, with the pod hardening every Job here shares.
    Finished Jobs keep their logs a week; once one is gone, `pulumi refresh` + `up` re-creates it."""
    return k8s.batch.v1.JobSpecArgs(
        backoff_limit=backoff,
        pod_failure_policy=pod_failure_policy,
        active_deadline_seconds=deadline_s,
        ttl_seconds_after_finished=JOB_TTL_S,
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels(model, component), annotations=annotations or None),
            spec=k8s.core.v1.PodSpecArgs(
                restart_policy="Never",
                containers=[container],
                enable_service_links=False,
                automount_service_account_token=False,
                # The download Job writes what the server then locks and reads: the same user.
                security_context=pod_security_context(model if as_server else None),
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


def download_failure_policy() -> k8s.batch.v1.PodFailurePolicyArgs:
    """Fail the Job at once on a refused token or a missing repository (no retry heals those; the
    backoff would only delay the error by minutes), and never count a pod lost to a node drain or
    preemption against the retries."""
    return k8s.batch.v1.PodFailurePolicyArgs(rules=[
        k8s.batch.v1.PodFailurePolicyRuleArgs(
            action="FailJob",
            on_exit_codes=k8s.batch.v1.PodFailurePolicyOnExitCodesRequirementArgs(
                container_name="download", operator="In", values=[EXIT_AUTH, EXIT_NOT_FOUND]
            ),
        ),
        k8s.batch.v1.PodFailurePolicyRuleArgs(
            action="Ignore",
            on_pod_conditions=[k8s.batch.v1.PodFailurePolicyOnPodConditionsPatternArgs(type="DisruptionTarget", status="True")],
        ),
    ])


def job_spec(
    model: Model, cluster: ClusterConfig, claim_name: pulumi.Input[str], storage_is_local: bool, node: str | None = None,
) -> k8s.batch.v1.JobSpecArgs:
    """The download Job. The marker file makes a re-run of a finished download a no-op. With `node`, the download
    onto that cache node's array: pinned by its hostname label through the scheduler, not `nodeName`, which
    bypasses it and which the Node authorizer then refuses the claim (KServe's cache met it: kserve#5502)."""
    command, repos_env = download_command(model)
    download = k8s.core.v1.ContainerArgs(
        name="download",
        image=model.image,  # ships huggingface_hub, and warms the image cache on the node
        image_pull_policy="IfNotPresent",
        command=command,
        env=[
            *token_env(model),
            k8s.core.v1.EnvVarArgs(name="HF_HUB_CACHE", value=DOWNLOAD_DIR),
            # Token and xet chunk caches on the volume, not on the node's small root disk.
            k8s.core.v1.EnvVarArgs(name="HF_HOME", value=f"{STATE_DIR}/hf-home"),
            k8s.core.v1.EnvVarArgs(name="GS_REPO", value=model.hugging_face_id),
            k8s.core.v1.EnvVarArgs(name="GS_REVISION", value=model.revision),
            k8s.core.v1.EnvVarArgs(name="GS_MARKER_DIR", value=MARKER_DIR),
            *repos_env,
            *(k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in (identity_env("/tmp") if non_root(model) else {}).items()),
        ],
        resources=k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "4Gi"}),
        volume_mounts=[MODEL_MOUNT_ARGS, k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp")],
        # The downloader writes only to the volume (HF_HOME and the cache are there).
        security_context=read_only_security_context(
            **({"run_as_non_root": True, "run_as_user": NON_ROOT_UID, "run_as_group": NON_ROOT_UID} if non_root(model) else {})
        ),
    )
    return run_once_job(
        model,
        "model-download",
        backoff=3,
        deadline_s=download_deadline_seconds(model.disk_gb),
        container=download,
        as_server=True,
        pod_failure_policy=download_failure_policy(),
        volumes=[
            model_volume(claim_name),
            k8s.core.v1.VolumeArgs(name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="1Gi")),
        ],
        # No GPU. Node-local storage: the PV's node affinity already picks the storage
        # node, which is a GPU node, so only its taint needs tolerating.
        tolerations=[gpu_toleration(cluster)] if storage_is_local else None,
        node_selector={"kubernetes.io/hostname": node} if node is not None else None,
    )


def prefer_nodes_without_gpus(cluster: ClusterConfig) -> k8s.core.v1.AffinityArgs:
    return k8s.core.v1.AffinityArgs(node_affinity=k8s.core.v1.NodeAffinityArgs(
        preferred_during_scheduling_ignored_during_execution=[k8s.core.v1.PreferredSchedulingTermArgs(
            weight=100,
            preference=k8s.core.v1.NodeSelectorTermArgs(match_expressions=[
                k8s.core.v1.NodeSelectorRequirementArgs(key=cluster.gpu_product_label, operator="DoesNotExist"),
            ]),
        )],
    ))


def smoke_job_spec(
    model: Model, namespace: str, api_key: bool, cluster: ClusterConfig, rollout_annotations: dict[str, pulumi.Input[str]] | None = None,
    hold: RequestHold | None = None,
) -> k8s.batch.v1.JobSpecArgs:
    """Runs against the Service, as a client would, with no GPU: on a node without GPUs when there is
    one, else on a GPU node, whose taint it tolerates. A cluster whose only schedulable nodes are GPU
    nodes (a small on-premises one) would otherwise leave it Pending until `pulumi up` fails; it
    takes 10m of CPU for seconds, which the taint is not there to keep out.
    With the servers' `rollout_annotations` a new API key replaces the Job, so it tests the new key.
    A model at `replicas.min: 0` is asked through the hold, as its clients ask it: at zero the Job
    wakes it, so each rollout proves the hold, the wake and the load."""
    if model.scales_to_zero:
        assert hold is not None
        base, wait = held_base_url(model, namespace, hold), ("WAKE_TIMEOUT_S", wake_timeout_seconds(model))
    else:
        base, wait = f"http://{object_name(model)}.{namespace}.svc:{PORT}", ("HEALTH_WAIT_S", HEALTH_WAIT_S)
    env = [
        k8s.core.v1.EnvVarArgs(name="BASE", value=base),
        k8s.core.v1.EnvVarArgs(name="MODEL", value=model.name),
        *([k8s.core.v1.EnvVarArgs(name="ADAPTERS", value=" ".join(served_names(model)[1:]))] if adapters(model) else []),
        k8s.core.v1.EnvVarArgs(name=wait[0], value=str(wait[1])),
        k8s.core.v1.EnvVarArgs(name="REQUEST_TIMEOUT_S", value=str(REQUEST_TIMEOUT_S)),
    ]
    if api_key:
        env.append(secret_env("VLLM_API_KEY", secret_name(model), "api-key"))
    smoke = k8s.core.v1.ContainerArgs(
        name="smoke-test",
        image=cluster.smoke_image,
        image_pull_policy="IfNotPresent",
        command=["/bin/sh", "-c", smoke_script(model)],
        env=env,
        resources=k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "10m", "memory": "16Mi"}, limits={"cpu": "200m", "memory": "64Mi"}),
        security_context=read_only_security_context(run_as_non_root=True, run_as_user=100),
    )
    return run_once_job(
        model, "smoke-test", backoff=2, deadline_s=smoke_deadline_seconds(model), container=smoke, annotations=rollout_annotations,
        tolerations=[gpu_toleration(cluster)], affinity=prefer_nodes_without_gpus(cluster),
    )
