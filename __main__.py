"""gpu-serving: wires the typed stack config to the components. No logic lives here."""

import pulumi

import stacks
from components.cluster import ClusterArgs, ClusterBase, applied_annotations, kubernetes_provider
from components.endpoint import TeamEndpoint, TeamEndpointArgs
from components.node import GpuNodeArgs, gpu_nodes, labelled_for
from components.prerequisites import warn_missing
from components.serving import VllmService, VllmServiceArgs, adapter_rules, needs_adapter_rules, reference_grant, servers_egress_policy
from components.storage import ModelStorage, ModelStorageArgs
from stacks.config import ROLLOUT_SALT_SECRET

config = stacks.load()
# Secrets are read here only, with `stacks.secret`, and handed to the components as arguments.
kubeconfig = config.cluster.kubeconfig
kubeconfig_secret = stacks.secret(kubeconfig.secret) if kubeconfig and kubeconfig.secret else None
warn_missing(config, kubeconfig_secret)  # at preview only: what the cluster lacks (ingress controller, cert-manager, adapter, KEDA)
kubernetes = pulumi.ResourceOptions(providers=[kubernetes_provider(config.cluster, kubeconfig_secret)])

rules = adapter_rules() if needs_adapter_rules(config.cluster, config.models) else None
grant = reference_grant(config.cluster, config.models)
cluster = ClusterBase("cluster", ClusterArgs(config.cluster, adapter_rules=rules, hold_grant=grant, nodes=tuple(config.nodes),
                                               models=tuple(m.name for m in config.models),
                                               servers_egress=servers_egress_policy(config.cluster, config.models)),
                      opts=kubernetes)

cache_nodes = config.cache_nodes()  # modelStorage.type nodeCache: every one of them serves from its own array
nodes = gpu_nodes(
    [
        GpuNodeArgs(
            node=node,
            cluster=config.cluster,
            private_key=stacks.secret(node.ssh.private_key_secret),
            host_key=stacks.secret(node.ssh.host_key_secret) if node.ssh.host_key_secret else None,
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

pulumi.export("namespace", cluster.namespace)
pulumi.export("nodes", {name: node.outputs for name, node in nodes.items()})
pulumi.export(
    "modelStorage",
    {
        "claim": model_storage.claim_name,
        "volume": model_storage.volume_name,
        "capacity": model_storage.capacity,
        "accessMode": model_storage.access_mode,
    },
)

services = [
    VllmService(
        model.name,
        VllmServiceArgs(
            model=model,
            cluster=config.cluster,
            claim_name=model_storage.claim_name,
            storage_is_local=config.model_storage.type == "local",
            # A stack that renders YAML writes no Secret: its values would be plain text in the files.
            hf_token=stacks.secret(config.hf_token_secret) if config.writes_secrets else None,
            api_key=stacks.secret(model.api_key_secret) if model.api_key_secret and config.writes_secrets else None,
            rollout_salt=stacks.secret(ROLLOUT_SALT_SECRET) if config.rolls_on_api_key else None,
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
            keys={t.name: tuple(stacks.secret(key) for key in t.api_key_secrets) for t in config.tenants}
            if config.writes_secrets else None,
            held_keys={m.name: stacks.secret(m.api_key_secret) for m in config.models
                       if config.on_endpoint(m) and m.scales_to_zero and m.api_key_secret} if config.writes_secrets else None,
            namespace=cluster.namespace,
            after=tuple(s for m, s in zip(config.models, services, strict=True) if config.on_endpoint(m)),
        ),
        opts=kubernetes,
    )
    pulumi.export("endpoint", endpoint.urls)

pulumi.export("prometheusAdapterRules", cluster.adapter_rules)
pulumi.export(
    "models",
    {
        model.name: {
            "url": service.url,
            "ingressUrl": service.ingress_url,
            "servedModelName": service.served_model_name,
            "gpusPerReplica": service.gpus_per_replica,
            "replicas": service.replicas,
        }
        for model, service in zip(config.models, services, strict=True)
    },
)
