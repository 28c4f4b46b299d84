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
    """The ExternalName Service and HTTPScaledObject of a model at `replicas.min: 0` (components/serving/hold.py).
    Not the ScaledObject's name: the HTTP add-on deletes a ScaledObject named like an HTTPScaledObject that skips its own."""
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
    fetched = f"{model.hugging_face_id}@{model.revision}"
    if model.lora:  # a model alone keeps the name it always had
        fetched += "".join(f" {a.hugging_face_id}@{a.revision}" for a in model.lora.adapters)
    digest = hashlib.sha256(fetched.encode()).hexdigest()[:8]
    return f"{object_name(model)}-dl-{digest}"


MARKER_DIR = f"{STATE_DIR}/downloads"
"""One `<org>--<name>@<commit>.done` per complete download, keyed by the commit the revision resolved to."""


def secret_name(model: Model) -> str:
    return f"{object_name(model)}-secrets"
