"""The teams' endpoint (issue #43): `cluster.endpoint` and `tenants`. The load checks, and what the program declares:
an InferencePool and a picker per model, per team a route that reaches only its models, a key check that admits
only its keys, and no key anywhere but the team's Secret."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from stacks.config import ConfigError, parse
from tests import checkers
from tools.render import ROOT, Render, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.endpoint.yaml"


def example_raw() -> dict[str, Any]:
    document = yaml.safe_load(EXAMPLE.read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in document.items()}


def render(raw: dict[str, Any] | None = None, secret_values: dict[str, str] | None = None) -> Render:
    overrides = {f"gpu-serving:{key}": json.dumps(value) for key, value in (raw or {}).items()}
    return run_program("endpoint", stack_file=EXAMPLE, overrides=overrides, secret_values=secret_values)


@pytest.fixture(scope="module")
def example() -> Render:
    return render()


def objects(out: Render, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in out.kubernetes_objects() if o["kind"] == kind}


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    return str(caught.value)


def changed(mutate: Any) -> dict[str, Any]:
    raw = copy.deepcopy(example_raw())
    mutate(raw)
    return raw


@pytest.mark.parametrize(("mutate", "starts", "says"), [
    (lambda r: r["tenants"][1]["models"].append("llama"), "tenants[1].models[2]: llama is not served by this stack",
     "qwen3, qwen3-sql, qwen3-support, mistral, embed"),
    (lambda r: r["tenants"][1].update(apiKeySecrets=["appsApiKey"]), "tenants[1].apiKeySecrets[0]: 'appsApiKey' is already",
     "one secret config key holds one credential"),
    (lambda r: r["tenants"][0].update(apiKeySecrets=["appsApiKey", "appsApiKey"]), "tenants[0].apiKeySecrets: names one key twice",
     "rotation"),
    (lambda r: r["tenants"][1].update(name="apps"), "tenants[1].name: 'apps' is already used by tenants[0]", ""),
    (lambda r: r["cluster"].pop("gateway"), "cluster.gateway: required with `cluster.endpoint`", "Envoy Gateway"),
    (lambda r: r["cluster"].pop("network"), "cluster.network.apiServerCidrs: required with `cluster.endpoint`",
     "kubectl get endpoints kubernetes"),
    (lambda r: r.pop("tenants"), "tenants: cluster.endpoint is set but no team is", ""),
    (lambda r: r["cluster"].pop("endpoint"), "tenants: needs cluster.endpoint", ""),
    (lambda r: r["models"][1].update(apiKeySecret="mistralKey"), "models[1].apiKeySecret: not for a model on the endpoint",
     "tenants[].apiKeySecrets"),
    (lambda r: r["models"][1].update(ingress={"host": "mistral.example.com"}), "models[1].ingress: not for a model on the endpoint",
     "endpoint: false"),
    (lambda r: r["models"][1].update(endpoint=False), "tenants[0].models[1]: mistral is not on the endpoint", ""),
    (lambda r: (r["cluster"].update(requestHold={}), r["models"][2].update(replicas={"min": 0, "max": 1})),
     "models[2].apiKeySecret: required for a model at replicas.min 0 on the endpoint", "every pod can reach"),
    (lambda r: r["cluster"]["network"].update(clientNamespaces=["apps"]), "cluster.network.clientNamespaces: not with cluster.endpoint",
     "without a team's key"),
    (lambda r: r["cluster"]["endpoint"].update(domain="ai"), "cluster.endpoint.domain", "a DNS domain with a dot"),
])
def test_endpoint_mistakes_are_refused_in_one_line_naming_the_key(mutate: Any, starts: str, says: str) -> None:
    message = error_of(changed(mutate))
    assert message.startswith(starts), message
    assert says in message and "\n" not in message, message


def test_an_endpoint_model_without_the_endpoint_is_refused() -> None:
    def mutate(raw: dict[str, Any]) -> None:
        raw["cluster"].pop("endpoint")
        raw.pop("tenants")
        raw["models"][0]["endpoint"] = True
    assert error_of(changed(mutate)).startswith("models[0].endpoint: true needs cluster.endpoint")


def test_a_model_no_team_may_call_is_warned() -> None:
    stack = parse(changed(lambda r: r["tenants"][1].update(models=["qwen3-sql"])))
    assert any(w.startswith("models[2].endpoint: embed is on the endpoint but no tenant may call it") for w in stack.warnings())
    assert not [w for w in parse(example_raw()).warnings() if "endpoint" in w]


def test_one_key_value_for_two_teams_is_refused_without_saying_it() -> None:
    from stacks.config.checks.secret_keys import check_secret_values
    stack = parse(example_raw())
    value = "a3f1c9e2b7d84f0aa1b2c3d4e5f60718"
    with pytest.raises(ConfigError) as caught:
        check_secret_values(stack, lambda key: value if key.endswith("ApiKey") else f"distinct-{key}")
    assert "dataApiKey" in str(caught.value) and "appsApiKey" in str(caught.value) and value not in str(caught.value)


def test_every_model_has_a_pool_whose_picker_exists(example: Render) -> None:
    pools, services, deployments = objects(example, "InferencePool"), objects(example, "Service"), objects(example, "Deployment")
    assert set(pools) == {"vllm-qwen3", "vllm-mistral", "vllm-embed"}
    for name, pool in pools.items():
        checkers.validate(pool)
        spec = pool["spec"]
        assert spec["selector"]["matchLabels"] == deployments[name]["spec"]["selector"]["matchLabels"]
        assert spec["targetPorts"] == [{"number": 8000}]
        picker = spec["endpointPickerRef"]
        assert picker["failureMode"] == "FailClose" and picker["port"] == {"number": 9002}
        assert picker["name"] in services and picker["name"] in deployments
        assert services[picker["name"]]["spec"]["selector"] == deployments[picker["name"]]["spec"]["selector"]["matchLabels"]
        args = deployments[picker["name"]]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--pool-name") + 1] == name and args[args.index("--pool-namespace") + 1] == "ai"


def test_the_picker_reads_only_what_it_watches(example: Render) -> None:
    roles, bindings = objects(example, "Role"), objects(example, "RoleBinding")
    assert set(roles) == {"vllm-qwen3-epp", "vllm-mistral-epp", "vllm-embed-epp"}
    for name, role in roles.items():
        assert {v for rule in role["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}
        assert {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]} == {
            ("", "pods"), ("inference.networking.k8s.io", "inferencepools"),
            ("inference.networking.x-k8s.io", "inferenceobjectives"), ("inference.networking.x-k8s.io", "inferencemodelrewrites")}
        assert bindings[name]["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "ai"}]
        assert bindings[name]["roleRef"]["name"] == name
    assert not objects(example, "ClusterRole") and not objects(example, "ClusterRoleBinding")


def test_each_team_reaches_only_its_models_on_its_own_host(example: Render) -> None:
    routes = objects(example, "AIGatewayRoute")
    assert set(routes) == {"gs-apps", "gs-data"}
    for route in routes.values():
        checkers.validate(route)

    def reach(route: dict[str, Any]) -> dict[str, str]:
        return {rule["matches"][0]["headers"][0]["value"]: rule["backendRefs"][0]["name"] for rule in route["spec"]["rules"]}

    # A model's name grants its adapters (served by the base model's pods); an adapter's name grants that adapter only.
    assert reach(routes["gs-apps"]) == {"qwen3": "vllm-qwen3", "qwen3-sql": "vllm-qwen3", "qwen3-support": "vllm-qwen3",
                                        "mistral": "vllm-mistral"}
    assert reach(routes["gs-data"]) == {"qwen3-sql": "vllm-qwen3", "embed": "vllm-embed"}
    assert routes["gs-apps"]["spec"]["hostnames"] == ["apps.ai.example.com"]
    assert {ref["kind"] for route in routes.values() for rule in route["spec"]["rules"] for ref in rule["backendRefs"]} == {"InferencePool"}
    assert example.outputs["endpoint"] == {"apps": "https://apps.ai.example.com/v1", "data": "https://data.ai.example.com/v1"}


def test_each_teams_route_admits_only_its_own_keys(example: Render) -> None:
    policies = objects(example, "SecurityPolicy")
    assert set(policies) == {"gs-apps", "gs-data"}
    for name, policy in policies.items():
        checkers.validate(policy)
        assert policy["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": name}]
        auth = policy["spec"]["apiKeyAuth"]
        assert [ref["name"] for ref in auth["credentialRefs"]] == [f"gs-tenant-{name[3:]}"]
        assert auth["sanitize"] is True and auth["forwardClientIDHeader"] == "x-gs-tenant"
    traffic = objects(example, "BackendTrafficPolicy")
    assert set(traffic) == {"gs-apps", "gs-data"}
    for policy in traffic.values():
        checkers.validate(policy)
    assert traffic["gs-apps"]["spec"]["rateLimit"]["local"]["rules"] == [{"limit": {"requests": 600, "unit": "Minute"}}]
    assert "rateLimit" not in traffic["gs-data"]["spec"]


def test_the_gateways_own_refusals_are_openai_errors(example: Render) -> None:
    """What Envoy answers itself (no key, no route for the model, the rate limit) reaches an OpenAI client as the error
    object it parses; a model server's own answers are left alone."""
    for name, policy in objects(example, "BackendTrafficPolicy").items():
        overrides = {o["match"]["statusCodes"][0]["value"]: o for o in policy["spec"]["responseOverride"]}
        assert set(overrides) == {401, 404, 429}, name
        for status, override in overrides.items():
            assert override["source"] == "Local"
            assert override["response"]["contentType"] == "application/json"
            error = json.loads(override["response"]["body"]["inline"])["error"]
            assert error["code"] == {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}[status]
            assert error["message"] and "type" in error and "param" in error


def secret_data(out: Render) -> dict[str, dict[str, str]]:
    """Each Secret's data as declared (a Pulumi secret arrives wrapped: its value under `value`)."""
    found = {}
    for resource in out.kubernetes_resources():
        if resource.type.endswith(":Secret"):
            data = resource.inputs["stringData"]
            found[resource.inputs["metadata"]["name"]] = data.get("value", data)
    return found


def team_secrets(out: Render) -> dict[str, dict[str, str]]:
    return {name: data for name, data in secret_data(out).items() if name.startswith("gs-tenant-")}


def test_keys_are_in_the_teams_secrets_only_and_a_rotation_touches_nothing_else() -> None:
    keys = {"appsApiKey": "k-apps-3b9e1d7c55a04f21", "dataApiKey": "k-data-8c2f6a0e19d347b5"}
    first = render(secret_values=keys)
    secrets = team_secrets(first)
    assert secrets["gs-tenant-apps"] == {"apps": keys["appsApiKey"]}
    text = json.dumps([o for o in first.kubernetes_objects() if o["kind"] != "Secret"])
    assert keys["appsApiKey"] not in text and keys["dataApiKey"] not in text

    rotating = example_raw()
    rotating["tenants"][0]["apiKeySecrets"] = ["appsApiKey", "appsApiKeyNext"]
    second = render(rotating, secret_values={**keys, "appsApiKeyNext": "k-apps-new-0d4e2b9a7f61"})
    assert team_secrets(second)["gs-tenant-apps"] == {"apps": keys["appsApiKey"], "apps.2": "k-apps-new-0d4e2b9a7f61"}
    # Nothing that runs a pod changes: no model or picker restarts for a key.
    for kind in ("Deployment", "Job", "InferencePool", "SecurityPolicy", "AIGatewayRoute"):
        assert objects(first, kind) == objects(second, kind), kind


def test_model_pods_admit_only_the_gateway_their_picker_prometheus_and_their_smoke_test(example: Render) -> None:
    policies = objects(example, "NetworkPolicy")
    peers = policies["vllm-mistral"]["spec"]["ingress"][0]["from"]
    namespaces = [p.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") for p in peers]
    assert namespaces == ["envoy-gateway-system", None, "monitoring", "ai"]
    assert peers[0]["podSelector"]["matchLabels"] == {"gateway.envoyproxy.io/owning-gateway-name": "ai-gateway",
                                                      "gateway.envoyproxy.io/owning-gateway-namespace": "envoy-gateway-system"}
    assert peers[1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "endpoint-picker"
    picker = policies["vllm-mistral-epp"]["spec"]
    assert picker["policyTypes"] == ["Ingress", "Egress"]
    assert [rule["ports"][0]["port"] for rule in picker["ingress"]] == [9002, 9090]
    assert {"ipBlock": {"cidr": "10.0.0.1/32"}} in picker["egress"][2]["to"]
    env = objects(example, "Deployment")["vllm-mistral"]["spec"]["template"]["spec"]["containers"][0].get("env", [])
    assert "VLLM_API_KEY" not in {e["name"] for e in env}


def test_a_stack_without_the_endpoint_declares_none_of_it() -> None:
    prod = run_program("prod")
    kinds = {o["kind"] for o in prod.kubernetes_objects()}
    assert not kinds & {"InferencePool", "AIGatewayRoute", "SecurityPolicy", "BackendTrafficPolicy", "Role"}
    assert "endpoint" not in prod.outputs


HELD_KEY = "k-embed-5e0c7a19b2d84f63"


@pytest.fixture(scope="module")
def held() -> Render:
    """The example with embed at `replicas.min: 0` (its requests held by KEDA's HTTP add-on) and its own key."""
    raw = example_raw()
    raw["cluster"]["requestHold"] = {}
    raw["models"][2].update(replicas={"min": 0, "max": 1}, apiKeySecret="embedApiKey")
    return render(raw, secret_values={"embedApiKey": HELD_KEY})


def test_a_held_model_is_reached_through_its_hold_with_its_own_key(held: Render) -> None:
    """The teams' rules send embed to the interceptor, under a Host its InterceptorRoute routes by, with embed's own key
    set by the gateway; embed has no pool or picker (nothing to pick at zero) and admits the interceptor alone."""
    (rule,) = [r for r in objects(held, "AIGatewayRoute")["gs-data"]["spec"]["rules"]
               if r["matches"][0]["headers"][0]["value"] == "embed"]
    assert rule["backendRefs"] == [{"name": "vllm-embed-hold"}]
    service_backend = objects(held, "AIServiceBackend")["vllm-embed-hold"]
    assert service_backend["spec"]["backendRef"] == {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": "vllm-embed-hold"}
    (endpoint,) = objects(held, "Backend")["vllm-embed-hold"]["spec"]["endpoints"]
    route = objects(held, "InterceptorRoute")["vllm-embed-hold"]["spec"]
    assert endpoint["fqdn"]["hostname"] in route["rules"][0]["hosts"] and endpoint["fqdn"]["port"] == 8080
    assert route["target"] == {"service": "vllm-embed", "port": 8000}
    policy = objects(held, "BackendSecurityPolicy")["vllm-embed-hold"]["spec"]
    assert policy["targetRefs"] == [{"group": "aigateway.envoyproxy.io", "kind": "AIServiceBackend", "name": "vllm-embed-hold"}]
    # The key the gateway presents is the one vLLM checks.
    secrets = secret_data(held)
    presented = secrets[policy["apiKey"]["secretRef"]["name"]]["apiKey"]
    container = objects(held, "Deployment")["vllm-embed"]["spec"]["template"]["spec"]["containers"][0]
    (checked,) = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "VLLM_API_KEY"]
    assert presented == secrets[checked["name"]][checked["key"]] == HELD_KEY
    for kind in ("AIServiceBackend", "Backend", "BackendSecurityPolicy", "InterceptorRoute", "AIGatewayRoute"):
        for obj in objects(held, kind).values():
            checkers.validate(obj)
    assert "vllm-embed" not in objects(held, "InferencePool") and "vllm-embed-epp" not in objects(held, "Deployment")
    peers = objects(held, "NetworkPolicy")["vllm-embed"]["spec"]["ingress"][0]["from"]
    assert peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "interceptor"
    assert not any("gateway.envoyproxy.io/owning-gateway-name" in p["podSelector"]["matchLabels"] for p in peers)
    # The other models keep their pools.
    assert set(objects(held, "InferencePool")) == {"vllm-qwen3", "vllm-mistral"}


def test_a_held_models_key_is_never_in_the_plain_objects(held: Render) -> None:
    text = json.dumps([o for o in held.kubernetes_objects() if o["kind"] != "Secret"])
    assert HELD_KEY not in text
