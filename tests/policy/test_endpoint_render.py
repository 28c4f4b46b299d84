"""The teams' endpoint in the pack, on the rendered example stack (docs/examples/Pulumi.endpoint.yaml: three models
behind pools, two teams): it passes every rule, and one change per rule makes that rule fire, over the render's
resources (as a preview sees them) and over its plain YAML."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from policy.check_yaml import main as check_yaml
from policy.rules import check_resources
from tests.policy.rendered_example import Entries, mandatory, named
from tools.render import ROOT, Render, manifests_yaml, policy_config, resources_json, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.endpoint.yaml"


@pytest.fixture(scope="module")
def rendered() -> Render:
    return run_program("endpoint", stack_file=EXAMPLE)


@pytest.fixture
def entries(rendered: Render) -> Entries:
    return copy.deepcopy(resources_json(rendered))




def test_the_example_passes_every_rule(rendered: Render, entries: Entries) -> None:
    assert list(check_resources(entries, config=policy_config(rendered))) == []


def no_key_check(e: Entries) -> None:
    named(e, "data-keys-policy")["spec"]["targetRefs"][0]["name"] = "gs-other"


def renamed_picker(e: Entries) -> None:
    named(e, "embed-picker-service")["metadata"]["name"] = "vllm-embed-picker"


def fail_open(e: Entries) -> None:
    named(e, "mistral-pool")["spec"]["endpointPickerRef"]["failureMode"] = "FailOpen"


def route_to_service(e: Entries) -> None:
    rule = named(e, "apps-route")["spec"]["rules"][-1]
    rule["backendRefs"] = [{"kind": "Service", "name": "vllm-mistral", "port": 8000}]


def namespace_peer(e: Entries) -> None:
    peers = named(e, "mistral-network-policy")["spec"]["ingress"][0]["from"]
    peers.append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}})


def secrets_role(e: Entries) -> None:
    named(e, "qwen3-picker-role")["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})


def other_namespace_keys(e: Entries) -> None:
    named(e, "apps-keys-policy")["spec"]["apiKeyAuth"]["credentialRefs"][0]["namespace"] = "shared"


MUTATIONS: list[tuple[str, Callable[[Entries], None], str]] = [
    ("endpoint-auth-required", no_key_check, "AIGatewayRoute gs-data reaches the models' pools but no SecurityPolicy"),
    ("endpoint-pool-has-picker", renamed_picker, "names Service vllm-embed-epp, which the stack does not declare"),
    ("endpoint-pool-has-picker", fail_open, "FailOpen sends requests to any pod"),
    ("endpoint-routes-to-pool", route_to_service, "sends to Service vllm-mistral, whose pods are InferencePool vllm-mistral's"),
    ("endpoint-pods-closed", namespace_peer, "admits every pod of namespace apps to Deployment vllm-mistral"),
    ("picker-rbac-minimal", secrets_role, "grants core/secrets"),
    ("tenant-keys-in-secrets", other_namespace_keys, "takes API keys from Secret shared/gs-tenant-apps"),
]


@pytest.mark.parametrize(("rule", "mutate", "says"), MUTATIONS, ids=[f"{m[0]}-{m[1].__name__}" for m in MUTATIONS])
def test_each_rule_fires_on_one_change_to_the_example(rendered: Render, entries: Entries, rule: str,
                                                       mutate: Callable[[Entries], None], says: str) -> None:
    mutate(entries)
    found = mandatory(rendered, entries)
    assert set(found) == {rule}, found
    assert any(says in m for m in found[rule]), found[rule]


def test_model_pods_without_any_network_policy_are_flagged(rendered: Render, entries: Entries) -> None:
    entries[:] = [e for e in entries if e["name"] != "embed-network-policy"]
    (message,) = mandatory(rendered, entries)["endpoint-pods-closed"]
    assert "Deployment/vllm-embed" in message and "no NetworkPolicy limits who reaches it" in message


def test_plain_yaml_of_the_example_is_judged_the_same(rendered: Render, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifests = tmp_path / "manifests.yaml"
    manifests.write_text(manifests_yaml(rendered))
    config = tmp_path / "policy-config.json"
    config.write_text(json.dumps(policy_config(rendered)))
    assert check_yaml([str(manifests), "--config", str(config)]) == 0
    documents = [d for d in yaml.safe_load_all(manifests.read_text()) if d]
    documents = [d for d in documents if not (d["kind"] == "SecurityPolicy" and d["metadata"]["name"] == "gs-apps")]
    manifests.write_text(yaml.safe_dump_all(documents))
    capsys.readouterr()
    assert check_yaml([str(manifests), "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "mandatory endpoint-auth-required" in out and "gs-apps" in out


@pytest.fixture(scope="module")
def held_rendered() -> Render:
    """The example with embed held at `replicas.min: 0`, its own key presented by the gateway (tests/test_endpoint.py)."""
    document = yaml.safe_load(EXAMPLE.read_text())["config"]
    cluster, models = document["gpu-serving:cluster"], document["gpu-serving:models"]
    cluster["requestHold"] = {}
    models[2].update(replicas={"min": 0, "max": 1}, apiKeySecret="embedApiKey")
    overrides = {"gpu-serving:cluster": json.dumps(cluster), "gpu-serving:models": json.dumps(models)}
    return run_program("endpoint", stack_file=EXAMPLE, overrides=overrides, secret_values={"embedApiKey": "k-embed"})


def test_a_held_model_on_the_endpoint_passes_every_rule_and_needs_its_key(held_rendered: Render) -> None:
    entries = copy.deepcopy(resources_json(held_rendered))
    assert list(check_resources(entries, config=policy_config(held_rendered))) == []
    entries[:] = [e for e in entries if e["name"] != "embed-hold-key-policy"]
    found = mandatory(held_rendered, entries)
    assert set(found) == {"endpoint-backend-key"}, found
    (message,) = found["endpoint-backend-key"]
    assert "AIGatewayRoute gs-data sends to AIServiceBackend vllm-embed-hold, which no BackendSecurityPolicy" in message
