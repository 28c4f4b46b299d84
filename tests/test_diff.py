"""`make diff`: what a change does to a rendered stack, summarised for review."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tools.diff import Restart, Snapshot, report, reruns, restarts, summary
from tools.render import ROOT

PV = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "ai-models"}, "spec": {"capacity": {"storage": "912Gi"}}}
SVC = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "qwen3", "namespace": "ai"}, "spec": {"ports": [{"port": 8000}]}}


def step(name: str, script: str, host: str = "k8s-worker-02") -> dict:
    return {"urn": f"urn:x::{name}", "name": name, "type": "command:remote:Command",
            "inputs": {"create": script, "connection": {"host": host}}}


def snapshot(objects: list[dict], steps: list[dict]) -> Snapshot:
    keyed = {}
    for obj in objects:
        meta = obj["metadata"]
        keyed["/".join([obj["kind"], *([meta["namespace"]] if "namespace" in meta else []), meta["name"]])] = obj
    scripts = {f"nodes/{s['name'].split(':')[0]}/{s['name'].split(':')[1]}.sh": s["inputs"]["create"] for s in steps}
    return Snapshot(keyed, {s["urn"]: s for s in steps}, scripts)


BASE = snapshot([PV, SVC], [step("n1:10-preflight", "echo check\n"), step("n1:20-partition", "echo part\n")])


def test_equal_renders_report_no_change() -> None:
    text, differs = report(BASE, copy.deepcopy(BASE), "main", "prod")
    assert not differs
    assert "No change" in text


def test_added_changed_and_removed_objects_are_listed() -> None:
    bigger = copy.deepcopy(PV)
    bigger["spec"]["capacity"]["storage"] = "1825Gi"
    ingress = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "qwen3", "namespace": "ai"}}
    new = snapshot([bigger, ingress], [step("n1:10-preflight", "echo check\n"), step("n1:20-partition", "echo part\n")])
    text, differs = report(BASE, new, "main", "prod")
    assert differs
    assert "| Kubernetes objects | 1 | 1 | 0 | 1 |" in text
    assert "- Kubernetes objects added: `Ingress/ai/qwen3`" in text
    assert "- Kubernetes objects changed: `PersistentVolume/ai-models`" in text
    assert "- Kubernetes objects removed: `Service/ai/qwen3`" in text
    assert "-    storage: 912Gi\n+    storage: 1825Gi" in text
    assert "Node scripts `pulumi up` would run again: none" in text


def test_a_changed_node_script_is_a_rerun_and_shows_its_diff() -> None:
    new = snapshot([PV, SVC], [step("n1:10-preflight", "echo check\n"), step("n1:20-partition", "echo part v2\n"),
                               step("n1:30-raid", "echo raid\n")])
    text, differs = report(BASE, new, "main", "prod")
    assert differs
    assert "| node steps | 1 | 1 | 0 | 0 |" in text
    assert reruns(BASE, new) == ["n1:20-partition", "n1:30-raid"]
    assert "Node scripts `pulumi up` would run again: `n1:20-partition`, `n1:30-raid`" in text
    assert "--- a/nodes/n1/20-partition.sh\n+++ b/nodes/n1/20-partition.sh" in text
    assert "-echo part\n+echo part v2" in text
    assert "--- /dev/null\n+++ b/nodes/n1/30-raid.sh" in text


def test_a_new_connection_reruns_the_step_but_a_removed_step_does_not() -> None:
    new = snapshot([PV, SVC], [step("n1:10-preflight", "echo check\n", host="10.0.0.9")])
    assert reruns(BASE, new) == ["n1:10-preflight"]
    text, _ = report(BASE, new, "main", "prod")
    assert "- node steps removed: `n1:20-partition`" in text


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(repo)], check=True)
    return repo


def run_diff(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.diff", *args], cwd=repo, capture_output=True, text=True, timeout=300)


def test_end_to_end_on_a_clone(clone: Path) -> None:
    same = run_diff(clone, "HEAD", "prod")
    assert same.returncode == 0, same.stderr
    stack = clone / "Pulumi.prod.yaml"
    document = yaml.safe_load(stack.read_text())
    document["config"]["gpu-serving:nodes"][0]["storage"]["sizeGb"] = 2000
    stack.write_text(yaml.safe_dump(document))
    changed = run_diff(clone, "HEAD", "prod")
    assert changed.returncode == 1, changed.stderr
    assert "- Kubernetes objects changed: `PersistentVolume/ai-models`" in changed.stdout
    assert "+    storage: 1825Gi" in changed.stdout
    bad = run_diff(clone, "no-such-ref", "prod")
    assert bad.returncode == 2
    assert bad.stderr.startswith("diff: cannot check out 'no-such-ref'")


def test_a_stack_new_since_the_base_is_all_added(clone: Path) -> None:
    (clone / "Pulumi.fresh.yaml").write_text((clone / "Pulumi.prod.yaml").read_text())
    result = run_diff(clone, "HEAD", "fresh")
    assert result.returncode == 1, result.stderr
    assert "`Pulumi.fresh.yaml` does not exist at `HEAD`: a new stack, everything is added." in result.stdout
    assert "- Kubernetes objects added: `PersistentVolume/ai-models`" in result.stdout
    assert "changed: `" not in result.stdout and "removed: `" not in result.stdout
    assert result.stderr.startswith("diff fresh: differs from HEAD (Kubernetes objects +")


def test_make_diff_prints_the_summary_and_no_make_error(clone: Path) -> None:
    stack = clone / "Pulumi.prod.yaml"
    document = yaml.safe_load(stack.read_text())
    document["config"]["gpu-serving:nodes"][0]["storage"]["sizeGb"] = 2000
    stack.write_text(yaml.safe_dump(document))
    make = ["make", "--no-print-directory", "-C", str(clone), "diff", "BASE=HEAD", "STACK=prod", f"VENV={ROOT / 'venv'}"]
    result = subprocess.run(make, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "- Kubernetes objects changed: `PersistentVolume/ai-models`" in result.stdout
    assert "***" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("diff prod: differs from HEAD (Kubernetes objects +0 ~")
    broken = subprocess.run([*make[:-3], "diff", "BASE=no-such-ref", "STACK=prod", make[-1]], capture_output=True, text=True, timeout=300)
    assert broken.returncode == 2
    assert "cannot check out 'no-such-ref'" in broken.stderr


# ---------------------------------------------------------------------------- what a release re-runs, per node


def rendered(name: str, **params: str) -> str:
    from components.node.script import render_script

    return render_script(f"{name}.sh", params)


def test_reruns_are_listed_per_node_with_their_reason(monkeypatch) -> None:
    from components.node import script as node_script

    mount = {"GS_RAID_NAME": "models", "GS_MOUNTPOINT": "/mnt/models", "GS_DEVICE_TIMEOUT": "30", "GS_KUBELET": "kubelet"}
    runtime = {"GS_RUNTIME": "containerd", "GS_SET_AS_DEFAULT": "true"}
    old = snapshot([PV], [step("n1:50-mount", rendered("50-mount", **mount)), step("n1:80-runtime", rendered("80-runtime", **runtime)),
                          step("n2:80-runtime", rendered("80-runtime", **runtime), host="n2"),
                          step("n3:80-runtime", rendered("80-runtime", **runtime), host="n3")])
    # A release that changed only a comment in lib.sh, and n1's mountpoint; n3 gets a new address.
    lib = node_script._body("lib.sh")
    body = node_script._body
    monkeypatch.setattr(node_script, "_body", lambda f: lib + "# a comment\n" if f == "lib.sh" else body(f))
    new = snapshot([PV], [step("n1:50-mount", rendered("50-mount", **(mount | {"GS_MOUNTPOINT": "/mnt/m2"}))),
                          step("n1:80-runtime", rendered("80-runtime", **runtime)),
                          step("n2:80-runtime", rendered("80-runtime", **runtime), host="n2"),
                          step("n3:80-runtime", old.resources["urn:x::n3:80-runtime"]["inputs"]["create"], host="10.0.0.3"),
                          step("n4:80-runtime", rendered("80-runtime", **runtime), host="n4")])
    text, _ = report(old, new, "main", "prod")
    assert "### Node steps `pulumi up` would run again, per node" in text
    assert "| `n1` | `50-mount` | parameters GS_MOUNTPOINT; shared helpers (lib.sh) |" in text
    assert "| `n1` | `80-runtime` | shared helpers (lib.sh) |" in text
    assert "| `n2` | `80-runtime` | shared helpers (lib.sh) |" in text
    assert "| `n3` | `80-runtime` | connection |" in text
    assert "| `n4` | `80-runtime` | new step |" in text
    assert "What a release re-runs" in text


def test_a_step_body_change_is_named_and_nothing_rerun_means_no_table() -> None:
    old = snapshot([PV], [step("n1:10-preflight", "#!/usr/bin/env bash\nGS_X=1\n# ---- lib.sh\nlib\n# ---- 10-preflight.sh\nold\n")])
    new = snapshot([PV], [step("n1:10-preflight", "#!/usr/bin/env bash\nGS_X=1\n# ---- lib.sh\nlib\n# ---- 10-preflight.sh\nnew\n")])
    text, _ = report(old, new, "main", "prod")
    assert "| `n1` | `10-preflight` | step script |" in text
    same_steps = snapshot([SVC], [step("n1:10-preflight", "echo check\n"), step("n1:20-partition", "echo part\n")])
    text, _ = report(BASE, same_steps, "main", "prod")
    assert "per node" not in text


def test_a_lib_change_on_a_clone_lists_every_step_of_the_node(clone: Path) -> None:
    lib = clone / "components" / "node" / "scripts" / "lib.sh"
    lib.write_text(lib.read_text() + "# a comment a release added\n")
    subprocess.run([sys.executable, "-m", "tools.node_scripts"], cwd=clone, check=True, capture_output=True)
    result = run_diff(clone, "HEAD", "prod")
    assert result.returncode == 1, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| `k8s-worker-02` |")]
    assert len(rows) == 9  # every step, and the node's copy of the step files (a new version)
    copy = "| `k8s-worker-02` | `steps` | step files (a new version) |"
    assert copy in rows, rows
    assert all(row.endswith("| shared helpers (lib.sh) |") for row in rows if row != copy), rows
    # The copy step is a node step, counted once: not again among the other resources.
    assert "| node steps | 0 | 9 | 0 | 0 |" in result.stdout and "| other resources | 0 | 0 | 0 | 0 |" in result.stdout


# ---------------------------------------------------------------------------- renames and restarts (issue 23)


def smoke_job(name: str, body: str = "curl vllm-qwen3:8000/v1/completions") -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "ai"},
            "spec": {"template": {"spec": {"containers": [{"name": "smoke", "command": ["sh", "-c", f"{body} > /tmp/{name}.done"]}]}}}}


def server(image: str, scaler_min: int | None = 1, replicas: int | None = None, strategy: dict | None = None) -> list[dict]:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "vllm-qwen3", "namespace": "ai",
                               "labels": {"app.kubernetes.io/component": "inference-server", "app.kubernetes.io/instance": "qwen3"}},
                  "spec": {"strategy": strategy or {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                           "template": {"spec": {"containers": [{"name": "vllm", "image": image}]}}}}
    if replicas is not None:
        deployment["spec"]["replicas"] = replicas
    objects = [deployment]
    if scaler_min is not None:
        objects.append({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "vllm-qwen3", "namespace": "ai"},
                        "spec": {"scaleTargetRef": {"name": "vllm-qwen3"}, "minReplicaCount": scaler_min, "maxReplicaCount": 2}})
    return objects


def test_a_renamed_object_with_the_same_body_is_one_line() -> None:
    old = snapshot([PV, smoke_job("vllm-qwen3-smoke-216d9794")], [])
    new = snapshot([PV, smoke_job("vllm-qwen3-smoke-0badf00d")], [])
    text, differs = report(old, new, "main", "prod")
    assert differs
    assert "| Kubernetes objects | 0 | 0 | 1 | 0 |" in text
    assert "- Kubernetes objects renamed: `Job/ai/vllm-qwen3-smoke-216d9794` → `vllm-qwen3-smoke-0badf00d` (same body)" in text
    assert "added: `" not in text and "removed: `" not in text
    assert "### Manifests" not in text and "curl" not in text
    assert summary(text, differs, "main", "prod") == (
        "diff prod: differs from main (Kubernetes objects +0 ~0 -0 (1 renamed)); the report is above")


def test_a_renamed_object_with_another_body_is_an_add_and_a_remove() -> None:
    old = snapshot([smoke_job("vllm-qwen3-smoke-216d9794")], [])
    new = snapshot([smoke_job("vllm-qwen3-smoke-0badf00d", body="curl vllm-qwen3:8000/v1/chat/completions")], [])
    text, _ = report(old, new, "main", "prod")
    assert "| Kubernetes objects | 1 | 0 | 0 | 1 |" in text
    assert "renamed: `" not in text
    assert "+++ b/manifests/Job/ai/vllm-qwen3-smoke-0badf00d" in text


def test_a_pod_template_change_says_which_model_restarts_and_that_one_replica_means_downtime() -> None:
    old = snapshot(server("vllm/vllm-openai:v0.11.0"), [])
    new = snapshot(server("vllm/vllm-openai:v0.18.0"), [])
    text, differs = report(old, new, "main", "prod")
    assert restarts(old, new) == [Restart("qwen3", 1, restarts(old, new)[0].how, True)]
    assert "Serving pods restarted (their pod template changes): `qwen3` (briefly down)" in text
    assert "- `qwen3`: 1 replica, and the GPU-safe rollout (maxSurge 0) stops it before its replacement starts" in text
    assert summary(text, differs, "main", "prod").endswith("restarts the serving pods of qwen3 (briefly down)); the report is above")


@pytest.mark.parametrize(
    ("objects", "down", "words"),
    [
        (server("v2", scaler_min=2), False, "2 replicas at the least, replaced one at a time"),
        (server("v2", scaler_min=None, replicas=3), False, "3 replicas at the least"),
        (server("v2", scaler_min=None), True, "1 replica"),
        (server("v2", scaler_min=2, strategy={"type": "Recreate"}), True, "Recreate stops every pod first"),
    ],
)
def test_what_a_restart_costs_follows_replicas_and_strategy(objects: list[dict], down: bool, words: str) -> None:
    old = snapshot(server("v1", scaler_min=None), [])
    (restart,) = restarts(old, snapshot(objects, []))
    assert restart.down is down and words in restart.how


def test_no_restart_when_the_pod_template_is_the_same() -> None:
    old = snapshot(server("v1"), [])
    scaled = copy.deepcopy(server("v1", scaler_min=2))
    text, _ = report(old, snapshot(scaled, []), "main", "prod")
    assert restarts(old, snapshot(scaled, [])) == []
    assert "Serving pods restarted: none" in text


def test_a_model_change_on_a_clone_shows_the_smoke_job_renamed_and_the_restart(clone: Path) -> None:
    stack = clone / "Pulumi.prod.yaml"
    stack.write_text(stack.read_text().replace("maxModelLen: 16384", "maxModelLen: 8192"))
    result = run_diff(clone, "HEAD", "prod")
    assert result.returncode == 1, result.stderr
    renamed = [line for line in result.stdout.splitlines() if "renamed: `Job/ai/vllm-qwen3-smoke-" in line]
    assert len(renamed) == 1 and renamed[0].endswith("(same body)"), result.stdout[:3000]
    assert "Serving pods restarted (their pod template changes): `qwen3` (briefly down)" in result.stdout
    assert "+++ b/manifests/Job/ai/vllm-qwen3-smoke" not in result.stdout
    assert "restarts the serving pods of qwen3 (briefly down)" in result.stderr.strip().splitlines()[-1]
