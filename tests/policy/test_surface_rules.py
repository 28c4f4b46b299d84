"""The rules issue 44 item 5 added, each on a rendered example stack: the render passes it (the good case), and
one change to the render makes that rule, and no other, fire (the held mutation)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from policy.rules import check_resources
from tools.render import ROOT, Render, policy_config, resources_json, run_program

Entries = list[dict[str, Any]]
RENDERS: dict[str, Render] = {}


def rendered(name: str) -> Render:
    if name not in RENDERS:
        RENDERS[name] = run_program(name) if name == "fewgpus" else \
            run_program(name, stack_file=ROOT / "docs" / "examples" / f"Pulumi.{name}.yaml")
    return RENDERS[name]


def of(entries: Entries, kind: str, name: str | None = None) -> dict[str, Any]:
    return next(e["inputs"] for e in entries if e["type"].endswith(f":{kind}")
                and (name is None or e["inputs"]["metadata"]["name"] == name))


def server(entries: Entries, name: str) -> dict[str, Any]:
    return of(entries, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]


def without_nodes(e: Entries) -> None:
    e[:] = [x for x in e if not x["type"].endswith(":NodePatch")]


def mig_profile_no_card_has(e: Entries) -> None:
    limits = server(e, "vllm-qwen3-small")["resources"]["limits"]
    limits["nvidia.com/mig-2g.25gb"] = limits.pop("nvidia.com/mig-2g.20gb")


def lora_named_as_model(e: Entries) -> None:
    args = server(e, "vllm-qwen3-base")["args"]
    k = next(i for i, a in enumerate(args) if a.startswith("qwen3-sql="))
    args[k] = args[k].replace("qwen3-sql=", "qwen3-base=", 1)


def cpu_cache_below_slots(e: Entries) -> None:
    server(e, "vllm-qwen3-base")["args"].append("--max-cpu-loras=1")


def underscored_query(e: Entries) -> None:
    trigger = of(e, "ScaledObject", "vllm-qwen3-rare")["spec"]["triggers"][0]
    trigger["metadata"]["query"] = trigger["metadata"]["query"].replace("vllm:", "vllm_")


def unnamed_port(e: Entries) -> None:
    server(e, "vllm-qwen3-chat")["ports"][0]["name"] = "api"


def hold_at_target_port(e: Entries) -> None:
    of(e, "InterceptorRoute")["spec"]["target"]["port"] = 8001


def privileged(e: Entries) -> None:
    server(e, "vllm-qwen3-chat")["securityContext"] = {"privileged": True}


def as_is(e: Entries) -> None:
    pass


# (rule, example, the render as the case starts from, the change, what the message says)
MUTATIONS: list[tuple[str, str, Callable[[Entries], None], Callable[[Entries], None], str]] = [
    ("gpu-nodes-declared", "fewgpus", as_is, without_nodes, "no Node or NodePatch here declares"),
    ("gpu-mig-profile", "sharing", without_nodes, mig_profile_no_card_has, "no GPU's MIG profiles include 2g.25gb"),
    ("vllm-lora-flags", "fewgpus", as_is, lora_named_as_model, "LoRA adapter 'qwen3-base' has the served model's name"),
    ("vllm-lora-flags", "fewgpus", as_is, cpu_cache_below_slots, "--max-cpu-loras 1 below --max-loras 2"),
    ("vllm-metric-queries", "fewgpus", as_is, underscored_query, "reads vllm_num_requests_waiting, which Prometheus does not have"),
    ("vllm-podmonitor-port", "fewgpus", as_is, unnamed_port, "name no container port 'http'"),
    ("vllm-hold-target", "fewgpus", as_is, hold_at_target_port, "sends held requests to port 8001"),
    ("pod-security-admitted", "fewgpus", as_is, privileged, "container 'vllm' privileged"),
]


def fired(name: str, entries: Entries) -> dict[tuple[str, str], str]:
    """(rule, object) → message: a rule that already spoke about an object is not new when its wording changes."""
    return {(v.policy, f"{v.kind}/{v.name}"): v.message for v in check_resources(entries, config=policy_config(rendered(name)))}


@pytest.mark.parametrize(("rule", "example", "start", "mutate", "says"), MUTATIONS, ids=[f"{m[0]}-{m[3].__name__}" for m in MUTATIONS])
def test_the_render_passes_and_one_change_fires_only_the_rule(rule: str, example: str, start: Callable[[Entries], None],
                                                               mutate: Callable[[Entries], None], says: str) -> None:
    """A MIG profile starts from the render without its nodes, as hand-written YAML comes: with them, gpu-capacity
    also says no node advertises it."""
    entries = copy.deepcopy(resources_json(rendered(example)))
    start(entries)
    before = fired(example, entries)
    assert [m for (policy, _), m in before.items() if policy == rule] == []
    mutate(entries)
    new = {key: m for key, m in fired(example, entries).items() if key not in before}
    assert {policy for policy, _ in new} == {rule}, new
    assert any(says in m for m in new.values()), new
