"""gpu-serving: wires the typed stack config to the components. No logic lives here."""

import pulumi

import stacks
from components.cluster import ClusterArgs, ClusterBase, kubernetes_provider
from components.storage import ModelStorage, ModelStorageArgs

config = stacks.load()
kubernetes = pulumi.ResourceOptions(providers=[kubernetes_provider(config.cluster)])

cluster = ClusterBase("cluster", ClusterArgs(config.cluster), opts=kubernetes)

storage_node = config.node(config.model_storage.node) if config.model_storage.type == "local" else None
model_storage = ModelStorage(
    "model-storage",
    ModelStorageArgs(
        storage=config.model_storage,
        namespace=config.cluster.namespace,
        capacity_gib=config.capacity_gib,
        mountpoint=storage_node.storage.mountpoint if storage_node and storage_node.storage else None,
        ready=[cluster],
    ),
    opts=kubernetes,
)

pulumi.export("namespace", cluster.namespace)
pulumi.export(
    "modelStorage",
    {
        "claim": model_storage.claim_name,
        "volume": model_storage.volume_name,
        "capacity": model_storage.capacity,
        "accessMode": model_storage.access_mode,
    },
)
