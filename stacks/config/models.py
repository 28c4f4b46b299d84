"""`models`: one vLLM service bundle each, and the flags and environment the bundle owns."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StringConstraints, field_validator, model_validator

from stacks.config.base import (
    CIDR,
    COMMIT_SHA,
    IPV4,
    MIG_PROFILE_BODY,
    ImageRef,
    K8sName,
    LabelValue,
    NodeName,
    SecretKeyName,
    _Model,
    refuse_loopback,
)
from stacks.config.budgets import IMAGE_PULL_S, startup_budget_seconds
from stacks.config.secrets import looks_like_secret_value


class Ingress(_Model):
    host: str = Field(pattern=r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
    """Host name of the Ingress rule."""
    path: str = Field("/", pattern=r"^/[A-Za-z0-9._~/-]*$")
    """Path prefix; a sub-path is stripped before it reaches vLLM."""
    tls_secret: K8sName | None = None
    """Secret for the certificate; cert-manager fills it when the cluster has an issuer."""
    auth_url: str | None = Field(None, pattern=r"^https?://[A-Za-z0-9.:_\[\]-]+(/[A-Za-z0-9._~/%?=&-]*)?$")
    """ingress-nginx external auth (`auth-url`): every request is checked there first. A public model needs this or `apiKeySecret`."""

    @field_validator("host")
    @classmethod
    def _dns_name(cls, host: str) -> str:
        if IPV4.match(host):
            raise ValueError("an IP address; Kubernetes accepts only a DNS name as an Ingress host "
                             "(and a certificate names one): give the name that resolves to the edge, e.g. ai.example.com")
        if len(host) > 253 or any(len(label) > 63 for label in host.split(".")):
            raise ValueError("longer than DNS allows (253 characters, 63 per label)")
        return host

    @field_validator("path")
    @classmethod
    def _no_v1(cls, path: str) -> str:
        trimmed = path.rstrip("/")
        if trimmed.split("/")[-1] == "v1":
            # The edge forwards `<path>/v1/...`: this path would serve `/v1/v1/...`.
            raise ValueError(f"ends in /v1, which the edge appends itself (clients would need {trimmed}/v1/...); "
                             f"write {trimmed[:-3] or '/'}")
        return path

    @field_validator("auth_url")
    @classmethod
    def _reachable_from_the_controller(cls, url: str | None) -> str | None:
        if url is not None:
            refuse_loopback(url, "the ingress-nginx controller calls it from its own pod")
        return url


GPU_RESOURCE = rf"^(gpu|gpu\.shared|mig-{MIG_PROFILE_BODY})$"
HF_REPO = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
REVISION = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$"


LoraRank = Literal[8, 16, 32, 64, 128, 256, 320, 512]
"""`--max-lora-rank` values every vLLM image from v0.11 on accepts (vLLM's LoRAConfig refuses any other;
later releases also take 1, which v0.11 refuses)."""


class LoraAdapter(_Model):
    name: K8sName
    """Name clients ask for (`"model": "<name>"`), listed by `/v1/models`; unique across the stack, model names included."""
    hugging_face_id: str = Field(pattern=HF_REPO)
    """Hugging Face repository of the adapter (PEFT format: `adapter_config.json` and the adapter weights), `org/name`."""
    revision: str = Field(pattern=REVISION)
    """Commit (40 hex) of the adapter's repository, always: the server's path is the snapshot folder named by it."""
    weights_gb: float = Field(gt=0, le=10_000)
    """Size of the adapter on disk; counted with the model's weights in the storage check and the download deadline."""

    @field_validator("revision")
    @classmethod
    def _commit(cls, revision: str) -> str:
        if not re.fullmatch(COMMIT_SHA, revision):
            # Not even in a lab: the render must name the snapshot folder the server loads, and
            # that folder is named by the commit a branch would only resolve to at download time.
            raise ValueError("a branch or tag: pin the 40-hex commit (even with "
                             "cluster.requireCommitRevisions: false, since --lora-modules names the snapshot folder of that commit)")
        return revision


class Lora(_Model):
    max_loras: int = Field(1, ge=1, le=256)
    """`--max-loras`: adapters one batch may use at once, each slot a GPU buffer of `maxLoraRank`;
    at most the number of adapters (unless `runtimeUpdates`)."""
    max_lora_rank: LoraRank = 16
    """`--max-lora-rank`: the largest rank among the adapters (their `adapter_config.json` `r`); vLLM refuses a larger one."""
    runtime_updates: bool = False
    """Allow loading and unloading adapters through the API (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`): those sit under `/v1`
    behind the same key as inference and are lost on restart. Refused for a model with `ingress`."""
    adapters: list[LoraAdapter] = Field(min_length=1)
    """Adapters served on top of the model (`--lora-modules`), downloaded by its download Job."""

    @model_validator(mode="after")
    def _slots(self) -> Lora:
        if not self.runtime_updates and self.max_loras > len(self.adapters):
            raise _at_key("maxLoras", f"{self.max_loras}, but the model serves {len(self.adapters)} adapter(s): every slot "
                          f"reserves GPU memory for a rank-{self.max_lora_rank} adapter that none would fill; "
                          f"set maxLoras: {len(self.adapters)} or less")
        return self


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(value: object) -> object:
    """Seconds from a whole number or a duration of s, m and h parts (`90`, `"900s"`, `"30m"`, `"1h30m"`);
    anything else is left for the int validation to refuse."""
    if isinstance(value, str) and not value.strip().isdigit():
        parts = re.findall(r"(\d+)([hms])", value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise ValueError("must be whole seconds or a duration of h, m and s, e.g. 1800 or 30m")
        return sum(int(n) * DURATION_UNITS[u] for n, u in parts)
    return value


Seconds = Annotated[int, BeforeValidator(duration_seconds), Field(ge=1, le=7 * 24 * 3600)]


class Replicas(_Model):
    min: int = Field(1, ge=0, le=100)
    """Fewest pods. 0 (scale to zero) needs `cluster.autoscaling: keda` and `cluster.requestHold`: the queue metric
    comes from the pods, so at zero only the HTTP add-on's interceptor sees a request, holds it and wakes the model."""
    max: int = Field(1, ge=1, le=100)
    """Most pods; max × gpusPerReplica counts against the nodes' GPUs."""
    target_requests_waiting: int = Field(3, ge=1, le=10_000)
    """Autoscaling target: average `vllm:num_requests_waiting` per pod."""
    cold_start_timeout_seconds: int | None = Field(None, ge=1, le=24 * 3600)
    """With `min: 0`: how long the interceptor holds a request while the model starts (the InterceptorRoute's `readiness`); at least the
    startup budget (from `weightsGb`). Unset: image pull allowance + startup budget, the longest a start may take."""
    idle_after: Seconds | None = None
    """With `min: 0`: how long without a request before the last pod goes (KEDA's `cooldownPeriod`), in seconds or as a
    duration (`45m`); at least the cold start timeout, so a start whose caller gave up still finishes. Unset: that timeout."""

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be ≤ max ({self.max})")
        if self.min > 0:
            for key, value in (("coldStartTimeoutSeconds", self.cold_start_timeout_seconds), ("idleAfter", self.idle_after)):
                if value is not None:
                    # A setting that does nothing would read as if the model scaled to zero.
                    raise _at_key(key, f"only with min: 0 (scale to zero); min is {self.min}, so no pod ever stops for idling "
                                       "and no request is held: remove it, or set min: 0")
        return self


# Flags the bundle sets from typed config (or must not be changed behind its back). Aliases
# included: vLLM's parser accepts `_` for `-` and short forms such as `-tp`.
BUNDLE_FLAGS = {
    "--model": "huggingFaceId", "--served-model-name": "name", "--revision": "revision",
    "--tokenizer-revision": "revision", "--host": "the bundle (0.0.0.0)", "--port": "the bundle (8000)",
    "--download-dir": "the bundle (the model volume)", "--tensor-parallel-size": "gpusPerReplica", "-tp": "gpusPerReplica",
    "--pipeline-parallel-size": "nodesPerReplica (one stage per node of a group)", "-pp": "nodesPerReplica (one stage per node of a group)",
    "--nnodes": "nodesPerReplica", "-n": "nodesPerReplica", "--node-rank": "the bundle (each group member's index)",
    "-r": "the bundle (each group member's index)", "--master-addr": "the bundle (the group's leader)",
    "--master-port": "the bundle (the group's leader)", "--headless": "the bundle (a group's workers)",
    "--distributed-executor-backend": "the bundle (mp: vLLM's own launcher, no Ray)",
    "--data-parallel-size": "replicas", "-dp": "replicas",
    "--gpu-memory-utilization": "gpuMemoryUtilization", "--max-model-len": "maxModelLen",
    "--api-key": "apiKeySecret (a literal would land in the manifest)",
    "--hf-token": "hfTokenSecret (a literal would land in the manifest)",
    "--disable-log-stats": "nothing: it removes the queue metric autoscaling and monitoring read",
    "--shutdown-timeout": "the bundle (the drain time, from the stream timeout)",
    "--enable-lora": "lora", "--lora-modules": "lora.adapters (downloaded to the volume by the download Job)",
    "--max-loras": "lora.maxLoras", "--max-lora-rank": "lora.maxLoraRank",
}
# Environment the bundle sets; overriding it breaks offline start, the secrets or GPU isolation.
BUNDLE_ENV = {
    "HF_TOKEN": "hfTokenSecret", "HUGGING_FACE_HUB_TOKEN": "hfTokenSecret", "VLLM_API_KEY": "apiKeySecret",
    "HF_HUB_OFFLINE": "the bundle (serving pods never download)", "HF_HOME": "the bundle (the model volume)",
    "HF_HUB_CACHE": "the bundle (the model volume)", "TRANSFORMERS_OFFLINE": "the bundle",
    "CUDA_VISIBLE_DEVICES": "the device plugin (a pod sees only its GPUs)",
    "NVIDIA_VISIBLE_DEVICES": "the device plugin (a pod sees only its GPUs)",
    "VLLM_CACHE_ROOT": "the bundle (compile caches on the model volume)", "TRITON_CACHE_DIR": "the bundle (the model volume)",
    "TORCHINDUCTOR_CACHE_DIR": "the bundle (the model volume)", "XDG_CACHE_HOME": "the bundle (the model volume)",
    "HOME": "securityProfile",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "lora.runtimeUpdates",
    "VLLM_NO_USAGE_STATS": "the bundle (serving pods never phone home)", "DO_NOT_TRACK": "the bundle (serving pods never phone home)",
}
# Object names are `vllm-<name>` plus suffixes up to `-dl-<8 hex>` (Job names are also pod label values: ≤ 63).
MODEL_NAME_MAX = 40


def flag_name(arg: str) -> str | None:
    """`--tensor_parallel_size=2` → `--tensor-parallel-size`, `-tp2` → `-tp`; None for a value."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit() or arg[1:2] == ".":
        return None
    name = arg.split("=", 1)[0].split(None, 1)[0]
    dashes = "-" * (len(name) - len(name.lstrip("-")))
    name = dashes + name.lstrip("-").replace("_", "-")
    if dashes == "-":
        # argparse reads a short option with its value attached: `-tp2` is `-tp 2`.
        name = next((short for short in SHORT_FLAGS if name.startswith(short) and name[len(short):].isdigit()), name)
    return name


SECRET_FLAGS = ("--api-key", "--hf-token")
# A credential inside an argument (`--header=Authorization: Bearer sk-…`), not only as the whole value.
SECRET_VALUE_START = re.compile(r"(^|[\s=:])(hf_|sk-|ghp_|github_pat_|glpat-)[A-Za-z0-9_-]{12,}")
SHORT_FLAGS = tuple(sorted((f for f in BUNDLE_FLAGS if not f.startswith("--")), key=len, reverse=True))


class FlagError(ValueError):
    """An `extraArgs` element that is refused; `sub_path` names it (`[2]`) after the key path."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.sub_path = f"[{index}]"


def check_extra_args(args: list[str]) -> None:
    """Refuse, in every form vLLM's parser accepts, a flag the bundle owns; and a flag glued to its value.

    Forms: `--flag=v`, `--flag` `v` (two elements), `--flag v` (one element), `_` for `-`, and the
    short aliases (`-tp 2`, `-tp=2`, `-tp2`).
    """
    for i, arg in enumerate(args):
        if looks_like_secret_value(arg.split("=", 1)[-1].strip(), hex_too=False) or SECRET_VALUE_START.search(arg):
            # Not repeated: it may be the credential itself.
            raise FlagError(i, "holds what looks like a credential, and extraArgs land in the manifest and the pod spec: "
                               "the bundle passes the HF token from hfTokenSecret and the API key from apiKeySecret")
        if flag_name(arg) is None:
            continue
        # `--a --b=2` or `--flag 2` in one element: every word before the first `=` may be a flag.
        words = arg.split("=", 1)[0].split()
        for word in words:
            flag = flag_name(word)
            if flag in BUNDLE_FLAGS:
                shown = flag if flag in SECRET_FLAGS else repr(arg)  # never repeat a secret's value
                raise FlagError(i, f"{shown}: {flag} is set by the bundle from {BUNDLE_FLAGS[flag]}; change that key instead")
        if len(words) > 1:
            # The container gets each element as one argv entry: argparse takes `--flag 2` for a positional.
            fix = f"write {flag_name(words[0])}={words[1]} or two elements" if len(words) == 2 and flag_name(words[1]) is None \
                else "give each flag and each value its own element"
            raise FlagError(i, f"{arg!r}: a flag and its value in one element reach vLLM as one argument; {fix}")


class Model(_Model):
    name: K8sName
    """Kubernetes name of the model's objects and vLLM's `--served-model-name`."""
    hugging_face_id: str = Field(pattern=HF_REPO)
    """Hugging Face repository, `org/name`."""
    revision: str = Field("main", pattern=REVISION)
    """Commit (40 hex) of the repository; a branch or tag only where `cluster.requireCommitRevisions` is false (a lab)."""
    image: ImageRef = "vllm/vllm-openai:v0.34.0"
    """vLLM image with a release version tag or a digest (a moving tag such as `latest` or `nightly` is refused)."""
    gpu_product: LabelValue
    """`nodes[].gpu.product` of the nodes this model runs on."""
    gfd_product: LabelValue | None = None
    """With `cluster.gpuFeatureDiscovery`: select nodes by GFD's `nvidia.com/gpu.product`
    (e.g. `NVIDIA-A100-SXM4-80GB`) instead of the stack's label."""
    gpus_per_replica: int = Field(1, ge=1, le=64)
    """GPUs per pod, all on one node; also `--tensor-parallel-size`. With `nodesPerReplica` above 1, the GPUs of each
    node of a group: all of that node's cards."""
    nodes_per_replica: int = Field(1, ge=1, le=16)
    """Nodes one replica spans, for a model larger than one node: a LeaderWorkerSet group of this many pods, one per
    whole node (`gpusPerReplica` cards each), tensor parallelism within a node and pipeline parallelism across them
    (vLLM's own multi-node launcher, no Ray); the group starts, restarts and rolls as one. 1: a Deployment."""
    gpu_resource: str = Field("gpu", pattern=GPU_RESOURCE)
    """What a pod asks for, after `nvidia.com/`: `gpu` (whole cards), `gpu.shared` (a time-slice of a card on a
    `timeSlicing` node: memory is shared, never by accident) or `mig-<profile>` (a MIG instance, e.g. `mig-3g.40gb`)."""
    max_model_len: int = Field(8192, ge=128, le=10_000_000)
    """`--max-model-len`: context length, bounds the KV cache."""
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0)
    """`--gpu-memory-utilization`: share of GPU memory vLLM may take (of the whole card, also of a time-shared one:
    the pods that may meet on one card must add up to 1.0 at most)."""
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
    """Secret config key holding the vLLM API key; unset serves without one (then `ingress` needs `authUrl`). Behind
    `cluster.endpoint` only for a model at `replicas.min: 0`, which needs one: the gateway presents it to the model
    through the interceptor."""
    egress_cidrs: list[Annotated[str, StringConstraints(pattern=CIDR)]] = []
    """Networks the serving pods may reach besides DNS (e.g. a tracing collector); by default nothing else."""
    cpu: str = Field("4", pattern=r"^[0-9]+(\.[0-9]+|m)?$")
    """CPU request and limit of each pod (equal: Guaranteed QoS; a whole number gets exclusive cores under the
    static CPU manager, so no throttling)."""
    memory: str = Field("16Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$")
    """Memory for the engine; request and limit are this plus the /dev/shm size (equal: Guaranteed QoS)."""
    security_profile: Literal["root", "nonRoot"] = "root"
    """`nonRoot`: UID/GID 65534 (`nobody`, in every vLLM image's passwd), USER/LOGNAME/HOME set, read-only root filesystem,
    emptyDirs for HOME and /tmp; needs a `vX.Y` image tag of v0.11 or newer."""
    smoke_test: bool = True
    """After each rollout, a Job asks the model for one token; `pulumi up` fails when inference does not answer."""
    lora: Lora | None = None
    """LoRA adapters served on top of this model (`--enable-lora`); unset: none."""
    endpoint: bool | None = None
    """With `cluster.endpoint`: behind the teams' endpoint (an InferencePool and a picker; default; at `replicas.min: 0`
    its request hold instead); false: only its own `ingress`, if any."""
    nodes: list[NodeName] | None = Field(None, min_length=1)
    """With `modelStorage.type: nodeCache`: the nodes that hold its weights and may run its pods (for small arrays);
    unset: every cache node of its `gpuProduct` that advertises its `gpuResource`."""

    @property
    def disk_gb(self) -> float:
        """What the model takes on the volume: its weights and its adapters'."""
        return self.weights_gb + sum(a.weights_gb for a in self.lora.adapters) if self.lora else self.weights_gb

    @property
    def spans_nodes(self) -> bool:
        """One replica is a group of pods on several nodes (a LeaderWorkerSet), not one pod (a Deployment)."""
        return self.nodes_per_replica > 1

    def pods(self, replicas: int) -> int:
        """Pods of `replicas` replicas, each asking for `gpusPerReplica` GPUs: a group has one per node."""
        return replicas * self.nodes_per_replica

    @property
    def scales_to_zero(self) -> bool:
        return self.replicas.min == 0

    @property
    def startup_budget_seconds(self) -> int:
        """How long the startup probe lets the server load (`budgets`)."""
        return startup_budget_seconds(self.weights_gb)

    @property
    def cold_start_seconds(self) -> int:
        """How long a request to this model at zero replicas is held: `replicas.coldStartTimeoutSeconds`, or the
        image pull allowance plus the startup budget (what a start on a node without the image may take)."""
        configured = self.replicas.cold_start_timeout_seconds
        return configured if configured is not None else IMAGE_PULL_S + self.startup_budget_seconds

    @property
    def idle_seconds(self) -> int:
        """`replicas.idleAfter`, or the cold start timeout."""
        return self.replicas.idle_after if self.replicas.idle_after is not None else self.cold_start_seconds

    @model_validator(mode="after")
    def _cold_start_budget(self) -> Model:
        if not self.scales_to_zero:
            return self
        budget = self.startup_budget_seconds
        configured = self.replicas.cold_start_timeout_seconds
        if configured is not None and configured < budget:
            # The interceptor would answer 502 while the pod is still within its startup probe's allowance.
            raise _at_key("replicas.coldStartTimeoutSeconds",
                          f"{configured} s is below the startup budget of {budget} s (engine start plus {self.weights_gb:g} GB of "
                          f"weights read at the assumed throughput, what the startup probe allows): the first request would get 502 "
                          f"while the model still loads; set {budget} or more")
        idle = self.replicas.idle_after
        if idle is not None and idle < self.cold_start_seconds:
            # KEDA counts idle time from the last request it saw: a caller that gave up mid-start leaves the pod loading.
            raise _at_key("replicas.idleAfter",
                          f"{idle} s is below the cold start timeout ({self.cold_start_seconds} s): when a caller gives up during a "
                          f"start, KEDA would stop the pod before it finishes loading and the next request starts over; "
                          f"set {self.cold_start_seconds} or more")
        return self

    @model_validator(mode="after")
    def _whole_cards_for_tensor_parallelism(self) -> Model:
        if self.gpus_per_replica == 1 or self.gpu_resource == "gpu":
            return self
        why = ("a CUDA process sees one MIG instance, and MIG instances have no peer-to-peer link for NCCL"
               if self.gpu_resource.startswith("mig-") else
               "the device plugin hands out time-slices, not cards, so two slices can be one card (and with the "
               "stack's failRequestsGreaterThanOne it refuses the pod)")
        raise _at_key("gpusPerReplica", f"{self.gpus_per_replica} with gpuResource {self.gpu_resource}: tensor parallelism "
                                        f"needs whole cards, and {why}; use gpusPerReplica: 1, or gpuResource: gpu")

    @model_validator(mode="after")
    def _groups(self) -> Model:
        if not self.spans_nodes:
            return self
        if self.gpu_resource != "gpu":
            raise _at_key("nodesPerReplica", f"{self.nodes_per_replica} with gpuResource {self.gpu_resource}: a group spans "
                                             "whole nodes, each member all of its node's cards; use gpuResource: gpu")
        if self.scales_to_zero:
            # A held request would wait for a whole group to start (every node loading its stage), and KEDA's
            # wake-up and the interceptor's hold are proven for Deployments only.
            raise _at_key("replicas.min", f"0 with nodesPerReplica {self.nodes_per_replica}: a model spanning nodes does not "
                                          "scale to zero; set min: 1 or more")
        return self

    @model_validator(mode="after")
    def _non_root_image(self) -> Model:
        if self.security_profile != "nonRoot":
            return self
        version = image_version(self.image)
        if version is None or version < NON_ROOT_SINCE:
            since = "v" + ".".join(map(str, NON_ROOT_SINCE))
            found = "a tag that names no release" if version is None else f"v{'.'.join(map(str, version))}"
            raise _at_key("securityProfile", f"nonRoot needs a vLLM image of {since} or newer, tagged so its version is "
                          f"known (`repo:vX.Y.Z` or `repo:vX.Y.Z@sha256:…`); {self.image} has {found}. "
                          "Use such an image or securityProfile: root")
        return self

    @field_validator("name")
    @classmethod
    def _short_enough(cls, name: str) -> str:
        if len(name) > MODEL_NAME_MAX:
            raise ValueError(f"at most {MODEL_NAME_MAX} characters: object names are vllm-<name> plus suffixes and must stay ≤ 63")
        return name

    @field_validator("extra_args")
    @classmethod
    def _not_bundle_flags(cls, args: list[str]) -> list[str]:
        check_extra_args(args)
        return args

    @field_validator("env")
    @classmethod
    def _no_literal_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if looks_like_secret_value(value, hex_too=False) or SECRET_VALUE_START.search(value):
                raise ValueError(f"{name}: its value looks like a credential, and literal env values land in the manifest; "
                                 "store it with `pulumi config set --secret` (the bundle passes hfTokenSecret and apiKeySecret)")
            if SECRET_LIKE.search(name):
                raise ValueError(f"{name} looks like a secret; literal env values land in the manifest, use *Secret keys")
            if name in BUNDLE_ENV:
                raise ValueError(f"{name} is set by the bundle from {BUNDLE_ENV[name]}; remove it from env")
        return env


NON_ROOT_SINCE = (0, 11)
"""Oldest vLLM image the nonRoot profile's paths are written for: older images kept their Python under
/root (vllm#15174), which another user cannot read."""


def image_version(image: str) -> tuple[int, ...] | None:
    """(major, minor, patch) from a `vX.Y.Z` tag, also in `repo:tag@sha256:…`; None for a bare digest or a tag that names no release."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    if ":" not in name:
        return None
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?", name.rsplit(":", 1)[1])
    if not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


def _at_key(key: str, message: str) -> ValueError:
    return _KeyError(key, message)


class _KeyError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.sub_path = f".{key}"


SECRET_LIKE = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|PRIVATE|CREDENTIAL", re.IGNORECASE)

