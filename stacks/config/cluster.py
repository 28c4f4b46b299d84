"""`cluster`: which cluster, how GPU nodes are marked, and the cluster add-ons the models rely on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stacks.config.base import K8sName, LabelValue, SecretKeyName, _at, _Model


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
    image: str = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    """Pinned device plugin image."""
    namespace: K8sName = "kube-system"
    """Namespace of the DaemonSet."""


class PrometheusAdapter(_Model):
    """Where the prometheus-adapter rule that turns the vLLM queue gauge into a Pods metric goes."""

    namespace: K8sName = "monitoring"
    """Namespace of prometheus-adapter."""
    config_map_name: K8sName = "gpu-serving-adapter-rules"
    """ConfigMap with the rule (`config.yaml`); point the adapter at it."""


class Cluster(_Model):
    namespace: K8sName = "ai"
    """Namespace of every model object (Secret, Jobs, Deployment, Service, Ingress, autoscaler, claim)."""
    create_namespace: bool = True
    """Create the namespace (kept when the stack is deleted); false if it is managed elsewhere."""
    kubeconfig: Kubeconfig | None = None
    """Which cluster the explicit Kubernetes provider talks to; required unless `renderYamlTo` is set."""
    render_yaml_to: str | None = Field(None, min_length=1, pattern=r"^[^~]")
    """Folder where `pulumi up` writes every Kubernetes object as YAML (for Argo CD or Flux) instead of
    applying it; no cluster is contacted, and no Secret is written. Absolute, or relative to the project folder."""
    ingress_class: K8sName = "nginx"
    """`ingressClassName` of every model Ingress; the nginx annotations assume ingress-nginx."""
    cluster_issuer: K8sName | None = None
    """cert-manager ClusterIssuer annotated on Ingresses that have a `tlsSecret`."""
    autoscaling: Literal["hpa", "keda", "none"] = "hpa"
    """Autoscaler for models with `replicas.min < replicas.max`: HPA on the queue metric (needs prometheus-adapter), KEDA, or none."""
    gpu_taint: GpuTaint = GpuTaint()
    """Taint put on every GPU node and tolerated by GPU pods."""
    gpu_product_label: str = Field("nvidia.com/gpu.product", pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$")
    """Node label that carries `nodes[].gpu.product`; models select nodes by it."""
    device_plugin: DevicePlugin = DevicePlugin()
    """NVIDIA device plugin DaemonSet (off: the cluster already has one, e.g. from the GPU Operator)."""
    prometheus_adapter: PrometheusAdapter = PrometheusAdapter()
    """Where the adapter rule for the HPAs' queue metric is written."""
    runtime_class_name: K8sName | None = None
    """RuntimeClass of GPU pods (e.g. `nvidia`) when the NVIDIA runtime is not the node's default."""
    prometheus_url: str = Field("http://prometheus-operated.monitoring.svc:9090", pattern=r"^https?://[A-Za-z0-9.:_\[\]-]+(/[A-Za-z0-9._~/-]*)?$")
    """Prometheus that KEDA queries for the vLLM queue length (autoscaling `keda`)."""

    @model_validator(mode="after")
    def _one_target(self) -> Cluster:
        if self.render_yaml_to is not None and self.kubeconfig is not None:
            raise _at("cluster.kubeconfig", "drop it: `cluster.renderYamlTo` writes YAML and talks to no cluster")
        if self.render_yaml_to is None and self.kubeconfig is None:
            raise _at("cluster.kubeconfig", "required key is missing (or set `cluster.renderYamlTo` to write YAML instead of applying it)")
        return self
