"""LoRA adapters against their base model: an adapter is a PEFT repository on top of a base, not a model, and
vLLM's LoRA flags do something only on a model that serves adapters (`lora`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacks.config.base import _at
from stacks.config.models import flag_name

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig

# vLLM's LoRAConfig argument group (vllm/engine/arg_utils.py, v0.11 and later releases) less the flags the bundle
# owns: without --enable-lora vLLM builds no LoRAConfig, so each is accepted and silently does nothing.
LORA_FLAGS = frozenset({
    "--max-cpu-loras", "--lora-dtype", "--fully-sharded-loras", "--lora-extra-vocab-size", "--enable-lora-bias",
    "--long-lora-scaling-factors", "--default-mm-loras", "--lora-target-modules", "--specialize-active-lora",
    "--enable-tower-connector-lora", "--enable-mixed-moe-lora-format", "--enable-moe-shared-loras",
})


def _flag_values(args: list[str]) -> list[tuple[int, str, str | None]]:
    """(index, flag, value) for each flag of `extraArgs`, in the forms vLLM's parser takes (`--f=v`, `--f v`)."""
    found = []
    for k, arg in enumerate(args):
        flag = flag_name(arg)
        if flag is None:
            continue
        value = arg.split("=", 1)[1] if "=" in arg else args[k + 1] if k + 1 < len(args) and flag_name(args[k + 1]) is None else None
        found.append((k, flag, value))
    return found


def check_adapters(stack: StackConfig, i: int) -> None:
    model = stack.models[i]
    flags = _flag_values(model.extra_args)
    if model.lora is None:
        for k, flag, _ in flags:
            if flag in LORA_FLAGS:
                raise _at(f"models[{i}].extraArgs[{k}]", f"{flag} is a LoRA flag, but the model serves no adapters (lora is "
                          "unset), so vLLM never reads it: add lora.adapters, or remove it")
        return
    bases = {m.hugging_face_id: f"models[{n}]" for n, m in enumerate(stack.models)}
    for j, adapter in enumerate(model.lora.adapters):
        path = f"models[{i}].lora.adapters[{j}]"
        if adapter.hugging_face_id in bases:
            # vLLM loads an adapter from adapter_config.json beside its weights; a model repository has neither.
            raise _at(f"{path}.huggingFaceId", f"{adapter.hugging_face_id} is a model ({bases[adapter.hugging_face_id]}."
                      "huggingFaceId), not a LoRA adapter: vLLM would find no adapter_config.json and fail at start; "
                      "list the adapter's own repository, or serve the model as a model of its own")
        if adapter.weights_gb >= model.weights_gb:
            # A LoRA adapter stores two rank-r matrices per adapted layer, a small part of the base.
            raise _at(f"{path}.weightsGb", f"{adapter.weights_gb:g} GB, as large as its base ({model.weights_gb:g} GB): a LoRA "
                      "adapter holds low-rank matrices beside the base's weights, so this is a full or merged fine-tune, "
                      "which vLLM cannot load as an adapter; serve it as a model, or give the adapter's real size")
    for k, flag, value in flags:
        if flag == "--max-cpu-loras" and value is not None and value.isdigit() and int(value) < model.lora.max_loras:
            # vLLM's LoRAConfig: "max_cpu_loras (N) must be >= max_loras (M)", at start.
            raise _at(f"models[{i}].extraArgs[{k}]", f"--max-cpu-loras {value} is below lora.maxLoras ({model.lora.max_loras}): "
                      "vLLM refuses to start (the CPU cache must hold every adapter a batch uses); raise it or lower maxLoras")
