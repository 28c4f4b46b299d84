"""A model on the teams' endpoint: its InferencePool and the endpoint picker (EPP) that chooses a pod for each request.

The gateway asks the picker over Envoy's ext_proc protocol (gRPC, port 9002) which pod should answer; the picker
reads every Ready pod of the pool's selector from the API server and their `/metrics` (queue, KV cache, prefix
cache) and names one. Upstream: Gateway API Inference Extension v1.5.0, the last release whose picker is served as
a Go module (docs/endpoint.md). One picker per model: a pool names exactly one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi_kubernetes as k8s

from components.serving.edge import DNS_PORT, _peer
from components.serving.names import PORT, instance_labels, object_name, selector_labels
from stacks.config import ClusterConfig, Model
from stacks.config.endpoint import OWNING_GATEWAY_LABEL, OWNING_GATEWAY_NAMESPACE_LABEL

INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_X_GROUP = "inference.networking.x-k8s.io"
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
CONFIG_FILE = "default-plugins.yaml"
CONFIG = (Path(__file__).parent / "picker-config.yaml").read_text()
PICKER_COMPONENT = "endpoint-picker"
# The picker image's own user (distroless `nonroot`).
PICKER_UID = 65532

# What the picker's controllers watch, read-only, in the pool's namespace: the pool, its pods, and the objectives and
# rewrites of the pool (its Helm chart's Role, config/charts/inferencepool/templates/rbac.yaml). No leases: one replica,
# so no leader election; no ClusterRole: `--metrics-endpoint-auth=false` (its metrics port is closed by NetworkPolicy).
PICKER_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", ("pods",)),
    (INFERENCE_GROUP, ("inferencepools",)),
    (INFERENCE_X_GROUP, ("inferenceobjectives", "inferencemodelrewrites")),
)
READ = ["get", "list", "watch"]


def picker_name(model: Model) -> str:
    return f"{object_name(model)}-epp"


def picker_labels(model: Model) -> dict[str, str]:
    return {**instance_labels(model), "app.kubernetes.io/component": PICKER_COMPONENT}


def data_plane_labels(cluster: ClusterConfig) -> dict[str, str]:
    """The Gateway's Envoy pods: configured, or Envoy Gateway's labels of the proxies of `cluster.gateway`."""
    assert cluster.endpoint is not None and cluster.gateway is not None
    if cluster.endpoint.data_plane_pod_labels:
        return dict(cluster.endpoint.data_plane_pod_labels)
    return {OWNING_GATEWAY_LABEL: cluster.gateway.name, OWNING_GATEWAY_NAMESPACE_LABEL: cluster.gateway.namespace}


def data_plane_peer(cluster: ClusterConfig) -> k8s.networking.v1.NetworkPolicyPeerArgs:
    assert cluster.endpoint is not None
    return _peer(cluster.endpoint.data_plane_namespace, data_plane_labels(cluster))


def inference_pool_spec(model: Model) -> dict[str, Any]:
    # FailClose: with the picker down a request fails rather than going to any pod, a loading one included.
    return {
        "selector": {"matchLabels": selector_labels(model)},
        "targetPorts": [{"number": PORT}],
        "endpointPickerRef": {"name": picker_name(model), "port": {"number": EXT_PROC_PORT}, "failureMode": "FailClose"},
    }


def role_rules() -> list[k8s.rbac.v1.PolicyRuleArgs]:
    return [k8s.rbac.v1.PolicyRuleArgs(api_groups=[group], resources=list(resources), verbs=READ) for group, resources in PICKER_RULES]


def picker_args(model: Model, namespace: str) -> list[str]:
    return [
        "--pool-name", object_name(model), "--pool-namespace", namespace, "--pool-group", INFERENCE_GROUP,
        "--grpc-port", str(EXT_PROC_PORT), "--grpc-health-port", str(HEALTH_PORT), "--metrics-port", str(METRICS_PORT),
        "--config-file", f"/config/{CONFIG_FILE}", "--zap-encoder", "json",
        # Its defaults export traces to localhost:4317, serve pprof on the metrics port, and ask for token reviews on
        # /metrics (a ClusterRole); the metrics port is closed by NetworkPolicy instead.
        "--tracing=false", "--enable-pprof=false", "--metrics-endpoint-auth=false",
    ]


def liveness_probe() -> k8s.core.v1.ProbeArgs:
    # The service name the picker's health server answers for with one replica.
    return k8s.core.v1.ProbeArgs(grpc=k8s.core.v1.GRPCActionArgs(port=HEALTH_PORT, service="inference-extension"),
                                 period_seconds=10)


def readiness_probe() -> k8s.core.v1.ProbeArgs:
    """Ready when the ext_proc port listens: the health server says SERVING before the picker's caches have synced and
    its ext_proc server started (16 s and more, measured on the lab VM), and the gateway would meet refused connections."""
    return k8s.core.v1.ProbeArgs(tcp_socket=k8s.core.v1.TCPSocketActionArgs(port=EXT_PROC_PORT), period_seconds=2)


def picker_pod_spec(model: Model, cluster: ClusterConfig, namespace: str) -> k8s.core.v1.PodSpecArgs:
    assert cluster.endpoint is not None

    def field(path: str) -> k8s.core.v1.EnvVarSourceArgs:
        return k8s.core.v1.EnvVarSourceArgs(field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path=path))

    return k8s.core.v1.PodSpecArgs(
        service_account_name=picker_name(model),
        containers=[k8s.core.v1.ContainerArgs(
            name="epp",
            image=cluster.endpoint.picker_image,
            image_pull_policy="IfNotPresent",
            args=picker_args(model, namespace),
            ports=[k8s.core.v1.ContainerPortArgs(name="grpc", container_port=EXT_PROC_PORT, protocol="TCP"),
                   k8s.core.v1.ContainerPortArgs(name="grpc-health", container_port=HEALTH_PORT, protocol="TCP"),
                   k8s.core.v1.ContainerPortArgs(name="metrics", container_port=METRICS_PORT, protocol="TCP")],
            env=[k8s.core.v1.EnvVarArgs(name="NAMESPACE", value_from=field("metadata.namespace")),
                 k8s.core.v1.EnvVarArgs(name="POD_NAME", value_from=field("metadata.name"))],
            resources=k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "250m", "memory": "256Mi"}, limits={"memory": "1Gi"}),
            readiness_probe=readiness_probe(),
            liveness_probe=liveness_probe(),
            volume_mounts=[k8s.core.v1.VolumeMountArgs(name="config", mount_path="/config", read_only=True)],
            security_context=k8s.core.v1.SecurityContextArgs(
                allow_privilege_escalation=False, privileged=False, read_only_root_filesystem=True,
                capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
            ),
        )],
        volumes=[k8s.core.v1.VolumeArgs(name="config", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=picker_name(model)))],
        security_context=k8s.core.v1.PodSecurityContextArgs(
            run_as_non_root=True, run_as_user=PICKER_UID, run_as_group=PICKER_UID,
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
        ),
        enable_service_links=False,
    )


def picker_deployment_spec(model: Model, cluster: ClusterConfig, namespace: str,
                           template_labels: dict[str, str]) -> k8s.apps.v1.DeploymentSpecArgs:
    return k8s.apps.v1.DeploymentSpecArgs(
        replicas=1,
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=picker_labels(model)),
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=template_labels),
            spec=picker_pod_spec(model, cluster, namespace),
        ),
    )


def picker_service_spec(model: Model) -> k8s.core.v1.ServiceSpecArgs:
    return k8s.core.v1.ServiceSpecArgs(
        type="ClusterIP",
        selector=picker_labels(model),
        # gRPC over TLS (the picker's default self-signed serving, which AI Gateway dials without verification).
        ports=[k8s.core.v1.ServicePortArgs(name="grpc-ext-proc", port=EXT_PROC_PORT, target_port="grpc", protocol="TCP"),
               k8s.core.v1.ServicePortArgs(name="http-metrics", port=METRICS_PORT, target_port="metrics", protocol="TCP")],
    )


def picker_network_policy_spec(model: Model, cluster: ClusterConfig) -> k8s.networking.v1.NetworkPolicySpecArgs:
    """In: ext_proc from the Gateway's Envoy pods, metrics from Prometheus. Out: the model's pods (their /metrics),
    the cluster DNS and the API server (its watches), nothing else."""
    net, config = k8s.networking.v1, cluster.network
    port = net.NetworkPolicyPortArgs
    dns = [port(port=DNS_PORT, protocol=p) for p in ("UDP", "TCP")]
    return net.NetworkPolicySpecArgs(
        pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=picker_labels(model)),
        policy_types=["Ingress", "Egress"],
        ingress=[
            net.NetworkPolicyIngressRuleArgs(from_=[data_plane_peer(cluster)], ports=[port(port=EXT_PROC_PORT, protocol="TCP")]),
            net.NetworkPolicyIngressRuleArgs(from_=[_peer(config.monitoring_namespace, config.monitoring_pod_labels)],
                                             ports=[port(port=METRICS_PORT, protocol="TCP")]),
        ],
        egress=[
            net.NetworkPolicyEgressRuleArgs(
                to=[net.NetworkPolicyPeerArgs(pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(model)))],
                ports=[port(port=PORT, protocol="TCP")]),
            net.NetworkPolicyEgressRuleArgs(to=[_peer(config.dns_namespace, config.dns_pod_labels)], ports=dns),
            net.NetworkPolicyEgressRuleArgs(to=[net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr=cidr))
                                                for cidr in config.api_server_cidrs]),
        ],
    )

