"""What waits for what in the cluster: model objects after their Namespace; the model volume after
the storage node's disks, and on nothing that monitoring needs."""

from __future__ import annotations

from tools.render import Render

NAMESPACE = "kubernetes:core/v1:Namespace"
NAMESPACED = (
    "kubernetes:core/v1:PersistentVolumeClaim", "kubernetes:core/v1:Secret", "kubernetes:batch/v1:Job",
    "kubernetes:apps/v1:Deployment", "kubernetes:core/v1:Service", "kubernetes:networking.k8s.io/v1:NetworkPolicy",
    "kubernetes:networking.k8s.io/v1:Ingress", "kubernetes:autoscaling/v2:HorizontalPodAutoscaler",
)


def test_every_model_object_waits_for_the_namespace(prod: Render) -> None:
    (namespace,) = prod.of_type(NAMESPACE)
    objects = [r for kind in NAMESPACED for r in prod.of_type(kind) if r.inputs["metadata"].get("namespace") == "ai"]
    kinds = {r.type for r in objects}
    assert {"kubernetes:core/v1:Secret", "kubernetes:batch/v1:Job", "kubernetes:apps/v1:Deployment",
            "kubernetes:core/v1:PersistentVolumeClaim"} <= kinds
    late = [r.urn for r in objects if namespace.urn not in r.options.get("dependsOn", [])]
    assert late == []


def test_model_volume_does_not_wait_for_monitoring_objects(render) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from tools.render import ROOT

    # prod autoscales with KEDA; the HPA path is the one that writes the adapter's ConfigMap.
    cluster = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]
    out = render(cluster={**cluster, "autoscaling": "hpa"})
    assert out.of_type("kubernetes:core/v1:ConfigMap"), "the hpa stack should have the adapter rules ConfigMap"
    (pv,) = out.of_type("kubernetes:core/v1:PersistentVolume")
    waits = pv.options.get("dependsOn", [])
    assert waits, "the PV waits for the storage node's disk steps"
    assert all("command:remote:Command" in urn for urn in waits), waits
    (claim,) = out.of_type("kubernetes:core/v1:PersistentVolumeClaim")
    assert not [urn for urn in claim.options["dependsOn"] if "ConfigMap" in urn or urn.endswith("ClusterBase::cluster")]


def test_an_existing_namespace_is_named_as_given(render) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from tools.render import ROOT

    cluster = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]
    out = render(cluster={**cluster, "createNamespace": False})
    assert out.of_type(NAMESPACE) == []
    (deployment,) = out.of_type("kubernetes:apps/v1:Deployment")
    assert deployment.inputs["metadata"]["namespace"] == "ai"
