"""Issue 15 item 5: node labels that do not fight GPU Feature Discovery."""

from __future__ import annotations

from typing import Any

import pytest

from policy.rules import check_resources
from tests.test_serving import DEPLOYMENT, error_of, one, prod_model, prod_raw, with_models
from tools.render import Render

NODE_PATCH = "kubernetes:core/v1:NodePatch"


def gfd_cluster(**extra: Any) -> dict[str, Any]:
    return prod_raw()["cluster"] | {"gpuFeatureDiscovery": True, **extra}


def test_the_stack_never_sets_labels_gfd_owns(prod: Render) -> None:
    (patch,) = prod.of_type(NODE_PATCH)
    labels = patch.inputs["metadata"]["labels"]
    assert not {"nvidia.com/gpu.product", "nvidia.com/gpu.count"} & set(labels)
    assert labels["gpu-serving/gpu.product"] == "nvidia-a100" and labels["gpu-serving/gpu.count"] == "2"


def test_with_gfd_the_stack_leaves_gpu_present_to_it_and_models_may_select_gfd_values(render) -> None:  # type: ignore[no-untyped-def]
    result = render(cluster=gfd_cluster(), models=[prod_model(gfdProduct="NVIDIA-A100-SXM4-80GB")])
    (patch,) = result.of_type(NODE_PATCH)
    assert not any(k.startswith("nvidia.com/") for k in patch.inputs["metadata"]["labels"])
    assert one(result, DEPLOYMENT)["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in result.resources if r.custom]
    assert not [v for v in check_resources(entries) if v.level == "mandatory"]


def test_without_gfd_product_a_model_selects_the_stack_label(render) -> None:  # type: ignore[no-untyped-def]
    result = render(cluster=gfd_cluster())
    assert one(result, DEPLOYMENT)["spec"]["template"]["spec"]["nodeSelector"] == {"gpu-serving/gpu.product": "nvidia-a100"}


@pytest.mark.parametrize(
    ("raw", "starts"),
    [
        (with_models(prod_model(), cluster=prod_raw()["cluster"] | {"gpuProductLabel": "nvidia.com/gpu.product"}),
         "cluster.gpuProductLabel: nvidia.com/gpu.product belongs to NVIDIA's GPU Feature Discovery"),
        (with_models(prod_model(gfdProduct="NVIDIA-A100-SXM4-80GB")),
         "models[0].gfdProduct: selects on GPU Feature Discovery's label, but cluster.gpuFeatureDiscovery is false"),
    ],
)
def test_label_choices_that_would_flap_or_match_nothing_are_refused(raw: dict[str, Any], starts: str) -> None:
    message = error_of(raw)
    assert message.startswith(starts), message


def test_capacity_rule_reads_the_stack_labels(render) -> None:  # type: ignore[no-untyped-def]
    result = render(models=[prod_model(replicas={"min": 1, "max": 2})])
    entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in result.resources if r.custom]
    assert not [v for v in check_resources(entries) if v.policy == "gpu-capacity"]
    # A hand edit asking for more than the labelled node has is caught through the stack's own labels.
    for entry in entries:
        if entry["type"].endswith(":ScaledObject"):
            entry["inputs"] = {**entry["inputs"], "spec": {**entry["inputs"]["spec"], "maxReplicaCount": 3}}
    assert [v for v in check_resources(entries) if v.policy == "gpu-capacity"]
