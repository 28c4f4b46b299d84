"""Building blocks every config model shares: the base model, name patterns and key-path errors."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

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
# NetworkPolicy ipBlock networks.
CIDR = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$|^[0-9A-Fa-f:]+/[0-9]{1,3}$"

PATTERN_HELP = {
    DNS_LABEL: "a Kubernetes name: lowercase letters, digits and '-', a letter first, at most 63 characters, e.g. qwen3",
    DNS_SUBDOMAIN: "a Kubernetes node name: lowercase letters, digits, '-' and '.', e.g. k8s-worker-02",
    LABEL_VALUE: "a label value: letters, digits, '-', '_' and '.', at most 63 characters, e.g. nvidia-a100",
    CONFIG_KEY: "a Pulumi config key name: a letter, then letters, digits, '_' or '-', e.g. hfToken",
    RAID_NAME: "an mdadm array name: letters, digits, '_' and '-', at most 31 characters, e.g. models",
    SAFE_PATH: "an absolute path of letters, digits and ._:+@/- (no spaces or shell characters), e.g. /dev/sda or /mnt/models",
    CIDR: "a network in CIDR notation, e.g. 10.0.0.0/8",
}

K8sName = Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=63)]
NodeName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=253)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE, max_length=63)]
SecretKeyName = Annotated[str, StringConstraints(pattern=CONFIG_KEY)]
SafePath = Annotated[str, StringConstraints(pattern=SAFE_PATH, max_length=255)]
# A container image by tag, by digest, or both (`repo:tag@sha256:…`: the digest decides what runs).
ImageRef = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9][a-z0-9._/:-]*[a-z0-9](:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$"),
]
# A Hugging Face commit: the one revision that never moves.
COMMIT_SHA = r"^[0-9a-f]{40}$"


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

