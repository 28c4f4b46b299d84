#!/usr/bin/env python3
"""A stand-in for vLLM's OpenAI-compatible server (`vllm serve`), said to be one wherever it answers.

Standard library only: it runs in an image built from Debian's python3 with no pip, with the
arguments and environment our Deployment gives the vLLM container, so kubelet, probes, volumes,
the API key, metrics scraping and the drain can be exercised on a node without a GPU:

    python3 vllm_sim.py [serve] <model> [--revision=R] [--served-model-name=N] [--download-dir=D]
        [--host=H] [--port=P] [--api-key=K | VLLM_API_KEY] [--max-model-len=L] [--max-num-seqs=S]
        [--shutdown-timeout=T] [--sim-startup-seconds=S] [--sim-token-seconds=S] [any other vLLM flag]
        [--nnodes=N --node-rank=R --master-addr=A --master-port=P [--headless]]

What it does as vLLM does:
- loads "weights" from the Hugging Face cache layout under --download-dir (HF_HUB_CACHE):
  models--<org>--<name>/snapshots/<commit>/, the commit being --revision or what refs/<revision>
  names; it never downloads, and exits 1 with one `ERROR:` line when they are missing or incomplete;
- writes at start where vLLM does (its lock in the download dir, VLLM_CACHE_ROOT, TRITON_CACHE_DIR,
  TORCHINDUCTOR_CACHE_DIR, the temp dir, each or its default under HOME) and exits 1 naming the one
  it cannot write;
- serves /health, /v1/models, /v1/chat/completions and /v1/completions (streamed as SSE chunks
  ending `data: [DONE]`, or not), and /metrics with vLLM's metric names and `model_name` label;
- with --api-key or VLLM_API_KEY, answers 401 on /v1 without `Authorization: Bearer <key>`
  (/health and /metrics stay open);
- on SIGTERM closes its listening socket, lets running requests finish for --shutdown-timeout
  seconds (0, the default, as vLLM before the flag: aborts them), then exits 0;
- in a group spanning nodes (--nnodes > 1, vLLM's own launcher): rank 0 listens on --master-port and serves only once
  every other rank joined it, each rank above 0 runs --headless and joins rank 0 at --master-addr, and a member whose
  peer goes exits 1. The join is a line over TCP standing in for torch.distributed and NCCL: it shows the address
  and the network path, not a collective or its bandwidth.

What it cannot show: a GPU, a model, a tokenizer (a token here is a word), real latencies, memory use.
It reports the sha256 of the files it loaded in /v1/models (`weights_sha256`) and its log: the
sha256 of `sha256sum` lines (`<hex>  <path>`, sorted by path) over every file of the snapshot,
so a shell on the node can check it:
    cd <snapshot> && find -L . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum | sha256sum
Flags it does not simulate are accepted and listed at start, so a new flag in the Deployment
does not stop it (vLLM would refuse an unknown one: the policy and config tests cover that).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STAND_IN = "vllm_sim, gpu-serving's stand-in for vLLM (no GPU, no model, no tokenizer)"


REPLY = ["This", "answer", "comes", "from", "vllm_sim,", "a", "stand-in", "for", "vLLM:", "no", "model", "ran."]
"""What every completion says, one word per "token"; it stops at its end as a model stops at EOS."""


COMMIT = re.compile(r"[0-9a-f]{40}")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class StartupError(Exception):
    """Why the server cannot start: one line, printed after `ERROR: `, exit 1."""


class AbortedError(Exception):
    """The request was cut: shutdown without drain time, or the client went away."""


# ---- arguments --------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm_sim", description=STAND_IN, allow_abbrev=False)
    p.add_argument("model", nargs="?")
    p.add_argument("--model", dest="model_flag")
    p.add_argument("--revision", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--download-dir", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--shutdown-timeout", type=float, default=0.0)
    # Accepted and checked as vLLM checks them; they change nothing here.
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    # A group spanning nodes (vLLM's own launcher): rank 0 serves and waits for the others, which run --headless.
    p.add_argument("--distributed-executor-backend", default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--sim-join-seconds", type=float, default=600.0, help="how long a group member waits for the others")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--sim-startup-seconds", type=float, default=0.0, help="pretend loading takes this long (startup probes)")
    p.add_argument("--sim-token-seconds", type=float, default=0.01, help="time per generated word (streams last long enough to drain)")
    return p


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    args, unknown = parser().parse_known_args(argv[1:] if argv[:1] == ["serve"] else argv)
    args.model = args.model or args.model_flag
    if not args.model:
        raise StartupError("no model: give it as the first argument (or --model)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise StartupError(f"--gpu-memory-utilization={args.gpu_memory_utilization} is not in (0, 1]")
    if args.max_num_seqs < 1 or args.max_model_len < 1:
        raise StartupError("--max-num-seqs and --max-model-len must be at least 1")
    if args.nnodes > 1:
        # As vLLM's ParallelConfig: only its own launcher spans nodes, every rank in range, the world split evenly.
        if args.distributed_executor_backend not in (None, "mp"):
            raise StartupError(f"--nnodes {args.nnodes} needs --distributed-executor-backend mp, not {args.distributed_executor_backend}")
        if not 0 <= args.node_rank < args.nnodes:
            raise StartupError(f"--node-rank {args.node_rank} is not in [0, {args.nnodes})")
        if (args.tensor_parallel_size * args.pipeline_parallel_size) % args.nnodes:
            raise StartupError(f"--nnodes {args.nnodes} does not divide the world size "
                               f"{args.tensor_parallel_size} x {args.pipeline_parallel_size}")
    if args.headless and args.node_rank == 0:
        raise StartupError("--headless is for the ranks above 0: rank 0 serves the API")
    args.served_model_name = args.served_model_name or [args.model]
    args.download_dir = args.download_dir or os.environ.get("HF_HUB_CACHE") or str(Path.home() / ".cache/huggingface/hub")
    args.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    return args, unknown


# ---- weights ----------------------------------------------------------------------------------


def snapshot_dir(download_dir: str, model: str, revision: str | None) -> Path:
    """Where huggingface_hub's cache keeps `model` at `revision`, as vLLM finds it offline."""
    if Path(model).is_dir():
        return Path(model)
    repo = Path(download_dir) / f"models--{model.replace('/', '--')}"
    wanted = revision or "main"
    if COMMIT.fullmatch(wanted):
        commit = wanted
    else:
        ref = repo / "refs" / wanted
        if not ref.is_file():
            raise StartupError(f"no weights for {model}@{wanted} in {download_dir}: {ref} does not exist "
                               "(run the download Job first; this stand-in never downloads)")
        commit = ref.read_text().strip()
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        raise StartupError(f"no weights for {model}@{wanted} in {download_dir}: {snapshot} does not exist "
                           "(run the download Job first; this stand-in never downloads)")
    return snapshot


def weights_digest(snapshot: Path) -> tuple[str, list[str]]:
    """(sha256 over `sha256sum` lines of every file, the files): refuses what vLLM could not load."""
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file() or p.is_symlink())
    broken = [f for f in files if not (snapshot / f).exists()]
    if broken:
        raise StartupError(f"incomplete weights in {snapshot}: {', '.join(broken)} point at nothing (re-run the download Job)")
    if "config.json" not in files or not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        raise StartupError(f"incomplete weights in {snapshot}: needs config.json and a weights file "
                           f"({', '.join(WEIGHT_SUFFIXES)}); found {', '.join(files) or 'nothing'} (re-run the download Job)")
    lines = "".join(f"{sha256_file(snapshot / f)}  {f}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest(), files


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def paths_written_at_start(download_dir: str, model: str) -> list[tuple[str, Path]]:
    """(what, path) vLLM and the libraries it loads write before serving, each setting or its default."""
    home = Path(os.environ.get("HOME") or Path.home())
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")
    tmp = Path(tempfile.gettempdir())
    env = os.environ.get
    return [
        # vLLM locks the model while it loads: <download-dir>/<model with / as ->.lock
        ("--download-dir", Path(download_dir) / f"{model.replace('/', '-')}.lock"),
        ("VLLM_CACHE_ROOT", Path(env("VLLM_CACHE_ROOT") or xdg / "vllm") / "vllm_sim-probe"),
        ("TRITON_CACHE_DIR", Path(env("TRITON_CACHE_DIR") or home / ".triton/cache") / "vllm_sim-probe"),
        ("TORCHINDUCTOR_CACHE_DIR", Path(env("TORCHINDUCTOR_CACHE_DIR") or tmp / f"torchinductor_{user()}") / "vllm_sim-probe"),
        ("the temp dir", tmp / f"vllm_sim-{os.getpid()}"),
    ]


def user() -> str:
    """torch's default inductor cache names the user: no USER/LOGNAME and a UID without a passwd
    entry fails there (`KeyError: getpwuid(): uid not found`), and so here."""
    try:
        return getpass.getuser()
    except (KeyError, OSError) as error:
        raise StartupError(f"cannot name the user for torch's cache dir: {error} (set USER, or run as a UID in /etc/passwd)") from error


def write_at_start(download_dir: str, model: str) -> Any:
    """Writes each path; returns the held lock file (vLLM holds it while loading)."""
    lock = None
    for what, path in paths_written_at_start(download_dir, model):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = path.open("a")
        except OSError as error:
            raise StartupError(f"cannot write {what} ({path}): {error.strerror}") from error
        if lock is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
            lock = handle
        else:
            handle.close()
            path.unlink(missing_ok=True)
    return lock


# ---- the engine -------------------------------------------------------------------------------


@dataclass
class Engine:
    """Request accounting behind /metrics and the drain: `max_num_seqs` run, the rest wait."""

    max_num_seqs: int
    token_seconds: float
    running: int = 0
    waiting: int = 0
    in_flight: int = 0
    counters: Counter[str] = field(default_factory=Counter)
    cond: threading.Condition = field(default_factory=threading.Condition)
    aborting: threading.Event = field(default_factory=threading.Event)
    draining: bool = False

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Any HTTP request: the drain waits for these."""
        with self.cond:
            self.in_flight += 1
        try:
            yield
        finally:
            with self.cond:
                self.in_flight -= 1
                self.cond.notify_all()

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        with self.cond:
            self.waiting += 1
            self.cond.wait_for(lambda: self.running < self.max_num_seqs or self.aborting.is_set())
            self.waiting -= 1
            if self.aborting.is_set():
                raise AbortedError
            self.running += 1
        try:
            yield
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    def generate(self, max_tokens: int | None, ignore_eos: bool) -> Iterator[str]:
        """The reply's words, one per token interval; cut when the server aborts."""
        count = max_tokens if max_tokens is not None and (ignore_eos or max_tokens < len(REPLY)) else len(REPLY)
        for i in range(count):
            if self.aborting.wait(self.token_seconds):
                raise AbortedError
            self.count("generation_tokens")
            yield REPLY[i % len(REPLY)]

    def count(self, name: str, by: int = 1) -> None:
        with self.cond:
            self.counters[name] += by

    def abort(self) -> None:
        with self.cond:
            self.aborting.set()
            self.cond.notify_all()

    def drain(self, timeout: float) -> int:
        """Waits up to `timeout` for running requests; the number still running after it."""
        with self.cond:
            self.draining = True
            self.cond.wait_for(lambda: self.in_flight == 0, timeout=timeout)
            return self.in_flight


def metrics_text(engine: Engine, model_names: list[str]) -> str:
    """Prometheus text with vLLM's names (counters as prometheus_client writes them: `<name>_total`)."""
    with engine.cond:
        running, waiting, counters = engine.running, engine.waiting, Counter(engine.counters)
    families = [
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", {"": running}),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", {"": waiting}),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", {"": running / engine.max_num_seqs}),
        ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", {"": counters["prompt_tokens"]}),
        ("vllm:generation_tokens", "counter", "Number of generation tokens processed.", {"": counters["generation_tokens"]}),
        ("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.", {"": counters["preemptions"]}),
        ("vllm:request_success", "counter", "Count of successfully processed requests.",
         {f'finished_reason="{r}"': counters[f"success_{r}"] for r in ("stop", "length", "abort")}),
    ]
    out = []
    for name, kind, help_text, values in families:
        out += [f"# HELP {name} {help_text} (counted by {STAND_IN})", f"# TYPE {name} {kind}"]
        series = f"{name}_total" if kind == "counter" else name
        for served in model_names:
            for extra, value in values.items():
                labels = ",".join(x for x in ('engine="0"', extra, f'model_name="{served}"') if x)
                out.append(f"{series}{{{labels}}} {float(value)}")
    return "\n".join(out) + "\n"


# ---- OpenAI-compatible answers ----------------------------------------------------------------


def compact_json(body: Any) -> str:
    """As vLLM writes JSON (FastAPI's response, pydantic's `model_dump_json`): no spaces. The smoke
    Job's script matches `"id":"<model>"` in /v1/models, as clients that grep a body do."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def error_body(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def prompt_words(body: dict[str, Any], chat: bool) -> int:
    """The prompt's length in "tokens" (words: there is no tokenizer)."""
    if not chat:
        prompt = body.get("prompt", "")
        return sum(len(str(p).split()) for p in prompt) if isinstance(prompt, list) else len(str(prompt).split())
    words = 0
    for message in body.get("messages", []):
        content = message.get("content") or ""
        parts = content if isinstance(content, list) else [{"text": content}]
        words += sum(len(str(p.get("text", "")).split()) for p in parts if isinstance(p, dict))
    return words


def chunk(kind: str, rid: str, model: str, created: int, text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else ({"content": text} if text is not None else {})
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def full_answer(kind: str, rid: str, model: str, created: int, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
    if kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice], "usage": usage}


@dataclass
class Served:
    """What the server loaded and answers with."""

    names: list[str]
    root: str
    commit: str
    weights_sha256: str
    files: list[str]
    max_model_len: int
    api_key: str | None
    group: list[dict[str, Any]] = field(default_factory=list)
    """With --nnodes > 1: the ranks that joined this leader, each with the address it came from."""

    def models(self) -> dict[str, Any]:
        entry = {"object": "model", "created": int(time.time()), "owned_by": "vllm", "root": self.root, "parent": None,
                 "max_model_len": self.max_model_len, "stand_in": STAND_IN, "revision": self.commit,
                 "weights_sha256": self.weights_sha256, "weights_files": self.files, **({"group": self.group} if self.group else {})}
        return {"object": "list", "data": [{"id": name, **entry} for name in self.names]}


def handler(served: Served, engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "vllm_sim (stand-in for vLLM)"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def send_json(self, status: int, body: Any) -> None:
            data = compact_json(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def send_text(self, status: int, text: str, content_type: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def end_headers(self) -> None:
            if engine.draining:
                self.send_header("Connection", "close")
                self.close_connection = True
            super().end_headers()

        def refused(self) -> bool:
            """A request the server must not serve: arrived during the drain, or /v1 without the key."""
            if engine.draining:
                self.send_json(503, error_body(503, "ServiceUnavailableError", "the server is shutting down"))
                return True
            path = self.path.split("?", 1)[0]
            if served.api_key and path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {served.api_key}":
                self.send_json(401, {"error": "Unauthorized"})
                return True
            return False

        def do_GET(self) -> None:
            with engine.request():
                if self.refused():
                    return
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    self.send_text(200, "", "text/plain")
                elif path == "/v1/models":
                    self.send_json(200, served.models())
                elif path == "/metrics":
                    self.send_text(200, metrics_text(engine, served.names), "text/plain; version=0.0.4; charset=utf-8")
                else:
                    self.send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            with engine.request():
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.refused():
                    return
                kind = {"/v1/chat/completions": "chat", "/v1/completions": "text"}.get(self.path.split("?", 1)[0])
                if kind is None:
                    self.send_json(404, {"detail": "Not Found"})
                    return
                try:
                    body = json.loads(raw or b"{}")
                    assert isinstance(body, dict)
                except (ValueError, AssertionError):
                    self.send_json(400, error_body(400, "BadRequestError", "the body is not a JSON object"))
                    return
                self.complete(kind, body)

        def complete(self, kind: str, body: dict[str, Any]) -> None:
            model = body.get("model") or served.names[0]
            if model not in served.names:
                self.send_json(404, error_body(404, "NotFoundError", f"The model `{model}` does not exist."))
                return
            prompt = prompt_words(body, kind == "chat")
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
            if prompt + (max_tokens or 0) > served.max_model_len:
                self.send_json(400, error_body(400, "BadRequestError", (
                    f"This model's maximum context length is {served.max_model_len} tokens. However, you requested "
                    f"{prompt + (max_tokens or 0)} tokens ({prompt} in the messages, {max_tokens or 0} in the completion).")))
                return
            rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
            engine.count("prompt_tokens", prompt)
            words = engine.generate(max_tokens if isinstance(max_tokens, int) else None, bool(body.get("ignore_eos")))
            try:
                if body.get("stream"):
                    self.stream(kind, rid, model, body, words, prompt)
                    return
                with engine.slot():
                    text = " ".join(words)
                usage = self.usage(prompt, len(text.split()))
                finish = self.finish_reason(max_tokens, usage["completion_tokens"])
                engine.count(f"success_{finish}")
                self.send_json(200, full_answer(kind, rid, model, int(time.time()), text, finish, usage))
            except (AbortedError, BrokenPipeError, ConnectionResetError):
                engine.count("success_abort")
                self.close_connection = True

        @staticmethod
        def usage(prompt: int, completion: int) -> dict[str, int]:
            return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

        @staticmethod
        def finish_reason(max_tokens: Any, generated: int) -> str:
            return "length" if isinstance(max_tokens, int) and generated >= max_tokens else "stop"

        def stream(self, kind: str, rid: str, model: str, body: dict[str, Any], words: Iterator[str], prompt: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            # Headers first, as vLLM's StreamingResponse: a queued request has its 200 while it waits.
            created, generated = int(time.time()), 0
            if kind == "chat":
                self.event(chunk(kind, rid, model, created, None, None, first=True))
            with engine.slot():
                for i, word in enumerate(words):
                    generated += 1
                    self.event(chunk(kind, rid, model, created, word if i == 0 else f" {word}", None, first=False))
            finish = self.finish_reason(body.get("max_completion_tokens") or body.get("max_tokens"), generated)
            self.event(chunk(kind, rid, model, created, None, finish, first=False))
            if (body.get("stream_options") or {}).get("include_usage"):
                self.event({"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                            "created": created, "model": model, "choices": [], "usage": self.usage(prompt, generated)})
            self.write_chunk(b"data: [DONE]\n\n")
            self.write_chunk(b"")
            engine.count(f"success_{finish}")

        def event(self, data: dict[str, Any]) -> None:
            self.write_chunk(f"data: {compact_json(data)}\n\n".encode())

        def write_chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    return Handler


# ---- the process ------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"INFO {time.strftime('%H:%M:%S')} vllm_sim: {message}", flush=True)


def load(args: argparse.Namespace) -> Served:
    snapshot = snapshot_dir(args.download_dir, args.model, args.revision)
    digest, files = weights_digest(snapshot)
    log(f"loaded {args.model}@{snapshot.name} from {snapshot}: {len(files)} files, weights sha256 {digest}")
    return Served(args.served_model_name, args.model, snapshot.name, digest, files, args.max_model_len, args.api_key)


def serve(args: argparse.Namespace, served: Served, signals: set[signal.Signals]) -> int:
    engine = Engine(args.max_num_seqs, args.sim_token_seconds)
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler(served, engine))
    except OSError as error:
        raise StartupError(f"cannot listen on {args.host}:{args.port}: {error.strerror}") from error
    server.daemon_threads = True
    server.handle_error = lambda _request, address: log(f"request from {address[0]} failed: {sys.exc_info()[1]!r}")  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"serving {', '.join(served.names)} on http://{args.host}:{server.server_address[1]}"
        f"{' (API key required on /v1)' if served.api_key else ''}")
    received = signal.sigwait(signals)
    log(f"received {signal.Signals(received).name}: no new requests; {engine.in_flight} running get up to "
        f"--shutdown-timeout={args.shutdown_timeout:g}s")
    with engine.cond:
        engine.draining = True
    # Stop listening at once (a connection now is refused, as by vLLM's closed socket), then the accept loop.
    with contextlib.suppress(OSError):
        server.socket.shutdown(socket.SHUT_RDWR)
    server.shutdown()
    server.socket.close()
    left = engine.drain(args.shutdown_timeout)
    if left:
        engine.abort()
        engine.drain(5)
        log(f"aborted {left} requests still running after --shutdown-timeout")
    log("shut down")
    return 0


# ---- a group spanning nodes ---------------------------------------------------------------------
# In place of torch.distributed's store on the leader (`--master-addr`:`--master-port`): each other rank connects,
# says its rank and what it loaded, and keeps the connection; the leader serves only once all of them joined, and a
# member that loses the other side exits 1, as a pipeline with a stage gone cannot go on.


def hello(args: argparse.Namespace, served: Served) -> str:
    return json.dumps({"rank": args.node_rank, "model": served.root, "revision": served.commit}, separators=(",", ":"))


def gather(args: argparse.Namespace, served: Served, signals: set[signal.Signals]) -> list[socket.socket]:
    """The leader: wait for ranks 1…nnodes-1 on the master port, each loading what the leader loaded."""
    try:
        listener = socket.create_server((args.host, args.master_port), backlog=args.nnodes)
    except OSError as error:
        raise StartupError(f"cannot listen on {args.host}:{args.master_port} (--master-port): {error.strerror}") from error
    listener.settimeout(1)
    joined: dict[int, socket.socket] = {}
    deadline = time.monotonic() + args.sim_join_seconds
    log(f"rank 0 of {args.nnodes}: waiting for the other ranks on port {args.master_port}")
    while len(joined) < args.nnodes - 1:
        if time.monotonic() > deadline:
            raise StartupError(f"ranks {sorted(set(range(1, args.nnodes)) - set(joined))} did not join within "
                               f"{args.sim_join_seconds:g}s: check that they reach {args.master_addr}:{args.master_port}")
        if signal.sigtimedwait(signals, 0) is not None:
            raise StartupError("stopped while waiting for the other ranks")
        try:
            conn, peer = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(10)
        member = json.loads(conn.makefile().readline() or "{}")
        if (member.get("model"), member.get("revision")) != (served.root, served.commit):
            conn.close()
            raise StartupError(f"rank {member.get('rank')} from {peer[0]} loaded {member.get('model')}@{member.get('revision')}, "
                               f"this leader {served.root}@{served.commit}")
        conn.sendall(b"ok\n")
        conn.settimeout(None)
        joined[int(member["rank"])] = conn
        served.group.append({"rank": int(member["rank"]), "address": peer[0]})
        log(f"rank {member['rank']} joined from {peer[0]}")
    listener.close()
    return list(joined.values())


def join(args: argparse.Namespace, served: Served, signals: set[signal.Signals]) -> int:
    """A headless rank: reach the leader at --master-addr (resolved anew on each try: its DNS name may come after the
    pod), join, and stay joined until told to stop or the leader goes."""
    deadline = time.monotonic() + args.sim_join_seconds
    said = 0.0
    while True:
        try:
            conn = socket.create_connection((args.master_addr, args.master_port), timeout=5)
            conn.sendall(hello(args, served).encode() + b"\n")
            if conn.makefile().readline().strip() == "ok":
                break
            raise StartupError(f"the leader at {args.master_addr}:{args.master_port} refused rank {args.node_rank}")
        except OSError as error:
            if time.monotonic() > deadline:
                raise StartupError(f"rank {args.node_rank} could not reach the leader at {args.master_addr}:{args.master_port} "
                                   f"within {args.sim_join_seconds:g}s: {error}") from error
            if time.monotonic() - said > 30:
                said = time.monotonic()
                log(f"rank {args.node_rank}: the leader at {args.master_addr}:{args.master_port} not reached yet ({error}); retrying")
            if signal.sigtimedwait(signals, 2) is not None:
                return 0
    log(f"rank {args.node_rank} of {args.nnodes} joined the leader at {args.master_addr}:{args.master_port} "
        f"({conn.getpeername()[0]}); headless, no API")
    watch([conn], "the leader")
    signal.sigwait(signals)
    return 0


def watch(peers: list[socket.socket], what: str) -> None:
    """From now on, a peer's connection ending ends this process with exit 1: a stage is gone."""
    def wait(conn: socket.socket) -> None:
        conn.settimeout(None)
        with contextlib.suppress(OSError):
            while conn.recv(1):
                pass
        print(f"ERROR: vllm_sim: lost {what}: a group runs whole or not at all, so this member exits (its group restarts)",
              file=sys.stderr, flush=True)
        os._exit(1)

    for conn in peers:
        threading.Thread(target=wait, args=(conn,), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    # Signals are taken by sigwait in the main thread: every thread started later inherits the block.
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        args, unknown = parse_args(sys.argv[1:] if argv is None else argv)
        log(f"this is {STAND_IN}")
        if unknown:
            log(f"accepted, not simulated: {' '.join(unknown)}")
        served = load(args)
        lock = write_at_start(args.download_dir, args.model)
        if args.sim_startup_seconds > 0:
            log(f"simulating a {args.sim_startup_seconds:g}s load before listening (--sim-startup-seconds)")
            if signal.sigtimedwait(signals, args.sim_startup_seconds) is not None:
                log("stopped while loading")
                return 0
        lock.close()
        if args.nnodes > 1 and args.node_rank > 0:
            return join(args, served, signals)
        if args.nnodes > 1:
            watch(gather(args, served, signals), "a rank of the group")
        return serve(args, served, signals)
    except StartupError as error:
        print(f"ERROR: vllm_sim: {error}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: handler threads idling on kept-alive connections must not delay or upset the exit
