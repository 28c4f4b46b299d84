"""`nodes[].gpu.sharing`: time-slicing or MIG on a node's cards, and the resources that makes the node advertise.

Time-slicing is one setting per node (the device plugin applies it to every card; it cannot share some
cards of a node and not others); MIG is one layout per card, the same on every card of the node (mig-parted's
`devices: all`). What a node advertises under each (`advertised`) is what the capacity checks count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from stacks.config.base import MIG_PROFILE_BODY, _Model
from stacks.config.models import _at_key

GPU = "gpu"
SHARED = "gpu.shared"
"""The device plugin's name for a time-slice with `renameByDefault: true`, which this stack always sets:
a pod that asks for `nvidia.com/gpu` never gets a slice of a shared card by accident, and GPU Feature
Discovery keeps the product label as it is (it appends `-SHARED` only to resources that are not renamed)."""
MIG_PROFILE = rf"^{MIG_PROFILE_BODY}$"
MigProfile = Annotated[str, StringConstraints(pattern=MIG_PROFILE)]


@dataclass(frozen=True)
class MigCard:
    compute_slices: int
    memory_slices: int
    profiles: dict[str, tuple[int, int]]
    """profile → (compute slices, memory slices) it takes of one card."""


def _seven_slices(one: int, one_double: int, two: int, three: int, four: int, seven: int) -> MigCard:
    """A card of 7 compute and 8 memory slices, from the memory (GB) in the names of its six profiles."""
    return MigCard(7, 8, {f"1g.{one}gb": (1, 1), f"1g.{one_double}gb": (1, 2), f"2g.{two}gb": (2, 2),
                          f"3g.{three}gb": (3, 4), f"4g.{four}gb": (4, 4), f"7g.{seven}gb": (7, 8)})


MIG_CARDS: dict[str, MigCard] = {
    # NVIDIA's MIG user guide and the GPU Operator's default mig-parted config (its all-<profile> entries
    # give how many of each fit one card: 7 × 1g, 4 × 1g of double memory, 3 × 2g, 2 × 3g, 1 × 4g, 1 × 7g,
    # which is 7 compute and 8 memory slices). The +me and +gfx variants are left out.
    "A100-40GB": _seven_slices(5, 10, 10, 20, 20, 40),
    "A100-80GB": _seven_slices(10, 20, 20, 40, 40, 80),
    "H100-80GB": _seven_slices(10, 20, 20, 40, 40, 80),
    "H100-94GB": _seven_slices(12, 24, 24, 47, 47, 94),
    "H100-96GB": _seven_slices(12, 24, 24, 48, 48, 96),
    "H200-141GB": _seven_slices(18, 35, 35, 71, 71, 141),
    "B200-180GB": _seven_slices(23, 45, 45, 90, 90, 180),
    # Four compute and four memory slices.
    "A30-24GB": MigCard(4, 4, {"1g.6gb": (1, 1), "2g.12gb": (2, 2), "4g.24gb": (4, 4)}),
}
MigCardName = Literal["A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H100-96GB", "H200-141GB", "B200-180GB", "A30-24GB"]


class TimeSlicing(_Model):
    replicas: int = Field(ge=2, le=64)
    """Pods that may share one card (the device plugin refuses fewer than 2); the node advertises count × replicas
    `nvidia.com/gpu.shared`. Memory is not isolated: the capacity check adds up the pods' `gpuMemoryUtilization`."""


class Mig(_Model):
    card: MigCardName
    """The card's model and memory, which decide its MIG profiles (e.g. `A100-80GB`: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb,
    4g.40gb, 7g.80gb)."""
    profiles: dict[MigProfile, Annotated[int, Field(ge=1, le=7)]] = Field(min_length=1)
    """The MIG instances of each card, profile → how many (`{"3g.40gb": 2}`); every card of the node gets this layout,
    which must fit the card's 7 compute and 8 memory slices (A30: 4 and 4)."""

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

