"""Rules for serving the same weights every time: a vLLM server names a commit, and the Job that
downloads a model gives up at once on what no retry heals (a refused token, a missing repository)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from . import k8s
from .core import ADVISORY, MANDATORY, Resource, Rule
from .k8s import as_list, as_map, container_name, dig

COMMIT = re.compile(r"[0-9a-f]{40}")


def check_revision_pinned(resource: Resource, cfg: Mapping) -> Iterator[str]:
    if not cfg["requireCommit"]:
        return
    spec = k8s.pod_template(resource)
    for c in k8s.containers(spec or {}):
        if not k8s.is_vllm_server(c):
            continue
        revision = k8s.flag_value(k8s.argv(c), "--revision")
        if revision is None or not COMMIT.fullmatch(revision):
            found = f"--revision {revision}" if revision is not None else "no --revision (the branch main)"
            yield (f"container '{container_name(c)}' serves {found}: a branch or tag moves, so a re-download or a "
                   f"second node serves other weights under the same name. Pass --revision=<40-hex commit>.")


# What a model download looks like on a command line: the library call or either CLI.
DOWNLOADERS = ("snapshot_download", "huggingface-cli download", "hf download")


def is_model_download(container: Mapping) -> bool:
    text = " ".join(k8s.argv(container))
    return any(d in text for d in DOWNLOADERS)


def check_download_fails_fast(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    spec = k8s.pod_template(resource)
    downloads = [c for c in k8s.containers(spec or {}) if is_model_download(c)]
    if not downloads:
        return
    rules = as_list(dig(resource.view, "spec", "podFailurePolicy", "rules"))
    fails_fast = {str(dig(r, "onExitCodes", "containerName") or "*") for r in rules
                  if as_map(r).get("action") == "FailJob" and dig(r, "onExitCodes", "operator") == "In"}
    for c in downloads:
        if container_name(c) not in fails_fast and "*" not in fails_fast:
            yield (f"Job downloads a model in container '{container_name(c)}' with no podFailurePolicy that fails it "
                   f"on the downloader's auth / not-found exit codes: a bad token or a wrong repository is retried "
                   f"backoffLimit times before anyone sees it. Add spec.podFailurePolicy.rules: action FailJob, "
                   f"onExitCodes {{containerName: {container_name(c)}, operator: In, values: [...]}}.")


RULES = [
    Rule("vllm-revision-pinned",
         "A vLLM server passes --revision as a 40-hex commit, not a branch or tag.",
         MANDATORY, check_revision_pinned, k8s.WORKLOADS,
         {"requireCommit": {"type": "boolean", "default": True,
                            "description": "false for a lab whose stack may follow a branch (cluster.requireCommitRevisions)."}}),
    Rule("model-download-fails-fast",
         "A Job that downloads a model has a podFailurePolicy failing it on auth / not-found exit codes.",
         ADVISORY, check_download_fails_fast, frozenset({k8s.JOB})),
]
