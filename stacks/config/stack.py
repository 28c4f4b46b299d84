"""The whole stack: cross-key checks (names, capacity, GPU fit) and checks against the deployed stack."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field, model_validator

from stacks.config.base import COMMIT_SHA, ConfigError, SecretKeyName, _at, _Model, _unique
from stacks.config.cluster import Cluster
from stacks.config.models import Model
from stacks.config.nodes import Node, disk_identity, size_gb_for
from stacks.config.secrets import value_problem
from stacks.config.sharing import GPU, SHARED, resource_name
from stacks.config.storage import ModelStorage, usable_gib
from stacks.placement import stranded_pod

ROLLOUT_SALT_SECRET = "rolloutSalt"
"""Secret config key holding the salt of the serving pods' API-key annotation (set once, random):
see components/serving/credentials.py for why it is a secret of its own."""


class StackConfig(_Model):
    cluster: Cluster
    """Cluster-wide choices."""
    nodes: list[Node] = Field(min_length=1)
    """The GPU nodes this stack prepares and labels."""
    model_storage: ModelStorage
    """Where model files live; see the three `type`s below."""
    models: list[Model] = []
    """Models to serve, one vLLM service bundle each."""
    hf_token_secret: SecretKeyName = "hfToken"
    """Secret config key holding the Hugging Face token."""

    @model_validator(mode="after")
    def _cross_checks(self) -> StackConfig:
        _unique(self.nodes, "name", "nodes")
        _unique(self.models, "name", "models")
        self._check_served_names()
        self._check_secret_roles()
        self._check_same_host_collisions()
        self._check_one_disk_one_node()
        self._check_storage_node()
        self._check_models()
        self._check_runtimes()
        self._check_sharing_plugin()
        self._check_pod_security()
        return self

    def _check_served_names(self) -> None:
        # A client picks a model or an adapter by the same `"model"` field, and a shared edge or
        # router lists them side by side: one name must mean one thing across the stack.
        served = {model.name: f"models[{i}].name" for i, model in enumerate(self.models)}
        for i, model in enumerate(self.models):
            for j, adapter in enumerate(model.lora.adapters if model.lora else []):
                path = f"models[{i}].lora.adapters[{j}].name"
                other = served.setdefault(adapter.name, path)
                if other != path:
                    raise _at(path, f"{adapter.name!r} is already served as {other}; clients choose a model or an adapter "
                                    "by this name, so it must be unique across the stack")

    def _check_pod_security(self) -> None:
        if self.cluster.pod_security.enforce != "restricted":
            return
        for i, model in enumerate(self.models):
            if model.security_profile != "nonRoot":
                raise _at(
                    f"models[{i}].securityProfile",
                    "root, but cluster.podSecurity.enforce is restricted, which refuses pods that run as root: "
                    "set securityProfile: nonRoot, or enforce: baseline",
                )

    def _check_sharing_plugin(self) -> None:
        if not self.cluster.device_plugin.enabled:
            return
        for i, node in enumerate(self.nodes):
            if node.gpu.sharing is not None and node.gpu.sharing.mig is not None:
                raise _at(
                    f"nodes[{i}].gpu.sharing.mig",
                    "not with cluster.devicePlugin.enabled: the stack's device plugin does not run MIG (the cards need "
                    "NVIDIA's MIG manager to create the instances, and the plugin CAP_SYS_ADMIN to list them): use the "
                    "GPU Operator's (devicePlugin.enabled: false)",
                )

    def _check_runtimes(self) -> None:
        # k3s/rke2 add the `nvidia` runtime but never make it the default: GPU pods must name it.
        for i, node in enumerate(self.nodes):
            if node.container_runtime in ("k3s", "rke2") and self.cluster.runtime_class_name is None:
                raise _at(
                    f"nodes[{i}].containerRuntime",
                    f"{node.container_runtime} does not make the NVIDIA runtime its default, so GPU pods must name it: "
                    "set cluster.runtimeClassName: nvidia",
                )

    def _check_same_host_collisions(self) -> None:
        # Two node entries with the same SSH host and port reach one machine (e.g. a lab VM); their
        # arrays and mounts must not meet. The same host on another port is another machine (a
        # port-forwarding jump host or NAT in front of several nodes).
        seen: dict[tuple[str, int, str, str], int] = {}
        for i, node in enumerate(self.nodes):
            if node.storage is None or not node.prepares_disks:
                continue
            claims = [("raidName", node.storage.raid_name), ("mountpoint", node.storage.mountpoint)]
            claims += [("disks", disk) for disk in node.storage.disks]
            for key, value in claims:
                other = seen.setdefault((node.ssh.host.lower(), node.ssh.port, key, value), i)
                if other != i:
                    where = f"{node.ssh.host} port {node.ssh.port}"
                    raise _at(f"nodes[{i}].storage.{key}", f"{value!r} is already used by nodes[{other}] on the same machine ({where})")

    def _check_one_disk_one_node(self) -> None:
        # A by-id name (WWN, EUI, model_serial) names one physical disk wherever it is seen: listed
        # under two machines it is a shared LUN both would partition and mirror, and two names of one
        # serial on one machine are two paths to a single disk (a "mirror" of it protects nothing).
        seen: dict[tuple[str, str], tuple[int, int, str]] = {}
        for i, node in enumerate(self.nodes):
            if node.storage is None or not node.prepares_disks:
                continue
            for j, disk in enumerate(node.storage.disks):
                identity = disk_identity(disk)
                if identity is None:
                    continue
                other = seen.setdefault(identity, (i, j, disk))
                if other[:2] == (i, j):
                    continue
                first = self.nodes[other[0]]
                if other[0] != i and (first.ssh.host.lower(), first.ssh.port) == (node.ssh.host.lower(), node.ssh.port) \
                        and other[2] == disk:
                    continue  # two entries of one machine: _check_same_host_collisions says it
                kind, value = identity
                where = f"nodes[{other[0]}].storage.disks[{other[1]}]"
                if other[0] == i:
                    raise _at(f"nodes[{i}].storage.disks[{j}]",
                              f"{disk} and {other[2]} are one physical disk ({kind} {value}: two paths to one device); "
                              "a mirror needs two disks: list two different ones (`ls -l /dev/disk/by-id/` on the node)")
                raise _at(f"nodes[{i}].storage.disks[{j}]",
                          f"{disk} is the same physical disk ({kind} {value}) as {where} on {first.name}; two nodes "
                          f"would partition and mirror it and destroy each other's data: list {node.name}'s own disks "
                          "(`ls -l /dev/disk/by-id/` on it)")

    def _check_secret_roles(self) -> None:
        first: dict[str, tuple[str, str, str]] = {}
        for key, role, path, what in self.secret_roles():
            role0, path0, what0 = first.setdefault(key, (role, path, what))
            if role0 != role:
                raise _at(path, f"{key!r} is already {path0} ({what0}); one secret config key holds one credential, "
                                f"so one of the two readers gets the wrong one: give {path} a key of its own")

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
        if self.rolls_on_api_key:
            roles.append((ROLLOUT_SALT_SECRET, "rollout-salt", ROLLOUT_SALT_SECRET, "a random salt"))
        return roles

    def _check_storage_node(self) -> None:
        storage = self.model_storage
        if storage.type != "local":
            return
        node = self.node(storage.node)
        if node is None:
            names = ", ".join(n.name for n in self.nodes)
            raise _at("modelStorage.node", f"{storage.node!r} is not a configured node (configured: {names})")
        if not node.prepares_disks:
            raise _at("modelStorage.node", f"node {storage.node!r} has no `storage.disks`, so there is no RAID mount to serve models from")

    def _check_models(self) -> None:
        self._check_replicas_and_routes()
        # Counted per product and per resource a node advertises: whole cards, time-slices, each MIG profile.
        demand: Counter[tuple[str, str]] = Counter()
        for i, model in enumerate(self.models):
            nodes = [n for n in self.nodes if n.gpu.product == model.gpu_product]
            if not nodes:
                products = sorted({n.gpu.product for n in self.nodes})
                raise _at(f"models[{i}].gpuProduct", f"{model.gpu_product!r} matches no node (products: {', '.join(products)})")
            resource = model.gpu_resource
            largest = max(n.gpu.advertised.get(resource, 0) for n in nodes)
            if largest == 0:
                raise _at(f"models[{i}].gpuResource", missing_resource(model, nodes))
            if model.gpus_per_replica > largest:
                raise _at(
                    f"models[{i}].gpusPerReplica",
                    f"{model.gpus_per_replica} GPUs, but the largest {model.gpu_product} node has {largest}; "
                    "one pod cannot span nodes (tensor parallelism needs all its GPUs on one node)",
                )
            demand[(model.gpu_product, resource)] += model.replicas.max * model.gpus_per_replica
        for (product, resource), wanted in demand.items():
            have = sum(n.gpu.advertised.get(resource, 0) for n in self.nodes if n.gpu.product == product)
            if wanted > have:
                what = f"{product} GPUs" if resource == GPU else f"{resource_name(resource)} on {product} nodes"
                raise _at(
                    "models",
                    f"at max replicas the models need {wanted} {what} but the nodes declare {have}; "
                    f"the extra pods would stay Pending with 'Insufficient {resource_name(resource)}' — lower replicas.max or add nodes",
                )
        self._check_per_node_fit()
        self._check_shared_memory()
        total = sum(m.disk_gb for m in self.models)
        capacity_gb = self.capacity_gib * 2**30 / 10**9
        weights = "weights and adapters" if any(m.lora for m in self.models) else "weights"
        if total > capacity_gb:
            raise _at(
                "models",
                f"the {weights} add up to {total:g} GB but the model volume holds {capacity_gb:.0f} GB "
                f"({self.capacity_gib} GiB) — raise the partition size or the shared volume's sizeGi",
            )
        if self.model_storage.type != "local" or not self.models:
            return
        # A local PV pins every pod that mounts it to the storage node: the scheduler never
        # places them elsewhere, so that node alone must hold every replica.
        home = self.node(self.model_storage.node)
        assert home is not None
        for i, model in enumerate(self.models):
            if model.gpu_product != home.gpu.product:
                raise _at(
                    f"models[{i}].gpuProduct",
                    f"{model.gpu_product!r}, but node-local model storage lives on {home.name} ({home.gpu.product}); "
                    "its pods could never schedule — use shared storage (modelStorage.type: nfs or storageClass)",
                )
        for resource in sorted({m.gpu_resource for m in self.models}):
            wanted = sum(m.replicas.max * m.gpus_per_replica for m in self.models if m.gpu_resource == resource)
            have = home.gpu.advertised.get(resource, 0)
            if wanted > have:
                unit = "GPUs" if resource == GPU else resource_name(resource)
                raise _at(
                    "models",
                    f"at max replicas the models need {wanted} {unit}, but node-local storage keeps every pod on "
                    f"{home.name} ({have} {unit}) and a ReadWriteOnce volume cannot attach to a second node — "
                    "use shared storage (modelStorage.type: nfs or storageClass) or lower replicas.max",
                )

    def _check_per_node_fit(self) -> None:
        for product, resource in sorted({(m.gpu_product, m.gpu_resource) for m in self.models}):
            nodes = [n for n in self.nodes if n.gpu.product == product and n.gpu.advertised.get(resource)]
            models = [(i, m) for i, m in enumerate(self.models) if (m.gpu_product, m.gpu_resource) == (product, resource)]
            pods = [m.gpus_per_replica for _, m in models for _ in range(m.replicas.max)]
            stranding = stranded_pod([n.gpu.advertised[resource] for n in nodes], pods)
            if stranding is None:
                continue
            i = next(i for i, m in models if m.gpus_per_replica == stranding.size)
            placed = "; ".join(
                f"{node.name}: {' + '.join(map(str, pods_there)) or 'nothing'} ({free} free)"
                for node, pods_there, free in zip(nodes, stranding.placement, stranding.free, strict=True)
            )
            raise _at(
                f"models[{i}].gpusPerReplica",
                f"its {stranding.size}-GPU pods can be left Pending although the {product} GPUs add up: the scheduler may "
                f"place the other pods as {placed}, and it never moves a running pod to make room — give the models on "
                "these nodes the same gpusPerReplica, lower replicas.max, or add a node",
            )

    def _check_shared_memory(self) -> None:
        # vLLM's --gpu-memory-utilization is a share of the whole card's memory, taken at start, and
        # time-slicing isolates no memory: pods on one card must add up to 1.0 at most. The device plugin,
        # not the scheduler, picks the card behind a slice, and which pods meet on one changes as they
        # restart, so any `replicas` of the pods that may land on the node can meet on one card.
        for node in self.nodes:
            sharing = node.gpu.sharing
            if sharing is None or sharing.time_slicing is None:
                continue
            replicas = sharing.time_slicing.replicas
            pods = sorted(((m.gpu_memory_utilization, i) for i, m in enumerate(self.models)
                           if m.gpu_product == node.gpu.product and m.gpu_resource == SHARED for _ in range(m.replicas.max)),
                          key=lambda pod: (-pod[0], pod[1]))
            worst = pods[:replicas]
            total = sum(share for share, _ in worst)
            if round(total, 6) <= 1:
                continue
            shares = " + ".join(f"{share:g} (models[{i}])" for share, i in worst)
            raise _at(
                f"models[{worst[0][1]}].gpuMemoryUtilization",
                f"{worst[0][0]:g}, but on {node.name} up to {replicas} of the shared pods can run on one card "
                f"(timeSlicing.replicas; the device plugin picks the card, not the scheduler): {shares} = {total:g} of its "
                "memory, which is not isolated, so the later pod fails at start — lower gpuMemoryUtilization until any "
                f"{replicas} of them add up to 1.0 or less, or lower timeSlicing.replicas",
            )

    def _check_replicas_and_routes(self) -> None:
        hosts: dict[str, tuple[int, str | None]] = {}
        routes: dict[tuple[str, str], int] = {}
        issued: dict[str, tuple[int, str]] = {}
        for i, model in enumerate(self.models):
            if self.cluster.require_commit_revisions and not re.fullmatch(COMMIT_SHA, model.revision):
                raise _at(
                    f"models[{i}].revision",
                    f"{model.revision!r} is a branch or tag, which moves: pin the 40-hex commit it points at "
                    f"(the model page's commit history, or `hf download --revision {model.revision}` prints the "
                    "snapshot path), or set cluster.requireCommitRevisions: false for a lab",
                )
            if model.gfd_product is not None and not self.cluster.gpu_feature_discovery:
                raise _at(
                    f"models[{i}].gfdProduct",
                    "selects on GPU Feature Discovery's label, but cluster.gpuFeatureDiscovery is false: no node would carry it",
                )
            if model.scales_to_zero:
                self._check_hold(i)
            if self.cluster.autoscaling == "none" and model.replicas.min != model.replicas.max:
                raise _at(
                    f"models[{i}].replicas",
                    f"min {model.replicas.min} ≠ max {model.replicas.max} but cluster.autoscaling is none, so nothing "
                    "would ever scale between them — set min == max or choose hpa or keda",
                )
            if model.ingress is None:
                continue
            if model.lora and model.lora.runtime_updates:
                # vLLM's load/unload endpoints sit under /v1, which the edge forwards, behind the same
                # key as inference: every client could swap what the model answers with.
                raise _at(f"models[{i}].lora.runtimeUpdates",
                          "not for a model with ingress: /v1/load_lora_adapter sits under the /v1 the edge forwards, behind "
                          "the same key as inference, and what it loads is lost on restart; list the adapters in lora.adapters")
            if self.cluster.edge == "gateway":
                for key in ("auth_url", "tls_secret"):
                    if getattr(model.ingress, key) is not None:
                        camel = "authUrl" if key == "auth_url" else "tlsSecret"
                        why = ("an HTTPRoute has no standard external auth: use apiKeySecret" if key == "auth_url"
                               else "the Gateway's listener holds the certificate")
                        raise _at(f"models[{i}].ingress.{camel}", f"not with cluster.edge gateway: {why}")
            if model.api_key_secret is None and model.ingress.auth_url is None:
                # vLLM's key guards /v1 only, and the edge forwards only /v1: with neither, anyone
                # who can resolve the host can use the GPUs.
                raise _at(
                    f"models[{i}].apiKeySecret",
                    f"models[{i}].ingress makes the model public but nothing authenticates it: set apiKeySecret "
                    "(vLLM's API key, a secret config key) or ingress.authUrl (ingress-nginx external auth)",
                )
            host, path = model.ingress.host, model.ingress.path.rstrip("/") or "/"
            other = routes.setdefault((host, path), i)
            if other != i:
                raise _at(f"models[{i}].ingress.path", f"{host}{path} is already routed to models[{other}]; give each model its own path")
            secret_name = model.ingress.tls_secret
            if secret_name and self.cluster.cluster_issuer and self.cluster.edge == "ingress":
                # cert-manager makes one Certificate per secret, from the one Ingress that owns it:
                # a second host on the same secret would be served a certificate without its name.
                owner, owner_host = issued.setdefault(secret_name, (i, host))
                if owner_host != host:
                    raise _at(f"models[{i}].ingress.tlsSecret",
                              f"{secret_name!r} already holds the certificate cert-manager issues for {owner_host} "
                              f"(models[{owner}]); {host} needs its own secret, e.g. {secret_name}-{host.split('.')[0]}")
            first, secret = hosts.setdefault(host, (i, model.ingress.tls_secret))
            if secret != model.ingress.tls_secret:
                # nginx serves one certificate per host; two secrets for one host means one is ignored.
                raise _at(
                    f"models[{i}].ingress.tlsSecret",
                    f"{host} already uses tlsSecret {secret!r} in models[{first}]; one host has one certificate",
                )

    def _check_hold(self, i: int) -> None:
        """`replicas.min: 0` only where something receives the requests and wakes the model."""
        if self.cluster.autoscaling != "keda":
            raise _at(f"models[{i}].replicas.min",
                      f"0 needs cluster.autoscaling keda (it is {self.cluster.autoscaling}): only KEDA scales a Deployment to zero "
                      "and back (an HPA stops at 1), and only its HTTP add-on holds the requests meanwhile; set keda, or min: 1")
        if self.cluster.request_hold is None:
            # The queue gauge is exported by the vLLM pods themselves: at zero pods no metric moves.
            raise _at(f"models[{i}].replicas.min",
                      "0, but cluster.requestHold is unset: the queue metric comes from the vLLM pods, so at zero nothing would "
                      "see a request or wake the model; install KEDA's HTTP add-on and set cluster.requestHold: {} "
                      "(its interceptor holds requests while the model starts), or use min: 1")

    def warnings(self) -> list[str]:
        """Valid but probably unintended choices, one line each naming the key.

        A node whose disks no model volume uses still gets its disk steps (warned, not skipped):
        the array may be prepared ahead of a switch to local storage, or kept from before a switch
        away from it, and a stack should not change what it does to disks behind the user's back.
        `storage.disks: []` is the one way to skip them, and the warning says so.
        """
        storage = self.model_storage
        home = storage.node if storage.type == "local" else None
        why = f"modelStorage.type is {storage.type}" if home is None else f"the model volume lives on {home}"
        return [
            f"nodes[{i}].storage.disks: {node.name} partitions, mirrors and mounts {' and '.join(node.storage.disks)} "
            f"at {node.storage.mountpoint} but nothing uses that array ({why}); set `storage.disks: []` to skip its disk steps"
            for i, node in enumerate(self.nodes)
            if node.storage is not None and node.prepares_disks and node.name != home
        ]

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    @property
    def capacity_gib(self) -> int:
        """Capacity of the model volume, derived from the partition for node-local storage."""
        storage = self.model_storage
        if storage.type == "local":
            node = self.node(storage.node)
            assert node is not None and node.storage is not None
            return usable_gib(node.storage.size_gb)
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

    def secret_keys(self) -> list[str]:
        """Every secret config key this stack reads, in a stable order."""
        return list(dict.fromkeys(key for key, *_ in self.secret_roles()))


# ---------------------------------------------------------------------------- against the secret values


def missing_resource(model: Model, nodes: list[Node]) -> str:
    """Why no node of the model's product can run its pods: none advertises what the pods ask for."""
    resource = model.gpu_resource
    offered = sorted({name for n in nodes for name in n.gpu.advertised})
    if resource == GPU:
        fix = ("set gpuResource to what they advertise (a shared card is never given to a model that did not ask for one), "
               "or remove gpu.sharing from a node")
    elif resource == SHARED:
        fix = "give a node gpu.sharing.timeSlicing, or ask for gpu"
    else:
        fix = f"add {resource.removeprefix('mig-')} to a node's gpu.sharing.mig.profiles, or ask for what they advertise"
    return (f"{resource}, but no {model.gpu_product} node advertises {resource_name(resource)} (they advertise "
            f"{', '.join(resource_name(o) for o in offered)}): its pods would stay Pending; {fix}")


def check_secret_values(stack: StackConfig, value_of: Callable[[str], str]) -> None:
    """Raise ConfigError when a secret holds another kind of credential than the key that reads it
    expects, or the same credential as a secret of another role. Never says the value."""
    seen: dict[str, tuple[str, str, str]] = {}
    for key, role, path, what in stack.secret_roles():
        value = value_of(key)
        problem = value_problem(role, value, what)
        if problem:
            raise ConfigError(f"{path}: the secret {key} {problem}")
        kind = role.split()[0]  # two machines' host keys are one kind (cloned images share theirs)
        other = seen.setdefault(value, (key, kind, path)) if value else (key, kind, path)
        if other[0] != key and other[1] != kind:
            raise ConfigError(f"{path}: the secret {key} holds the same value as {other[0]} ({other[2]}); "
                              f"one credential for two roles reaches the wrong audience: set {key} to {what} of its own")


# ---------------------------------------------------------------------------- against the deployed stack


def refuse_shrinking(stack: StackConfig, deployed_nodes: Mapping[str, Any]) -> None:
    """Raise ConfigError when a node's `sizeGb` is below the partitions its last `pulumi up` left.

    `deployed_nodes` is the stack output `nodes` of the previous run (`GpuNode.outputs` by node
    name). Partitions of another array or on other disks are not compared: nothing shrinks there.
    """
    if not isinstance(deployed_nodes, Mapping):
        return  # not what GpuNode exports: nothing to compare with
    for i, node in enumerate(stack.nodes):
        storage = node.storage
        before = deployed_nodes.get(node.name)
        if storage is None or not node.prepares_disks or not isinstance(before, Mapping):
            continue
        deployed_bytes = before.get("partitionBytes")
        if not isinstance(deployed_bytes, int | float) or isinstance(deployed_bytes, bool):
            continue  # unknown: deployed before this output existed, or the grow step never finished
        same_disks = set(before.get("disks") or []) & set(storage.disks)
        if before.get("arrayDevice") != storage.device or not same_disks:
            continue
        if storage.partition_bytes < deployed_bytes:
            at_least = size_gb_for(int(deployed_bytes))
            raise ConfigError(
                f"nodes[{i}].storage.sizeGb: {storage.size_gb} would shrink the partitions of {storage.device} on "
                f"{node.name} ({int(deployed_bytes)} bytes each since the last pulumi up); XFS cannot shrink. "
                f"Allowed: {at_least} or more"
            )

