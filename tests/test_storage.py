"""ModelStorage: PV and claim for node-local, NFS and storage-class storage; nothing lost on delete."""

from __future__ import annotations

from tools.render import Render

PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"


def test_local_pv_is_pinned_retained_and_sized_from_the_partition(prod: Render) -> None:
    (pv,) = prod.of_type(PV)
    spec = pv.inputs["spec"]
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"
    assert spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["local"] == {"path": "/mnt/ollama-models"}
    assert spec["capacity"] == {"storage": "912Gi"}
    expression = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expression == {"key": "kubernetes.io/hostname", "operator": "In", "values": ["k8s-worker-02"]}
    assert spec["claimRef"] == {"namespace": "ai", "name": "models"}
    assert "storageClassName" not in spec


def test_claim_binds_the_pv_by_name(prod: Render) -> None:
    (claim,) = prod.of_type(PVC)
    spec = claim.inputs["spec"]
    assert claim.inputs["metadata"] == {"name": "models", "namespace": "ai", "labels": claim.inputs["metadata"]["labels"],
                                        "annotations": {"pulumi.com/patchForce": "true"}}
    assert spec["volumeName"] == "ai-models"
    assert spec["storageClassName"] == ""
    # A floor the PV always has, not the volume's size: see test_growing_leaves_the_static_claim_alone.
    assert spec["resources"]["requests"] == {"storage": "1Gi"}


def test_volume_and_claim_survive_pulumi_destroy(prod: Render) -> None:
    for resource in prod.of_type(PV) + prod.of_type(PVC) + prod.of_type("kubernetes:core/v1:Namespace"):
        assert resource.options.get("retainOnDelete") is True, resource.urn


def test_claim_waits_for_the_volume(prod: Render) -> None:
    (pv,), (claim,) = prod.of_type(PV), prod.of_type(PVC)
    assert pv.urn in claim.options["dependsOn"]


def test_capacity_follows_the_partition_size(render) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from tools.render import ROOT

    nodes = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:nodes"]
    nodes[0]["storage"]["sizeGb"] = 2000
    (pv,) = render(nodes=nodes).of_type(PV)
    assert pv.inputs["spec"]["capacity"] == {"storage": "1825Gi"}


def test_growing_leaves_the_static_claim_alone(render) -> None:  # type: ignore[no-untyped-def]
    """kube-apiserver refuses to resize a claim no StorageClass provisioned ("only dynamically
    provisioned pvc can be resized"), so raising sizeGb must change the PV's capacity and leave the
    claim's spec as it is: `pulumi up` after a grow would otherwise fail on the claim."""
    import yaml

    from tools.render import ROOT

    nodes = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:nodes"]
    before = render(nodes=nodes)
    nodes[0]["storage"]["sizeGb"] = 1200
    after = render(nodes=nodes)
    (pv_before,), (pv_after,) = before.of_type(PV), after.of_type(PV)
    assert pv_before.inputs["spec"]["capacity"] != pv_after.inputs["spec"]["capacity"]
    (claim_before,), (claim_after,) = before.of_type(PVC), after.of_type(PVC)
    assert claim_before.inputs == claim_after.inputs
    # Claims made by earlier releases asked for the whole capacity: the engine must never send them a new request.
    assert claim_after.options["ignoreChanges"] == ["spec.resources"]


def test_nfs_storage_is_read_write_many(render) -> None:  # type: ignore[no-untyped-def]
    result = render(modelStorage={"type": "nfs", "server": "nas.lan", "path": "/export/models", "sizeGi": 500})
    (pv,), (claim,) = result.of_type(PV), result.of_type(PVC)
    assert pv.inputs["spec"]["nfs"] == {"server": "nas.lan", "path": "/export/models"}
    assert pv.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv.inputs["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert "nodeAffinity" not in pv.inputs["spec"]
    assert claim.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim.inputs["spec"]["resources"]["requests"] == {"storage": "1Gi"}
    assert pv.inputs["spec"]["capacity"] == {"storage": "500Gi"}


def test_storage_class_needs_no_static_volume(render) -> None:  # type: ignore[no-untyped-def]
    result = render(modelStorage={"type": "storageClass", "storageClass": "nfs", "sizeGi": 200})
    assert result.of_type(PV) == []
    (claim,) = result.of_type(PVC)
    assert claim.inputs["spec"]["storageClassName"] == "nfs"
    # The class provisions (and, when it allows expansion, grows) the volume the claim asks for.
    assert claim.inputs["spec"]["resources"]["requests"] == {"storage": "200Gi"}
    assert not claim.options.get("ignoreChanges")
    assert claim.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "volumeName" not in claim.inputs["spec"]
    assert claim.options.get("retainOnDelete") is True
