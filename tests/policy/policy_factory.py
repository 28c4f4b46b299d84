"""Builders for policy tests: one good GPU workload, mutated per case."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from policy.check_yaml import load_file
from policy.rules import Violation, check_resources

DATA = Path(__file__).parent / "data"
GOOD = DATA / "good" / "vllm.yaml"


def good_objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(GOOD.read_text()) if d]


def good(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(o for o in good_objects() if o["kind"] == kind))


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return pod_spec(deployment)["containers"][0]


def entry(obj: dict[str, Any], options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A resources.json-shaped entry for a Kubernetes object."""
    group, _, version = obj["apiVersion"].rpartition("/")
    return {"type": f"kubernetes:{group or 'core'}/{version}:{obj['kind']}",
            "name": obj["metadata"]["name"], "inputs": obj, "options": options or {}}


def check(*objects: dict[str, Any], config: dict[str, Any] | None = None) -> list[Violation]:
    entries = [o if "type" in o else entry(o) for o in objects]
    return check_resources(entries, config)


def policies(violations: list[Violation]) -> set[str]:
    return {v.policy for v in violations}


def seed(*names: str) -> list:
    return [r for n in names for r in load_file(str(DATA / "seed" / n))]
