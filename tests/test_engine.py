"""The real-engine tooling: pins agree with the Python SDKs, the environment never downloads, a git
source is checked against its pinned commit, and the e2e helpers read the engine's output right.
(`make e2e` itself runs the engine; these run without it.)"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed.e2e.engine_checks import engine_owned, needle
from testbed.e2e.run import object_key, provider_objects
from tools.render import ROOT

ENGINE = ROOT / "testbed" / "engine"


NEEDS_GO = pytest.mark.skipif(not any((Path(p) / "go").exists() for p in os.environ["PATH"].split(":")), reason="needs go")


def pins() -> dict[str, str]:
    return dict(re.findall(r"^([A-Z0-9_]+)=(\S+)$", (ENGINE / "versions.env").read_text(), re.M))


def requirement(name: str) -> str:
    return re.search(rf"^{name}==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)


def test_engine_plugins_are_the_versions_the_python_sdks_ask_for() -> None:
    # Each Python SDK asks the engine for its own plugin version: any other is "plugin not found".
    assert pins()["KUBERNETES_VERSION"] == requirement("pulumi-kubernetes")
    assert pins()["COMMAND_VERSION"] == requirement("pulumi-command")
    # The CLI may be newer than the SDK, never older.
    cli = tuple(map(int, pins()["PULUMI_VERSION"].split(".")))
    assert cli >= tuple(map(int, requirement("pulumi").split(".")))


def test_engine_environment_is_project_local_and_never_downloads(tmp_path: Path) -> None:
    out = subprocess.run(["bash", str(ENGINE / "env.sh")], capture_output=True, text=True, check=True,
                         env={**os.environ, "GS_CACHE": str(tmp_path)}).stdout
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env["PULUMI_HOME"] == str(ROOT / ".pulumi-home")
    assert env["GS_ENGINE"].startswith(f"{tmp_path}/engine/pulumi-{pins()['PULUMI_VERSION']}-")
    assert env["PATH"].split(":")[0] == f"{env['GS_ENGINE']}/bin"
    for switch in ("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "PULUMI_SKIP_UPDATE_CHECK", "PULUMI_IGNORE_AMBIENT_PLUGINS"):
        assert env[switch] == "true", switch


def fake_repo(path: Path, tag: str) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout.strip()

    path.mkdir()
    git("init", "-q")
    (path / "provider").mkdir()
    (path / "provider" / "go.mod").write_text("module example.com/provider\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    git("tag", tag)
    return git("rev-parse", "HEAD")


def without_archives() -> dict[str, str]:
    # .ci/run exports GS_ENGINE_SRC; a build that finds the real archive there never reaches git.
    return {k: v for k, v in os.environ.items() if k != "GS_ENGINE_SRC"}


@NEEDS_GO
def test_a_git_source_whose_tag_is_not_the_pinned_commit_is_refused(tmp_path: Path) -> None:
    commit = fake_repo(tmp_path / "repo", f"v{pins()['COMMAND_VERSION']}")
    proc = subprocess.run(["bash", str(ENGINE / "build.sh"), "command"], capture_output=True, text=True,
                          env={**without_archives(), "GS_CACHE": str(tmp_path / "cache"), "GS_PULUMI_COMMAND_GIT": str(tmp_path / "repo")})
    assert proc.returncode != 0
    assert f"tag v{pins()['COMMAND_VERSION']} is {commit}, pinned {pins()['COMMAND_COMMIT']}" in proc.stderr
    assert not (tmp_path / "cache" / "src").exists() or not any((tmp_path / "cache" / "src").iterdir())


def command_archive(tmp_path: Path, suffix: str) -> Path:
    """GS_ENGINE_SRC with a small stand-in for the command provider's source archive (`.tar` or `.tar.gz`)."""
    archives = tmp_path / "engine-src"
    stage = tmp_path / "stage" / "provider"
    stage.mkdir(parents=True)
    archives.mkdir()
    (stage / "go.mod").write_text("module example.com/provider\n")
    archive = archives / f"{pins()['COMMAND_COMMIT']}-provider{suffix}"
    subprocess.run(["tar", "-czf" if suffix.endswith(".gz") else "-cf", str(archive), "-C", str(stage.parent), "provider"], check=True)
    return archive


def build_command(tmp_path: Path, engine: Path, archive: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(engine / "build.sh"), "command"], capture_output=True, text=True,
                          env={**os.environ, "GS_CACHE": str(tmp_path / "cache"), "GS_ENGINE_SRC": str(archive.parent),
                               "GS_PULUMI_COMMAND_GIT": str(tmp_path / "no-such-repo")})


@NEEDS_GO
def test_a_source_archive_whose_checksum_is_not_pinned_is_refused(tmp_path: Path) -> None:
    archive = command_archive(tmp_path, ".tar.gz")
    proc = build_command(tmp_path, ENGINE, archive)
    assert proc.returncode != 0
    assert f"{archive}: sha256 of its tar is" in proc.stderr
    assert f"pinned {pins()['COMMAND_SRC_SHA256']}" in proc.stderr
    # Nothing of the refused archive is kept for a later build to pick up.
    assert not list((tmp_path / "cache").rglob("*.tar*"))


@NEEDS_GO
def test_a_source_archive_with_the_pinned_checksum_is_cached_without_git(tmp_path: Path) -> None:
    """The archive is used as the cache would be: the build then needs no git source. Checked with a
    pin made for a small archive, so nothing is compiled for long: the build fails later, in Go."""
    archive = command_archive(tmp_path, ".tar")
    engine = tmp_path / "engine"
    shutil.copytree(ENGINE, engine)
    shutil.copy(ENGINE.parent / "lib.sh", tmp_path / "lib.sh")
    versions = engine / "versions.env"
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    versions.write_text(re.sub(r"COMMAND_SRC_SHA256=\w+", f"COMMAND_SRC_SHA256={digest}", versions.read_text()))
    proc = build_command(tmp_path, engine, archive)
    assert "(sha256 checked)" in proc.stderr, proc.stderr
    assert "cloning" not in proc.stderr
    assert (tmp_path / "cache" / "src" / archive.name).read_bytes() == archive.read_bytes()


def test_engine_owned_resources_are_the_stack_and_default_providers() -> None:
    prefix = "urn:pulumi:prod::gpu-serving::"
    assert engine_owned(prefix + "pulumi:pulumi:Stack::gpu-serving-prod")
    assert engine_owned(prefix + "pulumi:providers:command::default_1_2_1")
    assert not engine_owned(prefix + "pulumi:providers:kubernetes::kubernetes")
    assert not engine_owned(prefix + "gpu-serving:node:GpuNode$command:remote:Command::lab-node:10-preflight")


def test_a_key_is_searched_by_its_longest_line_not_its_armour() -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nshort\n-----END OPENSSH PRIVATE KEY-----\n"
    assert needle(key) == "b3BlbnNzaC1rZXktdjEAAAAA"
    assert needle("gs-canary-hfToken-0123") == "gs-canary-hfToken-0123"


def test_provider_yaml_is_read_from_every_subfolder(tmp_path: Path) -> None:
    (tmp_path / "0-crd").mkdir()
    (tmp_path / "1-manifest").mkdir()
    (tmp_path / "0-crd" / "a.yaml").write_text("kind: CustomResourceDefinition\nmetadata: {name: a}\n")
    (tmp_path / "1-manifest" / "b.yaml").write_text("kind: Secret\nmetadata: {name: b, namespace: ai}\n---\n")
    assert [object_key(o) for o in provider_objects(tmp_path)] == ["CustomResourceDefinition//a", "Secret/ai/b"]
