"""Rules for models larger than one node: a LeaderWorkerSet whose groups run vLLM across nodes restarts a group as
one, rolls without a spare group's GPUs, keeps its own name for its pods' DNS, and is reached through its leaders
only. Every rule on pods also reads both of its templates (rules.k8s.members), so GPU limits, probes and the rest
hold for the leaders and the workers alike."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from . import k8s
from .core import MANDATORY, Resource, Rule
from .k8s import GPU, as_map, dig, namespace, to_int, workloads

GROUP_RESTART = "RecreateGroupOnPodRestart"


def _spans_nodes(resource: Resource) -> bool:
    """One of the leader template's views of a LeaderWorkerSet of GPU pods with workers (checked once per set)."""
    return resource.member == "leader" and k8s.group_size(resource) > 1 and bool(k8s.pod_gpu_resources(k8s.pod_template(resource) or {}))


def check_group_restart(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    if not _spans_nodes(resource):
        return
    policy = dig(resource.view, "spec", "leaderWorkerTemplate", "restartPolicy")
    if policy != GROUP_RESTART:
        shown = "not set" if policy is None else repr(policy)
        yield (f"leaderWorkerTemplate.restartPolicy is {shown}: when one member of a group fails, the others keep waiting "
               f"for a stage that restarted without them and the model stays down (a pipeline has no half). Set "
               f"restartPolicy: {GROUP_RESTART}.")


def check_group_rollout(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    if not _spans_nodes(resource):
        return
    surge = dig(resource.view, "spec", "rolloutStrategy", "rollingUpdateConfiguration", "maxSurge")
    if surge is None or to_int(surge) == 0 or surge in ("0", "0%"):
        return
    yield (f"rolloutStrategy surges ({surge!r}): every rollout starts a whole new group (its size × its {GPU}) before "
           f"stopping an old one, which needs that many spare GPUs; on a full cluster the new group stays Pending and the "
           f"rollout never finishes. Set rollingUpdateConfiguration.maxSurge: 0 and maxUnavailable: 1.")


def check_leaders_only(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    """A Service over a LeaderWorkerSet selects its leaders only: the workers serve no API (`--headless`)."""
    headless = [w for w in workloads(resources)
                if w.resource.member == "workers" and any(k8s.is_headless_vllm(c) for c in k8s.containers(w.spec))]
    for service in k8s.kinds_in(resources, frozenset({k8s.SERVICE})):
        selector = as_map(dig(service.view, "spec", "selector"))
        for w in headless:
            labels = k8s.pod_labels(w.resource)
            if namespace(service.view) == w.namespace and k8s.selects(selector, labels):
                yield (service, f"selects the workers of LeaderWorkerSet {w.name} (their template's labels), which run vLLM "
                                "--headless and serve no API: a share of the requests would be refused. Select the leaders "
                                "only (a label their template has and the workers' has not, e.g. app.kubernetes.io/component).")


def check_headless_service_free(resources: list[Resource], _cfg: Mapping) -> Iterator[tuple[Resource, str]]:
    """No other Service takes a LeaderWorkerSet's name: the set makes a headless Service of that name for its pods'
    DNS names and makes none when one exists, so its workers would never resolve their leader's address."""
    services = {k8s.object_key(s): s for s in k8s.kinds_in(resources, frozenset({k8s.SERVICE}))}
    for lws in k8s.kinds_in(resources, frozenset({k8s.LWS})):
        if lws.member != "leader" or k8s.group_size(lws) < 2:
            continue
        service = services.get(k8s.object_key(lws))
        if service is not None and dig(service.view, "spec", "clusterIP") != "None":
            yield (service, f"has the name of LeaderWorkerSet {k8s.object_key(lws)[1]}, whose controller then makes no headless "
                            "Service for its pods (it skips a name that exists): LWS_LEADER_ADDRESS names no DNS record and the "
                            "workers never reach their leader. Name the Service or the LeaderWorkerSet otherwise.")


RULES = [
    Rule("lws-group-restart",
         "A LeaderWorkerSet of GPU groups recreates a whole group when one of its pods restarts (RecreateGroupOnPodRestart).",
         MANDATORY, check_group_restart, frozenset({k8s.LWS})),
    Rule("lws-rollout-without-spare-gpu",
         "A LeaderWorkerSet of GPU groups rolls one group at a time without surging a spare group (maxSurge 0).",
         MANDATORY, check_group_rollout, frozenset({k8s.LWS})),
    Rule("lws-headless-service-free",
         "No Service takes the name of a LeaderWorkerSet of groups (its controller makes the headless Service of its pods' DNS names).",
         MANDATORY, check_headless_service_free),
    Rule("vllm-service-leaders-only",
         "A Service over a LeaderWorkerSet of vLLM groups selects the leaders, never the --headless workers.",
         MANDATORY, check_leaders_only),
]
