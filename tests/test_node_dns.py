"""The real node's cluster DNS stand-in (testbed/node/dns), built and asked over UDP, with a stub API server."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from testbed.node.images import build_go
from testbed.node.join import DNS_SOURCE

pytestmark = pytest.mark.skipif(shutil.which("go") is None or shutil.which("openssl") is None, reason="needs go and openssl")

SERVICES = {("vllm-qwen", "ai"): "10.96.7.8"}
ENDPOINTS = {("vllm-big-group", "ai"): {"subsets": [{
    # A LeaderWorkerSet's headless Service (publishNotReadyAddresses): a leader Ready, one not yet, one with no hostname.
    "addresses": [{"ip": "10.244.1.7", "hostname": "vllm-big-group-0"}, {"ip": "10.244.0.9"}],
    "notReadyAddresses": [{"ip": "10.244.1.8", "hostname": "vllm-big-group-1"}],
}]}}


class Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")  # api v1 namespaces NS services|endpoints NAME
        if len(parts) == 6 and parts[4] == "endpoints":
            found = ENDPOINTS.get((parts[5], parts[3]))
        else:
            ip = SERVICES.get((parts[-1], parts[3])) if len(parts) == 6 else None
            found = {"spec": {"clusterIP": ip}} if ip else None
        body = json.dumps(found).encode() if found else b"{}"
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def dns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    work = tmp_path_factory.mktemp("dns")
    binary = work / "gs-dns"
    build_go(DNS_SOURCE, binary)
    # It loads a CA and a client pair at start; the stub API server speaks plain HTTP and needs neither.
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=t",
                    "-keyout", work / "k.pem", "-out", work / "c.pem"], check=True, capture_output=True)
    api = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "-listen", f"127.0.0.1:{port}", "-server", f"http://127.0.0.1:{api.server_address[1]}",
                             "-ca", work / "c.pem", "-cert", work / "c.pem", "-key", work / "k.pem"], stderr=subprocess.PIPE)
    time.sleep(0.5)
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    yield "127.0.0.1", port
    proc.terminate()
    proc.wait(10)
    api.shutdown()


def ask(server: tuple[str, int], name: str, qtype: int = 1) -> tuple[int, list[str]]:
    """(rcode, A addresses) of one query, with an EDNS record as glibc sends it."""
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0" + struct.pack(">HH", qtype, 1)
    edns = b"\0" + struct.pack(">HHIH", 41, 1232, 0, 0)
    query = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 1) + question + edns
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(query, server)
        reply = s.recv(512)
    ident, flags, qd, an, _, _ = struct.unpack(">HHHHHH", reply[:12])
    assert ident == 0x1234 and flags & 0x8000 and qd == 1
    body = reply[12 + len(question):]
    addresses = []
    for _ in range(an):
        rtype, _, _, length = struct.unpack(">HHIH", body[2:12])
        if rtype == 1:
            addresses.append(socket.inet_ntoa(body[12:12 + length]))
        body = body[12 + length:]
    return flags & 0xF, addresses


def test_a_service_name_resolves_to_its_cluster_ip(dns: tuple[str, int]) -> None:
    assert ask(dns, "vllm-qwen.ai.svc.cluster.local") == (0, ["10.96.7.8"])
    assert ask(dns, "VLLM-Qwen.ai.svc.cluster.local") == (0, ["10.96.7.8"])  # names are case-insensitive


def test_search_path_tries_get_nxdomain_until_the_right_one(dns: tuple[str, int]) -> None:
    # The smoke Job asks for vllm-qwen.ai.svc; with ndots:5 the resolver appends each search domain first.
    assert ask(dns, "vllm-qwen.ai.svc.ai.svc.cluster.local") == (3, [])
    assert ask(dns, "vllm-qwen.ai.svc.svc.cluster.local") == (3, [])
    assert ask(dns, "no-such.ai.svc.cluster.local") == (3, [])
    assert ask(dns, "example.com") == (3, [])


def test_other_record_types_of_a_service_are_empty_not_missing(dns: tuple[str, int]) -> None:
    # NODATA, not NXDOMAIN: a resolver asking A and AAAA together keeps the A answer.
    assert ask(dns, "vllm-qwen.ai.svc.cluster.local", qtype=28) == (0, [])


def test_a_pod_of_a_headless_service_resolves_to_its_ip(dns: tuple[str, int]) -> None:
    """LWS_LEADER_ADDRESS (`<leader>.<set>.<namespace>`) through the search path: the address of that hostname in the
    headless Service's Endpoints, Ready or not yet; another name, or another Service, is not there (the worker retries)."""
    assert ask(dns, "vllm-big-group-0.vllm-big-group.ai.ai.svc.cluster.local") == (3, [])
    assert ask(dns, "vllm-big-group-0.vllm-big-group.ai.svc.cluster.local") == (0, ["10.244.1.7"])
    assert ask(dns, "vllm-big-group-1.vllm-big-group.ai.svc.cluster.local") == (0, ["10.244.1.8"])
    assert ask(dns, "vllm-big-group-2.vllm-big-group.ai.svc.cluster.local") == (3, [])
    assert ask(dns, "vllm-big-group-0.vllm-qwen.ai.svc.cluster.local") == (3, [])
