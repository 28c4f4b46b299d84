"""What the cluster must already have, checked at `pulumi preview`: one warning per missing piece,
saying what to install, before `pulumi up` fails on it halfway.

The stack creates objects that other software serves: an Ingress needs a controller that owns its
IngressClass, an HTTPRoute the Gateway API CRDs and its Gateway, TLS needs cert-manager and the
ClusterIssuer, PodMonitors and PrometheusRules the Prometheus Operator's CRDs, HPAs need the custom
metrics API of prometheus-adapter (whose rules ConfigMap goes into the adapter's namespace), KEDA
needs its CRDs, a model at `replicas.min: 0` KEDA's HTTP add-on (its CRD and interceptor Service), a model spanning
nodes LeaderWorkerSet (its CRD and its controller's webhook), and the teams' endpoint Envoy Gateway, Envoy AI Gateway
and the Inference Extension (their CRDs) and its Gateway.

The objects are read straight from the API server with the stack's own kubeconfig. The provider's
`.get()` is not used: a missing object makes it fail the whole preview with "resource does not
exist", with no way to turn that into advice, and it records a read resource in the state. Only
when the engine previews against a cluster: the offline render (mock engine, not a preview) and
`renderYamlTo` stacks read nothing. An unreachable cluster or an exec-plugin user skips the checks
with one informational line; the provider reports the connection itself.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml

from components.serving import autoscaler, needs_adapter_rules
from stacks.config import StackConfig

TIMEOUT_S = 5
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@dataclass(frozen=True)
class Need:
    """One object the stack relies on, and what to do when the cluster lacks it."""

    path: str
    """API path that answers 200 when it is there."""
    missing: str
    """The warning, naming what to install or create."""
    unless_missing: str | None = None
    """Skip this one when that path is missing (a CRD before its objects): one warning, not two."""
    present: bool = False
    """Warn when the path is there instead (an object left from before that stands in the way)."""


def needs(config: StackConfig) -> list[Need]:
    cluster, models = config.cluster, config.models
    found: list[Need] = []
    if not cluster.create_namespace:
        found.append(Need(f"/api/v1/namespaces/{cluster.namespace}",
                          f"namespace {cluster.namespace} does not exist and cluster.createNamespace is false: "
                          f"create it (`kubectl create namespace {cluster.namespace}`) or set createNamespace: true"))
    exposed = any(m.ingress is not None for m in models)
    if exposed and cluster.edge == "gateway":
        assert cluster.gateway is not None
        gateway = cluster.gateway
        crd = f"{CRDS}/httproutes.gateway.networking.k8s.io"
        found.append(Need(crd, "the Gateway API is not installed (no HTTPRoute CRD): `pulumi up` cannot create the models' "
                               "HTTPRoutes; install the Gateway API CRDs and a Gateway controller, or set cluster.edge: ingress"))
        found.append(Need(f"/apis/gateway.networking.k8s.io/v1/namespaces/{gateway.namespace}/gateways/{gateway.name}",
                          f"no Gateway {gateway.namespace}/{gateway.name}: the HTTPRoutes would attach to nothing; create it, "
                          f"or set cluster.gateway to an existing one", unless_missing=crd))
    if exposed and cluster.edge == "ingress":
        found.append(Need(f"/apis/networking.k8s.io/v1/ingressclasses/{cluster.ingress_class}",
                          f"no IngressClass {cluster.ingress_class}: the model Ingresses would get no address; install "
                          f"an ingress controller that provides it (ingress-nginx's is `nginx`) or set cluster.ingressClass"))
    monitors = [kind for kind, on in (("podmonitors", cluster.monitoring.pod_monitor), ("prometheusrules", cluster.monitoring.alerts))
                if on and models]
    for kind in monitors:
        found.append(Need(f"{CRDS}/{kind}.monitoring.coreos.com",
                          f"the Prometheus Operator is not installed (no {kind} CRD): `pulumi up` cannot create the models' "
                          f"{'PodMonitors' if kind == 'podmonitors' else 'PrometheusRules'}; install kube-prometheus-stack, "
                          f"or turn them off with cluster.monitoring"))
    if cluster.cluster_issuer and any(m.ingress is not None and m.ingress.tls_secret for m in models):
        crd = f"{CRDS}/clusterissuers.cert-manager.io"
        found.append(Need(crd, f"cert-manager is not installed (no ClusterIssuer CRD): install it and create ClusterIssuer "
                               f"{cluster.cluster_issuer}, or the Ingresses' TLS certificates are never issued"))
        found.append(Need(f"/apis/cert-manager.io/v1/clusterissuers/{cluster.cluster_issuer}",
                          f"no ClusterIssuer {cluster.cluster_issuer} (cert-manager is installed): create it, or set "
                          f"cluster.clusterIssuer to an existing one", unless_missing=crd))
    if any(autoscaler(cluster, m) == "keda" for m in models):
        found.append(Need(f"{CRDS}/scaledobjects.keda.sh",
                          "KEDA is not installed (no ScaledObject CRD): `pulumi up` cannot create the ScaledObjects; "
                          "install KEDA, or set cluster.autoscaling to hpa or none"))
    hold = cluster.request_hold
    if hold is not None and any(m.scales_to_zero for m in models):
        crd = f"{CRDS}/interceptorroutes.http.keda.sh"
        found.append(Need(crd, "KEDA's HTTP add-on v0.14 or later is not installed (no InterceptorRoute CRD): `pulumi up` cannot "
                               "create the request holds of the models at replicas.min: 0; install or upgrade it (Helm chart "
                               "kedacore/keda-add-ons-http, v0.15.0: an older add-on keeps holding for the HTTPScaledObjects of the "
                               "last `up` until then), or give those models min: 1"))
        found.append(Need(f"/api/v1/namespaces/{hold.namespace}/services/{hold.interceptor_service}",
                          f"no Service {hold.namespace}/{hold.interceptor_service} (the HTTP add-on is installed): the held models' "
                          f"requests would reach nothing; set cluster.requestHold to where the add-on's interceptor runs",
                          unless_missing=crd))
        if any(m.scales_to_zero and m.ingress is not None for m in models) and cluster.edge == "gateway":
            found.append(Need(f"{CRDS}/referencegrants.gateway.networking.k8s.io",
                              "the Gateway API has no ReferenceGrant CRD: the held models' HTTPRoutes cannot reach the interceptor in "
                              f"{hold.namespace}; install the Gateway API's standard CRDs",
                              unless_missing=f"{CRDS}/httproutes.gateway.networking.k8s.io"))
    if needs_adapter_rules(cluster, models):
        adapter = cluster.prometheus_adapter
        found.append(Need(f"/api/v1/namespaces/{adapter.namespace}",
                          f"namespace {adapter.namespace} does not exist: `pulumi up` fails creating the adapter rules "
                          f"ConfigMap in it; install Prometheus and prometheus-adapter there, or set "
                          f"cluster.prometheusAdapter.namespace to the adapter's namespace"))
        found.append(Need("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.custom.metrics.k8s.io",
                          "no custom metrics API (v1beta1.custom.metrics.k8s.io): the HPAs cannot read "
                          "vllm_num_requests_waiting; install Prometheus and prometheus-adapter with the rules ConfigMap, "
                          "or set cluster.autoscaling to keda or none"))
    if any(m.spans_nodes for m in models):
        crd = f"{CRDS}/leaderworkersets.leaderworkerset.x-k8s.io"
        install = ("install LeaderWorkerSet v0.9 or later (`kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/"
                   "releases/download/v0.9.0/manifests.yaml`, or its Helm chart), or set the models' nodesPerReplica: 1")
        found.append(Need(crd, f"LeaderWorkerSet is not installed (no LeaderWorkerSet CRD): `pulumi up` cannot create the groups "
                               f"of the models spanning nodes; {install}"))
        # Its pod webhook gives each member the leader's address: without it the workers never find their leader.
        found.append(Need("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/lws-mutating-webhook-configuration",
                          f"LeaderWorkerSet's controller is not installed (no lws-mutating-webhook-configuration: its webhook gives "
                          f"each group member its leader's address); {install}", unless_missing=crd))
    found += reshaped(config)
    found += sharing_needs(config)
    found += endpoint_needs(config, gateway_checked=exposed and cluster.edge == "gateway")
    return found


def reshaped(config: StackConfig) -> list[Need]:
    """A model moved from one node to several per replica: its Deployment still holds its GPUs, and `pulumi up`
    deletes it only at the end, after the LeaderWorkerSet it waits for, which finds no GPU where there are none to
    spare. (The other way round is the same; docs/models.md says so, and a preview does not look for every model's
    LeaderWorkerSet.)"""
    namespace = config.cluster.namespace
    return [Need(f"/apis/apps/v1/namespaces/{namespace}/deployments/vllm-{m.name}",
                 f"models[{i}] ({m.name}) now spans {m.nodes_per_replica} nodes, but its Deployment vllm-{m.name} from before "
                 f"still holds its GPUs, and `pulumi up` deletes it only after the LeaderWorkerSet, which waits for GPUs; with "
                 f"none to spare for both, delete it first (`kubectl -n {namespace} delete deployment vllm-{m.name}`: the model "
                 f"is down until its groups are Ready), then `pulumi up`", present=True)
            for i, m in enumerate(config.models) if m.spans_nodes]


def endpoint_needs(config: StackConfig, gateway_checked: bool) -> list[Need]:
    """With `cluster.endpoint`: Envoy Gateway and AI Gateway (the teams' routes, keys and limits), the Inference
    Extension (a pool per model), the Gateway the routes attach to, and for a held model the kinds its backend takes.
    One warning per missing installation: the kinds one chart installs together are checked by one of them."""
    cluster = config.cluster
    if cluster.endpoint is None:
        return []
    assert cluster.gateway is not None
    gateway, install = cluster.gateway, "install Envoy Gateway v1.8.1 or later with Envoy AI Gateway v1.0 (docs/endpoint.md)"
    routes, policies = f"{CRDS}/aigatewayroutes.aigateway.envoyproxy.io", f"{CRDS}/securitypolicies.gateway.envoyproxy.io"
    found = [Need(policies, f"Envoy Gateway is not installed (no SecurityPolicy CRD): `pulumi up` cannot create the teams' key "
                            f"checks and limits; {install}"),
             Need(routes, f"Envoy AI Gateway is not installed (no AIGatewayRoute CRD): `pulumi up` cannot create the teams' "
                          f"routes; {install}")]
    served = [m for m in config.models if config.on_endpoint(m)]
    if any(not m.scales_to_zero for m in served):
        found.append(Need(f"{CRDS}/inferencepools.inference.networking.k8s.io",
                          "the Gateway API Inference Extension is not installed (no InferencePool CRD): `pulumi up` cannot "
                          "create the models' pools; install its v1.5.0 CRDs (config/crd of "
                          "kubernetes-sigs/gateway-api-inference-extension)"))
    if any(m.scales_to_zero for m in served):
        found.append(Need(f"{CRDS}/backends.gateway.envoyproxy.io",
                          "Envoy Gateway has no Backend CRD (older than v1.2?): `pulumi up` cannot create the backends of the "
                          f"models at replicas.min: 0 behind the endpoint; {install}", unless_missing=policies))
        found.append(Need(f"{CRDS}/backendsecuritypolicies.aigateway.envoyproxy.io",
                          "Envoy AI Gateway has no BackendSecurityPolicy CRD: `pulumi up` cannot give the models at "
                          f"replicas.min: 0 their keys; {install}", unless_missing=routes))
    if not gateway_checked:
        found.append(Need(f"/apis/gateway.networking.k8s.io/v1/namespaces/{gateway.namespace}/gateways/{gateway.name}",
                          f"no Gateway {gateway.namespace}/{gateway.name}: the teams' routes would attach to nothing; create it "
                          f"(an HTTPS listener for *.{cluster.endpoint.domain}), or set cluster.gateway to an existing one"))
    return found


def sharing_needs(config: StackConfig) -> list[Need]:
    """With `gpu.sharing`: for MIG the GPU Operator, whose MIG manager creates the instances (the stack only writes
    their layout), and the namespaces the sharing configs are written to."""
    cluster, found = config.cluster, []
    sharing = [n.gpu.sharing for n in config.nodes if n.gpu.sharing is not None]
    written: dict[str, list[str]] = {}
    if sharing:
        plugin = cluster.device_plugin
        written.setdefault(plugin.namespace, []).append(
            f"the device plugin's sharing ConfigMap {plugin.config_map_name} (cluster.devicePlugin.namespace)")
    if any(s.mig is not None for s in sharing):
        manager = cluster.mig_manager
        found.append(Need(f"{CRDS}/clusterpolicies.nvidia.com",
                          "the GPU Operator is not installed (no ClusterPolicy CRD): nothing creates the MIG instances of the "
                          "gpu.sharing.mig nodes (its MIG manager reads the layouts the stack writes), so their pods stay "
                          f"Pending on nvidia.com/mig-*; install it with mig.strategy=mixed and migManager.config.name="
                          f"{manager.config_map_name}"))
        written.setdefault(manager.namespace, []).append(
            f"the MIG layouts ConfigMap {manager.config_map_name} (cluster.migManager.namespace)")
    for namespace, what in written.items():
        found.append(Need(f"/api/v1/namespaces/{namespace}",
                          f"namespace {namespace} does not exist: `pulumi up` fails creating {' and '.join(what)} in it; "
                          "set it to the namespace the device plugin (its Helm release's, or the GPU Operator's) and the "
                          "MIG manager run in"))
    return found


def missing(get: Callable[[str], int], wanted: list[Need]) -> list[str]:
    """The warnings for what `get` (path → HTTP status) does not find (or, for a `present` one, finds); other answers
    are not guessed at."""
    status: dict[str, int] = {}
    warnings = []
    for need in wanted:
        if need.unless_missing is not None and status.get(need.unless_missing) == 404:
            continue
        status[need.path] = get(need.path)
        if status[need.path] == (200 if need.present else 404):
            warnings.append(need.missing)
    return warnings


class UnsupportedAuthError(Exception):
    """The kubeconfig authenticates in a way this check does not (exec plugins, auth providers)."""


def _named(entries: list[dict[str, Any]] | None, name: str, kind: str) -> dict[str, Any]:
    for entry in entries or []:
        if entry.get("name") == name:
            return entry.get(kind) or {}
    raise UnsupportedAuthError(f"no {kind} {name!r} in the kubeconfig")


def context_error(text: str, context: str | None, source: str) -> str | None:
    """One line when the stack names a context the kubeconfig does not have (a copied ~/.kube/config
    keeps its own context names), with the command that fixes it."""
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return None
    if not isinstance(document, dict) or context is None:
        return None
    names = [c.get("name") for c in document.get("contexts") or [] if isinstance(c, dict)]
    if context in names:
        return None
    rename = (f"; rename it: `kubectl --kubeconfig {source} config rename-context {names[0]} {context}`"
              if len(names) == 1 else "")
    return (f"cluster.kubeconfig.context {context!r} is not in {source} (it has: {', '.join(map(str, names)) or 'none'})"
            f"{rename}")


def api_getter(text: str, context: str | None, base: Path, workdir: Path) -> tuple[str, Callable[[str], int]]:
    """(server, get) for the kubeconfig's context: get(path) → HTTP status of a GET."""
    document = yaml.safe_load(text) or {}
    name = context or document.get("current-context")
    ctx = _named(document.get("contexts"), name, "context")
    cluster = _named(document.get("clusters"), ctx.get("cluster"), "cluster")
    user = _named(document.get("users"), ctx.get("user"), "user") if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise UnsupportedAuthError("the kubeconfig user authenticates with an exec plugin or auth provider")

    def file_of(key: str, entry: dict[str, Any]) -> str | None:
        """A path for `key` (relative paths are relative to the kubeconfig) or its `-data` twin in a private file."""
        if entry.get(f"{key}-data"):
            path = workdir / key
            path.write_bytes(base64.b64decode(entry[f"{key}-data"]))
            path.chmod(0o600)
            return str(path)
        return str(base / entry[key]) if entry.get(key) else None

    server = str(cluster.get("server", "")).rstrip("/")
    context_tls = ssl.create_default_context(cafile=file_of("certificate-authority", cluster))
    if cluster.get("insecure-skip-tls-verify"):
        context_tls.check_hostname = False
        context_tls.verify_mode = ssl.CERT_NONE
    cert, key = file_of("client-certificate", user), file_of("client-key", user)
    if cert and key:
        context_tls.load_cert_chain(cert, key)
    headers = {"Accept": "application/json"}
    token = user.get("token") or (Path(base / user["tokenFile"]).read_text().strip() if user.get("tokenFile") else None)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif user.get("username") and user.get("password"):
        basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
        headers["Authorization"] = f"Basic {basic}"
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context_tls))

    def get(path: str) -> int:
        try:
            with opener.open(urllib.request.Request(server + path, headers=headers), timeout=TIMEOUT_S) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    return server, get


def check(config: StackConfig, kubeconfig_text: str, source: str, base: Path) -> tuple[list[str], list[str]]:
    """(warnings, notes): what the cluster lacks, and why a check could not run."""
    source_kubeconfig = config.cluster.kubeconfig
    assert source_kubeconfig is not None
    wrong_context = context_error(kubeconfig_text, source_kubeconfig.context, source)
    if wrong_context:
        return [wrong_context], []
    wanted = needs(config)
    if not wanted:
        return [], []
    with tempfile.TemporaryDirectory(prefix="gs-kubeconfig-") as tmp:
        os.chmod(tmp, 0o700)
        server = "the cluster"
        try:
            server, get = api_getter(kubeconfig_text, source_kubeconfig.context, base, Path(tmp))
            warnings = missing(get, wanted)
        except UnsupportedAuthError as exc:
            return [], [f"cluster prerequisites not checked: {exc}"]
        except (OSError, ValueError, yaml.YAMLError) as exc:  # URLError and SSLError are OSErrors
            reason = getattr(exc, "reason", None) or exc
            return [], [f"cluster prerequisites not checked: cannot read {server} ({reason})"]
    return [f"cluster prerequisite: {w}" for w in warnings], []


def report(config: StackConfig, kubeconfig_text: str, source: str, base: Path) -> None:
    warnings, notes = check(config, kubeconfig_text, source, base)
    for line in warnings:
        pulumi.log.warn(line)
    for line in notes:
        pulumi.log.info(line)


def warn_missing(config: StackConfig, kubeconfig_secret: pulumi.Output[str] | None = None, base: Path | None = None) -> None:
    """At `pulumi preview` (and the preview of `pulumi up`) against a cluster: warn for each missing piece.
    `kubeconfig_secret` is the text of the secret `cluster.kubeconfig.secret` names (None without one)."""
    source = config.cluster.kubeconfig
    if source is None or config.cluster.render_yaml_to is not None or not pulumi.runtime.is_dry_run():
        return
    base = base or Path.cwd()
    if source.secret:
        assert kubeconfig_secret is not None, f"kubeconfig_secret: the secret {source.secret} is not passed"
        kubeconfig_secret.apply(lambda text: report(config, text, f"secret {source.secret}", base))
        return
    assert source.path is not None
    path = base / source.path
    try:
        text = path.read_text()
    except OSError:
        return  # the provider says it cannot read its kubeconfig
    report(config, text, source.path, path.parent)
