"""The post-deploy smoke test: its script run for real against a fake vLLM on loopback, and its Job."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from components.serving.jobs import HEALTH_WAIT_S, REQUEST_TIMEOUT_S, SMOKE_DEADLINE_S, SMOKE_SCRIPT, smoke_job_name
from stacks.config import Model
from tools.render import ROOT, Render

API_KEY = "sk-smoke-canary-91c2"


class FakeVllm(BaseHTTPRequestHandler):
    """Answers like vLLM's OpenAI server; `behaviour` picks the failure to simulate."""

    behaviour = "healthy"
    require_key = False

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict | None = None) -> None:
        data = json.dumps(body or {}, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        return not self.require_key or self.headers.get("Authorization") == f"Bearer {API_KEY}"

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200)
        elif self.path == "/v1/models" and self._authorised():
            served = "other-model" if self.behaviour == "wrong-model" else "qwen3"
            self._send(200, {"object": "list", "data": [{"id": served, "object": "model"}]})
        else:
            self._send(401 if self.path == "/v1/models" else 404, {"error": "nope"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        request = json.loads(self.rfile.read(length))
        if not self._authorised():
            self._send(401, {"error": "unauthorised"})
        elif self.behaviour == "inference-broken":
            self._send(500, {"error": "CUDA error: an illegal memory access was encountered"})
        else:
            assert request == {"model": "qwen3", "prompt": "Hello", "max_tokens": 1}
            self._send(200, {"id": "cmpl-1", "choices": [{"index": 0, "text": " world"}]})


@pytest.fixture
def server() -> Iterator[tuple[str, type[FakeVllm]]]:
    handler = type("Handler", (FakeVllm,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", handler
    httpd.shutdown()
    httpd.server_close()


def run_smoke(base: str, api_key: str | None = None, health_wait_s: int = HEALTH_WAIT_S) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "BASE": base, "MODEL": "qwen3",
           "HEALTH_WAIT_S": str(health_wait_s), "REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return subprocess.run(["sh", "-c", SMOKE_SCRIPT], env=env, capture_output=True, text=True, timeout=60)


def test_a_serving_model_passes(server: tuple[str, type[FakeVllm]]) -> None:
    result = run_smoke(server[0])
    assert result.returncode == 0, result.stderr
    assert "served: qwen3" in result.stdout
    assert '"text":" world"' in result.stdout


def test_health_green_but_inference_broken_fails(server: tuple[str, type[FakeVllm]]) -> None:
    base, handler = server
    handler.behaviour = "inference-broken"
    result = run_smoke(base)
    assert result.returncode != 0
    assert "500" in result.stderr


def test_a_model_not_served_under_its_name_fails(server: tuple[str, type[FakeVllm]]) -> None:
    base, handler = server
    handler.behaviour = "wrong-model"
    result = run_smoke(base)
    assert result.returncode == 1
    assert "/v1/models does not list qwen3" in result.stderr


def test_api_key_is_sent_and_never_printed(server: tuple[str, type[FakeVllm]]) -> None:
    base, handler = server
    handler.require_key = True
    assert run_smoke(base).returncode != 0
    result = run_smoke(base, API_KEY)
    assert result.returncode == 0, result.stderr
    assert API_KEY not in result.stdout + result.stderr


def test_health_wait_is_bounded_by_the_clock_and_says_so() -> None:
    # Issue 24: the loop counted tries (60 × up to 15 s ≈ 15 min) while its message said 5 minutes.
    # Nothing listens on port 9 of loopback: every health check fails at once.
    result = run_smoke("http://127.0.0.1:9", health_wait_s=2)
    assert result.returncode == 1
    assert "/health did not answer within 2s" in result.stderr


def test_job_deadline_covers_the_whole_script() -> None:
    # The health wait plus /v1/models and one completion, each up to REQUEST_TIMEOUT_S: the Job's
    # deadline must not end the script before it can say what failed.
    assert "--max-time \"$REQUEST_TIMEOUT_S\"" in SMOKE_SCRIPT and SMOKE_SCRIPT.count('curl "$@"') == 2
    assert SMOKE_DEADLINE_S > HEALTH_WAIT_S + 2 * REQUEST_TIMEOUT_S


def test_script_is_shellcheck_clean(tmp_path: Path) -> None:
    script = tmp_path / "smoke.sh"
    script.write_text("#!/bin/sh\n" + SMOKE_SCRIPT)
    result = subprocess.run([str(ROOT / "venv/bin/shellcheck"), "-s", "sh", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def smoke_jobs(render: Render) -> list:
    return [r for r in render.of_type("kubernetes:batch/v1:Job") if "smoke" in r.inputs["metadata"]["name"]]


def test_prod_has_a_smoke_job_after_the_rollout(prod: Render) -> None:
    (job,) = smoke_jobs(prod)
    deployment = next(r for r in prod.of_type("kubernetes:apps/v1:Deployment"))
    assert deployment.urn in job.options["dependsOn"]
    assert job.options.get("deleteBeforeReplace") is True
    pod = job.inputs["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert "nodeSelector" not in pod
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env == {"BASE": "http://vllm-qwen3.ai.svc:8000", "MODEL": "qwen3", "VLLM_API_KEY": None,  # prod has a key
                   "HEALTH_WAIT_S": str(HEALTH_WAIT_S), "REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}
    assert job.inputs["spec"]["activeDeadlineSeconds"] == SMOKE_DEADLINE_S


def test_smoke_job_prefers_nodes_without_gpus_and_may_use_a_gpu_node(prod: Render, render) -> None:  # type: ignore[no-untyped-def]
    # Found on the real node (issue 22): with GPU nodes as the only schedulable nodes, a smoke Job that
    # tolerated no GPU taint stayed Pending until its deadline, and `pulumi up` failed.
    import yaml

    pod = smoke_jobs(prod)[0].inputs["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    (preferred,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"] == [{"key": "gpu-serving/gpu.product", "operator": "DoesNotExist"}]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["nodeAffinity"]
    cluster = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]
    custom = cluster | {"gpuTaint": {"key": "gpu", "effect": "NoExecute"}, "gpuProductLabel": "example.com/gpu"}
    pod = smoke_jobs(render(cluster=custom))[0].inputs["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoExecute"}]
    (preferred,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"][0]["key"] == "example.com/gpu"


def test_smoke_image_is_pinned_by_digest_and_configurable(prod: Render, render) -> None:  # type: ignore[no-untyped-def]
    # Issue 24: a public image by tag; an air-gapped cluster needs its own registry.
    (job,) = smoke_jobs(prod)
    image = job.inputs["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("curlimages/curl:") and "@sha256:" in image
    import yaml

    cluster = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]
    mirror = "registry.lan:5000/mirror/curl@sha256:" + "ab" * 32
    (job,) = smoke_jobs(render(cluster=cluster | {"smokeImage": mirror}))
    assert job.inputs["spec"]["template"]["spec"]["containers"][0]["image"] == mirror


def test_smoke_job_is_renamed_when_what_serves_changes() -> None:
    model = Model.model_validate({"name": "qwen3", "huggingFaceId": "Qwen/Qwen3-8B-AWQ", "gpuProduct": "a100", "weightsGb": 6})
    newer = model.model_copy(update={"image": "vllm/vllm-openai:v0.12.0"})
    assert smoke_job_name(model) != smoke_job_name(newer)
    assert smoke_job_name(model) == smoke_job_name(model.model_copy())
    assert len(smoke_job_name(model.model_copy(update={"name": "m" * 40}))) <= 63


def test_smoke_test_can_be_turned_off(render) -> None:  # type: ignore[no-untyped-def]
    import yaml

    models = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:models"]
    models[0]["smokeTest"] = False
    assert smoke_jobs(render(models=models)) == []
