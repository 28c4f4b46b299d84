"""Scale to zero with the requests held (issue 26 item 2): the pack allows zero replicas of a vLLM workload exactly
when KEDA's HTTP add-on holds its requests, and refuses the holds and edges that would drop them. One mutation of
the held model (data/good/vllm-held.yaml, as the program rendered it for the add-on's v0.12 HTTPScaledObject) per
refusal, over plain YAML as over a preview; the InterceptorRoute form the program renders now (v0.14+) is derived from
it (`to_route`) and judged the same way."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_factory import DATA, check, container, policies

from policy.check_yaml import main

HELD = DATA / "good" / "vllm-held.yaml"
Objects = list[dict[str, Any]]


def held() -> Objects:
    return [d for d in yaml.safe_load_all(HELD.read_text()) if d]


def of(objects: Objects, kind: str, name: str | None = None) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name))


def hold(objects: Objects) -> dict[str, Any]:
    return of(objects, "HTTPScaledObject")


def to_route(objects: Objects) -> Objects:
    """The same model held through an InterceptorRoute of the same name, as components/serving/hold.py renders it:
    target and rules instead of scaleTargetRef, hosts and pathPrefixes; `readiness` for `conditionWait`; no replicas
    or annotation (the add-on makes no ScaledObject for a route); the trigger names the route."""
    objects = copy.deepcopy(objects)
    old = hold(objects)
    spec = old["spec"]
    route = {"apiVersion": "http.keda.sh/v1beta1", "kind": "InterceptorRoute",
             "metadata": {k: v for k, v in old["metadata"].items() if k != "annotations"},
             "spec": {"target": {"service": spec["scaleTargetRef"]["service"], "port": spec["scaleTargetRef"]["port"]},
                      "rules": [{"hosts": spec["hosts"], "paths": [{"value": p} for p in spec["pathPrefixes"]]}],
                      "scalingMetric": spec["scalingMetric"],
                      "timeouts": {"readiness": spec["timeouts"]["conditionWait"], "responseHeader": spec["timeouts"]["responseHeader"]}}}
    objects[objects.index(old)] = route
    for trigger in scaled_object(objects)["spec"]["triggers"]:
        if trigger["type"] == "external-push":
            trigger["metadata"]["interceptorRoute"] = trigger["metadata"].pop("httpScaledObject")
    return objects


def route(objects: Objects) -> dict[str, Any]:
    return of(objects, "InterceptorRoute")


def scaled_object(objects: Objects) -> dict[str, Any]:
    return of(objects, "ScaledObject")


def ingress(objects: Objects) -> dict[str, Any]:
    return of(objects, "Ingress")


def mandatory(objects: Objects) -> set[str]:
    return {v.policy for v in check(*objects) if v.level == "mandatory"}


def messages(objects: Objects, policy: str) -> str:
    return " | ".join(v.message for v in check(*objects) if v.policy == policy)


def test_the_rendered_held_model_passes_as_plain_yaml(tmp_path: Path) -> None:
    assert main([str(HELD)]) == 0
    # Plain YAML without the nodes: their GPUs go uncounted, which the pack says (advisory), and nothing else.
    assert [(v.policy, v.level) for v in check(*held())] == [("gpu-nodes-declared", "advisory")]
    routed = tmp_path / "held-route.yaml"
    routed.write_text(yaml.safe_dump_all(to_route(held())))
    assert main([str(routed)]) == 0
    assert [(v.policy, v.level) for v in check(*to_route(held()))] == [("gpu-nodes-declared", "advisory")]


def test_mid_upgrade_both_holds_of_one_name_pass() -> None:
    """The `up` that moves a stack to the route creates it before it deletes the HTTPScaledObject: for a while both are
    there, the stack's ScaledObject already naming the route."""
    objects = to_route(held())
    objects.append(hold(held()))
    assert mandatory(objects) == set()


def test_a_route_whose_service_serves_another_port_is_refused() -> None:
    objects = to_route(held())
    route(objects)["spec"]["target"]["port"] = 8001
    objects.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "vllm-qwen3-small", "namespace": "ai"},
                    "spec": {"selector": {"app.kubernetes.io/instance": "qwen3-small"}, "ports": [{"name": "http", "port": 8000}]}})
    assert "target sends held requests to port 8001 of Service vllm-qwen3-small" in messages(objects, "vllm-hold-target")


# ---------------------------------------------------------------------------- zero replicas only with a hold


def no_wake_trigger(objects: Objects) -> None:
    scaled_object(objects)["spec"]["triggers"] = scaled_object(objects)["spec"]["triggers"][:1]


def no_hold_at_all(objects: Objects) -> None:
    no_wake_trigger(objects)
    objects.remove(hold(objects))


def wakes_another_workload(objects: Objects) -> None:
    hold(objects)["spec"]["scaleTargetRef"]["name"] = "vllm-other"


def keda_default_minimum(objects: Objects) -> None:
    no_wake_trigger(objects)
    scaled_object(objects)["spec"].pop("minReplicaCount")


ZERO = [
    ("the queue trigger alone", no_wake_trigger, "but nothing holds its requests"),
    ("no HTTPScaledObject and no trigger", no_hold_at_all, "but nothing holds its requests"),
    ("KEDA's default minimum without a hold", keda_default_minimum, "minReplicaCount is 0 (KEDA's default)"),
    ("a trigger naming the hold of another workload", wakes_another_workload,
     "its external-push trigger names HTTPScaledObject vllm-qwen3-small-hold, which holds the requests of another workload"),
]


@pytest.mark.parametrize(("mutate", "fragment"), [(m, f) for _, m, f in ZERO], ids=[c for c, _, _ in ZERO])
def test_zero_replicas_without_a_hold_are_refused(mutate: Callable[[Objects], None], fragment: str) -> None:
    objects = held()
    mutate(objects)
    assert "vllm-scale-to-zero" in mandatory(objects)
    assert fragment in messages(objects, "vllm-scale-to-zero")


def test_an_hpa_at_zero_is_refused_even_beside_a_hold() -> None:
    objects = held()
    objects.remove(scaled_object(objects))
    objects.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "h", "namespace": "ai"},
                    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-qwen3-small"},
                             "minReplicas": 0, "maxReplicas": 1,
                             "metrics": [{"type": "Pods", "pods": {"metric": {"name": "vllm_num_requests_waiting"},
                                                                   "target": {"type": "AverageValue", "averageValue": "3"}}}]}})
    assert "vllm-scale-to-zero" in mandatory(objects)


def test_a_hold_whose_add_on_makes_the_scaled_object_is_a_holder_too() -> None:
    objects = held()
    objects.remove(scaled_object(objects))
    hold(objects)["metadata"]["annotations"].pop("httpscaledobject.keda.sh/skip-scaledobject-creation")
    assert "vllm-scale-to-zero" not in mandatory(objects)


def test_a_trigger_naming_a_hold_outside_the_files_is_trusted() -> None:
    objects = held()
    objects.remove(hold(objects))
    assert "vllm-scale-to-zero" not in mandatory(objects)


def test_the_add_ons_scaled_object_and_the_stacks_fight() -> None:
    objects = held()
    hold(objects)["metadata"]["annotations"]["httpscaledobject.keda.sh/skip-scaledobject-creation"] = "false"
    assert "single-autoscaler" in mandatory(objects)
    assert "the HTTP add-on creates ScaledObject vllm-qwen3-small-hold" in messages(objects, "single-autoscaler")


def test_the_add_ons_maximum_counts_against_the_gpus() -> None:
    objects = held()
    objects.remove(scaled_object(objects))
    hold(objects)["metadata"]["annotations"].clear()
    hold(objects)["spec"]["replicas"]["max"] = 3
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {
        "gpu-serving/gpu.product": "nvidia-a100", "gpu-serving/gpu.count": "2"}}}
    assert "gpu-capacity" in mandatory([*objects, node])
    hold(objects)["spec"]["replicas"]["max"] = 2
    assert "gpu-capacity" not in mandatory([*objects, node])


# ---------------------------------------------------------------------------- the hold's own timeouts


def set_timeout(key: str, value: str | None, routed: bool = False) -> Callable[[Objects], None]:
    """Set (or, with None, drop) one timeout of the hold; `routed`: of its InterceptorRoute form."""
    def mutate(objects: Objects) -> None:
        if routed:
            objects[:] = to_route(objects)
        timeouts = (route(objects) if routed else hold(objects))["spec"]["timeouts"]
        if value is None:
            timeouts.pop(key)
        else:
            timeouts[key] = value
    return mutate


def same_name_scaled_object(objects: Objects) -> None:
    scaled_object(objects)["metadata"]["name"] = hold(objects)["metadata"]["name"]


HOLD = [
    ("conditionWait below the startup probe", set_timeout("conditionWait", "20s"),
     'timeouts.conditionWait is 20s, below the 600s the startup probe of Deployment vllm-qwen3-small allows'),
    ("conditionWait left to the interceptor", set_timeout("conditionWait", None), "timeouts.conditionWait is unset (KEDA_CONDITION_WAIT"),
    ("responseHeader left to the interceptor", set_timeout("responseHeader", None), "timeouts.responseHeader is unset (KEDA_RESPONSE"),
    ("responseHeader of the chart", set_timeout("responseHeader", "500ms"), "timeouts.responseHeader is 500ms (< 600s)"),
    ("a ScaledObject the add-on deletes", same_name_scaled_object, "the add-on deletes the ScaledObject named vllm-qwen3-small-hold"),
]


HOLD += [
    ("readiness below the startup probe", set_timeout("readiness", "20s", routed=True),
     "timeouts.readiness is 20s, below the 600s the startup probe of Deployment vllm-qwen3-small allows for a start: "
     "the first request after idling gets 504"),
    ("responseHeader of the route left to v0.14's default", set_timeout("responseHeader", None, routed=True),
     "timeouts.responseHeader is unset (KEDA_HTTP_RESPONSE_HEADER_TIMEOUT, 300s by default) (< 600s)"),
]


def test_a_route_without_readiness_waits_as_long_as_the_request() -> None:
    objects = held()
    set_timeout("readiness", None, routed=True)(objects)
    assert "vllm-request-hold" not in mandatory(objects)


@pytest.mark.parametrize(("mutate", "fragment"), [(m, f) for _, m, f in HOLD], ids=[c for c, _, _ in HOLD])
def test_a_hold_that_drops_requests_is_refused(mutate: Callable[[Objects], None], fragment: str) -> None:
    objects = held()
    assert "vllm-request-hold" not in mandatory(objects)
    mutate(objects)
    assert "vllm-request-hold" in mandatory(objects)
    assert fragment in messages(objects, "vllm-request-hold")


def test_the_hold_follows_the_startup_probe_of_a_bigger_model() -> None:
    objects = held()
    container(of(objects, "Deployment"))["startupProbe"]["failureThreshold"] = 400  # 4000 s
    assert "below the 4000s the startup probe" in messages(objects, "vllm-request-hold")


# ---------------------------------------------------------------------------- the edge in front of the hold


def read_timeout(value: str) -> Callable[[Objects], None]:
    return lambda objects: ingress(objects)["metadata"]["annotations"].update({"nginx.ingress.kubernetes.io/proxy-read-timeout": value})


def test_an_ingress_that_gives_up_before_the_hold_is_refused() -> None:
    objects = held()
    read_timeout("600")(objects)
    assert "vllm-request-hold" in mandatory(objects)
    assert "proxy-read-timeout is 600s in front of the request hold vllm-qwen3-small-hold" in messages(objects, "vllm-request-hold")
    assert "(2400s together)" in messages(objects, "vllm-request-hold")


def test_another_ingress_class_is_not_judged_by_nginx_annotations() -> None:
    objects = held()
    read_timeout("600")(objects)
    ingress(objects)["spec"]["ingressClassName"] = "traefik"
    assert "vllm-request-hold" not in mandatory(objects)


def route_to_the_interceptor(objects: Objects, timeout: str) -> None:
    edge = ingress(objects)
    objects.remove(edge)
    objects.append({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "vllm-qwen3-small", "namespace": "ai"},
        "spec": {"parentRefs": [{"name": "public", "namespace": "gateway"}], "hostnames": ["ai.primer.rs"],
                 "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/small/v1"}}],
                            "filters": [{"type": "URLRewrite", "urlRewrite": {
                                "hostname": "vllm-qwen3-small-hold.ai.svc",
                                "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1"}}}],
                            "backendRefs": [{"name": "keda-add-ons-http-interceptor-proxy", "namespace": "keda", "port": 8080}],
                            "timeouts": {"request": timeout}}]}})


@pytest.mark.parametrize("form", [held, lambda: to_route(held())], ids=["HTTPScaledObject", "InterceptorRoute"])
def test_a_route_that_gives_up_before_the_hold_is_refused(form: Callable[[], Objects]) -> None:
    objects = form()
    route_to_the_interceptor(objects, "2400s")
    assert mandatory(objects) == set()
    objects = form()
    route_to_the_interceptor(objects, "15m")
    assert "timeouts.request is 900s in front of the request hold" in messages(objects, "vllm-request-hold")


# ---------------------------------------------------------------------------- the edge rules see through the hold


def test_an_edge_through_the_hold_to_a_server_without_a_key_is_refused() -> None:
    objects = held()
    c = container(of(objects, "Deployment"))
    c["env"] = [e for e in c["env"] if e["name"] != "VLLM_API_KEY"]
    assert "edge-vllm-auth" in mandatory(objects)
    assert "exposes Deployment/vllm-qwen3-small on ai.primer.rs" in messages(objects, "edge-vllm-auth")


def test_an_edge_through_the_hold_that_forwards_everything_is_refused() -> None:
    objects = held()
    annotations = ingress(objects)["metadata"]["annotations"]
    annotations.pop("nginx.ingress.kubernetes.io/rewrite-target")
    ingress(objects)["spec"]["rules"][0]["http"]["paths"][0]["path"] = "/"
    assert "edge-vllm-openai-only" in mandatory(objects)


def test_an_edge_through_the_hold_that_buffers_is_refused() -> None:
    objects = held()
    ingress(objects)["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] = "on"
    assert "ingress-vllm-streaming" in mandatory(objects)


def test_a_host_no_hold_routes_reaches_no_vllm() -> None:
    objects = held()
    c = container(of(objects, "Deployment"))
    c["env"] = [e for e in c["env"] if e["name"] != "VLLM_API_KEY"]
    ingress(objects)["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-vhost"] = "elsewhere.example"
    assert "edge-vllm-auth" not in mandatory(objects)


def test_the_same_mutation_fails_the_yaml_checker(tmp_path: Path) -> None:
    objects = held()
    set_timeout("conditionWait", "20s")(objects)
    path = tmp_path / "held.yaml"
    path.write_text(yaml.safe_dump_all(copy.deepcopy(objects)))
    assert main([str(path)]) == 1
    assert policies(check(*objects)) >= {"vllm-request-hold"}
