"""What a change does to a stack, for reviewers without cluster credentials.

    python -m tools.diff BASE [STACK]      # make diff BASE=origin/main STACK=prod

Renders STACK at the git ref BASE (in a temporary worktree) and in the working tree, then
prints a summary — Kubernetes objects and node steps added, changed, renamed (same body under a new
name: one line, no diff) and removed, the models whose serving pods restart (with what that costs:
one replica under the GPU-safe rollout is briefly down), and the node scripts `pulumi up` would run
again, per node with the reason (the step's parameters, the shared
helpers in lib.sh, its own script, its connection) — followed by unified diffs of the manifests and scripts.
A stack file that does not exist at BASE (a new stack) counts as an empty stack: everything is
added. Exit 0 when the renders are equal, 1 when they differ, 2 on error; the last line, on
stderr, says which. `make diff` prints the same and exits 0 for a difference (it is the answer,
not a failure), so make shows no `*** Error` line.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools.render import ROOT, ManifestDumper

COMMAND = "command:remote:Command"
COPY = "command:remote:CopyToRemote"
# Inputs whose change makes pulumi_command run a step again (create, or update when set); a copy, copy again.
RERUN_INPUTS = ("create", "update", "connection", "environment", "stdin", "triggers")
COPY_INPUTS = ("remotePath", "source", "connection", "triggers")


@dataclass(frozen=True)
class Snapshot:
    """One rendered stack, read back from the files `tools.render` wrote."""

    objects: dict[str, dict[str, Any]]
    resources: dict[str, dict[str, Any]]
    scripts: dict[str, str]

    @classmethod
    def read(cls, folder: Path) -> Snapshot:
        objects = {}
        for obj in yaml.safe_load_all((folder / "manifests.yaml").read_text()):
            if obj:
                meta = obj.get("metadata") or {}
                key = f"{obj['kind']}/{meta['namespace']}/{meta['name']}" if meta.get("namespace") else f"{obj['kind']}/{meta['name']}"
                objects[key] = obj
        resources = {r["urn"]: r for r in json.loads((folder / "resources.json").read_text())}
        scripts = {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.glob("nodes/*/*.sh"))}
        return cls(objects, resources, scripts)

    @classmethod
    def empty(cls) -> Snapshot:
        return cls({}, {}, {})


@dataclass
class Change:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    """(old key, new key) of objects whose body is the same apart from their name."""

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.renamed)


def compare(old: dict[str, Any], new: dict[str, Any]) -> Change:
    return Change(
        added=sorted(set(new) - set(old)),
        changed=sorted(k for k in set(old) & set(new) if old[k] != new[k]),
        removed=sorted(set(old) - set(new)),
    )


def compare_objects(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> Change:
    """`compare`, with a removed and an added object of one kind and namespace whose bodies are equal
    once the name is swapped (the name may recur inside, e.g. a Job's marker file) paired as a rename.
    Names that carry a hash of what they run (the smoke and download Jobs) change with any model change."""
    change = compare(old, new)
    for gone in list(change.removed):
        body = _dump(old[gone])
        for came in change.added:
            if _scope(gone) == _scope(came) and body.replace(_name(gone), _name(came)) == _dump(new[came]):
                change.renamed.append((gone, came))
                change.removed.remove(gone)
                change.added.remove(came)
                break
    return change


def _scope(key: str) -> str:
    return key.rsplit("/", 1)[0]


def _name(key: str) -> str:
    return key.rsplit("/", 1)[1]


def _dump(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=ManifestDumper, sort_keys=True)


# Labels the serving Deployments carry (components/serving/names.py).
SERVER_COMPONENT = "inference-server"
INSTANCE = "app.kubernetes.io/instance"


@dataclass(frozen=True)
class Restart:
    """A model whose serving pods a release replaces."""

    model: str
    replicas: int
    how: str
    down: bool
    """Whether no pod serves for a while (one replica, or Recreate)."""


def restarts(old: Snapshot, new: Snapshot) -> list[Restart]:
    """Models whose serving pods `pulumi up` replaces: their Deployment's pod template changed
    (any change there rolls the pods), or the Deployment itself is replaced."""
    found = []
    for key, after in sorted(new.objects.items()):
        before = old.objects.get(key)
        if before is None or not _is_server(after) or _template(before) == _template(after):
            continue
        model = (after.get("metadata") or {}).get("labels", {}).get(INSTANCE) or _name(key)
        replicas = _fewest_replicas(new, after)
        how, down = _rollout(after, replicas)
        found.append(Restart(model, replicas, how, down))
    return found


def _template(obj: dict[str, Any]) -> Any:
    return (obj.get("spec") or {}).get("template")


def _is_server(obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return obj.get("kind") in ("Deployment", "StatefulSet") and labels.get("app.kubernetes.io/component") == SERVER_COMPONENT


def _fewest_replicas(snapshot: Snapshot, deployment: dict[str, Any]) -> int:
    """The replicas serving at the quietest time: an autoscaler's minimum, else spec.replicas (default 1)."""
    name = (deployment.get("metadata") or {}).get("name")
    for obj in snapshot.objects.values():
        spec = obj.get("spec") or {}
        if obj.get("kind") in ("ScaledObject", "HorizontalPodAutoscaler") and (spec.get("scaleTargetRef") or {}).get("name") == name:
            return int(spec.get("minReplicaCount", spec.get("minReplicas", 1)))
    return int((deployment.get("spec") or {}).get("replicas", 1))


def _rollout(deployment: dict[str, Any], replicas: int) -> tuple[str, bool]:
    """What replacing the pods costs, and whether the model is down meanwhile."""
    strategy = (deployment.get("spec") or {}).get("strategy") or {}
    surge = (strategy.get("rollingUpdate") or {}).get("maxSurge")
    if strategy.get("type") == "Recreate":
        return "Recreate stops every pod first: the model is down until a new pod has loaded its weights", True
    if surge in (0, "0", "0%"):
        if replicas <= 1:
            return ("1 replica, and the GPU-safe rollout (maxSurge 0) stops it before its replacement starts: "
                    "the model is briefly down, until the new pod has loaded its weights"), True
        return f"{replicas} replicas at the least, replaced one at a time (maxSurge 0): one pod's capacity is missing meanwhile", False
    return "a surge rollout: no downtime if a spare GPU is free for the new pod, else it stays Pending", False


def node_steps(snapshot: Snapshot) -> dict[str, dict[str, Any]]:
    """A node's steps and its copy of the step files (`<node>:steps`), by name."""
    return {r["name"]: r for r in snapshot.resources.values() if r["type"] in (COMMAND, COPY)}


def _rerun_inputs(step: dict[str, Any]) -> tuple[str, ...]:
    return COPY_INPUTS if step["type"] == COPY else RERUN_INPUTS


def reruns(old: Snapshot, new: Snapshot) -> list[str]:
    """Steps that `pulumi up` would run: new ones, and those whose re-run inputs changed."""
    before, after = node_steps(old), node_steps(new)
    names = []
    for name, step in sorted(after.items()):
        previous = before.get(name)
        if previous is None or any(previous["inputs"].get(k) != step["inputs"].get(k) for k in _rerun_inputs(step)):
            names.append(name)
    return names


# A rendered step script: header, a comment, the step's `GS_*=` parameters, `# ---- run-step.sh` and the runner, then
# the linked file it sources: `# ---- lib.sh`, the shared helpers, `# ---- NN-step.sh`, the step's own body
# (components/node/script.py; tools/render/files.py `with_linked`).
LINKING_PARAMS = frozenset({"GS_STEPS_DIR", "GS_SCRIPT", "GS_SCRIPT_SHA256", "GS_COPY_STEP"})
"""Parameters that name the linked file: they change with it, and the reason is the file's change, not theirs."""
STEP_MARKER = re.compile(r"^# ---- (\S+\.sh)\n", re.MULTILINE)


def script_parts(script: str) -> tuple[dict[str, str], str, str]:
    """(parameters by name, lib.sh text, step body) of a rendered step script."""
    markers = list(STEP_MARKER.finditer(script))
    head = script[: markers[0].start()] if markers else script
    params = {}
    for line in head.splitlines():
        name, eq, _ = line.partition("=")
        if eq and name.isidentifier() and name.isupper():
            params[name] = line
    lib = body = ""
    for i, marker in enumerate(markers):
        text = script[marker.end(): markers[i + 1].start() if i + 1 < len(markers) else len(script)]
        if marker.group(1) == "lib.sh":
            lib = text
        else:
            body = text
    return params, lib, body


def rerun_reasons(old: Snapshot, new: Snapshot) -> dict[str, list[str]]:
    """For each step `pulumi up` would run again, why: its parameters (by name), the shared helpers
    (lib.sh), its own script, its connection or other inputs, or that it is new."""
    before, after = node_steps(old), node_steps(new)
    reasons: dict[str, list[str]] = {}
    for name in reruns(old, new):
        previous = before.get(name)
        if previous is None:
            reasons[name] = ["new step"]
            continue
        why = []
        was, now = previous["inputs"], after[name]["inputs"]
        if after[name]["type"] == COPY:
            # Its folder is named by the files' content: a new one means changed step files, copied beside the old.
            why += ["step files (a new version)" if key == "remotePath" else key
                    for key in COPY_INPUTS if was.get(key) != now.get(key) and key != "source"]
            reasons[name] = why or ["step files"]
            continue
        if was.get("create") != now.get("create"):
            # What the node runs (the Command and the linked file it sources), as the render wrote it.
            node, _, step = name.partition(":")
            shown = f"nodes/{node}/{step}.sh"
            old_params, old_lib, old_body = script_parts(old.scripts.get(shown) or was.get("create") or "")
            new_params, new_lib, new_body = script_parts(new.scripts.get(shown) or now.get("create") or "")
            names = sorted(k for k in set(old_params) | set(new_params)
                           if old_params.get(k) != new_params.get(k) and k not in LINKING_PARAMS)
            if names:
                why.append("parameters " + ", ".join(names))
            if old_lib != new_lib:
                why.append("shared helpers (lib.sh)")
            if old_body != new_body:
                why.append("step script")
            if not why:  # the same step: the Command around it (its header, the runner) changed
                why.append("runner")
        why += [key for key in RERUN_INPUTS if key != "create" and was.get(key) != now.get(key)]
        reasons[name] = why
    return reasons


def rerun_table(old: Snapshot, new: Snapshot) -> list[str]:
    """Per node, the steps a release runs again on it and why (markdown lines; none when nothing re-runs)."""
    reasons = rerun_reasons(old, new)
    if not reasons:
        return []
    lines = ["### Node steps `pulumi up` would run again, per node", "",
             "They run on live nodes; docs/nodes.md \"What a release re-runs\" says why that is safe.", "",
             "| node | step | why |", "|---|---|---|"]
    for name, why in reasons.items():
        node, _, step = name.partition(":")
        lines.append(f"| `{node}` | `{step}` | {'; '.join(why)} |")
    return [*lines, ""]


def unified(old: dict[str, str], new: dict[str, str], label: str) -> str:
    chunks = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            chunks += difflib.unified_diff(
                (old.get(key) or "").splitlines(keepends=True), (new.get(key) or "").splitlines(keepends=True),
                fromfile=f"a/{label}{key}" if key in old else "/dev/null",
                tofile=f"b/{label}{key}" if key in new else "/dev/null",
            )
    return "".join(chunks)


COUNTED = ("Kubernetes objects", "node steps", "other resources")
"""Rows of the summary table at the top, which the last line repeats."""


def report(old: Snapshot, new: Snapshot, base: str, stack: str, note: str = "") -> tuple[str, bool]:
    objects = compare_objects(old.objects, new.objects)
    steps = compare(node_steps(old), node_steps(new))
    others = compare(*({u: r for u, r in snap.resources.items()
                        if not r["type"].startswith("kubernetes:") and r["type"] not in (COMMAND, COPY)} for snap in (old, new)))
    rerun = reruns(old, new)
    differs = bool(objects or steps or others or old.scripts != new.scripts)
    lines = [f"## `{stack}`: working tree against `{base}`", "", *([note, ""] if note else [])]
    if not differs:
        return "\n".join([*lines, "No change: `pulumi up` would do nothing.", ""]), False
    lines += ["| | added | changed | renamed | removed |", "|---|---|---|---|---|"]
    for title, change in zip(COUNTED, (objects, steps, others), strict=True):
        lines.append(f"| {title} | {len(change.added)} | {len(change.changed)} | {len(change.renamed)} | {len(change.removed)} |")
    lines.append("")
    for title, change in (("Kubernetes objects", objects), ("node steps", steps), ("other resources", others)):
        for verb, items in (("added", change.added), ("changed", change.changed), ("removed", change.removed)):
            lines += [f"- {title} {verb}: `{item}`" for item in items]
        lines += [f"- {title} renamed: `{gone}` → `{_name(came)}` (same body)" for gone, came in change.renamed]
    lines += ["", *restart_lines(restarts(old, new))]
    lines += ["Node scripts `pulumi up` would run again: " + (", ".join(f"`{s}`" for s in rerun) or "none"), ""]
    lines += rerun_table(old, new)
    # A rename with the same body is its one line above, not a page of `-` and `+`.
    gone, came = {g for g, _ in objects.renamed}, {c for _, c in objects.renamed}
    manifests = unified(
        {k: _dump(v) for k, v in old.objects.items() if k not in gone},
        {k: _dump(v) for k, v in new.objects.items() if k not in came},
        "manifests/",
    )
    scripts = unified(old.scripts, new.scripts, "")
    for title, text in (("Manifests", manifests), ("Node scripts", scripts)):
        if text:
            lines += [f"### {title}", "", "```diff", text.rstrip("\n"), "```", ""]
    return "\n".join(lines), True


def restart_lines(found: list[Restart]) -> list[str]:
    """The models whose serving pods a release replaces, each with what that costs (markdown)."""
    if not found:
        return ["Serving pods restarted: none", ""]
    return ["Serving pods restarted (their pod template changes): " + ", ".join(f"`{r.model}`" + (" (briefly down)" if r.down else "")
                                                                         for r in found),
            *[f"- `{r.model}`: {r.how}" for r in found], ""]


def render_at(source: Path, stack: str, out: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tools.render", stack, "--out", str(out)], cwd=source, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"render of {stack} in {source} failed: {result.stderr.strip() or result.stdout.strip()}")


def summary(text: str, differs: bool, base: str, stack: str) -> str:
    """One line for the end of the output, where the table at the top has scrolled away."""
    if not differs:
        return f"diff {stack}: no change against {base}"
    parts = []
    for row in text.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if not row.startswith("| ") or len(cells) != 5 or cells[0] not in COUNTED:
            continue  # another table (the per-node re-runs) or not a table row
        title, added, changed, renamed, removed = cells
        if (added, changed, renamed, removed) != ("0", "0", "0", "0"):
            parts.append(f"{title} +{added} ~{changed} -{removed}" + (f" ({renamed} renamed)" if renamed != "0" else ""))
    restarted = next((line for line in text.splitlines() if line.startswith("Serving pods restarted (")), "")
    if restarted:
        parts.append(f"restarts the serving pods of {restarted.split(': ', 1)[1].replace('`', '')}")
    return f"diff {stack}: differs from {base} ({'; '.join(parts) or 'node scripts'}); the report is above"


def diff(base: str, stack: str, repo: Path = ROOT) -> tuple[str, bool]:
    with tempfile.TemporaryDirectory(prefix="gs-diff-") as tmp:
        worktree, old_out, new_out = Path(tmp) / "base", Path(tmp) / "old", Path(tmp) / "new"
        add = subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(worktree), base],
                             capture_output=True, text=True)
        if add.returncode != 0:
            raise RuntimeError(f"cannot check out {base!r}: {add.stderr.strip()}")
        note = ""
        try:
            if (worktree / f"Pulumi.{stack}.yaml").exists():
                render_at(worktree, stack, old_out)
            else:
                note = f"`Pulumi.{stack}.yaml` does not exist at `{base}`: a new stack, everything is added."
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(worktree)], capture_output=True)
        render_at(repo, stack, new_out)
        old = Snapshot.read(old_out) if not note else Snapshot.empty()
        return report(old, Snapshot.read(new_out), base, stack, note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.diff", description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="git ref to compare against, e.g. origin/main")
    parser.add_argument("stack", nargs="?", default="prod")
    args = parser.parse_args(argv)
    try:
        text, differs = diff(args.base, args.stack)
    except (RuntimeError, OSError) as exc:
        print(f"diff: {exc}", file=sys.stderr)
        return 2
    print(text, flush=True)
    print(summary(text, differs, args.base, args.stack), file=sys.stderr)
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
