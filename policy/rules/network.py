"""Rules for the inside of the cluster: who reaches a vLLM server, and which resolver it asks.

vLLM's API key guards `/v1` only: `/metrics`, `/tokenize`, `/invocations` and the admin
endpoints answer anyone who reaches the port. A NetworkPolicy that admits traffic to a vLLM server
from every pod of every namespace leaves them open inside; DNS allowed to any address on port 53
is a tunnel out of a pod that is otherwise closed. Judged only for policies that select a vLLM
server of the same stack: a rule may only fail on what it saw.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from . import k8s
from .core import MANDATORY, Resource, Rule, Unknown
from .k8s import Workload, as_list, as_map, dig, namespace, workloads

NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DNS_PORTS = {"53", "dns", "dns-tcp"}


def _selects_pods(selector: Mapping, labels: Mapping) -> bool:
    """A NetworkPolicy podSelector: an empty one selects every pod of the namespace."""
    match = as_map(selector.get("matchLabels"))
    if as_list(selector.get("matchExpressions")):
        raise Unknown  # expressions are not evaluated here: say nothing rather than guess
    return all(labels.get(k) == v for k, v in match.items())


def _guarded(policy: Resource, servers: Sequence[Workload]) -> list[Workload]:
    ns = namespace(policy.view)
    selector = as_map(dig(policy.view, "spec", "podSelector"))
    return [w for w in servers if w.namespace == ns and _selects_pods(selector, k8s.pod_labels(w.resource))]


def _policies(resources: Sequence[Resource], kind: str) -> Iterator[tuple[Resource, list[Workload]]]:
    servers = [w for w in workloads(resources) if w.vllm]
    for policy in k8s.kinds_in(resources, frozenset({NETWORK_POLICY})):
        try:
            types = [str(t) for t in as_list(dig(policy.view, "spec", "policyTypes"))]
            if kind not in types and not (kind == "Ingress" and not types):
                continue
            guarded = _guarded(policy, servers)
        except Unknown:
            continue
        if guarded:
            yield policy, guarded


def _open_peer(peer: Mapping) -> bool:
    """A peer that admits every pod of every namespace: an empty one, or an empty namespaceSelector with no pod selector."""
    if "ipBlock" in peer:
        return dig(peer, "ipBlock", "cidr") in ("0.0.0.0/0", "::/0")
    ns_selector, pod_selector = peer.get("namespaceSelector"), peer.get("podSelector")
    if ns_selector is None and pod_selector is None:
        return True
    ns_open = ns_selector is not None and not as_map(ns_selector).get("matchLabels") and not as_list(
        as_map(ns_selector).get("matchExpressions"))
    pod_open = pod_selector is None or (not as_map(pod_selector).get("matchLabels") and not as_list(
        as_map(pod_selector).get("matchExpressions")))
    return ns_open and pod_open


def _names(guarded: list[Workload]) -> str:
    return ", ".join(sorted(f"{w.resource.kind}/{w.name}" for w in guarded))


def check_ingress_from(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    for policy, guarded in _policies(resources, "Ingress"):
        try:
            rules = [as_map(r) for r in as_list(dig(policy.view, "spec", "ingress"))]
            open_rule = any(not as_list(r.get("from")) or any(_open_peer(as_map(p)) for p in as_list(r.get("from")))
                            for r in rules)
        except Unknown:
            continue
        if open_rule:
            yield policy, (
                f"admits every pod of every namespace to {_names(guarded)}: vLLM's API key guards only /v1, so "
                f"/metrics, /tokenize, /invocations and the admin endpoints answer any pod in the cluster. Give each "
                f"ingress rule a `from`: the ingress controller's namespace and pods, the monitoring namespace's "
                f"Prometheus, and the namespace's own clients.")


def _dns_port(port: Mapping) -> bool:
    value = port.get("port")
    return value is None or str(value) in DNS_PORTS


def check_dns_egress(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    for policy, guarded in _policies(resources, "Egress"):
        try:
            rules = [as_map(r) for r in as_list(dig(policy.view, "spec", "egress"))]
            anywhere = [r for r in rules if any(_dns_port(as_map(p)) for p in as_list(r.get("ports")))
                        and (not as_list(r.get("to")) or any(_open_peer(as_map(p)) for p in as_list(r.get("to"))))]
        except Unknown:
            continue
        if anywhere:
            yield policy, (
                f"lets {_names(guarded)} send DNS (port 53) to any address: a resolver outside the cluster is a "
                f"tunnel out of a pod that is otherwise closed. Allow port 53 only `to` the cluster DNS pods "
                f"(namespaceSelector kubernetes.io/metadata.name: kube-system, podSelector k8s-app: kube-dns).")


RULES = [
    Rule("vllm-ingress-from",
         "NetworkPolicies that admit traffic to a vLLM server name who (`from`), never every pod of every namespace.",
         MANDATORY, check_ingress_from),
    Rule("vllm-dns-egress",
         "Egress NetworkPolicies of a vLLM server allow DNS only to the cluster DNS pods, not to any address.",
         MANDATORY, check_dns_egress),
]
