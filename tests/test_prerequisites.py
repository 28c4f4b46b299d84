"""Preview-time prerequisite checks: a warning per missing cluster piece, saying what to install,
read from a real (local) API endpoint with the stack's kubeconfig; nothing at render time."""

from __future__ import annotations

import base64
import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from components import prerequisites
from components.prerequisites import check, needs
from stacks.config import parse
from tests.test_endpoint import example_raw
from tests.test_serving_gateway import behind_gateway
from tools.render import ROOT, run_program

TOKEN = "test-token-not-a-secret"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
KEDA = f"{CRDS}/scaledobjects.keda.sh"
ALL = {
    "/apis/networking.k8s.io/v1/ingressclasses/nginx",
    f"{CRDS}/clusterissuers.cert-manager.io",
    "/apis/cert-manager.io/v1/clusterissuers/letsencrypt",
    KEDA,
    f"{CRDS}/podmonitors.monitoring.coreos.com",
    f"{CRDS}/prometheusrules.monitoring.coreos.com",
}
ADAPTER = {"/api/v1/namespaces/monitoring", "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.custom.metrics.k8s.io"}


def prod_raw() -> dict:
    config = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in config.items()}


class FakeApi(http.server.BaseHTTPRequestHandler):
    present: ClassVar[set[str]] = set()
    seen: ClassVar[list[str]] = []
    token: ClassVar[str | None] = TOKEN

    def do_GET(self) -> None:
        self.seen.append(self.path)
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_response(401)
        else:
            self.send_response(200 if self.path in self.present else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[tuple[str, type[FakeApi]]]:
    handler = type("Api", (FakeApi,), {"present": set(), "seen": [], "token": TOKEN})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def kubeconfig(server: str, context: str = "prod", user: dict | None = None, cluster: dict | None = None) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": TOKEN}}],
        "contexts": [{"name": context, "context": {"cluster": "c", "user": "u"}}],
    })


def test_prod_needs_an_ingress_class_cert_manager_keda_and_the_prometheus_operator() -> None:
    paths = [need.path for need in needs(parse(prod_raw()))]
    assert set(paths) == ALL
    none = prod_raw()
    none["cluster"] = {**none["cluster"], "autoscaling": "none", "monitoring": {"podMonitor": False, "alerts": False}}
    for model in none["models"]:
        model.pop("ingress", None)
        model["replicas"] = {"min": 1, "max": 1}
    assert needs(parse(none)) == []


def test_an_empty_cluster_gets_one_warning_per_missing_piece(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    warnings, notes = check(parse(prod_raw()), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert notes == []
    assert len(warnings) == 5, warnings  # the ClusterIssuer is not asked for once its CRD is missing
    assert warnings[0].startswith("cluster prerequisite: no IngressClass nginx")
    assert any("cert-manager is not installed" in w and "ClusterIssuer letsencrypt" in w for w in warnings)
    assert any("KEDA is not installed" in w for w in warnings)
    assert sum("the Prometheus Operator is not installed" in w for w in warnings) == 2
    assert "/apis/cert-manager.io/v1/clusterissuers/letsencrypt" not in handler.seen


def test_a_complete_cluster_gets_no_warning(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    handler.present.update(ALL)
    assert check(parse(prod_raw()), kubeconfig(server), ".kube/prod.yaml", tmp_path) == ([], [])
    handler.present.discard("/apis/cert-manager.io/v1/clusterissuers/letsencrypt")
    warnings, _ = check(parse(prod_raw()), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert warnings == ["cluster prerequisite: no ClusterIssuer letsencrypt (cert-manager is installed): create it, or set "
                        "cluster.clusterIssuer to an existing one"]


def test_keda_and_an_existing_namespace(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    raw = prod_raw()
    raw["cluster"] = {**raw["cluster"], "autoscaling": "keda", "createNamespace": False}
    handler.present.update(ALL - {KEDA})
    warnings, _ = check(parse(raw), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert [w.split(":", 2)[1].strip() for w in warnings] == [
        "namespace ai does not exist and cluster.createNamespace is false", "KEDA is not installed (no ScaledObject CRD)"]


def test_hpa_needs_the_adapter_namespace_and_the_custom_metrics_api(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    raw = prod_raw()
    raw["cluster"] = {**raw["cluster"], "autoscaling": "hpa"}
    assert {need.path for need in needs(parse(raw))} == (ALL - {KEDA}) | ADAPTER
    handler.present.update(ALL)
    warnings, _ = check(parse(raw), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("cluster prerequisite: namespace monitoring does not exist: `pulumi up` fails creating the adapter")
    assert "install Prometheus and prometheus-adapter" in warnings[1]


def test_the_gateway_edge_needs_the_gateway_api_and_its_gateway(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    raw = prod_raw()
    raw["cluster"] = behind_gateway(raw["cluster"], {"name": "public", "namespace": "edge"})
    for model in raw["models"]:
        model["ingress"].pop("tlsSecret", None)  # the Gateway's listener terminates TLS
    route_crd = f"{CRDS}/httproutes.gateway.networking.k8s.io"
    paths = {need.path for need in needs(parse(raw))}
    assert route_crd in paths and "/apis/gateway.networking.k8s.io/v1/namespaces/edge/gateways/public" in paths
    assert not [p for p in paths if "ingressclasses" in p or "cert-manager" in p]
    handler.present.update(ALL)
    warnings, _ = check(parse(raw), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert len(warnings) == 1 and "the Gateway API is not installed" in warnings[0], warnings
    handler.present.add(route_crd)
    warnings, _ = check(parse(raw), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert warnings == ["cluster prerequisite: no Gateway edge/public: the HTTPRoutes would attach to nothing; create it, "
                        "or set cluster.gateway to an existing one"]


HOLD_CRD = f"{CRDS}/interceptorroutes.http.keda.sh"
OLD_HOLD_CRD = f"{CRDS}/httpscaledobjects.http.keda.sh"
INTERCEPTOR = "/api/v1/namespaces/keda/services/keda-add-ons-http-interceptor-proxy"


def held_raw(**cluster: object) -> dict:
    raw = prod_raw()
    raw["cluster"] = {**raw["cluster"], "requestHold": {}, **cluster}
    raw["models"][0]["replicas"] = {"min": 0, "max": 2}
    return raw


def test_a_held_model_needs_the_http_add_on_and_its_interceptor(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    assert {need.path for need in needs(parse(held_raw()))} == ALL | {HOLD_CRD, INTERCEPTOR}
    assert {need.path for need in needs(parse(prod_raw()))} == ALL  # min 1: nothing of the add-on
    # An add-on of v0.12 (only the HTTPScaledObject CRD): upgrade it before the stack's holds can move to InterceptorRoutes.
    handler.present.update(ALL | {OLD_HOLD_CRD})
    warnings, _ = check(parse(held_raw()), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert len(warnings) == 1 and "KEDA's HTTP add-on v0.14 or later is not installed (no InterceptorRoute CRD)" in warnings[0], warnings
    assert "install or upgrade it (Helm chart kedacore/keda-add-ons-http, v0.15.0" in warnings[0]
    assert INTERCEPTOR not in handler.seen  # one warning, not two
    handler.present.add(HOLD_CRD)
    warnings, _ = check(parse(held_raw(requestHold={"namespace": "keda-http"})), kubeconfig(server), ".kube/prod.yaml", tmp_path)
    assert warnings == ["cluster prerequisite: no Service keda-http/keda-add-ons-http-interceptor-proxy (the HTTP add-on is installed): "
                        "the held models' requests would reach nothing; set cluster.requestHold to where the add-on's interceptor runs"]


def test_a_held_route_needs_the_reference_grant_crd() -> None:
    raw = held_raw()
    raw["cluster"] = behind_gateway(raw["cluster"], {"name": "public", "namespace": "edge"})
    raw["models"][0]["ingress"].pop("tlsSecret")
    assert f"{CRDS}/referencegrants.gateway.networking.k8s.io" in {need.path for need in needs(parse(raw))}
    assert f"{CRDS}/referencegrants.gateway.networking.k8s.io" not in {need.path for need in needs(parse(held_raw()))}


def test_a_kubeconfig_with_other_context_names_says_how_to_rename(tmp_path: Path) -> None:
    text = kubeconfig("https://127.0.0.1:1", context="kind-gpu")
    warnings, notes = check(parse(prod_raw()), text, ".kube/prod.yaml", tmp_path)
    assert notes == []
    assert warnings == ["cluster.kubeconfig.context 'prod' is not in .kube/prod.yaml (it has: kind-gpu); rename it: "
                        "`kubectl --kubeconfig .kube/prod.yaml config rename-context kind-gpu prod`"]


def test_an_unreachable_cluster_or_exec_user_skips_with_a_note(tmp_path: Path) -> None:
    _, notes = check(parse(prod_raw()), kubeconfig("http://127.0.0.1:9"), ".kube/prod.yaml", tmp_path)
    assert len(notes) == 1 and notes[0].startswith("cluster prerequisites not checked: cannot read http://127.0.0.1:9")
    exec_user = kubeconfig("http://127.0.0.1:9", user={"exec": {"command": "aws"}})
    assert check(parse(prod_raw()), exec_user, "k", tmp_path) == ([], [
        "cluster prerequisites not checked: the kubeconfig user authenticates with an exec plugin or auth provider"])


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def test_tls_with_client_certificates_in_the_kubeconfig(tmp_path: Path) -> None:
    """The loopback cluster's (and most clusters') kubeconfig: a CA and a client certificate, inline."""
    for name, subject in (("ca", "/CN=test-ca"), ("server", "/CN=127.0.0.1"), ("client", "/CN=admin")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=tmp_path)
        if name == "ca":
            (tmp_path / "ca.ext").write_text("basicConstraints=critical,CA:TRUE\nkeyUsage=keyCertSign\n")
            openssl("x509", "-req", "-in", "ca.csr", "-signkey", "ca.key", "-days", "2", "-out", "ca.crt", "-extfile", "ca.ext",
                    cwd=tmp_path)
            continue
        (tmp_path / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n" if name == "server" else "extendedKeyUsage=clientAuth\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=tmp_path)
    handler = type("Api", (FakeApi,), {"present": set(ALL), "seen": [], "token": None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    tls.load_verify_locations(tmp_path / "ca.crt")
    tls.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no answer
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        def data(name: str) -> str:
            return base64.b64encode((tmp_path / name).read_bytes()).decode()

        url = f"https://127.0.0.1:{server.server_address[1]}"
        inline = kubeconfig(url, user={"client-certificate-data": data("client.crt"), "client-key-data": data("client.key")},
                            cluster={"certificate-authority-data": data("ca.crt")})
        assert check(parse(prod_raw()), inline, "k", tmp_path) == ([], [])
        assert handler.seen, "the checks reached the TLS server"
        by_path = kubeconfig(url, user={"client-certificate": "client.crt", "client-key": "client.key"},
                             cluster={"certificate-authority": "ca.crt"})
        handler.present.discard("/apis/networking.k8s.io/v1/ingressclasses/nginx")
        warnings, notes = check(parse(prod_raw()), by_path, "k", tmp_path)  # paths relative to the kubeconfig's folder
        assert notes == [] and len(warnings) == 1 and "IngressClass nginx" in warnings[0]
    finally:
        server.shutdown()
        server.server_close()


def test_preview_warns_and_render_reads_no_cluster(api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube/prod.yaml").write_text(kubeconfig(server))
    logged: list[str] = []
    monkeypatch.setattr(prerequisites.pulumi.log, "warn", lambda message, *a, **k: logged.append(message))
    prerequisites.warn_missing(parse(prod_raw()), base=tmp_path)  # the offline render is no preview
    assert logged == [] and handler.seen == []
    monkeypatch.setattr(prerequisites.pulumi.runtime, "is_dry_run", lambda: True)
    prerequisites.warn_missing(parse(prod_raw()), base=tmp_path)
    assert len(logged) == 5 and handler.seen
    rendering = prod_raw()
    rendering["cluster"] = {k: v for k, v in rendering["cluster"].items() if k != "kubeconfig"} | {"renderYamlTo": "out"}
    handler.seen.clear()
    prerequisites.warn_missing(parse(rendering), base=tmp_path)
    assert handler.seen == []
    assert not [w for w in run_program("prod").warnings if "prerequisite" in w]


ENDPOINT_GATEWAY = "/apis/gateway.networking.k8s.io/v1/namespaces/envoy-gateway-system/gateways/ai-gateway"
ENVOY_GATEWAY = f"{CRDS}/securitypolicies.gateway.envoyproxy.io"
AI_GATEWAY = f"{CRDS}/aigatewayroutes.aigateway.envoyproxy.io"
POOLS = f"{CRDS}/inferencepools.inference.networking.k8s.io"
HELD_BACKEND_KINDS = {f"{CRDS}/backends.gateway.envoyproxy.io", f"{CRDS}/backendsecuritypolicies.aigateway.envoyproxy.io"}


def endpoint_check(server: str, raw: dict, tmp_path: Path) -> list[str]:
    warnings, notes = check(parse(raw), kubeconfig(server, context="endpoint"), ".kube/endpoint.yaml", tmp_path)
    assert notes == []
    return warnings


def test_the_endpoint_needs_both_gateways_the_inference_extension_and_its_gateway(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    raw = example_raw()
    wanted = {need.path for need in needs(parse(raw))}
    assert {ENVOY_GATEWAY, AI_GATEWAY, POOLS, ENDPOINT_GATEWAY} <= wanted and not wanted & HELD_BACKEND_KINDS
    handler.present.update(wanted - {ENVOY_GATEWAY, AI_GATEWAY, POOLS, ENDPOINT_GATEWAY})
    warnings = endpoint_check(server, raw, tmp_path)
    assert [w.split(":")[1].strip() for w in warnings] == [
        "Envoy Gateway is not installed (no SecurityPolicy CRD)", "Envoy AI Gateway is not installed (no AIGatewayRoute CRD)",
        "the Gateway API Inference Extension is not installed (no InferencePool CRD)",
        "no Gateway envoy-gateway-system/ai-gateway"], warnings
    assert all("install" in w or "create it" in w for w in warnings)
    handler.present.update({ENVOY_GATEWAY, AI_GATEWAY, POOLS, ENDPOINT_GATEWAY})
    assert endpoint_check(server, raw, tmp_path) == []


def test_a_held_model_on_the_endpoint_needs_its_backends_kinds_and_no_pool(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, handler = api
    raw = example_raw()
    for model in raw["models"]:
        model.update(replicas={"min": 0, "max": 1}, apiKeySecret="heldKey")
    raw["cluster"]["requestHold"] = {}
    wanted = {need.path for need in needs(parse(raw))}
    assert wanted >= HELD_BACKEND_KINDS and POOLS not in wanted
    handler.present.update(wanted - HELD_BACKEND_KINDS)
    warnings = endpoint_check(server, raw, tmp_path)
    assert len(warnings) == 2 and "no Backend CRD" in warnings[0] and "no BackendSecurityPolicy CRD" in warnings[1], warnings
    handler.present.clear()  # neither gateway: one warning each, not one per kind of theirs
    warnings = endpoint_check(server, raw, tmp_path)
    assert not any("Backend" in w for w in warnings), warnings


def test_without_the_endpoint_nothing_of_it_is_checked() -> None:
    paths = {need.path for need in needs(parse(prod_raw()))}
    assert not paths & ({ENVOY_GATEWAY, AI_GATEWAY, POOLS, ENDPOINT_GATEWAY} | HELD_BACKEND_KINDS)


def test_a_model_spanning_nodes_needs_leader_worker_set_and_no_deployment_of_its_old_shape(api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """LeaderWorkerSet's CRD and webhook (issue #41); and the model's Deployment from before `nodesPerReplica`, which
    holds the GPUs its groups wait for until the `up` deletes it at the end: present, it is what is warned of."""
    server, handler = api
    document = yaml.safe_load((ROOT / "docs/examples/Pulumi.multinode.yaml").read_text())["config"]
    raw = {key.split(":", 1)[1]: value for key, value in document.items()}
    raw["cluster"] = {**raw["cluster"], "autoscaling": "none", "monitoring": {"podMonitor": False, "alerts": False}}
    raw["models"][0]["replicas"] = {"min": 1, "max": 1}
    crd = f"{CRDS}/leaderworkersets.leaderworkerset.x-k8s.io"
    webhook = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/lws-mutating-webhook-configuration"
    old = "/apis/apps/v1/namespaces/ai/deployments/vllm-llama-405b"
    warnings, _ = check(parse(raw), kubeconfig(server, context="multinode"), ".kube/multinode.yaml", tmp_path)
    assert len(warnings) == 1 and "LeaderWorkerSet is not installed" in warnings[0] and webhook not in handler.seen
    handler.present.add(crd)
    warnings, _ = check(parse(raw), kubeconfig(server, context="multinode"), ".kube/multinode.yaml", tmp_path)
    assert len(warnings) == 1 and "no lws-mutating-webhook-configuration" in warnings[0]
    handler.present.update({webhook, old})
    warnings, _ = check(parse(raw), kubeconfig(server, context="multinode"), ".kube/multinode.yaml", tmp_path)
    assert warnings == ["cluster prerequisite: models[0] (llama-405b) now spans 2 nodes, but its Deployment vllm-llama-405b "
                        "from before still holds its GPUs, and `pulumi up` deletes it only after the LeaderWorkerSet, which "
                        "waits for GPUs; with none to spare for both, delete it first (`kubectl -n ai delete deployment "
                        "vllm-llama-405b`: the model is down until its groups are Ready), then `pulumi up`"]
    handler.present.discard(old)
    assert check(parse(raw), kubeconfig(server, context="multinode"), ".kube/multinode.yaml", tmp_path) == ([], [])
