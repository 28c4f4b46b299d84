"""VllmService: the ComponentResource that wires one model's objects together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.cluster import applied_annotations
from components.serving.autoscaling import autoscaler, hpa_spec, scaled_object
from components.serving.credentials import api_key_annotation
from components.serving.drain import disruption_budget_spec
from components.serving.edge import (
    egress_policy_spec,
    group_policy_spec,
    in_cluster_url,
    ingress_annotations,
    ingress_spec,
    ingress_url,
    network_policy_spec,
    service_spec,
)
from components.serving.gateway import httproute_spec
from components.serving.hold import held_url, hold_service_spec, interceptor_route
from components.serving.jobs import job_spec, smoke_deadline_seconds, smoke_job_name, smoke_job_spec
from components.serving.monitoring import prometheus_rule_spec
from components.serving.names import (
    WEIGHTS_VERIFIED,
    download_digest,
    download_job_name,
    hold_name,
    labels,
    node_download_job_name,
    object_name,
    secret_name,
    weights_label,
    workload,
)
from components.serving.picker import (
    CONFIG,
    CONFIG_FILE,
    INFERENCE_GROUP,
    PICKER_COMPONENT,
    data_plane_peer,
    inference_pool_spec,
    picker_deployment_spec,
    picker_labels,
    picker_name,
    picker_network_policy_spec,
    picker_service_spec,
    role_rules,
)
from components.serving.server import LWS_WAIT, deployment_spec, leader_worker_set_spec
from stacks.config import ClusterConfig, Model
from stacks.config.budgets import IMAGE_PULL_S, deployment_timeout_seconds, download_deadline_seconds


@dataclass(frozen=True)
class VllmServiceArgs:
    model: Model
    cluster: ClusterConfig
    claim_name: pulumi.Input[str]
    """The shared model volume's claim (ModelStorage.claim_name)."""
    storage_is_local: bool
    """Node-local storage lives on a (tainted) GPU node: the download Job must tolerate the taint."""
    hf_token: pulumi.Input[str] | None
    """None when the stack renders YAML: the Secret is then left to the cluster (see `credentials_note`)."""
    api_key: pulumi.Input[str] | None = None
    rollout_salt: pulumi.Input[str] | None = None
    """The `rolloutSalt` secret: with `api_key`, the serving pods roll when the key changes (credentials.py)."""
    namespace: pulumi.Input[str] | None = None
    """The namespace as ClusterBase.namespace (the Namespace resource's output), so every object is
    created after the Namespace; None: `cluster.namespace` as a plain string (no ordering)."""
    after: tuple[pulumi.Resource, ...] = ()
    """What the serving pods need first: cluster-wide objects (ClusterBase.serving_needs: the PriorityClass)
    and the label patches of the nodes they select (components.node.labelled_for)."""
    on_endpoint: bool = False
    """Behind the teams' endpoint (`cluster.endpoint`): an InferencePool and its endpoint picker (picker.py); a held
    model (`replicas.min: 0`) has neither: the teams' routes reach it through its hold (components/endpoint.py)."""
    holders: dict[str, pulumi.Resource] = field(default_factory=dict)
    """With a node cache (`modelStorage.type: nodeCache`): the nodes that hold the model's weights, each with what
    labels it a cache node (GpuNode.node_patch); `claim_name` is then the cache's claim. Empty: one shared volume."""


def credentials_note(model: Model, namespace: str) -> str:
    """What to create by hand when the stack renders YAML: the provider would write the Secret's
    values in plain text into the folder that Argo CD or Flux reads (and teams commit)."""
    keys = "hf-token" + (", api-key" if model.api_key_secret else "")
    files = "--from-file=hf-token=hf-token.txt" + (" --from-file=api-key=api-key.txt" if model.api_key_secret else "")
    return (
        f"renderYamlTo: Secret {namespace}/{secret_name(model)} (keys {keys}) is not written, its values would be plain "
        f"text in the YAML; create it in the cluster (sealed-secrets, external-secrets, or "
        f"`kubectl -n {namespace} create secret generic {secret_name(model)} {files}`)"
    )


class VllmService(pulumi.ComponentResource):
    """Secret, pre-download Job, Deployment (for a model spanning nodes a LeaderWorkerSet), Service, PodDisruptionBudget,
    NetworkPolicies, a smoke-test Job, and when configured an Ingress and an autoscaler, for one model."""

    url: pulumi.Output[str]
    """OpenAI base URL inside the cluster."""
    ingress_url: pulumi.Output[str | None]
    served_model_name: pulumi.Output[str]
    gpus_per_replica: pulumi.Output[int]
    replicas: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, args: VllmServiceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-serving:serving:VllmService", name, None, opts)
        model, cluster, namespace = args.model, args.cluster, args.cluster.namespace
        base = object_name(model)

        in_namespace = args.namespace if args.namespace is not None else namespace

        def meta(object_name: str, component: str, annotations: dict[str, str] | None = None) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(
                name=object_name, namespace=in_namespace, labels=labels(model, component),
                annotations=applied_annotations(cluster, annotations),
            )

        child = pulumi.ResourceOptions(parent=self)
        uses_api_key = model.api_key_secret is not None
        secrets: list[pulumi.Resource] = []
        if args.hf_token is None:
            pulumi.log.warn(credentials_note(model, namespace), resource=self)
        else:
            string_data: dict[str, pulumi.Input[str]] = {"hf-token": args.hf_token}
            if args.api_key is not None:
                string_data["api-key"] = args.api_key
            secrets.append(k8s.core.v1.Secret(
                f"{name}-secrets", metadata=meta(secret_name(model), "credentials"), type="Opaque", string_data=string_data, opts=child
            ))

        pull_and_download = IMAGE_PULL_S + download_deadline_seconds(model.disk_gb)
        # Any other change to an immutable Job replaces it under the same name; Pulumi waits for completion
        # (the Deployment must not start before the files exist).
        download_wait = pulumi.CustomTimeouts(create=f"{pull_and_download}s", update=f"{pull_and_download}s")
        if not args.holders:
            downloaded: list[pulumi.Resource] = [k8s.batch.v1.Job(
                f"{name}-download",
                metadata=meta(download_job_name(model), "model-download"),
                spec=job_spec(model, cluster, args.claim_name, args.storage_is_local),
                opts=pulumi.ResourceOptions(parent=self, depends_on=secrets, delete_before_replace=True, custom_timeouts=download_wait),
            )]
        else:
            downloaded = self._fill_caches(name, args, meta, secrets, download_wait)

        rollout = f"{deployment_timeout_seconds(model.weights_gb)}s"
        key_annotation = (
            api_key_annotation(args.rollout_salt, args.api_key, namespace, model.name)
            if args.api_key is not None and args.rollout_salt is not None else None
        )
        serving_opts = pulumi.ResourceOptions(
            parent=self,
            depends_on=[*downloaded, *secrets, *args.after],
            custom_timeouts=pulumi.CustomTimeouts(create=rollout, update=rollout),
        )
        servers: pulumi.CustomResource
        if model.spans_nodes:
            api_version, kind, group = workload(model)
            servers = k8s.apiextensions.CustomResource(
                f"{name}-leader-worker-set", api_version=api_version, kind=kind,
                metadata=meta(group, "inference-server", {"pulumi.com/waitFor": LWS_WAIT}),
                spec=leader_worker_set_spec(model, cluster, args.claim_name, uses_api_key, key_annotation, cached=bool(args.holders)),
                opts=serving_opts,
            )
            k8s.networking.v1.NetworkPolicy(f"{name}-group", metadata=meta(f"{base}-group", "inference-server"),
                                            spec=group_policy_spec(model), opts=child)
        else:
            servers = k8s.apps.v1.Deployment(
                f"{name}-deployment",
                metadata=meta(base, "inference-server"),
                spec=deployment_spec(model, cluster, args.claim_name, uses_api_key, key_annotation, cached=bool(args.holders)),
                opts=serving_opts,
            )
        service = k8s.core.v1.Service(f"{name}-service", metadata=meta(base, "inference-server"), spec=service_spec(model), opts=child)
        endpoint_peers = ()
        # A held model on the endpoint is reached through its hold (the teams' routes send to the interceptor):
        # a picker would have no pod to pick at zero. Its pods admit the interceptor, as for any held model.
        if args.on_endpoint and not model.scales_to_zero:
            endpoint_peers = (data_plane_peer(cluster), k8s.networking.v1.NetworkPolicyPeerArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=picker_labels(model))))
            self._pool(name, model, cluster, meta, servers)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            metadata=meta(base, "inference-server"),
            spec=network_policy_spec(model, cluster, namespace, endpoint_peers),
            opts=child,
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb", metadata=meta(base, "inference-server"), spec=disruption_budget_spec(model), opts=child
        )
        egress = egress_policy_spec(model)
        if egress is not None:
            # After the namespace's DNS policy (in `after`): on the upgrade that moved DNS there, the pods never lose it.
            k8s.networking.v1.NetworkPolicy(f"{name}-egress", metadata=meta(f"{base}-egress", "inference-server"), spec=egress,
                                            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)))

        # Scale to zero: the interceptor receives the requests (components/serving/hold.py).
        hold = cluster.request_hold if model.scales_to_zero else None
        holding: list[pulumi.Resource] = []
        if hold is not None:
            holding.append(k8s.core.v1.Service(
                f"{name}-hold-service", metadata=meta(hold_name(model), "request-hold"), spec=hold_service_spec(hold), opts=child
            ))
            holding.append(k8s.apiextensions.CustomResource(
                f"{name}-interceptor-route",
                api_version="http.keda.sh/v1beta1",
                kind="InterceptorRoute",
                metadata=meta(hold_name(model), "request-hold"),
                spec=interceptor_route(model, namespace, hold),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[service]),
            ))
        edge_after = [service, *holding]

        if model.ingress is not None and cluster.edge == "gateway":
            k8s.apiextensions.CustomResource(
                f"{name}-route",
                api_version="gateway.networking.k8s.io/v1",
                kind="HTTPRoute",
                metadata=meta(base, "inference-server"),
                spec=httproute_spec(model, cluster),
                opts=pulumi.ResourceOptions(parent=self, depends_on=edge_after),
            )
        elif model.ingress is not None:
            k8s.networking.v1.Ingress(
                f"{name}-ingress",
                metadata=meta(base, "inference-server", ingress_annotations(model, cluster)),
                spec=ingress_spec(model, cluster),
                opts=pulumi.ResourceOptions(parent=self, depends_on=edge_after),
            )

        if model.smoke_test:
            smoke_wait = f"{smoke_deadline_seconds(model) + 300}s"
            k8s.batch.v1.Job(
                f"{name}-smoke-test",
                metadata=meta(smoke_job_name(model), "smoke-test"),
                spec=smoke_job_spec(model, namespace, uses_api_key, cluster, key_annotation, hold),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[servers, *edge_after],
                    delete_before_replace=True,
                    custom_timeouts=pulumi.CustomTimeouts(create=smoke_wait, update=smoke_wait),
                ),
            )

        monitoring = cluster.monitoring

        def monitoring_meta(object_name: str) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(
                name=object_name, namespace=in_namespace, labels={**labels(model, "monitoring"), **monitoring.labels},
                annotations=applied_annotations(cluster),
            )

        # Scraped by the namespace's one PodMonitor (servers_pod_monitor, in ClusterBase).
        if monitoring.alerts:
            k8s.apiextensions.CustomResource(
                f"{name}-alerts",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata=monitoring_meta(base),
                spec=prometheus_rule_spec(model, namespace),
                opts=child,
            )

        scaler = autoscaler(cluster, model)
        after_servers = pulumi.ResourceOptions(parent=self, depends_on=[servers])
        if scaler == "hpa":
            k8s.autoscaling.v2.HorizontalPodAutoscaler(
                f"{name}-hpa", metadata=meta(base, "autoscaler"), spec=hpa_spec(model), opts=after_servers
            )
        elif scaler == "keda":
            k8s.apiextensions.CustomResource(
                f"{name}-scaled-object",
                api_version="keda.sh/v1alpha1",
                kind="ScaledObject",
                metadata=meta(base, "autoscaler"),
                spec=scaled_object(model, namespace, cluster.prometheus_url, hold),
                opts=after_servers,
            )

        self.url = pulumi.Output.from_input(held_url(model, namespace, hold) if hold is not None else in_cluster_url(model, namespace))
        self.ingress_url = pulumi.Output.from_input(ingress_url(model, cluster))
        self.served_model_name = pulumi.Output.from_input(model.name)
        self.gpus_per_replica = pulumi.Output.from_input(model.gpus_per_replica)
        self.replicas = pulumi.Output.from_input({"min": model.replicas.min, "max": model.replicas.max, "autoscaler": scaler})
        self.register_outputs(
            {
                "url": self.url,
                "ingressUrl": self.ingress_url,
                "servedModelName": self.served_model_name,
                "gpusPerReplica": self.gpus_per_replica,
                "replicas": self.replicas,
                # The workload's name once it exists.
                ("leaderWorkerSet" if model.spans_nodes else "deployment"): servers.urn.apply(lambda _: workload(model)[2]),
            }
        )

    def _pool(self, name: str, model: Model, cluster: ClusterConfig, meta: Any, servers: pulumi.Resource) -> None:
        """The InferencePool the teams' routes name, and its picker with exactly the reads it needs."""
        picker, child = picker_name(model), pulumi.ResourceOptions(parent=self)
        k8s.core.v1.ServiceAccount(f"{name}-picker-account", metadata=meta(picker, PICKER_COMPONENT), opts=child)
        role = k8s.rbac.v1.Role(f"{name}-picker-role", metadata=meta(picker, PICKER_COMPONENT), rules=role_rules(), opts=child)
        k8s.rbac.v1.RoleBinding(
            f"{name}-picker-role-binding", metadata=meta(picker, PICKER_COMPONENT),
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=picker),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=picker, namespace=cluster.namespace)],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[role]),
        )
        config = k8s.core.v1.ConfigMap(f"{name}-picker-config", metadata=meta(picker, PICKER_COMPONENT),
                                       data={CONFIG_FILE: CONFIG}, opts=child)
        k8s.networking.v1.NetworkPolicy(f"{name}-picker-network-policy", metadata=meta(picker, PICKER_COMPONENT),
                                        spec=picker_network_policy_spec(model, cluster), opts=child)
        pool = k8s.apiextensions.CustomResource(
            f"{name}-pool", api_version=f"{INFERENCE_GROUP}/v1", kind="InferencePool",
            metadata=meta(object_name(model), "inference-server"), spec=inference_pool_spec(model),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[servers]),
        )
        k8s.apps.v1.Deployment(
            f"{name}-picker", metadata=meta(picker, PICKER_COMPONENT),
            spec=picker_deployment_spec(model, cluster, cluster.namespace, labels(model, PICKER_COMPONENT)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[config, pool]),
        )
        k8s.core.v1.Service(f"{name}-picker-service", metadata=meta(picker, PICKER_COMPONENT), spec=picker_service_spec(model),
                            opts=child)

    def _fill_caches(
        self, name: str, args: VllmServiceArgs, meta: Any, secrets: list[pulumi.Resource], wait: pulumi.CustomTimeouts,
    ) -> list[pulumi.Resource]:
        """A download Job per holding node, pinned to it, and once it completed the node's weights label, which the
        serving pods require: a pod never starts where the copy is not complete, and a new revision is on every
        holding node before the Deployment (which waits for all of them) rolls. The label's resource is named by the
        revision, so the old label goes only when the `pulumi up` ends; removing a node deletes its Job and label,
        never its files."""
        model, namespace = args.model, args.cluster.namespace
        done: list[pulumi.Resource] = []
        for node, cache_node in args.holders.items():
            job = k8s.batch.v1.Job(
                f"{name}-download-{node}",
                metadata=meta(node_download_job_name(model, node), "model-download"),
                spec=job_spec(model, args.cluster, args.claim_name, storage_is_local=True, node=node),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*secrets, cache_node], delete_before_replace=True,
                                            custom_timeouts=wait),
            )
            done.append(job)
            done.append(k8s.core.v1.NodePatch(
                f"{node}-{name}-weights-{download_digest(model)}",
                metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels={weights_label(model, namespace): WEIGHTS_VERIFIED}),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[job]),
            ))
        return done
