"""LoRA rules over plain YAML: adapters come from the model volume, and a server behind the edge
never loads adapters at runtime (issue #26 item 3). Each starts from the good manifests and
mutates one thing."""

from __future__ import annotations

from typing import Any

import pytest
from policy_factory import check, container, good, pod_spec

from policy.rules.servers import lora_modules

ADAPTER = "/models/hub/models--acme--qwen3-8b-sql-lora/snapshots/" + "1" * 40


def with_adapters(*values: str) -> dict[str, Any]:
    d = good("Deployment")
    container(d)["args"] += ["--enable-lora", "--lora-modules", *values, "--max-loras=1"]
    return d


def found(policy: str, *objects: dict[str, Any]) -> list[str]:
    return [v.message for v in check(*objects) if v.policy == policy and v.level == "mandatory"]


def test_adapters_on_the_model_volume_pass() -> None:
    assert found("vllm-lora-modules-on-volume", with_adapters(f"sql={ADAPTER}")) == []
    assert found("vllm-lora-modules-on-volume", with_adapters(f'{{"name": "sql", "path": "{ADAPTER}", "base_model_name": "q"}}')) == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("sql=acme/qwen3-8b-sql-lora", "is not a path: vLLM fetches it from the Hugging Face hub"),
        ("sql=/adapters/sql", "is not on a mounted volume"),
        ("sql=/dev/shm/sql", "is on volume 'shm', which is not the model volume"),
        ('{"name": "sql", "path": "/tmp/sql"}', "is not on a mounted volume"),
    ],
)
def test_adapters_off_the_model_volume_are_refused(value: str, says: str) -> None:
    (message,) = found("vllm-lora-modules-on-volume", with_adapters(f"ok={ADAPTER}", value))
    assert message.startswith("container 'vllm': LoRA adapter 'sql'") and says in message, message


def test_the_flag_reads_every_form() -> None:
    tokens = ["vllm", "serve", "m", "--lora-modules", "a=/x", "b=/y", "--max-loras=2", "--lora-modules=c=/z"]
    assert lora_modules(tokens) == [("a", "/x"), ("b", "/y"), ("c", "/z")]


def runtime(value: str, d: dict[str, Any] | None = None) -> dict[str, Any]:
    d = d or good("Deployment")
    container(d)["env"].append({"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": value})
    return d


def test_runtime_loading_behind_the_edge_is_refused() -> None:
    stack = [good("Service"), good("Ingress")]
    assert found("edge-vllm-no-runtime-lora", good("Deployment"), *stack) == []
    (message,) = found("edge-vllm-no-runtime-lora", runtime("True"), *stack)
    assert "exposes Deployment/vllm-qwen3, which load LoRA adapters at runtime" in message
    assert found("edge-vllm-no-runtime-lora", runtime("1"), *stack)
    assert found("edge-vllm-no-runtime-lora", runtime("false"), *stack) == []


def test_runtime_loading_inside_the_cluster_only_is_allowed() -> None:
    assert found("edge-vllm-no-runtime-lora", runtime("True"), good("Service")) == []


def test_the_download_job_is_no_server_and_not_judged() -> None:
    job = good("Job")
    pod_spec(job)["containers"][0].setdefault("args", []).extend(["--lora-modules", "sql=/nowhere"])
    assert found("vllm-lora-modules-on-volume", job) == []
