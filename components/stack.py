"""The whole stack: every component a validated stack config asks for, wired together.

`__main__.py` declares it at the top of the program (its outputs are the stack's outputs); the component package's
`GpuServing` declares it under itself (package/). Secrets reach it only through `secret`: the stack's own secret config
there, the secrets a consumer program passes here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pulumi

from components.cluster import ClusterArgs, ClusterBase, applied_annotations, kubernetes_provider
from components.endpoint import TeamEndpoint, TeamEndpointArgs
from components.node import GpuNodeArgs, gpu_nodes, labelled_for
from components.prerequisites import warn_missing
from components.serving import (
    VllmService,
    VllmServiceArgs,
    adapter_rules,
    needs_adapter_rules,
    reference_grant,
    servers_egress_policy,
    servers_pod_monitor,
)
from components.storage import ModelStorage, ModelStorageArgs
from stacks.config import ROLLOUT_SALT_SECRET, StackConfig


def declare(config: StackConfig, secret: Callable[[str], pulumi.Output[str]], parent: pulumi.Resource | None = None) -> dict[str, Any]:
    """Every resource of `config`, under `parent` (None: the program's top level); returns the stack's outputs by name.
    `secret(key)` is the value of the secret config key `key` names, kept secret."""
    # Secrets are read here only, with `secret`, and handed to the components as arguments.
    kubeconfig = config.cluster.kubeconfig
    kubeconfig_secret = secret(kubeconfig.secret) if kubeconfig and kubeconfig.secret else None
    warn_missing(config, kubeconfig_secret)  # at preview only: what the cluster lacks (ingress controller, cert-manager, adapter, KEDA)
    kubernetes = pulumi.ResourceOptions(providers=[kubernetes_provider(config.cluster, kubeconfig_secret, parent)], parent=parent)

    rules = adapter_rules() if needs_adapter_rules(config.cluster, config.models) else None
    grant = reference_grant(config.cluster, config.models)
    cluster = ClusterBase("cluster", ClusterArgs(config.cluster, adapter_rules=rules, hold_grant=grant, nodes=tuple(config.nodes),
                                                   models=tuple(m.name for m in config.models),
                                                   servers_egress=servers_egress_policy(config.cluster, config.models),
                                                   servers_monitor=servers_pod_monitor(config.cluster, config.models)),
                          opts=kubernetes)

    cache_nodes = config.cache_nodes()  # modelStorage.type nodeCache: every one of them serves from its own array
    nodes = gpu_nodes(
        [
            GpuNodeArgs(
                node=node,
                cluster=config.cluster,
                private_key=secret(node.ssh.private_key_secret),
                host_key=secret(node.ssh.host_key_secret) if node.ssh.host_key_secret else None,
                caches_models=node in cache_nodes,
                sharing_configs=cluster.sharing_configs,
            )
            for node in config.nodes
        ],
        opts=kubernetes,
    )

    storage_node = config.node(config.model_storage.node) if config.model_storage.type == "local" else None
    mounted_at = storage_node or (cache_nodes[0] if cache_nodes else None)
    model_storage = ModelStorage(
        "model-storage",
        ModelStorageArgs(
            storage=config.model_storage,
            namespace=config.cluster.namespace,
            capacity_gib=config.capacity_gib,
            mountpoint=mounted_at.storage.mountpoint if mounted_at and mounted_at.storage else None,
            # The PV waits for the storage node's last disk step: the array is mounted at its configured size.
            # Not for the whole ClusterBase: its monitoring objects (adapter rules) are no business of the volume.
            ready=nodes[storage_node.name].storage_ready if storage_node else [],
            namespace_ref=cluster.namespace,
            annotations=applied_annotations(config.cluster),
        ),
        opts=kubernetes,
    )

    outputs: dict[str, Any] = {
        "namespace": cluster.namespace,
        "nodes": {name: node.outputs for name, node in nodes.items()},
        "modelStorage": {
            "claim": model_storage.claim_name,
            "volume": model_storage.volume_name,
            "capacity": model_storage.capacity,
            "accessMode": model_storage.access_mode,
        },
    }

    services = [
        VllmService(
            model.name,
            VllmServiceArgs(
                model=model,
                cluster=config.cluster,
                claim_name=model_storage.claim_name,
                storage_is_local=config.model_storage.type == "local",
                # A stack that renders YAML writes no Secret: its values would be plain text in the files.
                hf_token=secret(config.hf_token_secret) if config.writes_secrets else None,
                api_key=secret(model.api_key_secret) if model.api_key_secret and config.writes_secrets else None,
                rollout_salt=secret(ROLLOUT_SALT_SECRET) if config.rolls_on_api_key else None,
                namespace=cluster.namespace,
                after=(*cluster.serving_needs, *labelled_for(nodes, model.gpu_product)),
                holders={node.name: nodes[node.name].node_patch for node in config.holders(model)} if cache_nodes else {},
                on_endpoint=config.on_endpoint(model),
            ),
            opts=kubernetes,
        )
        for model in config.models
    ]

    if config.tenants:
        endpoint = TeamEndpoint(
            "endpoint",
            TeamEndpointArgs(
                cluster=config.cluster,
                tenants=tuple(config.tenants),
                models=tuple(m for m in config.models if config.on_endpoint(m)),
                keys={t.name: tuple(secret(key) for key in t.api_key_secrets) for t in config.tenants}
                if config.writes_secrets else None,
                held_keys={m.name: secret(m.api_key_secret) for m in config.models
                           if config.on_endpoint(m) and m.scales_to_zero and m.api_key_secret} if config.writes_secrets else None,
                namespace=cluster.namespace,
                after=tuple(s for m, s in zip(config.models, services, strict=True) if config.on_endpoint(m)),
            ),
            opts=kubernetes,
        )
        outputs["endpoint"] = endpoint.urls

    outputs["prometheusAdapterRules"] = cluster.adapter_rules
    outputs["models"] = {
        model.name: {
            "url": service.url,
            "ingressUrl": service.ingress_url,
            "servedModelName": service.served_model_name,
            "gpusPerReplica": service.gpus_per_replica,
            "replicas": service.replicas,
        }
        for model, service in zip(config.models, services, strict=True)
    }
    return outputs
