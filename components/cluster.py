"""Cluster: the explicit Kubernetes provider and the stack-wide objects every model shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.dashboards import dashboards
from components.sharing import DEVICE_PLUGIN_CONFIG_LABEL, device_plugin_configs, mig_parted_config, time_slicing_configs
from stacks.config import ClusterConfig, Node

PART_OF = {"app.kubernetes.io/part-of": "gpu-serving", "app.kubernetes.io/managed-by": "pulumi"}
# Server-side apply refuses to set a field another field manager owns (a `kubectl edit`/`patch` by
# hand): without force, that `pulumi up` and every later one fail on the conflict. The stack owns what
# it declares, so its apply takes such fields back (fields it does not declare stay the other's).
PATCH_FORCE = {"pulumi.com/patchForce": "true"}


def applied_annotations(cluster: ClusterConfig, annotations: dict[str, str] | None = None) -> dict[str, str] | None:
    """An object's annotations, with PATCH_FORCE when the provider applies it to a cluster; the YAML
    written with `renderYamlTo` carries no annotation only Pulumi's apply reads."""
    merged = {**(annotations or {}), **(PATCH_FORCE if cluster.render_yaml_to is None else {})}
    return merged or None


def kubernetes_provider(cluster: ClusterConfig, kubeconfig_secret: pulumi.Input[str] | None = None,
                        parent: pulumi.Resource | None = None) -> k8s.Provider:
    """Always an explicit provider: a stack never deploys to whatever the ambient kubeconfig points at.
    With `renderYamlTo` the provider writes YAML into that folder and talks to no cluster. Its kubeconfig
    is given as "" (none): left out, the SDK takes the shell's `KUBECONFIG`, and the provider then
    refuses the stack ("kubeconfig" arg is not compatible with "renderYamlToDirectory" arg).
    `kubeconfig_secret` is the text of the secret `cluster.kubeconfig.secret` names (None without one)."""
    if cluster.render_yaml_to is not None:
        return k8s.Provider("kubernetes", render_yaml_to_directory=cluster.render_yaml_to, namespace=cluster.namespace,
                            kubeconfig="", opts=pulumi.ResourceOptions(parent=parent))
    source = cluster.kubeconfig
    assert source is not None  # the config requires one of the two
    if source.secret:
        assert kubeconfig_secret is not None, f"kubeconfig_secret: the secret {source.secret} is not passed"
    kubeconfig = kubeconfig_secret if source.secret else source.path
    return k8s.Provider(
        "kubernetes",
        kubeconfig=kubeconfig,
        context=source.context,
        namespace=cluster.namespace,
        enable_server_side_apply=True,
        # A team's key rotation must update its Secret in place: by default the provider replaces a Secret whose data
        # changes, deleting it first (its name is fixed), and Envoy Gateway refuses the team's requests until it is
        # back. Only with the teams' endpoint, so that other stacks' provider stays as it was.
        enable_secret_mutable=True if cluster.endpoint is not None else None,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def runtime_class(cluster: ClusterConfig) -> dict[str, Any] | None:
    """RuntimeClass `<runtimeClassName>` → handler `nvidia` (the runtime nvidia-ctk / k3s add), when GPU
    pods name one; None when the NVIDIA runtime is the nodes' default and pods name no class."""
    if cluster.runtime_class_name is None:
        return None
    return dict(
        metadata=k8s.meta.v1.ObjectMetaArgs(name=cluster.runtime_class_name, labels=PART_OF, annotations=applied_annotations(cluster)),
        handler="nvidia",
        # Pods of this class only fit GPU nodes: the scheduler adds this selector to them.
        scheduling=k8s.node.v1.SchedulingArgs(node_selector={"nvidia.com/gpu.present": "true"}),
    )


PLUGIN_CONFIG_DIR = "/etc/nvidia-device-plugin"


def device_plugin(cluster: ClusterConfig, config: str | None = None, shared: Sequence[str] = ()) -> dict[str, Any] | None:
    """The NVIDIA device plugin (NVIDIA's static manifest as typed objects), pinned, on the labelled GPU nodes.

    Without the Helm chart's config manager a plugin runs one config: `config` names the one of the sharing
    ConfigMap (components.sharing) that this DaemonSet runs on the nodes labelled with it; the plain DaemonSet
    keeps off the nodes of every such config in `shared` (two plugins would both register the node's GPUs)."""
    plugin = cluster.device_plugin
    if not plugin.enabled:
        return None
    taint = cluster.gpu_taint
    name = "nvidia-device-plugin" if config is None else f"nvidia-device-plugin-{config.removeprefix('gpu-serving-')}"
    selector = {"app.kubernetes.io/name": name}
    labels = {**selector, **PART_OF}
    # Keep running (and advertise nothing) on a node whose driver is not ready yet.
    env = [k8s.core.v1.EnvVarArgs(name="FAIL_ON_INIT_ERROR", value="false")]
    mounts = [k8s.core.v1.VolumeMountArgs(name="device-plugin", mount_path="/var/lib/kubelet/device-plugins")]
    volumes = [k8s.core.v1.VolumeArgs(
        name="device-plugin", host_path=k8s.core.v1.HostPathVolumeSourceArgs(path="/var/lib/kubelet/device-plugins", type="Directory"),
    )]
    node_selector = {"nvidia.com/gpu.present": "true"}
    affinity = None
    if config is not None:
        env.append(k8s.core.v1.EnvVarArgs(name="CONFIG_FILE", value=f"{PLUGIN_CONFIG_DIR}/config.yaml"))
        mounts.append(k8s.core.v1.VolumeMountArgs(name="config", mount_path=PLUGIN_CONFIG_DIR, read_only=True))
        volumes.append(k8s.core.v1.VolumeArgs(name="config", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
            name=plugin.config_map_name, items=[k8s.core.v1.KeyToPathArgs(key=config, path="config.yaml")],
        )))
        node_selector[DEVICE_PLUGIN_CONFIG_LABEL] = config
    elif shared:
        affinity = k8s.core.v1.AffinityArgs(node_affinity=k8s.core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(node_selector_terms=[
                k8s.core.v1.NodeSelectorTermArgs(match_expressions=[k8s.core.v1.NodeSelectorRequirementArgs(
                    key=DEVICE_PLUGIN_CONFIG_LABEL, operator="NotIn", values=list(shared),
                )]),
            ]),
        ))
    container = k8s.core.v1.ContainerArgs(
        name="nvidia-device-plugin",
        image=plugin.image,
        image_pull_policy="IfNotPresent",
        env=env,
        security_context=k8s.core.v1.SecurityContextArgs(
            allow_privilege_escalation=False,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        ),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "32Mi"}, limits={"cpu": "100m", "memory": "128Mi"}
        ),
        volume_mounts=mounts,
    )
    return dict(
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=name, namespace=plugin.namespace, labels=labels, annotations=applied_annotations(cluster)
        ),
        spec=k8s.apps.v1.DaemonSetSpecArgs(
            selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
            update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(type="RollingUpdate"),
            template=k8s.core.v1.PodTemplateSpecArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels),
                spec=k8s.core.v1.PodSpecArgs(
                    # GpuNode labels every configured GPU node with this (no Node Feature Discovery needed).
                    node_selector=node_selector,
                    affinity=affinity,
                    tolerations=[
                        k8s.core.v1.TolerationArgs(key=taint.key, operator="Exists", effect=taint.effect),
                        k8s.core.v1.TolerationArgs(key="CriticalAddonsOnly", operator="Exists"),
                    ],
                    # system-node-critical is admitted in kube-system only (default ResourceQuota scope).
                    priority_class_name="system-node-critical" if plugin.namespace == "kube-system" else None,
                    # NVML comes from the NVIDIA runtime: the plugin needs it like any GPU pod.
                    runtime_class_name=cluster.runtime_class_name,
                    automount_service_account_token=False,
                    containers=[container],
                    volumes=volumes,
                ),
            ),
        ),
    )


POD_SECURITY = "pod-security.kubernetes.io"


def namespace_labels(cluster: ClusterConfig) -> dict[str, str]:
    """Pod Security admission: `enforce` refuses what breaks the level (baseline: no privileged pod,
    host namespace or hostPath in the models' namespace); `warn` and `audit` report what a stricter
    level would refuse without refusing it."""
    levels = cluster.pod_security
    return {
        **PART_OF,
        f"{POD_SECURITY}/enforce": levels.enforce,
        f"{POD_SECURITY}/warn": levels.warn,
        f"{POD_SECURITY}/audit": levels.warn,
    }


def priority_class(cluster: ClusterConfig) -> dict[str, Any] | None:
    """The serving pods' PriorityClass: above batch work, so a GPU pod may preempt a batch pod for its
    node and is never the one preempted for it. Not the global default (other pods keep theirs): left
    unset, as the API server stores `globalDefault: false` by leaving it out, so the offline render and
    the provider's YAML agree (e2e render-matches-engine)."""
    config = cluster.priority_class
    if config is None or not config.create:
        return None
    return dict(
        metadata=k8s.meta.v1.ObjectMetaArgs(name=config.name, labels=PART_OF, annotations=applied_annotations(cluster)),
        value=config.value,
        preemption_policy="PreemptLowerPriority",
        description="gpu-serving model servers: above batch workloads on the GPU nodes",
    )


@dataclass(frozen=True)
class ClusterArgs:
    cluster: ClusterConfig
    adapter_rules: str | None = None
    """prometheus-adapter `config.yaml` for the models' HPAs (components.serving.adapter_rules); None: no ConfigMap."""
    hold_grant: dict[str, Any] | None = None
    """The ReferenceGrant that lets HTTPRoutes reach the request hold's interceptor (components.serving.hold.reference_grant)."""
    servers_egress: dict[str, Any] | None = None
    """The namespace's egress NetworkPolicy of every serving pod (components.serving.servers_egress_policy)."""
    servers_monitor: dict[str, Any] | None = None
    """The namespace's PodMonitor of every serving pod (components.serving.servers_pod_monitor)."""
    nodes: tuple[Node, ...] = ()
    """The GPU nodes: those with `gpu.sharing` get the device plugin's and the MIG manager's configs written."""
    models: tuple[str, ...] = ()
    """The served model names, the choices of the models' dashboard."""


class ClusterBase(pulumi.ComponentResource):
    """The namespace the models live in; later issues add the cluster-wide GPU pieces here."""

    namespace: pulumi.Output[str]
    """Namespace of every namespaced object of the stack."""
    adapter_rules: pulumi.Output[str | None]
    """`namespace/name` of the prometheus-adapter rules ConfigMap, when the stack has HPAs."""
    serving_needs: list[pulumi.Resource]
    """What the serving pods need before they are created (the PriorityClass: admission refuses a pod naming a missing one;
    the egress policy)."""
    sharing_configs: list[pulumi.Resource]
    """The device plugin's and the MIG manager's ConfigMaps: a node's labels that name their entries come after them."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-serving:cluster:ClusterBase", name, None, opts)
        cluster = args.cluster
        namespace: k8s.core.v1.Namespace | None = None
        if cluster.create_namespace:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=cluster.namespace, labels=namespace_labels(cluster), annotations=applied_annotations(cluster)
                ),
                # Deleting a namespace deletes the model claim in it: keep it when the stack goes.
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
            self.namespace = namespace.metadata.apply(lambda m: m.name)
        else:
            self.namespace = pulumi.Output.from_input(cluster.namespace)
        gpu_runtime = runtime_class(cluster)
        if gpu_runtime is not None:
            k8s.node.v1.RuntimeClass(f"{name}-runtime-class", **gpu_runtime, opts=pulumi.ResourceOptions(parent=self))
        self.serving_needs = []
        priority = priority_class(cluster)
        if priority is not None:
            # Cluster-scoped and possibly shared: kept when the stack goes, like the namespace.
            self.serving_needs.append(k8s.scheduling.v1.PriorityClass(
                f"{name}-priority-class", **priority, opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True)
            ))
        if args.servers_egress is not None:
            # Before any serving pod starts: none ever runs with egress open.
            self.serving_needs.append(k8s.networking.v1.NetworkPolicy(
                f"{name}-servers-egress", **args.servers_egress,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[namespace] if namespace is not None else []),
            ))
        if args.servers_monitor is not None:
            k8s.apiextensions.CustomResource(
                f"{name}-servers-monitor", **args.servers_monitor,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[namespace] if namespace is not None else []),
            )
        self.sharing_configs = self._sharing_configs(name, cluster, args.nodes)
        shared = time_slicing_configs(args.nodes)
        plugin = device_plugin(cluster, shared=shared)
        if plugin is not None:
            k8s.apps.v1.DaemonSet(f"{name}-device-plugin", **plugin, opts=pulumi.ResourceOptions(parent=self))
            for config in shared:
                variant = device_plugin(cluster, config=config)
                assert variant is not None  # enabled, as the plain one
                # Its pods mount their config's key of the ConfigMap: written first, they never wait on a missing key.
                k8s.apps.v1.DaemonSet(f"{name}-device-plugin-{config}", **variant,
                                      opts=pulumi.ResourceOptions(parent=self, depends_on=self.sharing_configs))
        self.adapter_rules = pulumi.Output.from_input(None)
        if args.adapter_rules is not None:
            adapter = cluster.prometheus_adapter
            # In the adapter's own format and namespace: point the adapter at it (chart value
            # `rules.existing`); the adapter reads rules only at start, so restart it after a change.
            rules = self._config_map(f"{name}-adapter-rules", cluster, adapter.namespace, adapter.config_map_name,
                                     {"config.yaml": args.adapter_rules})
            self.adapter_rules = rules.metadata.apply(lambda m: f"{m.namespace}/{m.name}")
        if args.hold_grant is not None:
            k8s.apiextensions.CustomResource(f"{name}-hold-grant", **args.hold_grant, opts=pulumi.ResourceOptions(parent=self))
        if cluster.monitoring.dashboards:
            self._dashboards(name, cluster, args, namespace)
        self.register_outputs({"namespace": self.namespace, "adapterRules": self.adapter_rules})

    def _sharing_configs(self, name: str, cluster: ClusterConfig, nodes: tuple[Node, ...]) -> list[pulumi.Resource]:
        """In the namespaces of the programs that read them; the nodes' labels name their entries."""
        written: list[pulumi.Resource] = []
        configs = device_plugin_configs(nodes)
        if configs:
            plugin = cluster.device_plugin
            written.append(self._config_map(f"{name}-device-plugin-config", cluster, plugin.namespace, plugin.config_map_name, configs))
        layouts = mig_parted_config(nodes)
        if layouts is not None:
            manager = cluster.mig_manager
            written.append(self._config_map(f"{name}-mig-parted-config", cluster, manager.namespace, manager.config_map_name,
                                            {"config.yaml": layouts}))
        return written

    def _dashboards(self, name: str, cluster: ClusterConfig, args: ClusterArgs, namespace: pulumi.Resource | None) -> None:
        """One ConfigMap a dashboard (components/dashboards), labelled for the Grafana sidecar; in the stack's
        namespace (after it, when the stack creates it) unless `dashboardNamespace` names another."""
        monitoring = cluster.monitoring
        in_namespace = monitoring.dashboard_namespace or cluster.namespace
        after = [namespace] if namespace is not None and in_namespace == cluster.namespace else []
        for kind, (file, text) in dashboards(cluster.namespace, args.models, args.nodes).items():
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard-{kind}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=f"gpu-serving-{cluster.namespace}-{kind}", namespace=in_namespace,
                    labels={**PART_OF, **monitoring.dashboard_labels}, annotations=applied_annotations(cluster),
                ),
                data={file: text},
                opts=pulumi.ResourceOptions(parent=self, depends_on=after),
            )

    def _config_map(self, resource: str, cluster: ClusterConfig, namespace: str, name: str, data: dict[str, str]) -> k8s.core.v1.ConfigMap:
        """A ConfigMap another program reads (in that program's namespace)."""
        return k8s.core.v1.ConfigMap(
            resource,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=PART_OF, annotations=applied_annotations(cluster)),
            data=data,
            opts=pulumi.ResourceOptions(parent=self),
        )
