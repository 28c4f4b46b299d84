"""PersistentVolumes that hold models, and the claims a workload of several replicas mounts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from . import k8s
from .autoscaling import max_replicas, scalers
from .core import MANDATORY, Resource, Rule, attempt
from .k8s import as_list, as_map, dig, object_key, workloads

NODE_BOUND_SOURCES = ("hostPath", "local")


def _node_bound_source(spec: Mapping) -> str | None:
    return next((s for s in NODE_BOUND_SOURCES if s in spec), None)


def check_local_pv_affinity(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = as_map(resource.view.get("spec"))
    source = _node_bound_source(spec)
    if source is None:
        return
    terms = as_list(dig(spec, "nodeAffinity", "required", "nodeSelectorTerms"))
    # A term with no requirement matches no node; any other term places the volume (a hostname for one node, a label
    # such as cache.gpu-serving.io/<ns> In [ready] for every node holding the directory).
    if not any(as_list(as_map(t).get("matchExpressions")) or as_list(as_map(t).get("matchFields")) for t in terms):
        path = dig(spec, source, "path")
        yield (f"{source} PV ({path}) has no required nodeAffinity: the directory exists on some nodes "
               f"only, but the pod may be scheduled anywhere and then sees an empty (or missing) "
               f"directory and downloads the model again. Add spec.nodeAffinity.required with the "
               f"node's kubernetes.io/hostname or a label only the nodes holding the directory carry.")


def is_model_pv(props: Mapping) -> bool:
    """Node-bound PVs in this project only ever hold models; other PVs count
    when their name, labels, class or path say "model"."""
    spec = as_map(props.get("spec"))
    if _node_bound_source(spec):
        return True
    words = [dig(props, "metadata", "name"), spec.get("storageClassName"),
             *as_map(dig(props, "metadata", "labels")).values(),
             *(dig(spec, s, "path") for s in ("nfs", "hostPath", "local"))]
    return any(isinstance(w, str) and "model" in w.lower() for w in words)


def check_model_pv_retain(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    props = resource.view
    if not is_model_pv(props):
        return
    # Kubernetes defaults a statically created PV to Retain.
    policy = dig(props, "spec", "persistentVolumeReclaimPolicy") or "Retain"
    if policy != "Retain":
        yield (f"model PV has persistentVolumeReclaimPolicy {policy}: deleting or re-creating the "
               f"claim (a rename, a `pulumi destroy` of one model) releases the volume and the "
               f"reclaimer wipes it, or leaves it Failed for hostPath; the next start downloads "
               f"everything again. Set persistentVolumeReclaimPolicy: Retain.")


# --- ReadWriteOnce claims ---------------------------------------------------------------

def single_node_volumes(resources: Sequence[Resource]) -> set[str]:
    """PVs whose required node affinity names exactly one node: every pod using them runs there."""

    def pinned(r: Resource) -> bool:
        terms = as_list(dig(r.view, "spec", "nodeAffinity", "required", "nodeSelectorTerms"))
        expressions = [e for t in terms for e in as_list(as_map(t).get("matchExpressions"))]
        if len(terms) != 1 or len(expressions) != 1:
            return False
        expression = as_map(expressions[0])
        return (expression.get("key") == "kubernetes.io/hostname" and expression.get("operator") == "In"
                and len(as_list(expression.get("values"))) == 1)

    return {str(dig(r.view, "metadata", "name")) for r in k8s.kinds_in(resources, frozenset({k8s.PV})) if attempt(pinned, r)}


def local_volumes(resources: Sequence[Resource]) -> set[str]:
    """`local` PVs: not attachable, so nothing enforces ReadWriteOnce across nodes (no attach/detach, no
    Multi-Attach; the scheduler's VolumeRestrictions checks only in-line cloud disks and ReadWriteOncePod). Each
    pod's kubelet mounts the path on its own node: what KServe's model cache and our node cache rely on."""
    return {str(dig(r.view, "metadata", "name")) for r in k8s.kinds_in(resources, frozenset({k8s.PV}))
            if attempt(lambda pv: "local" in as_map(dig(pv.view, "spec")), r, default=False)}


def rwo_claims(resources: Sequence[Resource]) -> dict[tuple[str, str], list[str]]:
    """ReadWriteOnce claims that could be asked to attach on two nodes.

    A claim bound to a single-node PV is left out: ReadWriteOnce is per node, and that PV's
    affinity already keeps every replica on its node; so is one bound to a `local` PV, which is never
    attached (ReadWriteOncePod stays in: the scheduler enforces it per pod, whatever the volume).
    """

    def read(r: Resource) -> tuple[tuple[str, str], list[str], str]:
        modes = [str(m) for m in as_list(dig(r.view, "spec", "accessModes"))]
        return object_key(r), modes, str(dig(r.view, "spec", "volumeName") or "")

    pinned = single_node_volumes(resources) | local_volumes(resources)
    claims = {}
    for r in k8s.kinds_in(resources, frozenset({k8s.PVC})):
        found = attempt(read, r)
        if not found or "ReadWriteMany" in found[1] or not any(m.startswith("ReadWriteOnce") for m in found[1]):
            continue
        if found[2] in pinned and "ReadWriteOncePod" not in found[1]:
            continue
        claims[found[0]] = found[1]
    return claims


def check_rwo_claims(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    claims = rwo_claims(resources)
    all_scalers = scalers(resources)
    for w in workloads(resources):
        if w.resource.type != k8s.DEPLOYMENT:
            continue
        replicas = attempt(max_replicas, w, all_scalers, default=1)
        if replicas <= 1:
            continue
        for volume in k8s.volumes(w.spec).values():
            claim = dig(volume, "persistentVolumeClaim", "claimName")
            modes = claims.get((w.namespace, str(claim)))
            if modes:
                yield w.resource, (
                    f"mounts claim {claim} ({', '.join(modes)}) but may run {replicas} replicas: the "
                    f"second pod lands on another node and hangs in ContainerCreating with "
                    f"'Multi-Attach error'. Use a ReadWriteMany claim (NFS) shared by all replicas, a "
                    f"StatefulSet with volumeClaimTemplates, or a single replica.")


RULES = [
    Rule("local-pv-node-affinity",
         "hostPath/local PersistentVolumes are placed by required nodeAffinity: their node's hostname, or a label the "
         "nodes holding the directory carry.",
         MANDATORY, check_local_pv_affinity, frozenset({k8s.PV})),
    Rule("model-pv-retain", "PersistentVolumes that hold models use the Retain reclaim policy.",
         MANDATORY, check_model_pv_retain, frozenset({k8s.PV})),
    Rule("rwo-claim-single-replica",
         "A Deployment that may run more than one replica mounts no ReadWriteOnce claim (one bound to a `local` PV, never attached, may).",
         MANDATORY, check_rwo_claims),
]
