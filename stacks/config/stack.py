"""The whole stack: the four top-level keys together, and the cross-key checks it runs on them (`checks`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from stacks.config.base import SecretKeyName, _Model, _unique
from stacks.config.checks import disks, edge, endpoint, gpus, lora, model_volume, node_cache, reproducible, runtime, scaling, secret_keys
from stacks.config.cluster import ClusterConfig
from stacks.config.endpoint import Tenant
from stacks.config.models import Model
from stacks.config.nodes import Node
from stacks.config.storage import ModelStorageConfig, usable_gib

STABLE_DISK_NAMES = "/dev/disk/"
"""Where udev keeps the names that do not follow probe order: by-id (the disk's WWN or serial), by-path (its slot)."""

ROLLOUT_SALT_SECRET = "rolloutSalt"
"""Secret config key holding the salt of the serving pods' API-key annotation (set once, random):
see components/serving/credentials.py for why it is a secret of its own."""


class StackConfig(_Model):
    cluster: ClusterConfig
    """Cluster-wide choices."""
    nodes: list[Node] = Field(min_length=1)
    """The GPU nodes this stack prepares and labels."""
    model_storage: ModelStorageConfig
    """Where model files live; see the four `type`s below."""
    models: list[Model] = []
    """Models to serve, one vLLM service bundle each."""
    tenants: list[Tenant] = []
    """Teams of `cluster.endpoint`: each its keys, its host and the models it may use."""
    hf_token_secret: SecretKeyName = "hfToken"
    """Secret config key holding the Hugging Face token."""

    @model_validator(mode="after")
    def _cross_checks(self) -> StackConfig:
        # In this order, which decides the one error a config with several problems reports.
        _unique(self.nodes, "name", "nodes")
        _unique(self.models, "name", "models")
        edge.check_served_names(self)
        endpoint.check_tenants(self)
        edge.check_edge_kind(self)
        scaling.check_hold_services(self)
        secret_keys.check_roles(self)
        disks.check_same_machine(self)
        disks.check_one_disk_one_node(self)
        model_volume.check_home_node(self)
        node_cache.check_cache_nodes(self)
        for i in range(len(self.models)):
            # Model by model, every concern in turn: the first model with a problem is the one named.
            reproducible.check_revision(self, i)
            gpus.check_gfd_label(self, i)
            gpus.check_mig_model(self, i)
            lora.check_adapters(self, i)
            node_cache.check_model_nodes(self, i)
            gpus.check_groups(self, i)
            scaling.check_replicas(self, i)
            edge.check_ingress(self, i)
        gpus.check_demand(self)
        gpus.check_per_node_fit(self)
        gpus.check_time_sliced_memory(self)
        model_volume.check_size(self)
        model_volume.check_local_pins(self)
        node_cache.check_capacity(self)
        node_cache.check_survive_node_loss(self)
        runtime.check_runtime_class(self)
        gpus.check_mig_plugin(self)
        runtime.check_pod_security(self)
        return self

    def warnings(self) -> list[str]:
        """Valid but probably unintended choices, one line each naming the key.

        A node whose disks no model volume uses still gets its disk steps (warned, not skipped):
        the array may be prepared ahead of a switch to local storage, or kept from before a switch
        away from it, and a stack should not change what it does to disks behind the user's back.
        `storage.disks: []` is the one way to skip them, and the warning says so.
        """
        storage = self.model_storage
        used = {storage.node} if storage.type == "local" else {n.name for n in self.cache_nodes()}
        why = (f"the model volume lives on {storage.node}" if storage.type == "local" else
               "it is not one of modelStorage.nodes" if storage.type == "nodeCache" else f"modelStorage.type is {storage.type}")
        return [
            f"nodes[{i}].storage.disks: {node.name} partitions, mirrors and mounts {' and '.join(node.storage.disks)} "
            f"at {node.storage.mountpoint} but nothing uses that array ({why}); set `storage.disks: []` to skip its disk steps"
            for i, node in enumerate(self.nodes)
            if node.storage is not None and node.prepares_disks and node.name not in used
        ] + self._disk_name_warnings() + self._cache_warnings() + self._monitoring_warnings() + scaling.hold_port_warnings(self) \
            + endpoint.endpoint_warnings(self)

    def _disk_name_warnings(self) -> list[str]:
        """Disks listed by a kernel name (`/dev/sdb`, `/dev/nvme0n1`, `/dev/vda`): probe order gives those out, so after a
        reboot or a disk change one can name another disk, a new blank one say. Warned, not refused: a throwaway VM's
        disks may have no other name, and the steps (preflight warns too) never add a disk to a healthy array."""
        return [
            f"nodes[{i}].storage.disks: {' and '.join(kernel)} {'is a kernel name' if len(kernel) == 1 else 'are kernel names'}, "
            f"which can name another disk after a reboot or a disk change; list {node.name}'s disks by the names "
            "`ls -l /dev/disk/by-id/` shows on it"
            for i, node in enumerate(self.nodes)
            if node.storage is not None
            for kernel in [[disk for disk in node.storage.disks if not disk.startswith(STABLE_DISK_NAMES)]]
            if kernel
        ]

    def _cache_warnings(self) -> list[str]:
        """A cache node that holds no model; a model with several replicas that one node alone holds."""
        if self.model_storage.type != "nodeCache" or not self.models:
            return []
        holders = [self.holders(m) for m in self.models]
        holding = {n.name for nodes in holders for n in nodes}
        warned = [f"modelStorage.nodes: {n.name} caches no model (no model of its product and GPU resource, or none lists it "
                  "in models[].nodes): its array and GPUs are unused" for n in self.cache_nodes() if n.name not in holding]
        for i, (model, holders_of) in enumerate(zip(self.models, holders, strict=True)):
            if len(holders_of) == 1 and model.replicas.max > 1:
                warned.append(f"models[{i}].nodes: only {holders_of[0].name} holds {model.name}'s weights, so all its replicas run "
                              "there and losing it stops the model; list another node of its product")
        return warned

    def _monitoring_warnings(self) -> list[str]:
        """PodMonitors and PrometheusRules with no labels: a kube-prometheus-stack installed with its
        defaults selects them by `release: <its Helm release>` only, so they would exist and nothing
        would read them (no scrape, so no autoscaling on the queue, and no alert)."""
        monitoring = self.cluster.monitoring
        kinds = [kind for kind, on in (("PodMonitors", monitoring.pod_monitor), ("PrometheusRules", monitoring.alerts)) if on]
        if not self.models or not kinds or monitoring.labels:
            return []
        return [f"cluster.monitoring.labels is empty: a kube-prometheus-stack installed with its defaults selects "
                f"{' and '.join(kinds)} by `release: <its Helm release name>` and would read none of the models'; set "
                f"e.g. `release: kube-prometheus-stack` (your release's name), or turn `podMonitor`/`alerts` off"]

    def on_endpoint(self, model: Model) -> bool:
        """Whether the model is behind the teams' endpoint: `models[].endpoint`, by default with `cluster.endpoint`."""
        return self.cluster.endpoint is not None and model.endpoint is not False

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def cache_nodes(self) -> list[Node]:
        """With `modelStorage.type: nodeCache`, the nodes whose arrays hold weights, in config order; else none."""
        storage = self.model_storage
        if storage.type != "nodeCache":
            return []
        names = storage.nodes if storage.nodes is not None else [n.name for n in self.nodes if n.prepares_disks]
        return [n for n in self.nodes if n.name in names and n.prepares_disks]

    def holders(self, model: Model) -> list[Node]:
        """The nodes a model's pods may run on: of its product and advertising its GPU resource; with local storage
        the storage node only, with nodeCache the cache nodes that hold its weights (`models[].nodes`)."""
        fits = [n for n in self.nodes if n.gpu.product == model.gpu_product and n.gpu.advertised.get(model.gpu_resource)]
        storage = self.model_storage
        if storage.type == "local":
            return [n for n in fits if n.name == storage.node]
        if storage.type != "nodeCache":
            return fits
        names = model.nodes if model.nodes is not None else [n.name for n in self.cache_nodes()]
        return [n for n in fits if n.name in names and n.prepares_disks]

    @property
    def capacity_gib(self) -> int:
        """Capacity of the model volume, derived from the partition for node-local storage."""
        storage = self.model_storage
        if storage.type == "local":
            node = self.node(storage.node)
            assert node is not None and node.storage is not None
            return usable_gib(node.storage.size_gb)
        if storage.type == "nodeCache":
            # The one volume's declared size is what every cache node has (the smallest array): each node's
            # own fit is checked against its own array (checks.node_cache).
            return min(usable_gib(n.storage.size_gb) for n in self.cache_nodes() if n.storage is not None)
        return storage.size_gi

    @property
    def writes_secrets(self) -> bool:
        """Whether the stack creates Kubernetes Secrets: not when it renders YAML, where the
        provider would write their values in plain text."""
        return self.cluster.render_yaml_to is None

    @property
    def rolls_on_api_key(self) -> bool:
        """Whether serving pods carry the salted API-key annotation (and so the stack reads the salt):
        a model has an API key and the stack writes its Secret (a YAML-rendering stack knows no key)."""
        return self.writes_secrets and any(m.api_key_secret for m in self.models)

    def secret_roles(self) -> list[tuple[str, str, str, str]]:
        """(secret config key, role, key path, what it holds) for every secret the stack reads."""
        roles = [(self.hf_token_secret, "hf", "hfTokenSecret", "the Hugging Face token")] \
            if self.models and self.writes_secrets else []
        if self.cluster.kubeconfig and self.cluster.kubeconfig.secret:
            roles.append((self.cluster.kubeconfig.secret, "kubeconfig", "cluster.kubeconfig.secret", "the kubeconfig"))
        for i, node in enumerate(self.nodes):
            ssh = node.ssh
            roles.append((ssh.private_key_secret, "ssh-private", f"nodes[{i}].ssh.privateKeySecret", "an SSH private key"))
            if ssh.host_key_secret:
                # Each machine has its own host key; two entries on one host:port are one machine.
                roles.append((ssh.host_key_secret, f"host-key {ssh.host.lower()}:{ssh.port}", f"nodes[{i}].ssh.hostKeySecret",
                              f"the SSH host key of {ssh.host}"))
        roles += [(m.api_key_secret, "api-key", f"models[{i}].apiKeySecret", "a vLLM API key")
                  for i, m in enumerate(self.models) if m.api_key_secret and self.writes_secrets]
        # A role per team, its name in the role's kind (no space): one key or one value for two teams would let each
        # call the other's models.
        roles += [(key, f"tenant-key:{t.name}", f"tenants[{i}].apiKeySecrets[{j}]", f"an API key of team {t.name}")
                  for i, t in enumerate(self.tenants) for j, key in enumerate(t.api_key_secrets) if self.writes_secrets]
        if self.rolls_on_api_key:
            roles.append((ROLLOUT_SALT_SECRET, "rollout-salt", ROLLOUT_SALT_SECRET, "a random salt"))
        return roles

    def secret_keys(self) -> list[str]:
        """Every secret config key this stack reads, in a stable order."""
        return list(dict.fromkeys(key for key, *_ in self.secret_roles()))
