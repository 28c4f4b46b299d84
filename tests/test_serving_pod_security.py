"""Issue 24 item 3: the models' namespace carries Pod Security levels, serving pods are Guaranteed
QoS and run above batch work through a rendered, configurable PriorityClass."""

from __future__ import annotations

from typing import Any

from components.serving.sizing import memory_limit, shm_size_gi
from tests.test_serving import DEPLOYMENT, JOB, container, error_of, one, prod_model, prod_raw, with_models
from tools.render import Render

NAMESPACE = "kubernetes:core/v1:Namespace"
PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"


def cluster_with(**changes: Any) -> dict[str, Any]:
    return prod_raw()["cluster"] | changes


def test_namespace_enforces_baseline_and_warns_restricted(prod: Render) -> None:
    labels = one(prod, NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"


def test_enforcing_restricted_needs_every_model_non_root(render) -> None:  # type: ignore[no-untyped-def]
    raw = with_models(prod_model(), cluster=cluster_with(podSecurity={"enforce": "restricted"}))
    assert error_of(raw).startswith("models[0].securityProfile: root, but cluster.podSecurity.enforce is restricted")
    result = render(cluster=cluster_with(podSecurity={"enforce": "restricted"}), models=[prod_model(securityProfile="nonRoot")])
    assert one(result, NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_serving_pods_are_guaranteed_qos(prod: Render) -> None:
    resources = container(one(prod, DEPLOYMENT))["resources"]
    model = prod.config.models[0]
    memory = memory_limit(model.memory, shm_size_gi(model.gpus_per_replica))
    assert resources["requests"] == {"cpu": model.cpu, "memory": memory}
    assert resources["limits"] == {"nvidia.com/gpu": "1", "cpu": model.cpu, "memory": memory}


def test_serving_pods_run_above_batch_work(prod: Render) -> None:
    (priority,) = prod.of_type(PRIORITY_CLASS)
    assert priority.inputs["metadata"]["name"] == "gpu-serving"
    assert priority.inputs["value"] > 0 and not priority.inputs.get("globalDefault")
    assert priority.options.get("retainOnDelete") is True  # cluster-scoped, perhaps shared
    assert one(prod, DEPLOYMENT)["spec"]["template"]["spec"]["priorityClassName"] == "gpu-serving"
    # the Jobs keep the default priority: they are the batch work
    assert all("priorityClassName" not in j.inputs["spec"]["template"]["spec"] for j in prod.of_type(JOB))


def test_priority_class_is_configurable(render) -> None:  # type: ignore[no-untyped-def]
    result = render(cluster=cluster_with(priorityClass={"name": "inference", "value": 5000}))
    (priority,) = result.of_type(PRIORITY_CLASS)
    assert (priority.inputs["metadata"]["name"], priority.inputs["value"]) == ("inference", 5000)
    existing = render(cluster=cluster_with(priorityClass={"name": "high", "create": False}))
    assert existing.of_type(PRIORITY_CLASS) == []
    assert one(existing, DEPLOYMENT)["spec"]["template"]["spec"]["priorityClassName"] == "high"
    off = render(cluster=cluster_with(priorityClass=None))
    assert off.of_type(PRIORITY_CLASS) == [] and "priorityClassName" not in one(off, DEPLOYMENT)["spec"]["template"]["spec"]


def test_the_deployment_waits_for_its_priority_class(prod: Render) -> None:
    # Admission refuses a pod whose priorityClassName does not exist yet.
    (priority,) = prod.of_type(PRIORITY_CLASS)
    (deployment,) = prod.of_type(DEPLOYMENT)
    assert priority.urn in deployment.options["dependsOn"]
