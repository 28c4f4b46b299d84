"""ModelStorage: the PersistentVolume and claim that hold model files for every vLLM pod."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from stacks.config import ClassStorage, LocalStorage, NfsStorage, NodeCacheStorage

LABELS = {"app.kubernetes.io/part-of": "gpu-serving", "app.kubernetes.io/component": "model-storage"}

Storage = LocalStorage | NfsStorage | ClassStorage | NodeCacheStorage

CACHE_READY = "ready"


def cache_label(namespace: str) -> str:
    """The node label (value `ready`) of a node whose array a stack's node-cache volume may use: set on each cache
    node once its array is mounted. The volume selects nodes by it, not by a list of hostnames, because a
    PersistentVolume's node affinity cannot change after creation: adding or removing a node never touches it."""
    return f"cache.gpu-serving.io/{namespace}"


@dataclass(frozen=True)
class ModelStorageArgs:
    storage: Storage
    namespace: str
    capacity_gib: int
    """Derived from the partition for local storage (`stacks.config.usable_gib`), never typed by hand."""
    mountpoint: str | None = None
    """The nodes' RAID mountpoint; required for local storage and the node cache."""
    ready: list[pulumi.Resource] = field(default_factory=list)
    """Resources that must exist first, e.g. the node step that mounts the array."""
    namespace_ref: pulumi.Input[str] | None = None
    """The namespace as ClusterBase.namespace (the Namespace resource's output): the claim is created
    after the Namespace, and the volume waits on nothing else of the cluster (e.g. monitoring objects)."""
    annotations: dict[str, str] | None = None
    """Metadata annotations of the volume and the claim (components.cluster.applied_annotations)."""


def access_mode(storage: Storage) -> str:
    # A node cache is one `local` volume on every cache node: each pod mounts its own node's directory.
    return "ReadWriteOnce" if storage.type in ("local", "nodeCache") else "ReadWriteMany"


def pv_name(namespace: str, name: str) -> str:
    # PersistentVolumes are cluster-scoped: prefix the namespace so two stacks never collide.
    return f"{namespace}-{name}"


def persistent_volume_spec(args: ModelStorageArgs) -> k8s.core.v1.PersistentVolumeSpecArgs | None:
    """The static PV for local and NFS storage; None when a storage class provisions it."""
    storage = args.storage
    common = dict(
        capacity={"storage": f"{args.capacity_gib}Gi"},
        access_modes=[access_mode(storage)],
        # Retain: deleting the claim (or the stack) leaves the volume, and so the model files.
        persistent_volume_reclaim_policy="Retain",
        # No class (not ""): the same to the binder, and what the API server and the provider write back.
        claim_ref=k8s.core.v1.ObjectReferenceArgs(namespace=args.namespace, name=storage.name),
        volume_mode="Filesystem",
    )
    if storage.type in ("local", "nodeCache"):
        if not args.mountpoint:
            raise ValueError("node-local model storage needs the nodes' mountpoint")
        # One node by hostname, or every node carrying the stack's cache label.
        key, value = ("kubernetes.io/hostname", storage.node) if storage.type == "local" else (cache_label(args.namespace), CACHE_READY)
        return k8s.core.v1.PersistentVolumeSpecArgs(
            **common,
            local=k8s.core.v1.LocalVolumeSourceArgs(path=args.mountpoint),
            node_affinity=k8s.core.v1.VolumeNodeAffinityArgs(
                required=k8s.core.v1.NodeSelectorArgs(
                    node_selector_terms=[
                        k8s.core.v1.NodeSelectorTermArgs(
                            match_expressions=[k8s.core.v1.NodeSelectorRequirementArgs(key=key, operator="In", values=[value])]
                        )
                    ]
                )
            ),
        )
    if storage.type == "nfs":
        return k8s.core.v1.PersistentVolumeSpecArgs(
            **common,
            nfs=k8s.core.v1.NFSVolumeSourceArgs(server=storage.server, path=storage.path),
            mount_options=["nfsvers=4.1", "hard", "noatime"],
        )
    return None


STATIC_CLAIM_REQUEST = "1Gi"
"""What a claim bound by name to the stack's own PV asks for: a floor, never the disk's size.

kube-apiserver refuses to raise the request of a claim no StorageClass provisioned
(PersistentVolumeClaimResize admission: "only dynamically provisioned pvc can be resized") and to
lower it below the claim's status.capacity, so a request that followed `sizeGb` broke `pulumi up`
after every grow. The request only has to fit the volume for the binder; the pods see the whole
filesystem, and the PV's capacity (what `kubectl get pvc` shows once bound) follows the partition."""


def claim_request(args: ModelStorageArgs) -> str:
    # A class-provisioned claim is the volume's size: the class grows it, when it allows expansion.
    return STATIC_CLAIM_REQUEST if is_static(args.storage) else f"{args.capacity_gib}Gi"


def is_static(storage: Storage) -> bool:
    return storage.type != "storageClass"


def claim_spec(args: ModelStorageArgs) -> k8s.core.v1.PersistentVolumeClaimSpecArgs:
    storage = args.storage
    static = is_static(storage)
    return k8s.core.v1.PersistentVolumeClaimSpecArgs(
        access_modes=[access_mode(storage)],
        resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": claim_request(args)}),
        # A static PV is bound by name ("" = no dynamic provisioning); otherwise the class provisions one.
        storage_class_name="" if static else storage.storage_class,
        volume_name=pv_name(args.namespace, storage.name) if static else None,
        volume_mode="Filesystem",
    )


class ModelStorage(pulumi.ComponentResource):
    """A volume for model files that outlives the stack: reclaim policy Retain, and the PV
    and claim are retained on delete, so `pulumi destroy` never removes model files."""

    claim_name: pulumi.Output[str]
    """Name of the PersistentVolumeClaim that model pods mount."""
    volume_name: pulumi.Output[str]
    """Name of the PersistentVolume (empty when a storage class provisions it)."""
    capacity: pulumi.Output[str]
    """Declared capacity, e.g. `912Gi`."""
    access_mode: pulumi.Output[str]

    def __init__(self, name: str, args: ModelStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-serving:storage:ModelStorage", name, None, opts)
        storage = args.storage
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=True)

        spec = persistent_volume_spec(args)
        volume = None
        if spec is not None:
            volume = k8s.core.v1.PersistentVolume(
                f"{name}-pv",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=pv_name(args.namespace, storage.name), labels=LABELS, annotations=args.annotations
                ),
                spec=spec,
                opts=pulumi.ResourceOptions.merge(keep, pulumi.ResourceOptions(depends_on=args.ready)),
            )
        static = is_static(storage)
        claim = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-pvc",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=storage.name,
                namespace=args.namespace_ref if args.namespace_ref is not None else args.namespace,
                labels=LABELS,
                annotations=args.annotations,
            ),
            spec=claim_spec(args),
            opts=pulumi.ResourceOptions.merge(
                keep,
                pulumi.ResourceOptions(
                    depends_on=[volume] if volume else args.ready,
                    # A claim waits for its first consumer on many classes; don't block `pulumi up` on it.
                    custom_timeouts=pulumi.CustomTimeouts(create="15m"),
                    # Claims made by earlier releases asked for the PV's whole capacity: sending them
                    # the floor now would be a shrink below status.capacity, which the API server refuses too.
                    ignore_changes=["spec.resources"] if static else None,
                ),
            ),
        )

        self.claim_name = claim.metadata.apply(lambda m: m.name)
        self.volume_name = pulumi.Output.from_input(pv_name(args.namespace, storage.name) if volume else "")
        self.capacity = pulumi.Output.from_input(f"{args.capacity_gib}Gi")
        self.access_mode = pulumi.Output.from_input(access_mode(storage))
        self.register_outputs(
            {
                "claimName": self.claim_name,
                "volumeName": self.volume_name,
                "capacity": self.capacity,
                "accessMode": self.access_mode,
            }
        )
