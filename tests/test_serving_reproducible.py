"""Issue 24 items 4 and 5: a model is a commit, not a branch; the download Job fails fast on
errors no retry heals, is named after what it downloads, and keys its marker by the commit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.serving.jobs import DOWNLOAD_SCRIPT, EXIT_AUTH, EXIT_NOT_FOUND
from components.serving.names import download_job_name
from policy.rules import check_resources
from stacks.config import ConfigError, Model, parse
from tests.test_serving import JOB, of_type, one, prod_model
from tools.render import ROOT, Render

COMMIT = "4da05a8edb55c6046cce958586c33b61da07bb79"


def stack_with(**model_changes: Any) -> dict[str, Any]:
    raw = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    raw["gpu-serving:models"] = [prod_model(**model_changes)]
    return {k.split(":", 1)[1]: v for k, v in raw.items()}


# ---------------------------------------------------------------------------- revision


def test_prod_pins_a_commit() -> None:
    assert prod_model()["revision"] == COMMIT


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "4da05a8"])
def test_a_branch_tag_or_short_sha_is_refused_with_the_key_named(revision: str) -> None:
    with pytest.raises(ConfigError, match=r"^models\[0\]\.revision: .*40-hex commit.*requireCommitRevisions: false"):
        parse(stack_with(revision=revision))


def test_a_lab_may_follow_a_branch() -> None:
    raw = stack_with(revision="main")
    raw["cluster"] = raw["cluster"] | {"requireCommitRevisions": False}
    assert parse(raw).models[0].revision == "main"
    lab = yaml.safe_load((ROOT / "Pulumi.lab.yaml").read_text())["config"]
    assert lab["gpu-serving:cluster"]["requireCommitRevisions"] is False


def test_the_image_may_be_given_by_digest(render) -> None:  # type: ignore[no-untyped-def]
    digest = "sha256:" + "0f" * 32
    for image in (f"vllm/vllm-openai@{digest}", f"vllm/vllm-openai:v0.18.0@{digest}"):
        result = render(models=[prod_model(image=image)])
        deployment = one(result, "kubernetes:apps/v1:Deployment")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
        entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in result.kubernetes_resources()]
        assert not [v for v in check_resources(entries) if v.policy.endswith("image-pinned")]
    # a tag and a digest: the tag still tells which release, so the drain flag stays
    result = render(models=[prod_model(image=f"vllm/vllm-openai:v0.18.0@{digest}")])
    assert "--shutdown-timeout=600" in one(result, "kubernetes:apps/v1:Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


# ---------------------------------------------------------------------------- the download Job


def test_job_name_changes_with_what_it_downloads() -> None:
    base = Model.model_validate(prod_model())
    names = {download_job_name(base.model_copy(update=change)) for change in (
        {}, {"revision": "0" * 40}, {"hugging_face_id": "Qwen/Qwen3-4B-AWQ"})}
    assert len(names) == 3
    # what serves it does not change what is downloaded: same Job
    assert download_job_name(base.model_copy(update={"image": "vllm/vllm-openai:v0.19.0"})) == download_job_name(base)


def test_download_job_fails_fast_on_auth_and_not_found(prod: Render) -> None:
    (job,) = of_type(prod, JOB)
    spec = job.inputs["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    fail = next(r for r in rules if r["action"] == "FailJob")
    assert fail["onExitCodes"] == {"containerName": "download", "operator": "In",
                                   "values": [EXIT_AUTH, EXIT_NOT_FOUND]}
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules


FAKE_HUB = '''
import os, pathlib
mode = os.environ["FAKE_MODE"]
class HfApi:
    def model_info(self, repo, revision):
        class Info: sha = os.environ["FAKE_HEAD"]
        return Info()
    def list_repo_files(self, repo, revision):
        _raise()
        return ["model.safetensors"]
def _raise():
    from huggingface_hub.utils import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    if mode == "gated": raise GatedRepoError("gated")
    if mode == "no-repo": raise RepositoryNotFoundError("404")
    if mode == "no-revision": raise RevisionNotFoundError("404")
    if mode == "bad-token":
        class R: status_code = 401
        raise HfHubHTTPError("401", response=R())
    if mode == "server-error":
        class R: status_code = 503
        raise HfHubHTTPError("503", response=R())
def snapshot_download(repo, revision, cache_dir, ignore_patterns):
    open(os.environ["FAKE_LOG"], "a").write(f"download {revision}\\n")
    path = pathlib.Path(cache_dir) / "snapshots" / os.environ["FAKE_HEAD"]
    path.mkdir(parents=True, exist_ok=True)
    return str(path)
'''
FAKE_UTILS = '''
class HfHubHTTPError(Exception):
    def __init__(self, message, response=None):
        super().__init__(message)
        self.response = response
class RepositoryNotFoundError(HfHubHTTPError): pass
class GatedRepoError(RepositoryNotFoundError): pass
class RevisionNotFoundError(HfHubHTTPError): pass
'''


def run_download(tmp_path: Path, mode: str, revision: str, head: str = COMMIT) -> subprocess.CompletedProcess[str]:
    """The Job's script for real, against a stand-in `huggingface_hub` with the library's error classes."""
    fake = tmp_path / "fake" / "huggingface_hub"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text(textwrap.dedent(FAKE_HUB))
    (fake / "utils.py").write_text(textwrap.dedent(FAKE_UTILS))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "fake"), "FAKE_MODE": mode, "FAKE_HEAD": head,
           "FAKE_LOG": str(tmp_path / "log"), "GS_REPO": "Qwen/Qwen3-8B-AWQ", "GS_REVISION": revision,
           "HF_HUB_CACHE": str(tmp_path / "hub"), "GS_MARKER_DIR": str(tmp_path / "markers")}
    return subprocess.run([sys.executable, "-c", DOWNLOAD_SCRIPT], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("mode", "code"), [
    ("gated", EXIT_AUTH), ("bad-token", EXIT_AUTH),
    ("no-repo", EXIT_NOT_FOUND), ("no-revision", EXIT_NOT_FOUND),
])
def test_download_exits_with_the_code_the_failure_policy_reads(tmp_path: Path, mode: str, code: int) -> None:
    result = run_download(tmp_path, mode, COMMIT)
    assert result.returncode == code, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("ERROR: ")]
    assert "Qwen/Qwen3-8B-AWQ" in line


def test_a_transient_error_is_left_to_the_retries(tmp_path: Path) -> None:
    result = run_download(tmp_path, "server-error", COMMIT)
    assert result.returncode not in (0, EXIT_AUTH, EXIT_NOT_FOUND)


def test_marker_is_keyed_by_the_resolved_commit(tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert run_download(tmp_path, "ok", COMMIT).returncode == 0
    assert (tmp_path / "markers" / f"Qwen--Qwen3-8B-AWQ@{COMMIT}.done").exists()
    assert run_download(tmp_path, "ok", COMMIT).returncode == 0  # done: nothing downloaded again
    assert log.read_text().count("download") == 1
    # a branch that still points at that commit is done too; once it moves, the new commit is fetched
    assert run_download(tmp_path, "ok", "main", head=COMMIT).returncode == 0
    assert log.read_text().count("download") == 1
    moved = "1" * 40
    assert run_download(tmp_path, "ok", "main", head=moved).returncode == 0
    assert log.read_text().count("download") == 2
    assert (tmp_path / "markers" / f"Qwen--Qwen3-8B-AWQ@{moved}.done").exists()


def test_policy_refuses_a_download_job_without_a_failure_policy(prod: Render) -> None:
    (job,) = of_type(prod, JOB)
    entry = {"type": job.type, "name": job.name, "inputs": job.inputs}
    assert not [v for v in check_resources([entry]) if v.policy == "model-download-fails-fast"]
    bare = {**job.inputs, "spec": {k: v for k, v in job.inputs["spec"].items() if k != "podFailurePolicy"}}
    (violation,) = [v for v in check_resources([{**entry, "inputs": bare}]) if v.policy == "model-download-fails-fast"]
    assert "podFailurePolicy" in violation.message
