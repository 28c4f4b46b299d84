"""Models larger than one node in the pack, on the rendered example (docs/examples/Pulumi.multinode.yaml: a
LeaderWorkerSet of two-server groups): it passes every rule, every pod rule reads both of its templates, and one
change per group rule makes it fire, over the render's resources and over its plain YAML."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from policy.check_yaml import main as check_yaml
from policy.rules import check_resources
from tests.policy.rendered_example import Entries, fires_on, mandatory, named
from tools.render import ROOT, Render, manifests_yaml, policy_config, resources_json, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.multinode.yaml"
LWS = "llama-405b-leader-worker-set"


@pytest.fixture(scope="module")
def rendered() -> Render:
    return run_program("multinode", stack_file=EXAMPLE)


@pytest.fixture
def entries(rendered: Render) -> Entries:
    return copy.deepcopy(resources_json(rendered))


def template(entries: Entries, member: str) -> dict[str, Any]:
    return named(entries, LWS)["spec"]["leaderWorkerTemplate"][f"{member}Template"]


def container(entries: Entries, member: str) -> dict[str, Any]:
    return template(entries, member)["spec"]["containers"][0]


def test_the_example_passes_every_rule(rendered: Render, entries: Entries) -> None:
    assert check_resources(entries, config=policy_config(rendered)) == []


def no_group_restart(e: Entries) -> None:
    named(e, LWS)["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "None"


def surge(e: Entries) -> None:
    named(e, LWS)["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"] = 1


def service_on_every_member(e: Entries) -> None:
    del named(e, "llama-405b-service")["spec"]["selector"]["app.kubernetes.io/component"]


def worker_without_gpu(e: Entries) -> None:
    del container(e, "worker")["resources"]["limits"]["nvidia.com/gpu"]


def worker_with_half_the_stage(e: Entries) -> None:
    args = container(e, "worker")["args"]
    args[args.index("--tensor-parallel-size=8")] = "--tensor-parallel-size=4"


def leader_without_startup_probe(e: Entries) -> None:
    del container(e, "leader")["startupProbe"]


def service_named_like_the_set(e: Entries) -> None:
    named(e, "llama-405b-service")["metadata"]["name"] = "vllm-llama-405b-group"


MUTATIONS: list[tuple[str, Callable[[Entries], None], str]] = [
    ("lws-headless-service-free", service_named_like_the_set, "has the name of LeaderWorkerSet vllm-llama-405b-group"),
    ("lws-group-restart", no_group_restart, "LeaderWorkerSet/vllm-llama-405b-group (leader): leaderWorkerTemplate.restartPolicy is 'None'"),
    ("lws-rollout-without-spare-gpu", surge, "rolloutStrategy surges (1)"),
    ("vllm-service-leaders-only", service_on_every_member, "selects the workers of LeaderWorkerSet vllm-llama-405b-group"),
    ("vllm-server-gpu", worker_without_gpu, "LeaderWorkerSet/vllm-llama-405b-group (workers):"),
    ("vllm-tensor-parallel-matches-gpus", worker_with_half_the_stage, "= 8 over 2 pods (--nnodes) but gets 8 nvidia.com/gpu each"),
    ("gpu-startup-probe", leader_without_startup_probe,
     "LeaderWorkerSet/vllm-llama-405b-group (leader): container 'vllm' has no startupProbe"),
]


@pytest.mark.parametrize(("rule", "mutate", "says"), MUTATIONS, ids=[f"{m[0]}-{m[1].__name__}" for m in MUTATIONS])
def test_each_rule_fires_on_one_change_to_the_example(rendered: Render, entries: Entries, rule: str,
                                                       mutate: Callable[[Entries], None], says: str) -> None:
    fires_on(rendered, entries, rule, mutate, says)


def test_the_workers_are_not_asked_for_what_a_headless_stage_has_not(rendered: Render, entries: Entries) -> None:
    """No probe, port or drain on the workers, and no finding: they serve nothing. The same template without
    `--headless` (a second API server nothing routes to) is asked for all of them again."""
    assert "startupProbe" not in container(entries, "worker")
    container(entries, "worker")["args"].remove("--headless")
    found = mandatory(rendered, entries)
    assert any("(workers)" in m for m in found["gpu-startup-probe"]) and any("(workers)" in m for m in found["vllm-graceful-drain"])


def test_plain_yaml_of_the_example_is_judged_the_same(rendered: Render, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifests = tmp_path / "manifests.yaml"
    manifests.write_text(manifests_yaml(rendered))
    config = tmp_path / "policy-config.json"
    config.write_text(json.dumps(policy_config(rendered)))
    assert check_yaml([str(manifests), "--config", str(config)]) == 0
    documents = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    (lws,) = [d for d in documents if d["kind"] == "LeaderWorkerSet"]
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "None"
    manifests.write_text(yaml.safe_dump_all(documents))
    capsys.readouterr()
    assert check_yaml([str(manifests), "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "mandatory lws-group-restart" in out and "LeaderWorkerSet/vllm-llama-405b-group (leader)" in out
