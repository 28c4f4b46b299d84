"""Building blocks every config model shares: the base model, name patterns and key-path errors."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

# One judgement of image tags for the config and the policy pack (which runs on its own, so it owns it).
from policy.rules.workloads import image_problem
from stacks.config.secrets import looks_like_secret_value

PROJECT = "gpu-serving"

# Kubernetes object names. Services (one per model) need RFC 1035 labels: a letter first.
DNS_LABEL = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The cluster's DNS domain (labels of at most 63 characters).
DNS_DOMAIN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
# Label values (the GPU product is a node label value).
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
# Pulumi config key names of secrets (`pulumi config set --secret <name>`).
CONFIG_KEY = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
# mdadm array names end up in /dev/md/<name>, udev rules and GPT partition names.
RAID_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,30}$"
# Block devices and mountpoints reach node scripts; they are quoted there, but a path that
# needs quoting at all is almost always a typo, so refuse it early.
SAFE_PATH = r"^/[A-Za-z0-9._:+@/-]*$"
# NetworkPolicy ipBlock networks.
CIDR = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$|^[0-9A-Fa-f:]+/[0-9]{1,3}$"

PATTERN_HELP = {
    DNS_LABEL: "a Kubernetes name: lowercase letters, digits and '-', a letter first, at most 63 characters, e.g. qwen3",
    DNS_SUBDOMAIN: "a Kubernetes node name: lowercase letters, digits, '-' and '.', e.g. k8s-worker-02",
    DNS_DOMAIN: "a DNS domain of lowercase labels joined by '.', e.g. cluster.local",
    LABEL_VALUE: "a label value: letters, digits, '-', '_' and '.', at most 63 characters, e.g. nvidia-a100",
    CONFIG_KEY: "a Pulumi config key name: a letter, then letters, digits, '_' or '-', e.g. hfToken",
    RAID_NAME: "an mdadm array name: letters, digits, '_' and '-', at most 31 characters, e.g. models",
    SAFE_PATH: "an absolute path of letters, digits and ._:+@/- (no spaces or shell characters), e.g. /dev/sda or /mnt/models",
    CIDR: "a network in CIDR notation, e.g. 10.0.0.0/8",
}

IPV4 = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$")
LOOPBACK = re.compile(r"^(localhost|localhost\.localdomain|127(\.[0-9]{1,3}){3}|\[::1\]|0\.0\.0\.0)$", re.IGNORECASE)

# Container images: a tag or a digest is required (the form); `image_problem` says which tags still move.
IMAGE = r"^[a-z0-9][a-z0-9._/:-]*[a-z0-9](:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$"

K8sName = Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=63)]
NodeName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=253)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE, max_length=63)]
LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
PodLabels = dict[Annotated[str, StringConstraints(pattern=LABEL_KEY)], LabelValue]
SafePath = Annotated[str, StringConstraints(pattern=SAFE_PATH, max_length=255)]
# A container image by tag, by digest, or both (`repo:tag@sha256:…`: the digest decides what runs).
ImageRef = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9][a-z0-9._/:-]*[a-z0-9](:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$"),
]
# A Hugging Face commit: the one revision that never moves.
COMMIT_SHA = r"^[0-9a-f]{40}$"
# A MIG profile: compute slices and memory (`3g.40gb`); `nodes[].gpu.sharing.mig` and `models[].gpuResource` name them.
MIG_PROFILE_BODY = r"[1-7]g\.[0-9]{1,3}gb"


def _pinned(image: str) -> str:
    if "://" in image:
        # Kubernetes takes a bare reference: the kubelet refuses a scheme as an invalid image name.
        raise ValueError(f"an image reference has no scheme; write {image.split('://', 1)[1]}")
    problem = image_problem(image)
    if problem:
        repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
        raise ValueError(f"not pinned: {problem}; pin a release such as {repo}:v1.2.3, or a digest ({repo}@sha256:<64 hex digits>)")
    return image


ImageRef = Annotated[str, StringConstraints(pattern=IMAGE), AfterValidator(_pinned)]


class UnechoedError(ValueError):
    """A refused value the error line must not repeat (it may be a credential)."""


def _key_name_not_value(name: str) -> str:
    if looks_like_secret_value(name):
        raise UnechoedError("this looks like the secret's value, not the name of a secret config key; store the value with "
                         "`pulumi config set --secret <name>` (e.g. hfToken) and write that name here")
    return name


SecretKeyName = Annotated[str, StringConstraints(pattern=CONFIG_KEY), AfterValidator(_key_name_not_value)]


def refuse_port(host: str, fix: str) -> str:
    """A host given as host:port, where the port has a key of its own or none at all."""
    # One colon followed by digits is host:port (an IPv6 address has several colons).
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        raise ValueError(f"{host!r} includes a port; {fix.format(name=name, port=port)}")
    return host


def url_host(url: str) -> str:
    """The host of an http(s) URL as written (brackets kept for IPv6), without port."""
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    if authority.startswith("["):
        return authority[: authority.find("]") + 1]
    return authority.split(":", 1)[0]


def refuse_loopback(url: str, who: str) -> None:
    """A URL the stack hands to a client in another pod must not point at loopback: it would reach that pod itself."""
    host = url_host(url)
    if LOOPBACK.match(host):
        raise ValueError(f"points at {host}, but {who}: loopback there is that pod itself; "
                         "give the Service's cluster DNS name, e.g. http://<service>.<namespace>.svc:<port>")


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

