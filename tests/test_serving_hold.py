"""Issue 26 item 2: scale to zero with the requests held. A model at `replicas.min: 0` is reached through KEDA's
HTTP add-on (its interceptor holds a request while the model starts), refused at load where nothing would hold
its requests or the timeouts cannot cover a start, and rendered so every edge waits out the cold start."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.serving import monitoring
from components.serving.edge import PROXY_TIMEOUT_S
from components.serving.jobs import REQUEST_TIMEOUT_S, SMOKE_DEADLINE_S, SMOKE_SCRIPT
from policy.check_yaml import main as check_yaml
from stacks.config import ConfigError, Model, parse
from stacks.config.budgets import IMAGE_PULL_S, startup_budget_seconds
from tests import checkers
from tests.test_serving import DEPLOYMENT, INGRESS, JOB, SCALED_OBJECT, SERVICE, assert_valid, prod_raw
from tests.test_serving_gateway import behind_gateway
from tools.render import ROOT, Render, manifests_yaml, policy_violations, redact, resources_json, run_program

EXAMPLE = ROOT / "docs" / "examples" / "scale-to-zero.yaml"
INTERCEPTOR_ROUTE = "kubernetes:http.keda.sh/v1beta1:InterceptorRoute"
HTTPROUTE = "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute"
REFERENCE_GRANT = "kubernetes:gateway.networking.k8s.io/v1beta1:ReferenceGrant"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
HELD, ALWAYS_ON = "qwen3-small", "qwen3"


def example_raw() -> dict[str, Any]:
    config = yaml.safe_load(EXAMPLE.read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in config.items()}


def render_example(**overrides: Any) -> Render:
    values = {f"gpu-serving:{key}": json.dumps(value) for key, value in overrides.items()}
    return run_program("scale-to-zero", stack_file=EXAMPLE, overrides=values)


@pytest.fixture(scope="module")
def example() -> Render:
    return render_example()


def named(render: Render, type_token: str, name: str) -> dict[str, Any]:
    (found,) = [r for r in render.of_type(type_token) if r.inputs["metadata"]["name"] == name]
    return redact(found.inputs)


def held_model(render: Render) -> Model:
    return next(m for m in render.config.models if m.name == HELD)


# ---------------------------------------------------------------------------- the render


def test_the_example_renders_valid_objects_that_the_pack_accepts(example: Render) -> None:
    assert assert_valid(example) >= 30  # every custom resource against its CRD (InterceptorRoute included)
    assert policy_violations(example, resources_json(example)) == []


def test_the_example_manifests_pass_the_pack_as_plain_yaml(example: Render, tmp_path: Path) -> None:
    path = tmp_path / "manifests.yaml"
    path.write_text(manifests_yaml(example))
    assert check_yaml([str(path)]) == 0


def test_the_hold_routes_v1_by_the_hold_services_own_names_to_the_models_service(example: Render) -> None:
    hold = named(example, INTERCEPTOR_ROUTE, "vllm-qwen3-small-hold")
    spec = hold["spec"]
    (rule,) = spec["rules"]
    assert rule["hosts"] == ["vllm-qwen3-small-hold", "vllm-qwen3-small-hold.ai", "vllm-qwen3-small-hold.ai.svc",
                             "vllm-qwen3-small-hold.ai.svc.cluster.local"]
    assert rule["paths"] == [{"value": "/v1"}]
    assert spec["target"] == {"service": "vllm-qwen3-small", "port": 8000}
    model = held_model(example)
    budget = startup_budget_seconds(model.weights_gb)
    assert model.cold_start_seconds == IMAGE_PULL_S + budget  # unset: pull allowance + startup budget
    # Set, not left to the interceptor's defaults (v0.14 changed them).
    assert spec["timeouts"] == {"readiness": f"{model.cold_start_seconds}s", "responseHeader": f"{PROXY_TIMEOUT_S}s"}
    # The add-on makes no ScaledObject for a route: nothing of the add-on's annotations is needed.
    assert "annotations" not in hold["metadata"] or not any("keda.sh" in k for k in hold["metadata"]["annotations"])


def test_the_stacks_scaled_object_wakes_on_the_hold_and_scales_on_the_queue(example: Render) -> None:
    spec = named(example, SCALED_OBJECT, "vllm-qwen3-small")["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 1, 45 * 60)
    queue, wake = spec["triggers"]
    assert queue["type"] == "prometheus" and 'model_name="qwen3-small"' in queue["metadata"]["query"]
    assert wake == {"type": "external-push", "metadata": {"scalerAddress": "keda-add-ons-http-external-scaler.keda:9090",
                                                          "interceptorRoute": "vllm-qwen3-small-hold"}}
    # The add-on (v0.12) deleted a ScaledObject named like an HTTPScaledObject that skipped its own, and a stack moving
    # from one to the other still has it until the `up` ends.
    assert wake["metadata"]["interceptorRoute"] != "vllm-qwen3-small"
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["policies"][0]["value"] == 1
    # The autoscaler owns the count: `pulumi up` neither fights KEDA nor waits for pods that idle at zero.
    assert "replicas" not in named(example, DEPLOYMENT, "vllm-qwen3-small")["spec"]


def test_the_edge_reaches_the_interceptor_with_the_hold_host_and_waits_out_the_cold_start(example: Render) -> None:
    service = named(example, SERVICE, "vllm-qwen3-small-hold")["spec"]
    assert service == {"type": "ExternalName", "externalName": "keda-add-ons-http-interceptor-proxy.keda.svc.cluster.local",
                       "ports": [{"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}]}
    ingress = named(example, INGRESS, "vllm-qwen3-small")
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["backend"]["service"] == {"name": "vllm-qwen3-small-hold", "port": {"number": 8080}}
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-vhost"] == "vllm-qwen3-small-hold.ai.svc"
    wait = str(held_model(example).cold_start_seconds + PROXY_TIMEOUT_S)
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == wait
    assert annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"] == wait
    assert annotations["nginx.ingress.kubernetes.io/rewrite-target"] == "/v1/$2"  # still /v1 only


def test_an_always_on_model_of_the_same_stack_keeps_its_direct_edge(example: Render) -> None:
    ingress = named(example, INGRESS, "vllm-qwen3")
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"] == {"name": "vllm-qwen3", "port": {"name": "http"}}
    assert "nginx.ingress.kubernetes.io/upstream-vhost" not in ingress["metadata"]["annotations"]
    assert [r for r in example.of_type(INTERCEPTOR_ROUTE) if "qwen3-small" not in r.inputs["metadata"]["name"]] == []
    assert example.outputs["models"][ALWAYS_ON]["url"] == "http://vllm-qwen3.ai.svc:8000/v1"


def test_in_cluster_clients_get_the_url_through_the_hold(example: Render) -> None:
    assert example.outputs["models"][HELD]["url"] == "http://vllm-qwen3-small-hold.ai.svc:8080/v1"
    assert example.outputs["models"][HELD]["replicas"] == {"min": 0, "max": 1, "autoscaler": "keda"}


def test_only_the_interceptor_and_prometheus_reach_a_held_model() -> None:
    raw = example_raw()
    raw["cluster"]["network"] = {"clientNamespaces": ["apps"]}
    result = render_example(cluster=raw["cluster"])
    (rule,) = named(result, NETWORK_POLICY, "vllm-qwen3-small")["spec"]["ingress"]
    peers = [(p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], p.get("podSelector")) for p in rule["from"]]
    assert peers == [("keda", {"matchLabels": {"app.kubernetes.io/component": "interceptor",
                                                "app.kubernetes.io/part-of": "keda-add-ons-http"}}),
                     ("monitoring", {"matchLabels": {"app.kubernetes.io/name": "prometheus"}})]
    # The always-on model still admits its edge, its smoke test and the clients.
    (direct,) = named(result, NETWORK_POLICY, "vllm-qwen3")["spec"]["ingress"]
    assert "apps" in [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in direct["from"]]


def test_the_smoke_test_wakes_the_model_through_the_hold(example: Render) -> None:
    (job,) = [j for j in example.of_type(JOB) if j.inputs["metadata"]["name"].startswith("vllm-qwen3-small-smoke-")]
    spec = redact(job.inputs)["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    model = held_model(example)
    assert env["BASE"] == "http://vllm-qwen3-small-hold.ai.svc:8080"
    assert env["WAKE_TIMEOUT_S"] == str(model.cold_start_seconds + REQUEST_TIMEOUT_S)
    assert "HEALTH_WAIT_S" not in env  # /health is not routed through the hold, and at zero nothing answers it
    script = container["command"][2]
    assert "/health" not in script and '--max-time "$WAKE_TIMEOUT_S" "$BASE/v1/models"' in script
    assert spec["activeDeadlineSeconds"] == int(env["WAKE_TIMEOUT_S"]) + 2 * REQUEST_TIMEOUT_S + 60
    (other,) = [j for j in example.of_type(JOB) if j.inputs["metadata"]["name"].startswith("vllm-qwen3-smoke-")]
    assert other.inputs["spec"]["activeDeadlineSeconds"] == SMOKE_DEADLINE_S
    assert other.inputs["spec"]["template"]["spec"]["containers"][0]["command"][2] == SMOKE_SCRIPT


def test_the_gateway_edge_reaches_the_interceptor_under_a_reference_grant() -> None:
    raw = example_raw()
    cluster = behind_gateway(raw["cluster"], {"name": "public", "namespace": "gateway"})
    models = copy.deepcopy(raw["models"])
    for model in models:
        model["ingress"].pop("tlsSecret")
    result = render_example(cluster=cluster, models=models)
    (rule,) = named(result, HTTPROUTE, "vllm-qwen3-small")["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "keda-add-ons-http-interceptor-proxy", "namespace": "keda", "port": 8080}]
    (rewrite,) = rule["filters"]
    assert rewrite["urlRewrite"] == {"hostname": "vllm-qwen3-small-hold.ai.svc",
                                     "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}}
    wait = f"{held_model(result).cold_start_seconds + PROXY_TIMEOUT_S}s"
    assert rule["timeouts"] == {"request": wait, "backendRequest": wait}
    grant = named(result, REFERENCE_GRANT, "gpu-serving-ai")
    assert grant["metadata"]["namespace"] == "keda"
    assert grant["spec"] == {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "ai"}],
                             "to": [{"group": "", "kind": "Service", "name": "keda-add-ons-http-interceptor-proxy"}]}
    (direct,) = named(result, HTTPROUTE, "vllm-qwen3")["spec"]["rules"]
    assert direct["backendRefs"] == [{"name": "vllm-qwen3", "port": 8000}]
    assert assert_valid(result) >= 30
    assert policy_violations(result, resources_json(result)) == []


def test_no_reference_grant_without_a_held_route(render) -> None:  # type: ignore[no-untyped-def]
    assert render().of_type(REFERENCE_GRANT) == []
    assert render_example().of_type(REFERENCE_GRANT) == []  # ingress edge: the ExternalName Service is enough


def test_the_crd_schema_refuses_a_misspelt_hold(example: Render) -> None:
    import jsonschema

    hold = copy.deepcopy(named(example, INTERCEPTOR_ROUTE, "vllm-qwen3-small-hold"))
    hold["spec"]["timeouts"]["conditionWait"] = "1800s"  # the HTTPScaledObject's name for readiness
    with pytest.raises(jsonschema.ValidationError):
        checkers.validate(hold)


# ---------------------------------------------------------------------------- refused at load


def with_held(replicas: dict[str, Any] | None = None, **cluster: Any) -> dict[str, Any]:
    raw = example_raw()
    raw["cluster"].update(cluster)
    if replicas is not None:
        raw["models"][1]["replicas"] = replicas
    return raw


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    return str(caught.value)


def without_hold() -> dict[str, Any]:
    raw = with_held()
    raw["cluster"].pop("requestHold")
    return raw


REFUSED = [
    ("no hold installed", without_hold(),
     "models[1].replicas.min: 0, but cluster.requestHold is unset: the queue metric comes from the vLLM pods"),
    ("an HPA cannot scale to zero", with_held(autoscaling="hpa"),
     "models[1].replicas.min: 0 needs cluster.autoscaling keda (it is hpa)"),
    ("no autoscaler", with_held(autoscaling="none"), "models[1].replicas.min: 0 needs cluster.autoscaling keda (it is none)"),
    ("a hold shorter than the startup probe", with_held({"min": 0, "max": 1, "coldStartTimeoutSeconds": 300}),
     "models[1].replicas.coldStartTimeoutSeconds: 300 s is below the startup budget of 600 s"),
    ("idling shorter than a start", with_held({"min": 0, "max": 1, "idleAfter": "10m"}),
     "models[1].replicas.idleAfter: 600 s is below the cold start timeout (1800 s)"),
    ("idleAfter on a model that never idles", with_held({"min": 1, "max": 1, "idleAfter": "45m"}),
     "models[1].replicas.idleAfter: only with min: 0 (scale to zero); min is 1"),
    ("a cold start timeout on a model that never starts cold", with_held({"min": 1, "max": 1, "coldStartTimeoutSeconds": 900}),
     "models[1].replicas.coldStartTimeoutSeconds: only with min: 0 (scale to zero); min is 1"),
    ("idleAfter not a duration", with_held({"min": 0, "max": 1, "idleAfter": "45 minutes"}),
     "models[1].replicas.idleAfter: must be whole seconds or a duration of h, m and s, e.g. 1800 or 30m (got '45 minutes')"),
    ("a cluster domain that is no DNS name", with_held(requestHold={"clusterDomain": "Cluster_Local"}),
     "cluster.requestHold.clusterDomain: must be a DNS domain of lowercase labels joined by '.', e.g. cluster.local"),
    ("a misspelt hold key", with_held(requestHold={"interceptorSvc": "x"}),
     "cluster.requestHold.interceptorSvc: unknown key; did you mean interceptorService?"),
]


@pytest.mark.parametrize(("raw", "starts"), [(r, s) for _, r, s in REFUSED], ids=[c for c, _, _ in REFUSED])
def test_scale_to_zero_is_refused_where_it_cannot_work(raw: dict[str, Any], starts: str) -> None:
    message = error_of(raw)
    assert message.startswith(starts), message


def test_a_bigger_model_needs_a_longer_hold_and_the_message_names_its_budget() -> None:
    raw = with_held({"min": 0, "max": 1, "coldStartTimeoutSeconds": 900})
    raw["models"][1]["weightsGb"] = 140
    budget = startup_budget_seconds(140)
    assert error_of(raw).endswith(f"set {budget} or more")
    raw["models"][1]["replicas"]["coldStartTimeoutSeconds"] = budget
    model = parse(raw).models[1]
    assert (model.cold_start_seconds, model.idle_seconds) == (budget, budget)


@pytest.mark.parametrize(("given", "seconds"), [(2700, 2700), ("2700", 2700), ("45m", 2700), ("1h30m", 5400), ("2700s", 2700)])
def test_idle_after_takes_seconds_or_a_duration(given: Any, seconds: int) -> None:
    model = parse(with_held({"min": 0, "max": 1, "idleAfter": given})).models[1]
    assert model.idle_seconds == seconds


def test_prod_still_refuses_zero_without_a_hold() -> None:
    raw = prod_raw()
    raw["models"][0]["replicas"] = {"min": 0, "max": 2}
    assert error_of(raw).startswith("models[0].replicas.min: 0, but cluster.requestHold is unset")


# ---------------------------------------------------------------------------- alerts


def test_no_pod_ready_stays_quiet_at_zero_and_fires_when_a_wake_fails(tmp_path: Path, example: Render) -> None:
    model = held_model(example)
    (rule,) = [r for r in named(example, PROMETHEUS_RULE, "vllm-qwen3-small")["spec"]["groups"]]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [rule]}))
    where = 'namespace="ai",deployment="vllm-qwen3-small"'
    available, wanted = f"kube_deployment_status_replicas_available{{{where}}}", f"kube_deployment_spec_replicas{{{where}}}"
    window = -(-model.cold_start_seconds // 60)
    (alert,) = [r for r in monitoring.alert_rules(model, "ai") if r["alert"] == "VllmNoPodReady"]
    down = {"exp_labels": {"namespace": "ai", "deployment": "vllm-qwen3-small", **alert["labels"]},
            "exp_annotations": alert["annotations"]}
    span = window + 30
    tests = [
        {   # idling at zero for hours: by design
            "interval": "1m",
            "input_series": [{"series": available, "values": f"0x{span}"}, {"series": wanted, "values": f"0x{span}"}],
            "alert_rule_test": [{"eval_time": f"{span - 1}m30s", "alertname": "VllmNoPodReady", "exp_alerts": []}],
        },
        {   # woken, ready within the cold start timeout
            "interval": "1m",
            "input_series": [{"series": available, "values": f"0x{window - 2} 1x30"},
                             {"series": wanted, "values": f"0 1x{window + 28}"}],
            "alert_rule_test": [{"eval_time": f"{window + 5}m30s", "alertname": "VllmNoPodReady", "exp_alerts": []}],
        },
        {   # woken and never ready: the held requests get 502
            "interval": "1m",
            "input_series": [{"series": available, "values": f"0x{span}"}, {"series": wanted, "values": f"0 1x{span - 1}"}],
            "alert_rule_test": [
                {"eval_time": f"{window - 2}m30s", "alertname": "VllmNoPodReady", "exp_alerts": []},
                {"eval_time": f"{window + 3}m30s", "alertname": "VllmNoPodReady", "exp_alerts": [down]},
            ],
        },
    ]
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run([str(checkers.promtool()), "test", "rules", str(test_file)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
