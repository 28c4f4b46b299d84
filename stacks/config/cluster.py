"""`cluster`: which cluster, how GPU nodes are marked, and the cluster add-ons the models rely on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from stacks.config.base import (
    CIDR,
    DNS_DOMAIN,
    LABEL_KEY,
    ImageRef,
    K8sName,
    LabelValue,
    PodLabels,
    SecretKeyName,
    _at,
    _Model,
    refuse_loopback,
)
from stacks.config.endpoint import Endpoint

# The project's own node label keys: GPU Feature Discovery owns `nvidia.com/gpu.*` and rewrites them
# (`nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB`), so labels the stack force-set there would flap.
GPU_PRODUCT_LABEL = "gpu-serving/gpu.product"
GPU_COUNT_LABEL = "gpu-serving/gpu.count"
GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"
# With gpu.sharing, what a node advertises, in the project's own keys after GFD's (`nvidia.com/gpu.replicas`,
# `nvidia.com/mig-<profile>.count`): the policy pack counts capacity from either.
GPU_REPLICAS_LABEL = "gpu-serving/gpu.replicas"


def mig_count_label(profile: str) -> str:
    return f"gpu-serving/mig-{profile}.count"


# Folders `make render` and `make clean` replace or remove (tools/render.py, Makefile).
WIPED_FOLDERS = ("rendered", "bench-out")
PROJECT_DIR = Path(__file__).resolve().parents[2]


class Kubeconfig(_Model):
    """Which cluster the explicit Kubernetes provider talks to. Exactly one source."""

    path: str | None = Field(None, min_length=1, pattern=r"^[^~]")
    """Kubeconfig file on the machine that runs `pulumi`: absolute, or relative to the project folder."""
    secret: SecretKeyName | None = None
    """Name of a secret config key that holds the kubeconfig text."""
    context: str | None = Field(None, min_length=1)
    """Context inside the kubeconfig; the file's current context when unset."""

    @model_validator(mode="after")
    def _one_source(self) -> Kubeconfig:
        if (self.path is None) == (self.secret is None):
            raise ValueError("set exactly one of `path` or `secret` (never the ambient default)")
        return self


class GpuTaint(_Model):
    key: str = Field("nvidia.com/gpu", pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$")
    """Taint key."""
    value: LabelValue = "true"
    """Taint value."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    """Taint effect."""


class DevicePlugin(_Model):
    enabled: bool = False
    """Deploy the device plugin from this stack."""
    image: ImageRef = "nvcr.io/nvidia/k8s-device-plugin:v0.19.3"
    """Device plugin image with a release version tag or a digest."""
    namespace: K8sName = "kube-system"
    """Namespace of the DaemonSet, and of the ConfigMap of per-node configs written when a node has `gpu.sharing`: the
    plugin reads its config from its own namespace (the Helm chart's release namespace; the GPU Operator's `gpu-operator`)."""
    config_map_name: K8sName = "gpu-serving-device-plugin-config"
    """That ConfigMap: point the Helm chart's `config.name` (the GPU Operator's `devicePlugin.config.name`) at it."""


class MigManager(_Model):
    """Where NVIDIA's MIG manager (GPU Operator) reads the MIG layouts the stack writes for `gpu.sharing.mig` nodes."""

    namespace: K8sName = "gpu-operator"
    """Namespace of the MIG manager."""
    config_map_name: K8sName = "gpu-serving-mig-parted-config"
    """ConfigMap of the layouts (key `config.yaml`): point the operator's `migManager.config.name` at it."""


class PrometheusAdapter(_Model):
    """Where the prometheus-adapter rule that turns the vLLM queue gauge into a Pods metric goes."""

    namespace: K8sName = "monitoring"
    """Namespace of prometheus-adapter."""
    config_map_name: K8sName = "gpu-serving-adapter-rules"
    """ConfigMap with the rule (`config.yaml`); point the adapter at it."""


class Monitoring(_Model):
    """What the Prometheus Operator (kube-prometheus-stack) needs: it ignores `prometheus.io/*` annotations; and the
    dashboards its Grafana loads."""

    pod_monitor: bool = True
    """One PodMonitor (`gpu-serving-servers`) for every model's serving pods, so the operator's Prometheus scrapes
    `/metrics` (autoscaling and alerts read it)."""
    alerts: bool = True
    """A PrometheusRule per model: no pod ready, queue stalled (per pod), requests preempted, download Job failed."""
    labels: dict[Annotated[str, StringConstraints(pattern=LABEL_KEY)], LabelValue] = {}
    """Labels the Prometheus selects PodMonitors and PrometheusRules by (kube-prometheus-stack: `release: <release>`)."""
    dashboards: bool = True
    """Grafana dashboards as ConfigMaps: the models (a `model_name` variable) and the nodes (arrays, mount, GPUs)."""
    dashboard_labels: dict[Annotated[str, StringConstraints(pattern=LABEL_KEY)], LabelValue] = {"grafana_dashboard": "1"}
    """Labels the Grafana sidecar loads dashboard ConfigMaps by (kube-prometheus-stack: `grafana.sidecar.dashboards.label`
    `grafana_dashboard`, `labelValue` `"1"`)."""
    dashboard_namespace: K8sName | None = None
    """Namespace of the dashboard ConfigMaps; unset: the stack's. kube-prometheus-stack's sidecar searches every namespace
    (`searchNamespace: ALL`); a Grafana chart installed on its own searches only its own: name that one here."""


class Network(_Model):
    """Who may reach the model servers inside the cluster, and which resolver they may ask. vLLM's
    API key guards `/v1` only: `/metrics`, `/tokenize`, `/invocations` and the admin endpoints
    answer anyone who reaches the port, so the port is open to these pods alone."""

    ingress_namespace: K8sName = "ingress-nginx"
    """Namespace of the edge's proxy pods: ingress-nginx, or the Gateway implementation's data plane with `edge: gateway`."""
    ingress_pod_labels: PodLabels = {"app.kubernetes.io/name": "ingress-nginx"}
    """Labels of those proxy pods (the ingress-nginx chart's; for a Gateway, its data-plane pods')."""
    monitoring_namespace: K8sName = "monitoring"
    """Namespace of the Prometheus that scrapes `/metrics`."""
    monitoring_pod_labels: PodLabels = {"app.kubernetes.io/name": "prometheus"}
    """Labels of the Prometheus pods (kube-prometheus-stack's)."""
    client_namespaces: list[K8sName] = []
    """Namespaces whose pods call the models in-cluster (the exported `url`); by default none but the edge."""
    dns_namespace: K8sName = "kube-system"
    """Namespace of the cluster DNS, the only resolver the serving pods may ask."""
    dns_pod_labels: PodLabels = {"k8s-app": "kube-dns"}
    """Labels of the cluster DNS pods (CoreDNS and kube-dns both carry `k8s-app: kube-dns`)."""
    api_server_cidrs: list[Annotated[str, StringConstraints(pattern=CIDR)]] = []
    """Addresses of the Kubernetes API server as the pods reach it (`kubectl get endpoints kubernetes`): the endpoint
    pickers watch their pods there. Required with `cluster.endpoint` (a NetworkPolicy cannot name the API server)."""


class RequestHold(_Model):
    """KEDA's HTTP add-on (v0.15; v0.14 at least, for the InterceptorRoute), which holds the requests to a model at
    zero replicas while it starts: its interceptor proxy receives them and its external scaler wakes the model. The
    defaults are the add-on's Helm chart (`keda-add-ons-http`) installed in the namespace `keda`."""

    namespace: K8sName = "keda"
    """Namespace of the add-on's interceptor and external scaler."""
    interceptor_service: K8sName = "keda-add-ons-http-interceptor-proxy"
    """The interceptor's proxy Service, which the edge and in-cluster clients reach a held model through."""
    interceptor_port: int = Field(8080, ge=1, le=65535)
    """Port of that Service (the chart's `interceptor.proxy.port`)."""
    interceptor_pod_labels: PodLabels = {"app.kubernetes.io/component": "interceptor", "app.kubernetes.io/part-of": "keda-add-ons-http"}
    """Labels of the interceptor pods: the serving pods of a held model admit these pods, not the edge's."""
    scaler_service: K8sName = "keda-add-ons-http-external-scaler"
    """The add-on's external scaler Service, the `external-push` trigger that wakes a model."""
    scaler_port: int = Field(9090, ge=1, le=65535)
    """Its gRPC port (the chart's `scaler.grpcPort`)."""
    cluster_domain: str = Field("cluster.local", pattern=DNS_DOMAIN, max_length=253)
    """The cluster's DNS domain: the held model's ExternalName Service points at the interceptor's full name."""


class PodSecurity(_Model):
    """Pod Security admission labels of the namespace (`pod-security.kubernetes.io/*`)."""

    enforce: Literal["baseline", "restricted"] = "baseline"
    """Refused pods: `baseline` at least (no privileged, host namespaces or hostPath); `restricted` needs every model `nonRoot`."""
    warn: Literal["baseline", "restricted"] = "restricted"
    """Warned at apply time: `restricted` shows what a root profile still lacks."""


class PriorityClass(_Model):
    """The PriorityClass of the serving pods: above batch work, so the scheduler preempts a batch pod for a
    GPU pod and never the reverse."""

    name: K8sName = "gpu-serving"
    """Its name (the pods' `priorityClassName`)."""
    value: int = Field(1_000_000, ge=1, le=1_000_000_000)
    """Its priority; batch workloads are usually 0 (no class). At most 10⁹ (above is for system-critical pods)."""
    create: bool = True
    """Create it (cluster-scoped, kept when the stack goes); false when the cluster already defines `name`."""


class Gateway(_Model):
    """The Gateway API Gateway the models' HTTPRoutes attach to (it terminates TLS)."""

    name: K8sName
    """Gateway name."""
    namespace: K8sName
    """Gateway namespace; its listener's `allowedRoutes` must admit routes from `cluster.namespace`."""
    section_name: K8sName | None = None
    """Listener of the Gateway to attach to; unset: every listener that admits the route."""
    https: bool = True
    """Whether the listener serves HTTPS (only the URLs the stack exports depend on it)."""


class ClusterConfig(_Model):
    namespace: K8sName = "ai"
    """Namespace of every model object (Secret, Jobs, Deployment, Service, Ingress, autoscaler, claim)."""
    create_namespace: bool = True
    """Create the namespace (kept when the stack is deleted); false if it is managed elsewhere."""
    kubeconfig: Kubeconfig | None = None
    """Which cluster the explicit Kubernetes provider talks to; required unless `renderYamlTo` is set."""
    render_yaml_to: str | None = Field(None, min_length=1, pattern=r"^[^~]")
    """Folder where `pulumi up` writes every Kubernetes object as YAML (for Argo CD or Flux) instead of
    applying it; no cluster is contacted, and no Secret is written. Absolute, or relative to the project folder."""
    edge: Literal["ingress", "gateway"] = "ingress"
    """How models with `ingress` are exposed: an Ingress for ingress-nginx, or a Gateway API HTTPRoute to `gateway`."""
    gateway: Gateway | None = None
    """The Gateway HTTPRoutes attach to; required with `edge: gateway` and with `endpoint`."""
    endpoint: Endpoint | None = None
    """One OpenAI base URL per team (`tenants`) for every model it may use, on `gateway` with Envoy AI Gateway
    (docs/endpoint.md); unset: each model has its own edge (`models[].ingress`)."""
    ingress_class: K8sName = "nginx"
    """`ingressClassName` of every model Ingress; the nginx annotations assume ingress-nginx."""
    cluster_issuer: K8sName | None = None
    """cert-manager ClusterIssuer annotated on Ingresses that have a `tlsSecret`."""
    autoscaling: Literal["hpa", "keda", "none"] = "keda"
    """Autoscaler for models with `replicas.min < replicas.max`: KEDA (queries Prometheus), HPA (needs prometheus-adapter), or none."""
    gpu_taint: GpuTaint = GpuTaint()
    """Taint put on every GPU node and tolerated by GPU pods."""
    gpu_product_label: str = Field(GPU_PRODUCT_LABEL, pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$")
    """Node label the stack sets to `nodes[].gpu.product` (its count goes to `gpu-serving/gpu.count`); models select nodes by it.
    Never a `nvidia.com/` label: GPU Feature Discovery owns those and would flip them back."""
    gpu_feature_discovery: bool = False
    """GPU Feature Discovery (GPU Operator) labels the nodes: the stack leaves `nvidia.com/gpu.present` to it,
    and a model may select on GFD's `nvidia.com/gpu.product` with `gfdProduct`."""
    device_plugin: DevicePlugin = DevicePlugin()
    """NVIDIA device plugin DaemonSet (off: the cluster already has one, e.g. from the GPU Operator)."""
    mig_manager: MigManager = MigManager()
    """Where the MIG layouts of `gpu.sharing.mig` nodes are written (the MIG manager itself is the GPU Operator's)."""
    prometheus_adapter: PrometheusAdapter = PrometheusAdapter()
    """Where the adapter rule for the HPAs' queue metric is written."""
    runtime_class_name: K8sName | None = None
    """RuntimeClass of GPU pods (e.g. `nvidia`) when the NVIDIA runtime is not the node's default."""
    monitoring: Monitoring = Monitoring()
    """Prometheus Operator objects (the servers' PodMonitor, a PrometheusRule per model) and Grafana dashboards."""
    pod_security: PodSecurity = PodSecurity()
    """Pod Security admission levels put on the namespace (when the stack creates it)."""
    priority_class: PriorityClass | None = PriorityClass()
    """PriorityClass of the serving pods; null: none (the cluster's default priority)."""
    network: Network = Network()
    """The NetworkPolicies' peers: the edge, Prometheus, in-cluster clients, the cluster DNS."""
    require_commit_revisions: bool = True
    """Every `models[].revision` must be a 40-hex commit: a branch moves, so two nodes (or a re-download)
    could serve different weights under one name. false: a lab that follows a branch."""
    smoke_image: ImageRef = "curlimages/curl:8.11.1@sha256:c1fe1679c34d9784c1b0d1e5f62ac0a79fca01fb6377cdd33e90473c6f9f9a69"
    """Image of the smoke-test Job (needs `sh` and `curl`), pinned by digest; point it at a mirror for an air-gapped registry."""
    request_hold: RequestHold | None = None
    """KEDA's HTTP add-on, which holds requests while a model with `replicas.min: 0` starts; unset: no model may
    scale to zero (nothing would receive its requests or wake it)."""
    node_loss_eviction_seconds: int = Field(60, ge=0, le=3600)
    """With `modelStorage.type: nodeCache`: how long a model pod stays bound to an unreachable or not-ready node
    before it is evicted and rescheduled on another node that holds its weights (Kubernetes' default is 300)."""
    survive_node_loss: bool = False
    """A promise checked at load: with any one node gone, every model's `replicas.min` still fits the GPUs and
    the weights of the nodes left."""
    prometheus_url: str = Field("http://prometheus-operated.monitoring.svc:9090", pattern=r"^https?://[A-Za-z0-9.:_\[\]-]+(/[A-Za-z0-9._~/-]*)?$")
    """Prometheus that KEDA queries for the vLLM queue length (autoscaling `keda`)."""

    @field_validator("prometheus_url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        refuse_loopback(url, "KEDA's operator queries it from its own pod")
        path = url.split("://", 1)[1].partition("/")[2]
        if "api" in path.split("/"):
            # KEDA's Prometheus scaler appends /api/v1/query to serverAddress itself.
            base = url[: url.index("/api")]
            raise ValueError(f"already holds the API path, which KEDA appends itself (/api/v1/query); "
                             f"give the server's base URL, e.g. {base}")
        return url

    @model_validator(mode="after")
    def _own_labels(self) -> ClusterConfig:
        if self.gpu_product_label.startswith("nvidia.com/"):
            raise _at(
                "cluster.gpuProductLabel",
                f"{self.gpu_product_label} belongs to NVIDIA's GPU Feature Discovery, which overwrites it (labels flap, "
                f"nodeSelectors stop matching): keep the default {GPU_PRODUCT_LABEL}, or set gpuFeatureDiscovery and "
                "models[].gfdProduct to select on GFD's own value",
            )
        return self

    @model_validator(mode="after")
    def _gateway_for_routes(self) -> ClusterConfig:
        if self.edge == "gateway" and self.gateway is None:
            raise _at("cluster.gateway", "required with `edge: gateway` (name and namespace of the Gateway the routes attach to)")
        return self

    @model_validator(mode="after")
    def _endpoint_needs(self) -> ClusterConfig:
        if self.endpoint is None:
            return self
        if self.gateway is None:
            raise _at("cluster.gateway", "required with `cluster.endpoint`: the Envoy Gateway Gateway (name, namespace) "
                                         "whose listener serves *.<endpoint.domain>")
        if not self.network.api_server_cidrs:
            raise _at("cluster.network.apiServerCidrs", "required with `cluster.endpoint`: the endpoint pickers watch their "
                                                        "pods at the API server, and a NetworkPolicy can only name it by "
                                                        "address (`kubectl get endpoints kubernetes`)")
        return self

    @field_validator("render_yaml_to")
    @classmethod
    def _outside_wiped_folders(cls, folder: str | None) -> str | None:
        if folder is None:
            return None
        path = Path(folder) if Path(folder).is_absolute() else PROJECT_DIR / folder
        inside = os.path.relpath(os.path.normpath(path), PROJECT_DIR)
        top = inside.split(os.sep, 1)[0]
        if top in WIPED_FOLDERS:
            # `make render` replaces rendered/<stack>/ and `make clean` removes both folders:
            # the GitOps copy would vanish between two commits.
            also = " and `make render` replaces" if top == "rendered" else ""
            raise ValueError(f"lies inside {top}/, which `make clean` removes{also}: the YAML would vanish; "
                             "choose a folder outside it, e.g. gitops/")
        return folder

    @model_validator(mode="after")
    def _one_target(self) -> ClusterConfig:
        if self.render_yaml_to is not None and self.kubeconfig is not None:
            raise _at("cluster.kubeconfig", "drop it: `cluster.renderYamlTo` writes YAML and talks to no cluster")
        if self.render_yaml_to is None and self.kubeconfig is None:
            raise _at("cluster.kubeconfig", "required key is missing (or set `cluster.renderYamlTo` to write YAML instead of applying it)")
        return self
