"""The stand-ins for the Hugging Face hub and vLLM (testbed/standins/), driven as the real node will:
the download Job's own script and env against the hub stand-in with the real `huggingface_hub`
client, then the vLLM stand-in with the Deployment's own arguments and env on what it wrote."""

from __future__ import annotations

import ast
import hashlib
import http.client
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from components.serving.jobs import DOWNLOAD_SCRIPT, EXIT_AUTH, EXIT_NOT_FOUND, SMOKE_SCRIPT
from components.serving.names import MODEL_MOUNT
from testbed.standins import hub as hub_module
from testbed.standins import vllm_sim
from testbed.standins.hub import Hub, Repo
from tools.render import Render

pytest.importorskip("huggingface_hub", reason="requirements-dev.txt pins the client the download Job runs")

SIM = Path(vllm_sim.__file__)
HF_TOKEN = "hf_standin_canary_7d1e"
API_KEY = "sk-standin-canary-42aa"
FILES = {
    "config.json": b'{"architectures": ["Qwen3ForCausalLM"], "stand_in": true}\n',
    "model.safetensors": hashlib.sha256(b"weights").digest() * 200,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}\n',
    "original/consolidated.pth": b"the Job skips original/*, as vLLM does",
}
LOADED = sorted(f for f in FILES if not f.startswith("original/"))


def deployment_container(prod: Render) -> dict[str, Any]:
    (deployment,) = prod.of_type("kubernetes:apps/v1:Deployment")
    return deployment.inputs["spec"]["template"]["spec"]["containers"][0]


def download_container(prod: Render) -> dict[str, Any]:
    (job,) = [j for j in prod.of_type("kubernetes:batch/v1:Job") if "-dl-" in j.inputs["metadata"]["name"]]
    return job.inputs["spec"]["template"]["spec"]["containers"][0]


def container_env(container: dict[str, Any], volume: Path, secrets: dict[str, str | None]) -> dict[str, str]:
    """The container's env on this machine: the model volume at `volume`, each secret key's value
    from `secrets` (None: the Secret lacks the key, so the variable is not set)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(volume.parent / "home")}
    for var in container["env"]:
        if "valueFrom" in var:
            value = secrets[var["valueFrom"]["secretKeyRef"]["key"]]
            if value is not None:
                env[var["name"]] = value
        else:
            env[var["name"]] = var["value"].replace(MODEL_MOUNT, str(volume))
    return env


def prod_repo(prod: Render) -> Repo:
    """The prod model's repository at its pinned commit, gated, with tiny files."""
    env = {v["name"]: v.get("value") for v in download_container(prod)["env"]}
    return Repo(env["GS_REPO"], FILES, env["GS_REVISION"], access="gated", token=HF_TOKEN)


@pytest.fixture
def repo(prod: Render) -> Repo:
    return prod_repo(prod)


def download(prod: Render, hub: Hub, volume: Path, token: str | None = HF_TOKEN, **env: str) -> subprocess.CompletedProcess[str]:
    """The Job's script and env, as the Job's container runs them, against the stand-in hub."""
    container = download_container(prod)
    assert container["command"][:2] == ["python3", "-c"] and container["command"][2] == DOWNLOAD_SCRIPT
    run_env = {**container_env(container, volume, {"hf-token": token}), "HF_ENDPOINT": hub.url, **env}
    return subprocess.run([sys.executable, "-c", DOWNLOAD_SCRIPT], env=run_env, capture_output=True, text=True, timeout=60)


def expected_digest(files: dict[str, bytes]) -> str:
    """What the stand-in's docstring promises: sha256 of `sha256sum` lines sorted by path."""
    lines = "".join(f"{hashlib.sha256(files[f]).hexdigest()}  {f}\n" for f in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


# ---- the vLLM stand-in as a process -------------------------------------------------------------


@dataclass
class Sim:
    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    log: list[str] = field(default_factory=list)
    port: int = 0

    def wait_for(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log:
                if match := re.search(pattern, line):
                    return match
            try:
                self.log.append(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"no log line matching {pattern!r} in {timeout}s: {self.log}") from None

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, key: str | None = API_KEY) -> tuple[int, bytes]:
        conn = self.connection()
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, data


def server_argv(prod: Render, volume: Path, *extra: str) -> list[str]:
    """The Deployment's args for the vLLM container, on loopback and a free port."""
    args = [a.replace(MODEL_MOUNT, str(volume)) for a in deployment_container(prod)["args"]]
    args = [{"--host=0.0.0.0": "--host=127.0.0.1", "--port=8000": "--port=0"}.get(a, a) for a in args]
    return [sys.executable, str(SIM), *args, *extra]


@pytest.fixture
def start_sim(prod: Render) -> Iterator[Any]:
    started: list[Sim] = []

    def start(volume: Path, *extra: str, env: dict[str, str] | None = None, wait: bool = True) -> Sim:
        run_env = env if env is not None else container_env(deployment_container(prod), volume, {"api-key": API_KEY})
        process = subprocess.Popen(server_argv(prod, volume, *extra), env=run_env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        sim = Sim(process)
        started.append(sim)
        threading.Thread(target=lambda: [sim.lines.put(line.rstrip("\n")) for line in process.stdout or []], daemon=True).start()
        if wait:
            sim.port = int(sim.wait_for(r"serving .* on http://127\.0\.0\.1:(\d+)")[1])
        return sim

    yield start
    for sim in started:
        if sim.process.poll() is None:
            sim.process.kill()
        sim.process.wait(10)


@pytest.fixture(scope="module")
def downloaded_once(prod: Render, tmp_path_factory: pytest.TempPathFactory) -> Path:
    volume = tmp_path_factory.mktemp("downloaded") / "models"
    with Hub([prod_repo(prod)]) as hub:
        result = download(prod, hub, volume)
    assert result.returncode == 0, result.stderr
    return volume


@pytest.fixture
def downloaded(downloaded_once: Path, tmp_path: Path) -> Path:
    """The model volume after the download Job ran against the stand-in hub (one download, a copy each)."""
    return Path(shutil.copytree(downloaded_once, tmp_path / "models", symlinks=True))


def sse_events(response: http.client.HTTPResponse) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, as they arrive."""
    for raw in response:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            yield line[len("data: "):]
        else:
            assert line == "", f"not an SSE line: {line!r}"


def open_stream(sim: Sim, max_tokens: int | None = None) -> http.client.HTTPResponse:
    body: dict[str, Any] = {"model": "qwen3", "messages": [{"role": "user", "content": "Hello there"}], "stream": True}
    if max_tokens:
        body.update(max_tokens=max_tokens, ignore_eos=True)
    conn = sim.connection()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type", "").startswith("text/event-stream")
    return response


def refused(sim: Sim, within: float = 5) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            sim.request("GET", "/health")
        except ConnectionError:
            return True
        time.sleep(0.05)
    return False


# ---- the download Job against the hub stand-in --------------------------------------------------


@pytest.mark.parametrize("revision", ["pinned", "main"])
def test_the_server_reads_what_the_download_job_wrote(prod: Render, repo: Repo, tmp_path: Path, start_sim: Any,
                                                      revision: str) -> None:
    volume = tmp_path / "models"
    with Hub([repo]) as hub:
        result = download(prod, hub, volume, **({"GS_REVISION": "main"} if revision == "main" else {}))
        assert result.returncode == 0, result.stderr
        assert f"{repo.repo_id}@{repo.commit} ready in" in result.stdout
        asked = len(hub.requests)
        to_repo = [authorised for _, path, authorised in hub.requests if not path.startswith("/lfs/")]
        assert to_repo and all(to_repo), "the client sent no token to a gated repository"
        # Done is done: a re-run of the pinned Job asks the hub nothing (a branch is looked up again).
        again = download(prod, hub, volume)
        assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
        assert len(hub.requests) == asked
    snapshot = next(volume.glob("hub/models--*/snapshots/*"))
    assert snapshot.name == repo.commit
    extra = ("--revision=main",) if revision == "main" else ()  # the Deployment then names the branch too
    sim = start_sim(volume, *extra)
    status, body = sim.request("GET", "/v1/models")
    assert status == 200
    (model,) = json.loads(body)["data"]
    assert model["id"] == "qwen3" and model["revision"] == repo.commit
    assert model["weights_files"] == LOADED
    assert model["weights_sha256"] == expected_digest({f: FILES[f] for f in LOADED})
    sim.wait_for(f"weights sha256 {model['weights_sha256']}")
    # The shell line the stand-in's docstring gives for a check on the node computes the same sum.
    shell = subprocess.run(["bash", "-c", "find -L . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum"],
                           cwd=snapshot, capture_output=True, text=True, check=True)
    assert shell.stdout.split()[0] == model["weights_sha256"]


@pytest.mark.parametrize(("token", "env", "code", "says"), [
    ("hf_not_the_token", {}, EXIT_AUTH, "the hub refused the token (401)"),
    (None, {}, EXIT_AUTH, "gated repository"),
    (HF_TOKEN, {"GS_REVISION": "no-such-branch"}, EXIT_NOT_FOUND, "no such revision"),
    (HF_TOKEN, {"GS_REPO": "Qwen/No-Such-Model"}, EXIT_NOT_FOUND, "no such repository"),
    (HF_TOKEN, {"GS_REPO": "someone/private"}, EXIT_NOT_FOUND, "no such repository, or private"),
])
def test_a_refusing_hub_gives_the_exit_code_the_failure_policy_reads(prod: Render, repo: Repo, tmp_path: Path,
                                                                     token: str | None, env: dict[str, str], code: int, says: str) -> None:
    private = Repo("someone/private", FILES, repo.commit, access="private", token="hf_someone_elses")
    with Hub([repo, private]) as hub:
        result = download(prod, hub, tmp_path / "models", token=token, **env)
    assert result.returncode == code, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("ERROR: ")]
    assert says in line
    assert HF_TOKEN not in result.stderr + result.stdout
    assert not list((tmp_path / "models").glob("hub/models--*/snapshots/*/*")), "a refused download left files behind"


def test_the_hub_serves_a_resumed_download_from_where_it_stopped() -> None:
    repo = Repo("org/name", {"model.safetensors": bytes(range(256)) * 4})
    with Hub([repo]) as hub:
        conn = http.client.HTTPConnection("127.0.0.1", int(hub.url.rsplit(":", 1)[1]), timeout=10)
        conn.request("HEAD", "/org/name/resolve/main/model.safetensors")
        head = conn.getresponse()
        head.read()
        assert head.status == 302 and head.getheader("X-Repo-Commit") == repo.commit
        assert head.getheader("X-Linked-Size") == "1024"
        location = head.getheader("Location", "")
        assert location.startswith(hub.cdn_url) and hub.cdn_url != hub.url
        conn.request("GET", location.removeprefix(hub.cdn_url), headers={"Range": "bytes=1000-"})
        part = conn.getresponse()
        assert part.status == 206 and part.read() == repo.files["model.safetensors"][1000:]
        assert part.getheader("Content-Range") == "bytes 1000-1023/1024"


# ---- the vLLM stand-in -----------------------------------------------------------------------------


@pytest.mark.parametrize("volume_state", ["empty", "no-ref", "dangling-link", "no-weights-file"])
def test_the_server_refuses_to_start_without_the_weights(downloaded: Path, start_sim: Any, volume_state: str) -> None:
    snapshot = next(downloaded.glob("hub/models--*/snapshots/*"))
    if volume_state == "empty":
        for path in sorted(downloaded.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    elif volume_state == "no-ref":
        pass  # the Job fetched the pinned commit: no refs/main for a server told `--revision=main`
    elif volume_state == "dangling-link":
        (snapshot / "model.safetensors").resolve().unlink()  # the blob an interrupted download never wrote
    else:
        (snapshot / "model.safetensors").unlink()
    extra = ("--revision=main",) if volume_state == "no-ref" else ()
    sim = start_sim(downloaded, *extra, wait=False)
    assert sim.process.wait(10) == 1
    sim.wait_for("^ERROR: vllm_sim: ")
    errors = [line for line in sim.log if line.startswith("ERROR")]
    assert len(errors) == 1
    assert "download Job" in errors[0]
    assert not any(" on http://" in line for line in sim.log)


def test_the_server_refuses_to_start_where_it_cannot_write_its_cache(prod: Render, downloaded: Path, start_sim: Any) -> None:
    env = container_env(deployment_container(prod), downloaded, {"api-key": API_KEY})
    blocker = downloaded / "not-a-folder"
    blocker.write_text("")
    env["VLLM_CACHE_ROOT"] = str(blocker / "vllm")
    sim = start_sim(downloaded, env=env, wait=False)
    assert sim.process.wait(10) == 1
    sim.wait_for(f"^ERROR: vllm_sim: cannot write VLLM_CACHE_ROOT \\({blocker}/vllm")


def test_the_api_key_guards_v1_only(downloaded: Path, start_sim: Any) -> None:
    sim = start_sim(downloaded, "--enable-prefix-caching", "--kv-cache-dtype", "fp8")
    sim.wait_for("accepted, not simulated: --enable-prefix-caching --kv-cache-dtype fp8")
    chat = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}
    for key in (None, "sk-wrong"):
        assert sim.request("GET", "/v1/models", key=key)[0] == 401
        assert sim.request("POST", "/v1/chat/completions", chat, key=key)[0] == 401
    assert sim.request("GET", "/health", key=None) == (200, b"")
    assert sim.request("GET", "/metrics", key=None)[0] == 200
    assert sim.request("POST", "/v1/chat/completions", chat)[0] == 200
    assert not any(API_KEY in line for line in sim.log)


def test_a_streamed_chat_completion_arrives_as_sse_chunks(downloaded: Path, start_sim: Any) -> None:
    sim = start_sim(downloaded)
    events = list(sse_events(open_stream(sim)))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "qwen3" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert len(chunks) >= 4 and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # The same words unstreamed, and the smoke Job's /v1/completions.
    status, body = sim.request("POST", "/v1/chat/completions", {"model": "qwen3", "messages": [{"role": "user", "content": "Hello"}]})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == text
    status, body = sim.request("POST", "/v1/completions", {"model": "qwen3", "prompt": "Hello", "max_tokens": 1})
    answer = json.loads(body)
    assert status == 200 and answer["usage"]["completion_tokens"] == 1 and answer["choices"][0]["finish_reason"] == "length"
    status, body = sim.request("POST", "/v1/chat/completions", {"model": "other", "messages": []})
    assert status == 404 and "`other` does not exist" in json.loads(body)["message"]


def test_the_smoke_jobs_script_passes_against_the_stand_in(downloaded: Path, start_sim: Any) -> None:
    # The script greps `"id":"<model>"`: the stand-in must write JSON as compactly as vLLM does.
    sim = start_sim(downloaded)
    env = {"PATH": "/usr/bin:/bin", "BASE": f"http://127.0.0.1:{sim.port}", "MODEL": "qwen3", "HEALTH_WAIT_S": "10",
           "REQUEST_TIMEOUT_S": "10", "VLLM_API_KEY": API_KEY}
    result = subprocess.run(["sh", "-c", SMOKE_SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "served: qwen3" in result.stdout and "inference answered" in result.stdout


def test_metrics_carry_every_vllm_series_the_stack_queries(prod: Render, downloaded: Path, start_sim: Any) -> None:
    # What the stack's own machinery queries (autoscaler, adapter, alerts); the dashboards' queries are for people,
    # checked against the real vLLM's series by tests/test_dashboards.py.
    machinery = [r.inputs for r in prod.resources if "grafana_dashboard" not in json.dumps(r.inputs.get("metadata", {}))]
    queried = set(re.findall(r"vllm:[a-z_]+", json.dumps(machinery)))
    assert {"vllm:num_requests_waiting", "vllm:generation_tokens_total"} <= queried
    sim = start_sim(downloaded, "--max-num-seqs=1", "--sim-token-seconds=0.1")
    first, second = open_stream(sim, max_tokens=10), open_stream(sim, max_tokens=10)

    def series() -> dict[str, float]:
        text = sim.request("GET", "/metrics", key=None)[1].decode()
        found = re.findall(r'^(vllm:[a-z_]+)\{[^}]*model_name="qwen3"[^}]*\} (\S+)$', text, re.MULTILINE)
        return {name: float(value) for name, value in found}

    deadline = time.monotonic() + 5
    while (now := series()).get("vllm:num_requests_waiting") != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert queried <= set(now), f"the stack queries series the stand-in does not serve: {queried - set(now)}"
    assert now["vllm:num_requests_running"] == 1 and now["vllm:num_requests_waiting"] == 1
    for response in (first, second):
        assert list(sse_events(response))[-1] == "[DONE]"
    assert series()["vllm:generation_tokens_total"] == 20


def test_sigterm_drains_a_running_stream_and_refuses_new_requests(downloaded: Path, start_sim: Any) -> None:
    sim = start_sim(downloaded, "--sim-token-seconds=0.1")  # the render's --shutdown-timeout (600 s)
    stream = sse_events(open_stream(sim, max_tokens=25))
    next(stream)
    sim.process.send_signal(signal.SIGTERM)
    assert refused(sim), "the server still took requests after SIGTERM"
    events = list(stream)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert sim.process.wait(10) == 0
    sim.wait_for("shut down")


def test_sigterm_without_a_shutdown_timeout_cuts_the_stream(prod: Render, downloaded: Path, start_sim: Any) -> None:
    """As vLLM before --shutdown-timeout (the Deployment leaves the flag out for such images)."""
    sim = start_sim(downloaded, "--sim-token-seconds=0.1", "--shutdown-timeout=0")
    stream = sse_events(open_stream(sim, max_tokens=25))
    next(stream)
    sim.process.send_signal(signal.SIGTERM)
    events = list(stream)  # the stream ends where the server cut it: no finish_reason, no [DONE]
    assert "[DONE]" not in events
    assert not any(json.loads(e)["choices"][0]["finish_reason"] for e in events)
    assert sim.process.wait(10) == 0
    sim.wait_for("aborted 1 requests")


def test_the_startup_delay_holds_the_port_closed(downloaded: Path, start_sim: Any) -> None:
    started = time.monotonic()
    sim = start_sim(downloaded, "--sim-startup-seconds=1.5", wait=False)
    sim.wait_for("simulating a 1.5s load")
    sim.port = int(sim.wait_for(r"serving .* on http://127\.0\.0\.1:(\d+)")[1])
    assert time.monotonic() - started >= 1.5
    assert sim.request("GET", "/health", key=None)[0] == 200


@pytest.mark.parametrize("module", [vllm_sim, hub_module])
def test_the_stand_ins_need_only_the_standard_library(module: Any) -> None:
    """vllm_sim runs in an image of Debian's python3 with no pip; the hub beside it on a bare host."""
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} <= sys.stdlib_module_names


# ---- a group spanning nodes (vLLM's own launcher, issue #41) ----------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_group_serves_once_every_rank_joined_and_stops_when_one_goes(downloaded: Path, start_sim: Any) -> None:
    master = free_port()
    group = ("--nnodes=2", "--pipeline-parallel-size=2", "--master-addr=127.0.0.1", f"--master-port={master}")
    leader = start_sim(downloaded, *group, "--node-rank=0", wait=False)
    leader.wait_for(r"rank 0 of 2: waiting for the other ranks")
    with pytest.raises(AssertionError):
        leader.wait_for(r"serving ", timeout=1)  # no API before the whole group is there
    worker = start_sim(downloaded, *group, "--node-rank=1", "--headless", wait=False)
    worker.wait_for(rf"rank 1 of 2 joined the leader at 127\.0\.0\.1:{master}")
    leader.port = int(leader.wait_for(r"serving .* on http://127\.0\.0\.1:(\d+)")[1])
    status, body = leader.request("GET", "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["group"] == [{"rank": 1, "address": "127.0.0.1"}]
    with pytest.raises(AssertionError):
        worker.wait_for(r"serving ", timeout=0.5)  # headless: no API of its own
    worker.process.kill()
    assert leader.process.wait(10) == 1
    leader.wait_for(r"ERROR: vllm_sim: lost a rank of the group")


def test_a_rank_that_cannot_reach_its_leader_says_where_it_looked(downloaded: Path, start_sim: Any) -> None:
    port = free_port()
    worker = start_sim(downloaded, "--nnodes=2", "--pipeline-parallel-size=2", "--node-rank=1", "--headless",
                       "--master-addr=127.0.0.1", f"--master-port={port}", "--sim-join-seconds=1", wait=False)
    assert worker.process.wait(20) == 1
    worker.wait_for(rf"ERROR: vllm_sim: rank 1 could not reach the leader at 127\.0\.0\.1:{port} within 1s")


@pytest.mark.parametrize(("args", "says"), [
    (["--nnodes=2", "--node-rank=2"], "--node-rank 2 is not in [0, 2)"),
    (["--nnodes=3", "--pipeline-parallel-size=2"], "--nnodes 3 does not divide the world size 1 x 2"),
    (["--nnodes=2", "--pipeline-parallel-size=2", "--distributed-executor-backend=ray"], "needs --distributed-executor-backend mp"),
    (["--headless"], "--headless is for the ranks above 0"),
])
def test_group_flags_are_checked_as_vllm_checks_them(args: list[str], says: str) -> None:
    with pytest.raises(vllm_sim.StartupError, match=re.escape(says)):
        vllm_sim.parse_args(["org/model", *args])
