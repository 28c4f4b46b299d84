"""The gateway stand-in's control-plane half (testbed/endpoint/standin_gateway.py) over the example endpoint stack's
render: what the real-node one-URL checks serve is what the stack's objects say, and an object the gateway could not
resolve is an error rather than a silently open or empty route."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from testbed.endpoint.standin_gateway import TranslationError, data_plane_config, seconds
from tools.render import ROOT, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.endpoint.yaml"


@pytest.fixture(scope="module")
def applied() -> list[dict[str, Any]]:
    """The render's objects as the API server would hold them after apply: the teams' Secrets with keys of the test's
    own (base64 `data`, as the API server returns them) and a ClusterIP on each Service."""
    objects = [copy.deepcopy(o) for o in run_program("endpoint", stack_file=EXAMPLE).kubernetes_objects()
               if not o["metadata"]["name"].startswith("gs-tenant-")]
    for n, obj in enumerate(o for o in objects if o["kind"] == "Service"):
        obj["spec"]["clusterIP"] = f"10.96.0.{10 + n}"
    for team, keys in {"apps": {"apps": "k-apps-1"}, "data": {"data": "k-data-1"}}.items():
        objects.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"gs-tenant-{team}"},
                        "data": {cid: base64.b64encode(k.encode()).decode() for cid, k in keys.items()}})
    return objects


def test_each_team_host_serves_its_models_behind_its_keys(applied: list[dict[str, Any]]) -> None:
    hosts = data_plane_config(applied)["hosts"]
    assert set(hosts) == {"apps.ai.example.com", "data.ai.example.com"}
    apps, data = hosts["apps.ai.example.com"], hosts["data.ai.example.com"]
    assert [m["name"] for m in apps["models"]] == ["qwen3", "qwen3-sql", "qwen3-support", "mistral"]
    assert [m["name"] for m in data["models"]] == ["qwen3-sql", "embed"]
    assert apps["keys"] == ["k-apps-1"] and data["keys"] == ["k-data-1"]
    services = {o["metadata"]["name"]: o["spec"]["clusterIP"] for o in applied if o["kind"] == "Service"}
    # An adapter goes to its base model's pool, whose picker is reached at its Service.
    assert {m["name"]: (m["pool"], m["picker"]) for m in data["models"]} == {
        "qwen3-sql": ("vllm-qwen3", f"{services['vllm-qwen3-epp']}:9002"),
        "embed": ("vllm-embed", f"{services['vllm-embed-epp']}:9002")}
    assert all(m["timeoutSeconds"] > 0 for m in apps["models"])
    for host in hosts.values():
        assert set(host["overrides"]) == {"401", "404", "429"}
        assert json.loads(host["overrides"]["404"]["body"])["error"]["code"] == "model_not_found"


def test_a_rotation_admits_both_keys(applied: list[dict[str, Any]]) -> None:
    objects = copy.deepcopy(applied)
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "gs-tenant-apps")
    secret["data"]["apps.2"] = base64.b64encode(b"k-apps-2").decode()
    assert data_plane_config(objects)["hosts"]["apps.ai.example.com"]["keys"] == ["k-apps-1", "k-apps-2"]


@pytest.mark.parametrize(("mutate", "says"), [
    (lambda objs: objs.remove(next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == "gs-tenant-data")),
     "SecurityPolicy gs-data: no Secret gs-tenant-data"),
    (lambda objs: objs.remove(next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "vllm-embed-epp")),
     "InferencePool vllm-embed: no Service vllm-embed-epp"),
    (lambda objs: next(o for o in objs if o["kind"] == "AIGatewayRoute" and o["metadata"]["name"] == "gs-data")["spec"]["rules"][0]
     .update(backendRefs=[{"kind": "Service", "name": "vllm-qwen3"}]), "a rule sends to Service vllm-qwen3, not a pool"),
])
def test_what_the_gateway_could_not_resolve_is_an_error(applied: list[dict[str, Any]], mutate: Any, says: str) -> None:
    objects = copy.deepcopy(applied)
    mutate(objects)
    with pytest.raises(TranslationError, match=says):
        data_plane_config(objects)


def test_a_route_without_a_key_check_is_open_not_closed(applied: list[dict[str, Any]]) -> None:
    objects = [o for o in applied if not (o["kind"] == "SecurityPolicy" and o["metadata"]["name"] == "gs-apps")]
    hosts = data_plane_config(objects)["hosts"]
    assert hosts["apps.ai.example.com"]["keys"] is None  # the data plane then checks nothing, as Envoy would
    assert hosts["data.ai.example.com"]["keys"] == ["k-data-1"]


@pytest.mark.parametrize(("text", "value"), [("600s", 600), ("1h30m", 5400), ("500ms", 0.5)])
def test_durations(text: str, value: float) -> None:
    assert seconds(text) == value


def test_a_duration_it_cannot_read_is_refused() -> None:
    with pytest.raises(TranslationError):
        seconds("10 minutes")
