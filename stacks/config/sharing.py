"""`nodes[].gpu.sharing`: time-slicing or MIG on a node's cards, and the resources that makes the node advertise.

Time-slicing is one setting per node (the device plugin applies it to every card; it cannot share some
cards of a node and not others); MIG is one layout per card, the same on every card of the node (mig-parted's
`devices: all`). What a node advertises under each (`advertised`) is what the capacity checks count.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, ValidationError, model_validator

from policy.rules.mig import MIG_CARDS, MigCard
from stacks.config.base import MIG_PROFILE_BODY, _Model
from stacks.config.models import _at_key

GPU = "gpu"
SHARED = "gpu.shared"
"""The device plugin's name for a time-slice with `renameByDefault: true`, which this stack always sets:
a pod that asks for `nvidia.com/gpu` never gets a slice of a shared card by accident, and GPU Feature
Discovery keeps the product label as it is (it appends `-SHARED` only to resources that are not renamed)."""
MIG_PROFILE = rf"^{MIG_PROFILE_BODY}$"
MigProfile = Annotated[str, StringConstraints(pattern=MIG_PROFILE)]


MigCardName = Literal["A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H100-96GB", "H200-141GB", "GH200-144GB", "B200-180GB",
                      "GB200-189GB", "A30-24GB", "RTX-PRO-6000-96GB"]


REPLICAS = range(2, 65)
"""The time-slicing replicas a node may ask for (the device plugin refuses fewer than 2)."""
MAX_INSTANCES = 7
"""The most instances of one profile a layout may name (seven 1g instances fill a card)."""


class TimeSlicing(_Model):
    replicas: int = Field(ge=REPLICAS.start, le=REPLICAS.stop - 1)
    """Pods that may share one card (the device plugin refuses fewer than 2); the node advertises count × replicas
    `nvidia.com/gpu.shared`. Memory is not isolated: the capacity check adds up the pods' `gpuMemoryUtilization`."""


class Mig(_Model):
    card: MigCardName
    """The card's model and memory, which decide its MIG profiles (e.g. `A100-80GB`: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb,
    4g.40gb, 7g.80gb); it must agree with `gpu.product` where that names a GPU model or memory."""
    profiles: dict[MigProfile, Annotated[int, Field(ge=1, le=MAX_INSTANCES)]] = Field(min_length=1)
    """The MIG instances of each card, profile → how many (`{"3g.40gb": 2}`); every card of the node gets this layout,
    which must fit the card's 7 compute and 8 memory slices (A30, RTX PRO 6000: 4 and 4)."""

    @model_validator(mode="after")
    def _fits_the_card(self) -> Mig:
        card = MIG_CARDS[self.card]
        unknown = [p for p in self.profiles if p not in card.profiles]
        if unknown:
            raise _at_key("profiles", f"{unknown[0]} is not a MIG profile of {self.card} (its profiles: "
                                      f"{', '.join(card.profiles)}); NVIDIA names each by compute slices and memory")
        compute = sum(card.profiles[p][0] * n for p, n in self.profiles.items())
        memory = sum(card.profiles[p][1] * n for p, n in self.profiles.items())
        if compute > card.compute_slices or memory > card.memory_slices:
            raise _at_key("profiles", f"{layout_text(self.profiles)} takes {compute} compute and {memory} memory slices, but one "
                                      f"{self.card} has {card.compute_slices} and {card.memory_slices}: the MIG manager would fail "
                                      "to create them; these are per card, the node's count multiplies them")
        return self

    @property
    def config_name(self) -> str:
        """The mig-parted entry (and `nvidia.com/mig.config` value) for this layout: nodes with the same layout share it."""
        return "gpu-serving-" + "-".join(f"{n}x{p}" for p, n in ordered(self.profiles))


class Sharing(_Model):
    """Exactly one of the two."""

    time_slicing: TimeSlicing | None = None
    """CUDA time-slicing: several pods take turns on one card, with no memory isolation."""
    mig: Mig | None = None
    """Multi-Instance GPU: each card split into isolated instances; models ask for one with `gpuResource: mig-<profile>`."""

    @model_validator(mode="after")
    def _one_kind(self) -> Sharing:
        if (self.time_slicing is None) == (self.mig is None):
            raise ValueError("set exactly one of `timeSlicing` or `mig` (this stack does not time-slice MIG instances)")
        return self

    @property
    def device_plugin_config(self) -> str:
        """The key of the device plugin's ConfigMap (and `nvidia.com/device-plugin.config` value) for this node."""
        if self.time_slicing is not None:
            return f"gpu-serving-time-slicing-{self.time_slicing.replicas}"
        return "gpu-serving-mig-mixed"


def every_layout() -> dict[str, dict[str, int]]:
    """Every layout `Mig` accepts, of every card it knows, by `config_name`: what the MIG manager's file holds, so
    that a node's label can only ever name an entry the file already has (components.sharing.mig_parted_config)."""
    return {name: dict(profiles) for name, profiles in _every_layout()}


@cache
def _every_layout() -> tuple[tuple[str, dict[str, int]], ...]:
    found: dict[str, dict[str, int]] = {}
    for card_name, card in MIG_CARDS.items():
        for profiles in _within(card, list(card.profiles)):
            try:
                mig = Mig(card=card_name, profiles=profiles)  # type: ignore[arg-type]
            except ValidationError:
                continue  # the slices fit, but a rule of `Mig` refuses it: no stack can name it
            found[mig.config_name] = dict(ordered(mig.profiles))
    return tuple(sorted(found.items()))


def _within(card: MigCard, profiles: list[str], compute: int = 0, memory: int = 0) -> list[dict[str, int]]:
    """Every non-empty choice of instances of `profiles` whose slices add up to at most the card's."""
    if not profiles:
        return []
    first, rest = profiles[0], profiles[1:]
    per_compute, per_memory = card.profiles[first]
    found = list(_within(card, rest, compute, memory))
    for n in range(1, MAX_INSTANCES + 1):
        used_compute, used_memory = compute + n * per_compute, memory + n * per_memory
        if used_compute > card.compute_slices or used_memory > card.memory_slices:
            break
        found.append({first: n})
        found += [{first: n, **more} for more in _within(card, rest, used_compute, used_memory)]
    return found


def ordered(profiles: dict[str, int]) -> list[tuple[str, int]]:
    """Largest instances first, so that one layout has one name however the stack file orders it."""
    return sorted(profiles.items(), key=lambda item: (-int(item[0].split("g", 1)[0]), item[0]))


def layout_text(profiles: dict[str, int]) -> str:
    return " + ".join(f"{n} × {p}" for p, n in ordered(profiles))


def advertised(count: int, sharing: Sharing | None) -> dict[str, int]:
    """What a node of `count` cards advertises, by resource name after `nvidia.com/`."""
    if sharing is None:
        return {GPU: count}
    if sharing.time_slicing is not None:
        return {SHARED: count * sharing.time_slicing.replicas}
    assert sharing.mig is not None
    return {f"mig-{profile}": count * n for profile, n in ordered(sharing.mig.profiles)}


def resource_name(gpu_resource: str) -> str:
    return f"nvidia.com/{gpu_resource}"

