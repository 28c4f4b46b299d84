"""Object names, labels and the paths on the model volume that every object of a model agrees on."""

from __future__ import annotations

import hashlib
import re

from stacks.config import Model

PORT = 8000


MODEL_MOUNT = "/models"


# huggingface_hub's cache layout (models--org--name/snapshots/<commit>/...). vLLM passes
# `--download-dir` to `snapshot_download(cache_dir=...)`, so the Job and the server share it.
DOWNLOAD_DIR = f"{MODEL_MOUNT}/hub"


STATE_DIR = f"{MODEL_MOUNT}/.gpu-serving"


def object_name(model: Model) -> str:
    return f"vllm-{model.name}"


def hold_name(model: Model) -> str:
    """The ExternalName Service and InterceptorRoute of a model at `replicas.min: 0` (components/serving/hold.py): the
    name its HTTPScaledObject had. Not the ScaledObject's name: the add-on (v0.12) deleted a ScaledObject named like an
    HTTPScaledObject that skipped its own, and a stack moving from one to the other still has that HTTPScaledObject."""
    return f"{object_name(model)}-hold"


def hold_host(model: Model, namespace: str) -> str:
    """The Host the interceptor routes a held model's requests by: the hold Service's own DNS name, which the
    edge sets on what it forwards and an in-cluster client sends by calling that name."""
    return f"{hold_name(model)}.{namespace}.svc"


def instance_labels(model: Model) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": model.name}


def selector_labels(model: Model) -> dict[str, str]:
    """The serving pods only: the download Job's pods share the instance labels."""
    return {**instance_labels(model), "app.kubernetes.io/component": "inference-server"}


SERVER_LABELS = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/component": "inference-server"}
"""Every model's serving pods (its `selector_labels` without the instance), and nothing else: not the download and
smoke-test Jobs, the pickers or the holds. A group's leader (a model spanning nodes) is its serving pod."""

WORKER_COMPONENT = "inference-worker"
"""The members of a group other than its leader (a model spanning nodes): vLLM without its API (`--headless`), so no
Service, PodMonitor or pool selects them."""

MEMBERS = {"key": "app.kubernetes.io/component", "operator": "In", "values": [SERVER_LABELS["app.kubernetes.io/component"],
                                                                             WORKER_COMPONENT]}
"""A selector's expression for every pod that runs vLLM: serving pods and a group's workers."""


def members_selector(model: Model) -> dict[str, object]:
    """Every pod of the model that runs vLLM (its serving pods and, for a group, the workers), as a LabelSelector."""
    return {"matchLabels": instance_labels(model), "matchExpressions": [MEMBERS]}


LWS_API = "leaderworkerset.x-k8s.io/v1"


def workload(model: Model) -> tuple[str, str, str]:
    """(apiVersion, kind, name) of what runs the model's pods: the Deployment `vllm-<name>`, or for a model spanning
    nodes the LeaderWorkerSet `vllm-<name>-group`. Not the Service's name: LeaderWorkerSet makes a headless Service of
    its own name for its pods' DNS names (the leader's address), and skips it when a Service of that name exists, so
    the workers would never resolve their leader."""
    if model.spans_nodes:
        return LWS_API, "LeaderWorkerSet", f"{object_name(model)}-group"
    return "apps/v1", "Deployment", object_name(model)


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


def download_job_name(model: Model) -> str:
    """Named after what it downloads (the model and its adapters): a new (id, revision) is a new Job, which Pulumi creates and
    awaits. Jobs are immutable, so re-running a failed one is `pulumi up --replace <its URN>`."""
    return f"{object_name(model)}-dl-{download_digest(model)}"


def download_digest(model: Model) -> str:
    """Eight hex digits naming what a model downloads (its repository and revision, and its adapters')."""
    fetched = f"{model.hugging_face_id}@{model.revision}"
    if model.lora:  # a model alone keeps the name it always had
        fetched += "".join(f" {a.hugging_face_id}@{a.revision}" for a in model.lora.adapters)
    return hashlib.sha256(fetched.encode()).hexdigest()[:8]


def node_download_job_name(model: Model, node: str) -> str:
    """The download Job of a model onto one cache node: a node name may be 253 characters, so a digest of it.
    At most 63 characters: `vllm-` + a 40-character model name + `-dl-` + 8 + `-` + 5."""
    return f"{download_job_name(model)}-{hashlib.sha256(node.encode()).hexdigest()[:5]}"


WEIGHTS_VERIFIED = "verified"


def weights_label(model: Model, namespace: str) -> str:
    """The node label (value `verified`) that says a cache node holds this revision of the model's weights: set by
    Pulumi after the node's download Job completed, required by the model's pods. Keyed by what was downloaded,
    so a new revision is a new label, set on every node that holds it before the pods roll, and the old one
    stays on the nodes until the `pulumi up` ends (an old pod rescheduled meanwhile still finds its copy).
    `kubectl get nodes -l <key>` lists the nodes that hold it."""
    return f"{model.name}.{namespace}.weights.gpu-serving.io/{download_digest(model)}"


MARKER_DIR = f"{STATE_DIR}/downloads"
"""One `<org>--<name>@<commit>.done` per complete download, keyed by the commit the revision resolved to."""


def secret_name(model: Model) -> str:
    return f"{object_name(model)}-secrets"
