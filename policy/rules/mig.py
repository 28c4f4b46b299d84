"""MIG in the pack: the profiles each GPU product offers (NVIDIA mig-parted's default config), shared with the
stack's config, which owns no copy (layers point one way: stacks → policy). A pod that asks for a MIG resource
no card offers stays Pending: no device plugin ever advertises it."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from . import k8s
from .core import MANDATORY, Resource, Rule, attempt
from .k8s import MIG_PREFIX


@dataclass(frozen=True)
class MigCard:
    compute_slices: int
    memory_slices: int
    profiles: dict[str, tuple[int, int]]
    """profile → (compute slices, memory slices) it takes of one card."""
    models: frozenset[str] = frozenset()
    """The GPU models (as in product names: `a100`, `gh200`) whose cards carry these profiles."""

    @property
    def memory_gb(self) -> int:
        """The card's memory, from its whole-card profile (`7g.80gb`, `4g.96gb`)."""
        return max(profile_gb(p) for p in self.profiles)


def _seven_slices(models: str, one: int, one_double: int, two: int, three: int, four: int, seven: int) -> MigCard:
    """A card of 7 compute and 8 memory slices, from the memory (GB) in the names of its six profiles."""
    return MigCard(7, 8, {f"1g.{one}gb": (1, 1), f"1g.{one_double}gb": (1, 2), f"2g.{two}gb": (2, 2),
                          f"3g.{three}gb": (3, 4), f"4g.{four}gb": (4, 4), f"7g.{seven}gb": (7, 8)}, frozenset(models.split()))


MIG_CARDS: dict[str, MigCard] = {
    # NVIDIA mig-parted's default config (deployments/systemd/config-default.yaml, which the GPU Operator ships as
    # default-mig-parted-config): its all-<profile> entries give how many of each fit one card, 7 × 1g, 4 × 1g of
    # double memory, 3 × 2g, 2 × 3g, 1 × 4g, 1 × 7g, which is 7 compute and 8 memory slices; its comments and
    # device filters name the cards of each set (A800 and H800 share the A100's and H100's). A layout is judged by
    # its slice counts only; NVIDIA's placement rules (which slot each instance may start at) are not modelled.
    # The +me, -me and +gfx variants are left out.
    "A100-40GB": _seven_slices("a100 a800", 5, 10, 10, 20, 20, 40),
    "A100-80GB": _seven_slices("a100 a800", 10, 20, 20, 40, 40, 80),
    "H100-80GB": _seven_slices("h100 h800", 10, 20, 20, 40, 40, 80),
    "H100-94GB": _seven_slices("h100 h800", 12, 24, 24, 47, 47, 94),  # H100 NVL
    "H100-96GB": _seven_slices("h100 gh200 h20", 12, 24, 24, 48, 48, 96),  # also GH200 96GB and H20
    "H200-141GB": _seven_slices("h200", 18, 35, 35, 71, 71, 141),
    "GH200-144GB": _seven_slices("gh200", 18, 36, 36, 72, 72, 144),  # GH200 144G HBM3e
    "B200-180GB": _seven_slices("b200", 23, 45, 45, 90, 90, 180),
    "GB200-189GB": _seven_slices("gb200", 24, 47, 47, 95, 95, 189),
    # Four compute and four memory slices.
    "A30-24GB": MigCard(4, 4, {"1g.6gb": (1, 1), "2g.12gb": (2, 2), "4g.24gb": (4, 4)}, frozenset({"a30"})),
    "RTX-PRO-6000-96GB": MigCard(4, 4, {"1g.24gb": (1, 1), "2g.48gb": (2, 2), "4g.96gb": (4, 4)}, frozenset({"rtx"})),
}
# GPU models without MIG that a product label may name (NVIDIA's data-center and workstation cards).
NO_MIG_MODELS = frozenset({"l40s", "l40", "l20", "l4", "l2", "a40", "a10", "a10g", "a16", "a2", "t4", "v100", "p100", "p40", "p4",
                           "a6000", "a5000", "a4000", "rtx6000", "rtx8000"})
MIG_MODELS = frozenset(m for card in MIG_CARDS.values() for m in card.models)


def profile_gb(profile: str) -> int:
    """The memory in a MIG profile's name: `3g.40gb` → 40."""
    return int(profile.rsplit(".", 1)[1].removesuffix("gb"))


def product_contradicts(card_name: str, product: str) -> str | None:
    """Why a product name (the stack's label, or GPU Feature Discovery's `NVIDIA-A100-SXM4-80GB`) is not a card
    of `card_name`: it names another GPU model, or the memory of another card of the same model. None when it
    agrees or names neither (a label such as `big-gpu` says nothing about the card)."""
    card = MIG_CARDS[card_name]
    words = re.split(r"[-_.]", product.lower())
    other = [w for w in words if w in (NO_MIG_MODELS | MIG_MODELS) - card.models]
    if other:
        what = "another card" if other[0] in MIG_MODELS else "which has no MIG (mig-parted's config has no profile for it)"
        return f"names {other[0].upper()}, {what}"
    sizes = {other_card.memory_gb for other_card in MIG_CARDS.values() if other_card.models & card.models}
    memory = [int(w[:-2]) for w in words if re.fullmatch(r"[0-9]+gb", w)]
    if memory and memory[0] != card.memory_gb and memory[0] in sizes:
        return f"names a {memory[0]} GB card ({card_name}: {card.memory_gb} GB)"
    return None


def profile_of(resource: str) -> str | None:
    """`nvidia.com/mig-3g.40gb` → `3g.40gb` (the device plugin's mixed-strategy names); None for other resources."""
    return resource[len(MIG_PREFIX):] if resource.startswith(MIG_PREFIX) else None


MIG_PROFILES = frozenset(p for card in MIG_CARDS.values() for p in card.profiles)
# The variants left out of the table (+me media extensions, -me, +gfx): the device plugin names them with `.me`, `+gfx`.
PROFILE_VARIANT = re.compile(r"^([1-7]g\.[0-9]+gb)([.+-](me|gfx|me\.all))*$")


def check_mig_profile(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    if spec is None:
        return
    for name in attempt(k8s.pod_gpu_resources, spec, default={}):
        profile = profile_of(name)
        if profile is None:
            continue
        base = PROFILE_VARIANT.match(profile)
        if base is None or base.group(1) not in MIG_PROFILES:
            yield (f"asks for {name}, but no GPU's MIG profiles include {profile} (mig-parted's default config: e.g. "
                   f"3g.40gb on an A100 80GB, 3g.20gb on a 40GB; <compute slices>g.<memory in GB>gb): no node ever "
                   f"advertises it and the pods stay Pending. Ask for a profile your nodes' MIG layout creates.")


RULES = [
    Rule("gpu-mig-profile", "A pod asks only for MIG profiles some GPU offers (NVIDIA mig-parted's default config).",
         MANDATORY, check_mig_profile, k8s.WORKLOADS),
]
