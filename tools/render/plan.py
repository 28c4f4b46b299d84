"""The plan a render prints: per node what `pulumi up` does to it and what it will carry, per model where it may
run and how it is reached, and the policy pack's verdict. A pure function of the render (its config, outputs and
resources) and the pack's findings, so that tests read it as the operator does.

A small stack gets a line or two per node and model; a fleet (more than FLEET nodes or models) gets counts and
groupings of alike nodes and models instead, naming the first few of each group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stacks.config.sharing import layout_text, resource_name
from stacks.config.storage import usable_gib
from tools.render.result import Render

FLEET = 8
"""More nodes or models than this: summarised by groups, not one entry each."""
FIRST_FINDINGS = 3
"""How many of the policy pack's findings the plan quotes."""
NAMED = 4
"""How many names a group of alike nodes or models lists before `…` and the last one."""


def plan(render: Render, policy: list[str], policy_file: str = "policy.txt") -> str:
    """The plan as text: nodes, models, the policy verdict (every line ends with a newline)."""
    config = render.config
    lines: list[str] = []
    if config is not None:
        fleet = len(config.nodes) > FLEET or len(config.models) > FLEET
        lines += _nodes(render, fleet)
        lines += _models(render, fleet)
        lines += _teams(render)
    lines += _policy(policy, policy_file)
    return "".join(f"{line}\n" for line in lines)


# --- nodes --------------------------------------------------------------------------------------------


def patched_nodes(render: Render) -> dict[str, tuple[dict[str, str], list[dict[str, str]]]]:
    """What the render patches onto each node, by name: every label of its NodePatch objects (components/node/labels.py
    sets them: GPU product and count, sharing, the cache's and the verified weights'), and its taints."""
    patched: dict[str, tuple[dict[str, str], list[dict[str, str]]]] = {}
    for resource in render.of_type("kubernetes:core/v1:NodePatch"):
        metadata = resource.inputs.get("metadata") or {}
        labels, taints = patched.setdefault(str(metadata.get("name")), ({}, []))
        labels |= metadata.get("labels") or {}
        taints += (resource.inputs.get("spec") or {}).get("taints") or []
    return {name: (dict(sorted(labels.items())), taints) for name, (labels, taints) in patched.items()}


def _node_facts(render: Render, node: Any, patched: dict[str, Any], cache_nodes: set[str]) -> dict[str, str]:
    """One node's plan, field by field (fields alike across nodes group them in a fleet)."""
    config = render.config
    storage = node.storage
    if node.prepares_disks:
        array = (f"{storage.device} (RAID1 of 2 × {storage.size_gb} GB partitions, {usable_gib(storage.size_gb)} GiB usable)"
                 f"{f', adopted from {storage.adopt}' if storage.adopt else ''} mounted at {storage.mountpoint}")
        disks = " + ".join(storage.disks)
    else:
        array, disks = "no disk work", ""
    gpu = node.gpu
    if gpu.sharing is None:
        sharing = "whole cards"
    elif gpu.sharing.time_slicing is not None:
        sharing = f"time-sliced, {gpu.sharing.time_slicing.replicas} pods per card"
    else:
        sharing = f"MIG {layout_text(gpu.sharing.mig.profiles)} per card"
    advertised = ", ".join(f"{resource_name(r)}: {n}" for r, n in gpu.advertised.items())
    labels, taints = patched.get(node.name, ({}, []))
    volume = config.model_storage
    if node.name in cache_nodes:
        role = "caches models (nodeCache)"
    elif volume.type == "local":
        role = "holds the model volume (local)" if volume.node == node.name else f"runs no model (the volume is on {volume.node})"
    else:
        role = "caches no models" if volume.type == "nodeCache" else f"reads models from the {volume.type} volume"
    return {
        "gpu": f"{gpu.count} × {gpu.product}, {sharing} ({advertised})",
        "array": array,
        "disks": disks,
        "runtime": f"runtime {node.container_runtime}",
        "role": role,
        "labels": ", ".join(f"{k}={v}" for k, v in labels.items()) or "none",
        "taints": ", ".join(f"{t.get('key')}={t.get('value')}:{t.get('effect')}" for t in taints) or "none",
    }


def _nodes(render: Render, fleet: bool) -> list[str]:
    nodes = render.config.nodes
    patched = patched_nodes(render)
    cache_nodes = {n.name for n in render.config.cache_nodes()}
    facts = {node.name: _node_facts(render, node, patched, cache_nodes) for node in nodes}
    lines = [f"nodes ({len(nodes)}):"]
    if not fleet:
        for name, f in facts.items():
            lines.append(f"  {name}: {f['gpu']}; {f['runtime']}; {f['role']}")
            lines.append(f"    array: {f['array']}")
            if f["disks"]:
                lines.append(f"    disks: {f['disks']}")
            lines.append(f"    labels: {f['labels']}")
            lines.append(f"    taint: {f['taints']}")
        return lines
    # A fleet: nodes alike in everything but their names and disks, one group each (labels differ by the weights
    # each node holds, so a group names its labels' keys, not every value).
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, f in facts.items():
        groups.setdefault((f["gpu"], f["runtime"], f["role"], f["array"], f["taints"]), []).append(name)
    for (gpu, runtime, role, array, taints), names in list(groups.items())[:FLEET]:
        lines.append(f"  {len(names)} node{'s' if len(names) > 1 else ''} of {gpu}; {runtime}; {role}: {_names(names)}")
        lines.append(f"    array: {array}")
        keys = sorted({label.split("=", 1)[0] for n in names for label in facts[n]["labels"].split(", ") if label != "none"})
        lines.append(f"    label keys: {_first(keys, 6)}; taint: {taints}")
    lines += _more_groups(list(groups.values())[FLEET:], "node")
    return lines


# --- models -------------------------------------------------------------------------------------------


def _model_facts(render: Render, model: Any) -> dict[str, str]:
    config = render.config
    out = (render.outputs.get("models") or {}).get(model.name) or {}
    replicas = out.get("replicas") or {}
    autoscaler = replicas.get("autoscaler", config.cluster.autoscaling)
    autoscaler = "no autoscaler" if autoscaler == "none" else autoscaler
    holders = [n.name for n in config.holders(model)]
    budget = f"startup ≤ {model.startup_budget_seconds} s"
    if model.scales_to_zero:
        budget += f", a cold start held ≤ {model.cold_start_seconds} s"
    return {
        "gpus": f"{model.gpus_per_replica} × {resource_name(model.gpu_resource)} ({model.gpu_product}) per replica"
        if not model.spans_nodes else
        f"{model.nodes_per_replica} whole nodes × {model.gpus_per_replica} {resource_name(model.gpu_resource)} ({model.gpu_product}) "
        "per replica (a LeaderWorkerSet group)",
        "replicas": f"replicas {model.replicas.min}–{model.replicas.max} ({autoscaler})",
        "holders": ", ".join(holders) or "no node",
        "budget": budget,
        "in cluster": str(out.get("url") or "none"),
        "ingress": str(out.get("ingressUrl") or ""),
    }


def _models(render: Render, fleet: bool) -> list[str]:
    models = render.config.models
    if not models:
        return ["models: none"]
    facts = {model.name: _model_facts(render, model) for model in models}
    lines = [f"models ({len(models)}):"]
    if not fleet:
        for name, f in facts.items():
            lines.append(f"  {name}: {f['gpus']}; {f['replicas']}; {f['budget']}")
            lines.append(f"    runs on: {f['holders']}")
            lines.append(f"    url: {f['in cluster']} (in cluster)" + (f", {f['ingress']} (ingress)" if f["ingress"] else ""))
        return lines
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, f in facts.items():
        groups.setdefault((f["gpus"], f["replicas"], f["budget"], f["holders"]), []).append(name)
    for (gpus, replicas, budget, holders), names in list(groups.items())[:FLEET]:
        lines.append(f"  {len(names)} model{'s' if len(names) > 1 else ''}, {gpus}; {replicas}; {budget}: {_names(names)}")
        lines.append(f"    run on: {_names(holders.split(', '))}")
    lines += _more_groups(list(groups.values())[FLEET:], "model")
    exposed = sum(1 for f in facts.values() if f["ingress"])
    lines.append(f"  urls: {len(facts)} in cluster ({next(iter(facts.values()))['in cluster']}, …), {exposed} through the ingress"
                 " (every one in outputs.json)")
    return lines


# --- teams ---------------------------------------------------------------------------------------------


def _teams(render: Render) -> list[str]:
    """Each team's one URL and what it may call there (`tenants`; none: each model is reached on its own)."""
    tenants = render.config.tenants
    if not tenants:
        return []
    urls = render.outputs.get("endpoint") or {}
    lines = [f"teams ({len(tenants)}), one URL each, routed by the request's model:"]
    for tenant in tenants:
        limit = f"; {tenant.requests_per_minute} requests/min per gateway replica" if tenant.requests_per_minute else ""
        keys = len(tenant.api_key_secrets)
        lines.append(f"  {tenant.name}: {urls.get(tenant.name, 'no URL')} → {_names(list(tenant.models))}; "
                     f"{keys} key{'s' if keys > 1 else ''}{limit}")
    return lines


# --- policy -------------------------------------------------------------------------------------------


def _policy(policy: list[str], policy_file: str) -> list[str]:
    mandatory = [line for line in policy if line.startswith("mandatory ")]
    advisory = [line for line in policy if line.startswith("advisory ")]
    if not policy:
        return ["policy: passed (0 mandatory, 0 advisory findings)"]
    verdict = "failed" if mandatory else "passed with advisories"
    lines = [f"policy: {verdict} ({len(mandatory)} mandatory, {len(advisory)} advisory findings, in {policy_file})"]
    if len(policy) > FIRST_FINDINGS:
        rules: dict[str, int] = {}
        for line in mandatory + advisory:
            level, rule = line.split(" ", 2)[:2]
            rules[f"{level} {rule}"] = rules.get(f"{level} {rule}", 0) + 1
        lines.append("  by rule: " + ", ".join(f"{rule} × {n}" for rule, n in rules.items()))
    lines += [f"  {line}" for line in (mandatory + advisory)[:FIRST_FINDINGS]]
    if len(policy) > FIRST_FINDINGS:
        lines.append(f"  … {len(policy) - FIRST_FINDINGS} more in {policy_file}")
    return lines


# --- helpers ------------------------------------------------------------------------------------------


def _more_groups(groups: list[list[str]], what: str) -> list[str]:
    if not groups:
        return []
    count = sum(len(names) for names in groups)
    return [f"  … {len(groups)} more groups of {count} {what}s in all: {_names([n for names in groups for n in names])}"]


def _names(names: list[str]) -> str:
    """`a, b, c, d` or, for more than NAMED, `a, b, c, d, … z`."""
    if len(names) <= NAMED + 1:
        return ", ".join(names)
    return ", ".join(names[:NAMED]) + f", … {names[-1]}"


def _first(items: Iterable[str], n: int) -> str:
    items = list(items)
    return ", ".join(items) if len(items) <= n else ", ".join(items[:n]) + f", … ({len(items)} in all)"
