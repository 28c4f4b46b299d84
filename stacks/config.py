"""Typed stack configuration: everything a `Pulumi.<stack>.yaml` may choose.

The models below are the one source of truth for keys, types and defaults; the README's
config reference is written from them. Everything is validated before any resource is
declared, and every error names the key path the user has to change.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from stacks.placement import stranded_pod

PROJECT = "gpu-serving"

# Kubernetes object names. Services (one per model) need RFC 1035 labels: a letter first.
DNS_LABEL = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Label values (the GPU product is a node label value).
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
# Pulumi config key names of secrets (`pulumi config set --secret <name>`).
CONFIG_KEY = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
# mdadm array names end up in /dev/md/<name>, udev rules and GPT partition names.
RAID_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,30}$"
# Block devices and mountpoints reach node scripts; they are quoted there, but a path that
# needs quoting at all is almost always a typo, so refuse it early.
SAFE_PATH = r"^/[A-Za-z0-9._:+@/-]*$"

PATTERN_HELP = {
    DNS_LABEL: "a Kubernetes name: lowercase letters, digits and '-', a letter first, at most 63 characters",
    DNS_SUBDOMAIN: "a Kubernetes node name: lowercase letters, digits, '-' and '.'",
    LABEL_VALUE: "a label value: letters, digits, '-', '_' and '.', at most 63 characters",
    CONFIG_KEY: "a Pulumi config key name: a letter, then letters, digits, '_' or '-'",
    RAID_NAME: "an mdadm array name: letters, digits, '_' and '-', at most 31 characters",
    SAFE_PATH: "an absolute path of letters, digits and ._:+@/- (no spaces or shell characters)",
}

K8sName = Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=63)]
NodeName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=253)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE, max_length=63)]
SecretKeyName = Annotated[str, StringConstraints(pattern=CONFIG_KEY)]
SafePath = Annotated[str, StringConstraints(pattern=SAFE_PATH, max_length=255)]


class ConfigError(Exception):
    """A stack config problem, reported as one line that names the key path."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=False,
        strict=False,
        validate_default=True,
        use_attribute_docstrings=True,
    )


# ---------------------------------------------------------------------------- cluster


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


# ---------------------------------------------------------------------------- nodes


class Ssh(_Model):
    host: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:_-]+$")
    """Address or name the machine running `pulumi` reaches the node's sshd at."""
    port: int = Field(22, ge=1, le=65535)
    """sshd port."""
    user: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    """Login user; the steps need root (bash as login shell)."""
    private_key_secret: SecretKeyName = "sshPrivateKey"
    """Secret config key holding the SSH private key (PEM/OpenSSH text)."""
    host_key_secret: SecretKeyName | None = None
    """Secret config key holding the node's SSH host public key; unset disables host-key pinning."""


class Gpu(_Model):
    product: LabelValue = Field(min_length=1)
    """Value of the GPU product node label; models choose nodes by it."""
    count: int = Field(ge=1, le=256)
    """`nvidia.com/gpu` the node advertises: cards, or MIG slices (16 cards × 7 slices = 112)."""


class NodeStorage(_Model):
    disks: list[SafePath] = Field(max_length=2)
    """The two mirror members, whole disks; `/dev/disk/by-id/...` survives reordering. Empty: no disk work."""
    size_gb: int = Field(1000, ge=1, le=1_000_000)
    """Partition size on each member, in GB (10^9 bytes)."""
    raid_name: str = Field("models", pattern=RAID_NAME)
    """Array name: the array is `/dev/md/<raidName>`, the GPT partitions are named `gs-<raidName>`."""
    mountpoint: SafePath = "/mnt/models"
    """Where the array is mounted on the node; the node-local PV points here."""
    filesystem: Literal["xfs"] = "xfs"
    """Filesystem made on the array (XFS: grows online)."""
    device_timeout_seconds: int = Field(30, ge=1, le=3600)
    """How long systemd waits for the array at boot before giving up on the (nofail) mount."""

    @field_validator("disks")
    @classmethod
    def _two_distinct_disks(cls, disks: list[str]) -> list[str]:
        if len(disks) not in (0, 2):
            raise ValueError(f"a RAID1 mirror needs exactly 2 disks (or [] for no disk work), got {len(disks)}")
        if len(disks) == 2 and disks[0] == disks[1]:
            raise ValueError(f"the two disks must differ, both are {disks[0]!r}")
        return disks

    @field_validator("mountpoint")
    @classmethod
    def _not_system_dir(cls, mountpoint: str) -> str:
        normal = posixpath.normpath(mountpoint)
        if normal != mountpoint.rstrip("/") or normal in SYSTEM_DIRS:
            raise ValueError(f"{mountpoint!r} is a system directory or not a normalised path; use e.g. /mnt/models")
        return normal

    @property
    def device(self) -> str:
        return f"/dev/md/{self.raid_name}"

    @property
    def partition_name(self) -> str:
        return f"gs-{self.raid_name}"

    @property
    def partition_bytes(self) -> int:
        return partition_bytes(self.size_gb)


def partition_bytes(size_gb: int) -> int:
    """Partition size: `sizeGb` GB (10^9 bytes) rounded down to whole MiB, so that a 1 MiB-aligned
    start gives an optimally aligned end and parted never adjusts it."""
    return size_gb * 10**9 // 2**20 * 2**20


def size_gb_for(part_bytes: int) -> int:
    """The smallest `sizeGb` whose partition holds `part_bytes`."""
    size_gb = max(1, -(-part_bytes // 10**9))
    while partition_bytes(size_gb) < part_bytes:
        size_gb += 1
    return size_gb


SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/mnt", "/opt", "/proc", "/root",
     "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/lib/kubelet"]
)


class Node(_Model):
    name: NodeName
    """The Kubernetes node name (what `kubectl get nodes` shows)."""
    ssh: Ssh
    """How `pulumi up` reaches the node."""
    gpu: Gpu
    """The node's GPUs, as labels and for the capacity checks."""
    storage: NodeStorage | None = None
    """Model disk preparation; unset or `disks: []` means this node does no disk work."""
    container_runtime: Literal["containerd", "k3s", "rke2", "none"] = "containerd"
    """Runtime to configure for NVIDIA (`none`: leave it alone). k3s and rke2 need `cluster.runtimeClassName`."""

    @property
    def prepares_disks(self) -> bool:
        return self.storage is not None and len(self.storage.disks) == 2


# ---------------------------------------------------------------------------- model storage

# mdadm 1.2 superblocks reserve a data offset in front of the data; recent mdadm uses up to
# 128 MiB on large members (the internal bitmap lives in that gap).
RAID_DATA_OFFSET_BYTES = 128 * 2**20
# XFS keeps part of the device for its log, allocation-group headers, inode chunks and the
# reserved block pool. 2 % bounds what `df` shows missing on a fresh mkfs.xfs (measured on
# the test VM; see README "Capacity").
XFS_OVERHEAD_FRACTION = 0.02


def usable_gib(size_gb: int) -> int:
    """PersistentVolume capacity, in GiB, for a RAID1 of two `size_gb` GB partitions with XFS.

    GB (10^9) to bytes, minus the mdadm data offset, minus the XFS overhead, to GiB, rounded down.
    1000 GB gives 912 GiB (the seed hand-picked 900Gi).
    """
    raid_bytes = size_gb * 10**9 - RAID_DATA_OFFSET_BYTES
    return max(0, math.floor(raid_bytes * (1 - XFS_OVERHEAD_FRACTION) / 2**30))


class _StorageBase(_Model):
    name: K8sName = "models"
    """Name of the PersistentVolume and its claim."""


class LocalStorage(_StorageBase):
    """ReadWriteOnce on one node's RAID mount: every model pod runs on that node."""

    type: Literal["local"]
    node: NodeName
    """A configured node whose `storage` prepares the RAID; the PV is its mountpoint."""


class NfsStorage(_StorageBase):
    """ReadWriteMany on an NFS export: pods may run on any GPU node."""

    type: Literal["nfs"]
    server: str = Field(min_length=1, pattern=r"^[A-Za-z0-9.:_-]+$")
    """NFS server name or address."""
    path: SafePath
    """Exported path; must not squash root (the download Job writes as root)."""
    size_gi: int = Field(ge=1)
    """Capacity of the export in GiB (the program cannot measure a remote server)."""


class ClassStorage(_StorageBase):
    """ReadWriteMany from an existing storage class that provisions shared volumes."""

    type: Literal["storageClass"]
    storage_class: K8sName
    """An existing storage class that provisions ReadWriteMany volumes."""
    size_gi: int = Field(ge=1)
    """Size of the claim in GiB."""


ModelStorage = Annotated[LocalStorage | NfsStorage | ClassStorage, Field(discriminator="type")]


# ---------------------------------------------------------------------------- models


class Ingress(_Model):
    host: str = Field(pattern=r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
    """Host name of the Ingress rule."""
    path: str = Field("/", pattern=r"^/[A-Za-z0-9._~/-]*$")
    """Path prefix; a sub-path is stripped before it reaches vLLM."""
    tls_secret: K8sName | None = None
    """Secret for the certificate; cert-manager fills it when the cluster has an issuer."""


class Replicas(_Model):
    min: int = Field(1, ge=0, le=100)
    """Fewest pods (at least 1: the queue metric comes from the pods)."""
    max: int = Field(1, ge=1, le=100)
    """Most pods; max × gpusPerReplica counts against the nodes' GPUs."""
    target_requests_waiting: int = Field(3, ge=1, le=10_000)
    """Autoscaling target: average `vllm:num_requests_waiting` per pod."""

    @field_validator("min")
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            # The queue gauge is exported by the vLLM pods themselves: at zero pods there is no
            # metric, so no autoscaler could ever scale back up.
            raise ValueError("0 replicas can never scale up again (the queue metric comes from the vLLM pods); use 1 or more")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be ≤ max ({self.max})")
        return self


ImageRef = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9][a-z0-9._/:-]*[a-z0-9](:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$"),
]


# Flags the bundle sets from typed config (or must not be changed behind its back). Aliases
# included: vLLM's parser accepts `_` for `-` and short forms such as `-tp`.
BUNDLE_FLAGS = {
    "--model": "huggingFaceId", "--served-model-name": "name", "--revision": "revision",
    "--tokenizer-revision": "revision", "--host": "the bundle (0.0.0.0)", "--port": "the bundle (8000)",
    "--download-dir": "the bundle (the model volume)", "--tensor-parallel-size": "gpusPerReplica", "-tp": "gpusPerReplica",
    "--pipeline-parallel-size": "gpusPerReplica (one pod owns exactly its GPUs)", "-pp": "gpusPerReplica (one pod owns exactly its GPUs)",
    "--data-parallel-size": "replicas", "-dp": "replicas",
    "--gpu-memory-utilization": "gpuMemoryUtilization", "--max-model-len": "maxModelLen",
    "--api-key": "apiKeySecret (a literal would land in the manifest)",
    "--disable-log-stats": "nothing: it removes the queue metric autoscaling and monitoring read",
}
# Environment the bundle sets; overriding it breaks offline start, the secrets or GPU isolation.
BUNDLE_ENV = {
    "HF_TOKEN": "hfTokenSecret", "HUGGING_FACE_HUB_TOKEN": "hfTokenSecret", "VLLM_API_KEY": "apiKeySecret",
    "HF_HUB_OFFLINE": "the bundle (serving pods never download)", "HF_HOME": "the bundle (the model volume)",
    "HF_HUB_CACHE": "the bundle (the model volume)", "TRANSFORMERS_OFFLINE": "the bundle",
    "CUDA_VISIBLE_DEVICES": "the device plugin (a pod sees only its GPUs)",
    "NVIDIA_VISIBLE_DEVICES": "the device plugin (a pod sees only its GPUs)",
}
# Object names are `vllm-<name>` plus suffixes up to `-dl-<8 hex>` (Job names are also pod label values: ≤ 63).
MODEL_NAME_MAX = 40


def flag_name(arg: str) -> str | None:
    """`--tensor_parallel_size=2` → `--tensor-parallel-size`; None for a value."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None
    name = arg.split("=", 1)[0]
    return "-" * (len(name) - len(name.lstrip("-"))) + name.lstrip("-").replace("_", "-")


class Model(_Model):
    name: K8sName
    """Kubernetes name of the model's objects and vLLM's `--served-model-name`."""
    hugging_face_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Hugging Face repository, `org/name`."""
    revision: str = Field("main", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
    """Branch, tag or commit of the repository; pin a commit for reproducible serving."""
    image: ImageRef = "vllm/vllm-openai:v0.11.0"
    """vLLM image with a pinned tag or digest (`latest` is refused)."""
    gpu_product: LabelValue
    """`nodes[].gpu.product` of the nodes this model runs on."""
    gpus_per_replica: int = Field(1, ge=1, le=64)
    """GPUs per pod, all on one node; also `--tensor-parallel-size`."""
    max_model_len: int = Field(8192, ge=128, le=10_000_000)
    """`--max-model-len`: context length, bounds the KV cache."""
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0)
    """`--gpu-memory-utilization`: share of GPU memory vLLM may take."""
    weights_gb: float = Field(gt=0, le=100_000)
    """Approximate size of the weights on disk; sizes the startup probe and the storage check."""
    replicas: Replicas = Replicas()
    """Replica range; an autoscaler is created when min < max."""
    ingress: Ingress | None = None
    """Expose the model outside the cluster through an Ingress."""
    extra_args: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = []
    """More `vllm serve` flags; flags the bundle owns (model, port, download dir, parallelism…) are refused."""
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    """More environment variables, literal values only; secret-looking names are refused."""
    api_key_secret: SecretKeyName | None = None
    """Secret config key holding the vLLM API key; unset serves without one."""
    cpu: str = Field("4", pattern=r"^[0-9]+(\.[0-9]+|m)?$")
    """CPU request of each pod (no CPU limit: throttling hurts inference)."""
    memory: str = Field("16Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$")
    """Memory request; the limit adds the /dev/shm size."""
    smoke_test: bool = True
    """After each rollout, a Job asks the model for one token; `pulumi up` fails when inference does not answer."""

    @field_validator("image")
    @classmethod
    def _pinned(cls, image: str) -> str:
        if image.endswith(":latest"):
            raise ValueError(f"{image!r} is not pinned; use a version tag such as vllm/vllm-openai:v0.11.0")
        return image

    @field_validator("name")
    @classmethod
    def _short_enough(cls, name: str) -> str:
        if len(name) > MODEL_NAME_MAX:
            raise ValueError(f"at most {MODEL_NAME_MAX} characters: object names are vllm-<name> plus suffixes and must stay ≤ 63")
        return name

    @field_validator("extra_args")
    @classmethod
    def _not_bundle_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = flag_name(arg)
            if flag in BUNDLE_FLAGS:
                raise ValueError(f"{arg!r}: {flag} is set by the bundle from {BUNDLE_FLAGS[flag]}; change that key instead")
        return args

    @field_validator("env")
    @classmethod
    def _no_literal_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if SECRET_LIKE.search(name):
                raise ValueError(f"{name} looks like a secret; literal env values land in the manifest, use *Secret keys")
            if name in BUNDLE_ENV:
                raise ValueError(f"{name} is set by the bundle from {BUNDLE_ENV[name]}; remove it from env")
        return env


SECRET_LIKE = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|PRIVATE|CREDENTIAL", re.IGNORECASE)


# ---------------------------------------------------------------------------- the stack


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
        self._check_same_host_collisions()
        self._check_storage_node()
        self._check_models()
        self._check_runtimes()
        return self

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
        # Two node entries may point at one machine (e.g. a lab VM); their arrays and mounts must not meet.
        seen: dict[tuple[str, str, str], int] = {}
        for i, node in enumerate(self.nodes):
            if node.storage is None or not node.prepares_disks:
                continue
            claims = [("raidName", node.storage.raid_name), ("mountpoint", node.storage.mountpoint)]
            claims += [("disks", disk) for disk in node.storage.disks]
            for key, value in claims:
                other = seen.setdefault((node.ssh.host, key, value), i)
                if other != i:
                    raise _at(f"nodes[{i}].storage.{key}", f"{value!r} is already used by nodes[{other}] on host {node.ssh.host}")

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
        demand: Counter[str] = Counter()
        for i, model in enumerate(self.models):
            nodes = [n for n in self.nodes if n.gpu.product == model.gpu_product]
            if not nodes:
                products = sorted({n.gpu.product for n in self.nodes})
                raise _at(f"models[{i}].gpuProduct", f"{model.gpu_product!r} matches no node (products: {', '.join(products)})")
            largest = max(n.gpu.count for n in nodes)
            if model.gpus_per_replica > largest:
                raise _at(
                    f"models[{i}].gpusPerReplica",
                    f"{model.gpus_per_replica} GPUs, but the largest {model.gpu_product} node has {largest}; "
                    "one pod cannot span nodes (tensor parallelism needs all its GPUs on one node)",
                )
            demand[model.gpu_product] += model.replicas.max * model.gpus_per_replica
        for product, wanted in demand.items():
            have = sum(n.gpu.count for n in self.nodes if n.gpu.product == product)
            if wanted > have:
                raise _at(
                    "models",
                    f"at max replicas the models need {wanted} {product} GPUs but the nodes declare {have}; "
                    "the extra pods would stay Pending with 'Insufficient nvidia.com/gpu' — lower replicas.max or add nodes",
                )
        self._check_per_node_fit()
        total = sum(m.weights_gb for m in self.models)
        capacity_gb = self.capacity_gib * 2**30 / 10**9
        if total > capacity_gb:
            raise _at(
                "models",
                f"the weights add up to {total:g} GB but the model volume holds {capacity_gb:.0f} GB "
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
        wanted = sum(m.replicas.max * m.gpus_per_replica for m in self.models)
        if wanted > home.gpu.count:
            raise _at(
                "models",
                f"at max replicas the models need {wanted} GPUs, but node-local storage keeps every pod on "
                f"{home.name} ({home.gpu.count} GPUs) and a ReadWriteOnce volume cannot attach to a second node — "
                "use shared storage (modelStorage.type: nfs or storageClass) or lower replicas.max",
            )

    def _check_per_node_fit(self) -> None:
        for product in sorted({m.gpu_product for m in self.models}):
            nodes = [n for n in self.nodes if n.gpu.product == product]
            models = [(i, m) for i, m in enumerate(self.models) if m.gpu_product == product]
            pods = [m.gpus_per_replica for _, m in models for _ in range(m.replicas.max)]
            stranding = stranded_pod([n.gpu.count for n in nodes], pods)
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

    def _check_replicas_and_routes(self) -> None:
        hosts: dict[str, tuple[int, str | None]] = {}
        routes: dict[tuple[str, str], int] = {}
        for i, model in enumerate(self.models):
            if self.cluster.autoscaling == "none" and model.replicas.min != model.replicas.max:
                raise _at(
                    f"models[{i}].replicas",
                    f"min {model.replicas.min} ≠ max {model.replicas.max} but cluster.autoscaling is none, so nothing "
                    "would ever scale between them — set min == max or choose hpa or keda",
                )
            if model.ingress is None:
                continue
            host, path = model.ingress.host, model.ingress.path.rstrip("/") or "/"
            other = routes.setdefault((host, path), i)
            if other != i:
                raise _at(f"models[{i}].ingress.path", f"{host}{path} is already routed to models[{other}]; give each model its own path")
            first, secret = hosts.setdefault(host, (i, model.ingress.tls_secret))
            if secret != model.ingress.tls_secret:
                # nginx serves one certificate per host; two secrets for one host means one is ignored.
                raise _at(
                    f"models[{i}].ingress.tlsSecret",
                    f"{host} already uses tlsSecret {secret!r} in models[{first}]; one host has one certificate",
                )

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

    def secret_keys(self) -> list[str]:
        """Every secret config key this stack reads, in a stable order."""
        keys = [self.hf_token_secret] if self.models and self.writes_secrets else []
        if self.cluster.kubeconfig and self.cluster.kubeconfig.secret:
            keys.append(self.cluster.kubeconfig.secret)
        for node in self.nodes:
            keys += [k for k in (node.ssh.private_key_secret, node.ssh.host_key_secret) if k]
        keys += [m.api_key_secret for m in self.models if m.api_key_secret and self.writes_secrets]
        return list(dict.fromkeys(keys))


class _KeyPathError(ValueError):
    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


def _at(path: str, message: str) -> _KeyPathError:
    return _KeyPathError(path, message)


def _unique(items: list[Any], attr: str, where: str) -> None:
    seen: dict[Any, int] = {}
    for i, item in enumerate(items):
        value = getattr(item, attr)
        if value in seen:
            raise _at(f"{where}[{i}].{attr}", f"{value!r} is already used by {where}[{seen[value]}]")
        seen[value] = i


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


# ---------------------------------------------------------------------------- loading

TOP_LEVEL_KEYS = ("cluster", "nodes", "modelStorage", "models", "hfTokenSecret")


def parse(raw: dict[str, Any]) -> StackConfig:
    """Validate the stack's non-secret top-level values (already decoded from YAML/JSON).

    Raises ConfigError with a one-line message naming the key path.
    """
    known = {key: value for key, value in raw.items() if key in TOP_LEVEL_KEYS}
    try:
        stack = StackConfig.model_validate(known)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    for key in sorted(set(raw) - set(TOP_LEVEL_KEYS)):
        if key in stack.secret_keys():
            raise ConfigError(f"{key}: holds a secret but is stored in plain text; set it with `pulumi config set --secret {key}`")
        raise ConfigError(f"{_key_name(key)}: unknown config key; allowed: {', '.join(TOP_LEVEL_KEYS)} and the stack's secret keys")
    return stack


def _describe(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    ctx_error = (error.get("ctx") or {}).get("error")
    if isinstance(ctx_error, _KeyPathError):
        return f"{ctx_error.path}: {ctx_error}"
    path = _key_path(error["loc"])
    given = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        return f"{path}: required key is missing"
    if error["type"] == "string_pattern_mismatch":
        allowed = PATTERN_HELP.get((error.get("ctx") or {}).get("pattern", ""), "the documented format")
        return f"{path}: must be {allowed} (got {_short(given)})"
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key (check the spelling; keys are camelCase)"
    return f"{path}: {message} (got {_short(given)})"


def _key_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("local", "nfs", "storageClass") and path.endswith("modelStorage"):
            continue  # the discriminated union's tag is not a key the user wrote
        else:
            path += f".{_key_name(part)}" if path else _key_name(part)
    return path or "(stack)"


def _key_name(key: Any) -> str:
    """A key as the user can find it again: quoted when it is empty or holds odd characters."""
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else json.dumps(text)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
