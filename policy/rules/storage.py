"""PersistentVolumes that hold models."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from . import k8s
from .core import MANDATORY, Resource, Rule
from .k8s import as_list, as_map, dig

NODE_BOUND_SOURCES = ("hostPath", "local")


def _node_bound_source(spec: Mapping) -> str | None:
    return next((s for s in NODE_BOUND_SOURCES if s in spec), None)


def check_local_pv_affinity(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = as_map(resource.view.get("spec"))
    source = _node_bound_source(spec)
    if source is None:
        return
    terms = as_list(dig(spec, "nodeAffinity", "required", "nodeSelectorTerms"))
    if not terms:
        path = dig(spec, source, "path")
        yield (f"{source} PV ({path}) has no required nodeAffinity: the directory exists on one node "
               f"only, but the pod may be scheduled anywhere and then sees an empty (or missing) "
               f"directory and downloads the model again. Add spec.nodeAffinity.required with the "
               f"node's kubernetes.io/hostname.")


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


RULES = [
    Rule("local-pv-node-affinity", "hostPath/local PersistentVolumes are pinned to their node by required nodeAffinity.",
         MANDATORY, check_local_pv_affinity, frozenset({k8s.PV})),
    Rule("model-pv-retain", "PersistentVolumes that hold models use the Retain reclaim policy.",
         MANDATORY, check_model_pv_retain, frozenset({k8s.PV})),
]
