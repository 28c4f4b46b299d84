"""A request held by KEDA's HTTP add-on interceptor (the real one, built from its pinned module) on the loopback cluster.

The interceptor runs as a process of this machine against the loopback API server, watching the stack's namespace as
its Deployment would watch the cluster: it builds its routing table from the HTTPScaledObjects and InterceptorRoutes it
reads, holds a request while the target Service has no ready endpoint (its EndpointSlices, written by the real
kube-controller-manager from kwok's pods), and forwards it to `<service>.<namespace>:<port>` once one is ready.

It runs in a network namespace of its own (testbed/e2e/netns.py: it listens on every address, with no setting to
narrow it), reaching the API server through a forwarded port. Standing in: kwok's pods run nothing and there is no
cluster DNS, so that namespace's /etc/hosts names the model's Service 127.0.0.1, where `ModelStandIn` listens on the
Service's port and answers for the model, saying it is a stand-in. A request reaching it is one the interceptor sent
to the Service its route names (no other name leads there). It cannot show the model's own answer, the pod network,
kube-proxy, or the time a real model takes to load.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from testbed.e2e.netns import NetworkNamespace, network_namespace
from testbed.e2e.run import CheckError, JsonHandler

COLD_START_HEADER = "x-keda-http-cold-start"
"""Set by the interceptor on every forwarded answer: `true` when the request waited for the first ready endpoint.
Headers are kept lower-cased (`HeldRequest.headers`)."""


class ModelStandIn:
    """The model's server as the interceptor's upstream, on `port` of the namespace's loopback, which its /etc/hosts
    names `address`: answers every request 200, naming the address it stands for. A stand-in, and its answers say so."""

    def __init__(self, namespace: NetworkNamespace, address: str, port: int) -> None:
        self.requests: list[str] = []
        owner = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:  # noqa: N802 (the name http.server calls)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                owner.requests.append(self.path)
                self.reply_json(200, {"standIn": "model server behind the interceptor (testbed/e2e/held_request.py)",
                                      "upstream": f"{address}:{port}", "path": self.path})

        self.server = namespace.call(lambda: ThreadingHTTPServer(("127.0.0.1", port), Handler))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Interceptor:
    """The add-on's interceptor (`interceptor-<version>` of the cluster build) watching one namespace of the cluster."""

    namespace: NetworkNamespace
    binary: Path
    kubeconfig: str
    watch: str
    log_path: Path
    proxy_port: int = 8080
    admin_port: int = 9090
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")}
        env.update({"KUBECONFIG": self.kubeconfig, "KEDA_HTTP_WATCH_NAMESPACE": self.watch,
                    "KEDA_HTTP_PROXY_PORT": str(self.proxy_port), "KEDA_HTTP_ADMIN_PORT": str(self.admin_port)})
        self.process = self.namespace.start([str(self.binary)], env, self.log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CheckError(f"the interceptor exited ({self.process.returncode}): {self.log_tail()}")
            if self.namespace.call(self.ready):
                return
            time.sleep(0.5)
        raise CheckError(f"the interceptor was not ready on :{self.admin_port} within {timeout:.0f} s: {self.log_tail()}")

    def ready(self) -> bool:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=2)
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return " | ".join(text.splitlines()[-lines:])


class HeldRequest:
    """One OpenAI request sent to the interceptor's proxy port under `host`, waited for on a thread of its own."""

    def __init__(self, interceptor: Interceptor, host: str, path: str, body: dict[str, Any]) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""
        self.error: str | None = None
        self.sent = time.monotonic()
        self.answered: float | None = None
        self._thread = threading.Thread(target=self._send, args=(interceptor, host, path, body), daemon=True)
        self._thread.start()

    def _send(self, interceptor: Interceptor, host: str, path: str, body: dict[str, Any]) -> None:
        try:
            interceptor.namespace.enter()
            port = interceptor.proxy_port
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
            connection.request("POST", path, body=json.dumps(body), headers={"Host": host, "Content-Type": "application/json"})
            response = connection.getresponse()
            self.status, self.body = response.status, response.read()
            self.headers = {k.lower(): v for k, v in response.headers.items()}
        except OSError as e:
            self.error = f"{type(e).__name__}: {e}"
        self.answered = time.monotonic()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return self.done

    def describe(self) -> str:
        if not self.done:
            return "still held"
        return self.error or f"HTTP {self.status}: {self.body[:300].decode(errors='replace')}"

    def answer(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.body))
        except ValueError as e:
            raise CheckError(f"the held request's answer is not JSON: {self.describe()}") from e


@contextlib.contextmanager
def running_interceptor(binary: Path, kubeconfig: str, api_port: int, watch: str, service: str, service_port: int,
                        folder: Path) -> Iterator[tuple[Interceptor, ModelStandIn]]:
    """The interceptor watching the cluster's namespace `watch` from a network namespace of its own, where the model's
    Service (`service` of `watch`, on `service_port`) is the stand-in; all of it gone on the way out."""
    if not binary.is_file():
        raise CheckError(f"no interceptor at {binary}: testbed/cluster/build.sh builds it")
    address = f"{service}.{watch}"
    with network_namespace(folder, {address: "127.0.0.1"}) as namespace:
        namespace.forward_in(api_port)
        model = ModelStandIn(namespace, address, service_port)
        try:
            interceptor = Interceptor(namespace, binary, kubeconfig, watch, folder / "interceptor.log")
            interceptor.start()
            yield interceptor, model
        finally:
            model.close()


def hold_one(interceptor: Interceptor, host: str, path: str, body: dict[str, Any], held_for: float = 3) -> HeldRequest:
    """A request the interceptor holds: sent again while it answers 404 (its routing table not yet built from the
    informers it just synced), and required to be unanswered `held_for` seconds later."""
    deadline = time.monotonic() + 30
    while True:
        request = HeldRequest(interceptor, host, path, body)
        if not request.wait(held_for):
            return request
        if request.status != 404 or time.monotonic() > deadline:
            raise CheckError(f"a request to {host}{path} was not held by the interceptor: {request.describe()} "
                             f"(its log: {interceptor.log_tail()})")
        time.sleep(0.5)
