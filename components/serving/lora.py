"""LoRA adapters: what the download Job fetches, where it lands, and the server flags that load it."""

from __future__ import annotations

from components.serving.names import DOWNLOAD_DIR
from stacks.config import Model
from stacks.config.models import LoraAdapter

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def adapter_path(adapter: LoraAdapter) -> str:
    """The snapshot folder the download Job writes for the adapter's pinned commit, in huggingface_hub's
    cache layout (`models--<org>--<name>/snapshots/<commit>`): vLLM reads a local folder, never the hub."""
    return f"{DOWNLOAD_DIR}/models--{adapter.hugging_face_id.replace('/', '--')}/snapshots/{adapter.revision}"


def adapters(model: Model) -> list[LoraAdapter]:
    return list(model.lora.adapters) if model.lora else []


def lora_args(model: Model) -> list[str]:
    """`vllm serve` flags for the adapters, in the `name=path` form every vLLM release reads (the JSON
    form, which adds `base_model_name`, came later); none without `lora`."""
    if model.lora is None:
        return []
    return [
        "--enable-lora",
        "--lora-modules", *(f"{a.name}={adapter_path(a)}" for a in model.lora.adapters),
        f"--max-loras={model.lora.max_loras}",
        f"--max-lora-rank={model.lora.max_lora_rank}",
    ]


def lora_env(model: Model) -> dict[str, str]:
    """Runtime loading only when asked for: its endpoints sit under /v1 behind the inference key, and
    what it loads is gone after a restart (the listed adapters come back from the volume)."""
    return {RUNTIME_UPDATES_ENV: "True"} if model.lora and model.lora.runtime_updates else {}


def download_repos(model: Model) -> list[tuple[str, str]]:
    """(repository, revision) the download Job fetches: the adapters first, then the model, whose
    marker the Job's re-run checks last."""
    return [*((a.hugging_face_id, a.revision) for a in adapters(model)), (model.hugging_face_id, model.revision)]


def served_names(model: Model) -> list[str]:
    """What `/v1/models` lists for the server: the model, then each adapter."""
    return [model.name, *(a.name for a in adapters(model))]
