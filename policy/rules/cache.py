"""Rules for a node cache (`modelStorage.type: nodeCache`, issue #38): one `local` PersistentVolume whose node
affinity is a label (`cache.gpu-serving.io/<ns> In [ready]`) that every cache node carries, so each pod mounts its
own node's array; a download Job per (node, model) pinned to its node; a label per (node, model)
`<model>.<ns>.weights.gpu-serving.io/<digest8>: verified` set once that Job completed; and the model's pods
selecting that label, so a pod only starts where a verified copy is.

What the rules read: the cache volume is a `local` PV with a `cache.gpu-serving.io/` node affinity term; its claim
is the PVC bound to it (`volumeName`, or the PV's `claimRef`); a node's labels are those of every NodePatch and Node
of that name in the stack (the node's own `<node>-gpu` patch and its weights patches)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from . import k8s
from .autoscaling import max_replicas, min_replicas, scalers
from .capacity import GPU_NODE_LABELS, DeclaredNode, labelled_nodes
from .core import MANDATORY, Resource, Rule, attempt
from .k8s import Workload, as_list, as_map, dig, workloads
from .workloads import download_targets

CACHE_LABEL_PREFIX = "cache.gpu-serving.io/"
# `<model>.<ns>.weights.gpu-serving.io/<digest8>`: a label per held revision; its value once the copy is verified.
WEIGHTS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.weights\.gpu-serving\.io/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
VERIFIED = "verified"
HOSTNAME = "kubernetes.io/hostname"
COMPONENT = "app.kubernetes.io/component"
DOWNLOAD_COMPONENT = "model-download"


# --- reading the cache ---------------------------------------------------------------------------------------

def _expressions(pv: Resource) -> list[Mapping]:
    terms = as_list(dig(pv.view, "spec", "nodeAffinity", "required", "nodeSelectorTerms"))
    return [as_map(e) for t in terms for e in as_list(as_map(t).get("matchExpressions"))]


def is_cache_volume(pv: Resource) -> bool:
    """A `local` PV placed by a cache label: it exists on every node carrying the label."""
    spec = as_map(pv.view.get("spec"))
    return "local" in spec and any(str(e.get("key", "")).startswith(CACHE_LABEL_PREFIX) for e in _expressions(pv))


@dataclass(frozen=True)
class Cache:
    volumes: frozenset[str]
    """Names of the node-cache PVs."""
    claims: frozenset[tuple[str, str]]
    """(namespace, name) of the claims bound to them."""

    @property
    def namespaces(self) -> set[str]:
        return {ns for ns, _ in self.claims}


def node_cache(resources: Sequence[Resource]) -> Cache:
    volumes: set[str] = set()
    claims: set[tuple[str, str]] = set()
    for pv in k8s.kinds_in(resources, frozenset({k8s.PV})):
        if not attempt(is_cache_volume, pv, default=False):
            continue
        volumes.add(str(dig(pv.view, "metadata", "name")))
        ref = attempt(lambda r: as_map(dig(r.view, "spec", "claimRef")), pv, default={})
        if ref and ref.get("name"):
            claims.add((str(ref.get("namespace") or "default"), str(ref.get("name"))))
    for pvc in k8s.kinds_in(resources, frozenset({k8s.PVC})):
        if attempt(lambda r: dig(r.view, "spec", "volumeName"), pvc) in volumes:
            claims.add(k8s.object_key(pvc))
    return Cache(frozenset(volumes), frozenset(claims))


def claims_of(w: Workload) -> list[str]:
    """The claims a workload's pods mount, in volume order."""
    found = (dig(v, "persistentVolumeClaim", "claimName") for v in k8s.volumes(w.spec).values())
    return [str(c) for c in found if c]


def cache_claim_of(w: Workload, cache: Cache) -> str | None:
    return next((c for c in claims_of(w) if (w.namespace, c) in cache.claims), None)


def weights_labels(spec: Mapping) -> list[str]:
    """The weights labels a pod requires to be `verified`, by nodeSelector or required node affinity."""
    found = [str(k) for k, v in as_map(spec.get("nodeSelector")).items() if WEIGHTS_LABEL.match(str(k)) and v == VERIFIED]
    for term in k8s.required_node_terms(spec):
        for expr in as_list(term.get("matchExpressions")):
            expr = as_map(expr)
            key = str(expr.get("key"))
            if WEIGHTS_LABEL.match(key) and expr.get("operator") == "In" and list(as_list(expr.get("values"))) == [VERIFIED]:
                found.append(key)
    return sorted(set(found))


def node_labels(resources: Sequence[Resource]) -> dict[str, dict[str, str]]:
    """Every node's labels as the stack sets them: all its NodePatches and Nodes together, by node name."""
    labels: dict[str, dict[str, str]] = {}
    for node in k8s.kinds_in(resources, frozenset({k8s.NODE_PATCH, k8s.NODE})):
        name = dig(node.view, "metadata", "name")
        if name:
            labels.setdefault(str(name), {}).update({str(k): str(v) for k, v in as_map(dig(node.view, "metadata", "labels")).items()})
    return labels


# --- cache-holders-fit -----------------------------------------------------------------------------------------

def _gpus(node: DeclaredNode, resource: str) -> int:
    return node.advertised.get(resource, 0)


def check_holders_fit(resources: list[Resource], cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    labels = node_labels(resources)
    if not labels:
        return  # no node in view (plain manifests): the holders are not part of this stack
    product_label, declared = labelled_nodes(resources, cfg)
    by_name = {str(dig(n.resource.view, "metadata", "name")): n for n in declared}
    all_scalers = scalers(resources)
    for w in workloads(resources):
        for key in attempt(weights_labels, w.spec, default=[]):
            message = attempt(_holders_problem, w, key, labels, by_name, product_label, all_scalers)
            if message:
                yield w.resource, message


def _holders_problem(w: Workload, key: str, labels: Mapping[str, Mapping[str, str]], by_name: Mapping[str, DeclaredNode],
                     product_label: str, all_scalers: Sequence) -> str | None:
    holders = sorted(n for n, node in labels.items() if node.get(key) == VERIFIED)
    gate = f"its pods select {key}={VERIFIED}"
    if not holders:
        return (f"{gate}, which no node in the stack carries (no weights NodePatch sets it): every pod stays Pending. "
                f"Download the model to the nodes that should serve it (models[].nodes) or fix the nodeSelector.")
    if any(n not in by_name for n in holders):
        return None  # a holder whose GPUs the labels in view do not declare (another product or count label): unknown supply
    product = k8s.node_label_value(w.spec, product_label)
    usable = [by_name[n] for n in holders if product is None or by_name[n].product == product]
    replicas = max_replicas(w, all_scalers) * w.pods_per_replica
    for resource, per_pod in w.gpu_resources.items():
        supply = sum(_gpus(n, resource) for n in usable)
        largest = max((_gpus(n, resource) for n in usable), default=0)
        held = ", ".join(f"{n} ({_gpus(by_name[n], resource) if by_name[n] in usable else 0})" for n in holders)
        where = f"{gate}, set on {held} {resource}"
        if largest < per_pod:
            return (f"{where}: one pod asks for {per_pod} {resource} and no holding node has that many, so every pod "
                    f"stays Pending with 'Insufficient {resource}'. Hold the model on a node with {per_pod} or more "
                    f"(models[].nodes) or lower the GPUs per pod.")
        if supply < replicas * per_pod:
            return (f"{where}: up to {replicas} pod(s) x {per_pod} {resource} = {replicas * per_pod}, but the holding "
                    f"nodes declare only {supply}: the extra pods stay Pending (only a node holding a verified copy "
                    f"may run one). Hold the model on more nodes (models[].nodes) or lower replicas.max.")
    return None


# --- cache-pods-gated ----------------------------------------------------------------------------------------

def check_pods_gated(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    cache = node_cache(resources)
    if not cache.claims:
        return
    for w in workloads(resources):
        if w.resource.type == k8s.JOB:
            continue  # a download Job writes the copy: cache-download-pinned pins it to its node
        claim = attempt(cache_claim_of, w, cache)
        if claim is None or attempt(weights_labels, w.spec) != []:
            continue
        yield w.resource, (
            f"mounts node-cache claim {claim} but requires no weights label "
            f"(<model>.{w.namespace}.weights.gpu-serving.io/<digest8>: {VERIFIED}) in its nodeSelector: a pod may start on "
            f"a cache node whose copy of the model is missing, partial or of another revision, and downloads or fails "
            f"there. Add the weights label of the revision it serves to the nodeSelector.")


# --- cache-read-local ----------------------------------------------------------------------------------------

def _remote_claims(resources: Sequence[Resource]) -> dict[tuple[str, str], str]:
    """Claims whose files come over the network or from a provisioner: (namespace, name) -> what backs them."""
    nfs = {}
    for pv in k8s.kinds_in(resources, frozenset({k8s.PV})):
        server = attempt(lambda r: dig(r.view, "spec", "nfs", "server"), pv)
        if server is not None:
            nfs[str(dig(pv.view, "metadata", "name"))] = f"NFS volume from {server}"

    def backing(r: Resource) -> str | None:
        spec = as_map(r.view.get("spec"))
        volume = spec.get("volumeName")
        if volume:
            return nfs.get(str(volume))
        storage_class = spec.get("storageClassName")
        if storage_class == "":
            return None  # static binding to a PV outside the stack
        return f"volume provisioned by StorageClass {storage_class}" if storage_class else "volume provisioned by the default StorageClass"

    found = {}
    for pvc in k8s.kinds_in(resources, frozenset({k8s.PVC})):
        what = attempt(backing, pvc)
        if what:
            found[k8s.object_key(pvc)] = what
    return found


def _model_claims(w: Workload) -> list[str]:
    """The claims holding a vLLM server's model files (download dir, HF cache, or a local --model path)."""
    vols = k8s.volumes(w.spec)
    found = []
    for c in k8s.containers(w.spec):
        if not k8s.is_vllm_server(c):
            continue
        for _, path in download_targets(c):
            mount = k8s.mount_for(path, c)
            claim = dig(vols.get(str(mount.get("name"))) if mount else None, "persistentVolumeClaim", "claimName")
            if claim and str(claim) not in found:
                found.append(str(claim))
    return found


def check_read_local(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    cache = node_cache(resources)
    if not cache.claims:
        return
    remote = _remote_claims(resources)
    for w in workloads(resources):
        if not w.vllm or w.namespace not in cache.namespaces:
            continue
        for claim in attempt(_model_claims, w, default=[]):
            what = remote.get((w.namespace, claim))
            if what is None:
                continue
            local = ", ".join(sorted(c for ns, c in cache.claims if ns == w.namespace))
            yield w.resource, (
                f"reads its model from claim {claim} ({what}) though node-cache claim {local} holds a verified copy on "
                f"each cache node: every start pulls tens of GB over the network. Mount {local} (and select its "
                f"weights label) instead.")


# --- cache-spread --------------------------------------------------------------------------------------------

def _spreads(spec: Mapping, labels: Mapping) -> bool:
    """A topology spread constraint over hostnames counts these pods (or a pod anti-affinity on hostname does)."""
    for constraint in as_list(spec.get("topologySpreadConstraints")):
        constraint = as_map(constraint)
        selector = constraint.get("labelSelector")
        if constraint.get("topologyKey") == HOSTNAME and selector is not None and k8s.matches_label_selector(as_map(selector), labels):
            return True
    anti = as_map(dig(spec, "affinity", "podAntiAffinity"))
    terms = [*as_list(anti.get("requiredDuringSchedulingIgnoredDuringExecution")),
             *(dig(t, "podAffinityTerm") for t in as_list(anti.get("preferredDuringSchedulingIgnoredDuringExecution")))]
    return any(dig(t, "topologyKey") == HOSTNAME and dig(t, "labelSelector") is not None
               and k8s.matches_label_selector(as_map(dig(t, "labelSelector")), labels) for t in terms)


def check_spread(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    cache = node_cache(resources)
    if not cache.claims:
        return
    all_scalers = scalers(resources)
    for w in workloads(resources):
        if w.resource.type not in k8s.SCALABLE:
            continue
        claim = attempt(cache_claim_of, w, cache)
        minimum = attempt(min_replicas, w, all_scalers, default=0)
        if claim is None or minimum <= 1:
            continue
        spread = attempt(lambda r, spec: _spreads(spec, k8s.pod_labels(r)), w.resource, w.spec, default=True)
        if spread:
            continue
        yield w.resource, (
            f"keeps at least {minimum} replicas on node-cache claim {claim} with no topologySpreadConstraints over "
            f"{HOSTNAME} selecting its pods: the scheduler may put them all on one node, and losing that node takes the "
            f"model down though other nodes hold it. Add a constraint with topologyKey {HOSTNAME}, maxSkew 1, "
            f"whenUnsatisfiable ScheduleAnyway and its selector labels.")


# --- cache-download-pinned -----------------------------------------------------------------------------------

def _is_download(r: Resource) -> bool:
    return DOWNLOAD_COMPONENT in (as_map(dig(r.view, "metadata", "labels")).get(COMPONENT), k8s.pod_labels(r).get(COMPONENT))


def _pinned_host(spec: Mapping) -> str | None:
    """The one node a pod is pinned to through the scheduler: a hostname nodeSelector, or required node affinity
    whose every term names the same single hostname."""
    host = as_map(spec.get("nodeSelector")).get(HOSTNAME)
    if isinstance(host, str) and host:
        return host
    hosts = set()
    terms = k8s.required_node_terms(spec)
    for term in terms:
        names = [tuple(as_list(as_map(e).get("values"))) for e in as_list(term.get("matchExpressions"))
                 if as_map(e).get("key") == HOSTNAME and as_map(e).get("operator") == "In"]
        if len(names) != 1 or len(names[0]) != 1:
            return None
        hosts.add(str(names[0][0]))
    return hosts.pop() if len(hosts) == 1 else None


def _download_problem(w: Workload, claim: str) -> str | None:
    node_name = w.spec.get("nodeName")
    if node_name:
        return (f"download Job on node-cache claim {claim} sets nodeName {node_name}: that bypasses the scheduler, and "
                f"the Node authorizer then refuses the kubelet the claim ('no relationship found between node'; "
                f"kserve/kserve#5502), so the copy is never written. Pin it with nodeSelector {HOSTNAME}: {node_name} instead.")
    if _pinned_host(w.spec) is None:
        return (f"download Job on node-cache claim {claim} is not pinned to one node: it writes the copy on whichever "
                f"cache node the scheduler picks, not the node whose weights label it vouches for. Set exactly one "
                f"nodeSelector {HOSTNAME}: <node> (not nodeName).")
    return None


def check_download_pinned(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    cache = node_cache(resources)
    if not cache.claims:
        return
    for w in workloads(resources):
        if w.resource.type != k8s.JOB or not attempt(_is_download, w.resource, default=False):
            continue
        claim = attempt(cache_claim_of, w, cache)
        message = attempt(_download_problem, w, claim) if claim else None
        if message:
            yield w.resource, message


RULES = [
    Rule("cache-holders-fit",
         "A workload gated on a weights label (`<model>.<ns>.weights.gpu-serving.io/<digest8>: verified`) fits the GPUs of "
         "the nodes the stack labels with it: in total at max replicas, and one pod on the largest.",
         MANDATORY, check_holders_fit, config=GPU_NODE_LABELS),
    Rule("cache-pods-gated",
         "A workload mounting the node-cache claim requires a weights label in its nodeSelector (a verified copy on the node).",
         MANDATORY, check_pods_gated),
    Rule("cache-read-local",
         "With a node cache in the namespace, a vLLM server reads its model from it, not from an NFS or class-provisioned claim.",
         MANDATORY, check_read_local),
    Rule("cache-spread",
         "A Deployment on the node-cache claim keeping more than one replica spreads them over nodes (hostname topologySpreadConstraints).",
         MANDATORY, check_spread),
    Rule("cache-download-pinned",
         "A model download Job on the node-cache claim is pinned to one node by a kubernetes.io/hostname nodeSelector, never nodeName.",
         MANDATORY, check_download_pinned),
]
