"""Cluster: the explicit Kubernetes provider and the stack-wide objects every model shares."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

import stacks
from stacks.config import Cluster as ClusterConfig

PART_OF = {"app.kubernetes.io/part-of": "gpu-serving", "app.kubernetes.io/managed-by": "pulumi"}


def kubernetes_provider(cluster: ClusterConfig) -> k8s.Provider:
    """Always an explicit provider: a stack never deploys to whatever the ambient kubeconfig points at."""
    source = cluster.kubeconfig
    kubeconfig = stacks.secret(source.secret) if source.secret else source.path
    return k8s.Provider(
        "kubernetes",
        kubeconfig=kubeconfig,
        context=source.context,
        namespace=cluster.namespace,
        enable_server_side_apply=True,
    )


@dataclass(frozen=True)
class ClusterArgs:
    cluster: ClusterConfig


class ClusterBase(pulumi.ComponentResource):
    """The namespace the models live in; later issues add the cluster-wide GPU pieces here."""

    namespace: pulumi.Output[str]
    """Namespace of every namespaced object of the stack."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-serving:cluster:ClusterBase", name, None, opts)
        cluster = args.cluster
        if cluster.create_namespace:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=cluster.namespace, labels=PART_OF),
                # Deleting a namespace deletes the model claim in it: keep it when the stack goes.
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
            self.namespace = namespace.metadata.apply(lambda m: m.name)
        else:
            self.namespace = pulumi.Output.from_input(cluster.namespace)
        self.register_outputs({"namespace": self.namespace})
