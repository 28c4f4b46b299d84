"""What `make render` leaves behind (issue #16): malformed stack files, secrets still to set, a
fresh folder swapped in, and an apply file in the program's order without placeholders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tools.render import ROOT, ManifestDumper, Render, files, findings, main, run_program, write

PROD = (ROOT / "Pulumi.prod.yaml").read_text()


def render_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.render", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- item 1: every malformed stack file is one line naming the file -------------------------------

MALFORMED = [
    (b"- config: {}\n", "Pulumi.bad.yaml: the document is a list; it must be a mapping"),
    (b"config:\n  - gpu-serving:models: []\n", "Pulumi.bad.yaml: `config:` is a list; it must be a mapping of `namespace:key: value`"),
    (b"config: 7\n", "Pulumi.bad.yaml: `config:` is a number (7)"),
    (b"just some text\n", "Pulumi.bad.yaml: the document is a string ('just some text')"),
    (b"confg:\n  gpu-serving:models: []\n", "Pulumi.bad.yaml: unknown top-level key 'confg' (did you mean config?)"),
    (b"", "Pulumi.bad.yaml: no `config:` section"),
    (b"config:\n  1: x\n", "Pulumi.bad.yaml: config key 1 is not a `namespace:key` name"),
    (b"config:\n  gpu-serving:hfToken:\n    secure: [1]\n", "Pulumi.bad.yaml: gpu-serving:hfToken: `secure:` holds a list"),
    (b"config: {a: [}\n", "Pulumi.bad.yaml:1:14: expected the node content, but found '}'"),
    (b"config:\n  gpu-serving:models: \xff\n", "Pulumi.bad.yaml: is not UTF-8 text"),
]


@pytest.mark.parametrize(("content", "expected"), MALFORMED, ids=[e.split(": ", 1)[-1][:40] for _, e in MALFORMED])
def test_a_malformed_stack_file_is_one_line_naming_it(tmp_path: Path, content: bytes, expected: str) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_bytes(content)
    result = render_cli("bad", "--stack-file", str(bad), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"render bad: {expected}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# Issue 39: a YAML slip is one line, `file:line:column: what`, in words for the usual slips.
YAML_SLIPS = [
    ("    ingressClass: nginx", "   ingressClass: nginx", ":10:4: this line is indented differently from the keys or list items "
     "above it (the block that starts on line 5, column 3); indent each key as far as its siblings, with spaces"),
    ("    clusterIssuer: letsencrypt", "      clusterIssuer: letsencrypt", ":11:20: a `key: value` where a value was expected: "
     "a line indented deeper than the one above, or a value holding ': ' that needs quotes"),
    ("    ingressClass: nginx", "\tingressClass: nginx", ":10:1: a tab; YAML indents with spaces only"),
]


@pytest.mark.parametrize(("line", "slip", "expected"), YAML_SLIPS, ids=["dedented", "indented", "tab"])
def test_a_yaml_slip_is_one_line_with_file_line_and_column(tmp_path: Path, line: str, slip: str, expected: str) -> None:
    assert line in PROD.splitlines()[9:11]  # line 10 or 11 of Pulumi.prod.yaml
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(PROD.replace(line, slip, 1))
    result = render_cli("bad", "--stack-file", str(bad), "--out", str(tmp_path / "out"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"render bad: Pulumi.bad.yaml{expected}\n"


def test_a_yaml_slip_names_the_stack_file_as_it_can_be_opened(tmp_path: Path) -> None:
    """Under the folder the render runs in, the path from there (an editor or CI annotation opens it)."""
    folder = ROOT / "rendered" / f".yaml-slip-{tmp_path.name}"
    folder.mkdir(parents=True)
    try:
        bad = folder / "Pulumi.bad.yaml"
        bad.write_text(PROD.replace("    ingressClass: nginx", "   ingressClass: nginx", 1))
        result = render_cli("bad", "--stack-file", str(bad), "--out", str(tmp_path / "out"))
    finally:
        bad.unlink(missing_ok=True)
        folder.rmdir()
    assert result.stderr.startswith(f"render bad: rendered/{folder.name}/Pulumi.bad.yaml:10:4: this line is indented"), result.stderr


def test_a_mistyped_namespace_in_a_stack_file_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(PROD.replace("gpu-serving:models:", "gpu-servng:models:"))
    result = render_cli("bad", "--stack-file", str(bad), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stderr.startswith("render bad: config error: gpu-servng:models: unknown config namespace 'gpu-servng'"), result.stderr


# --- item 7: the secrets still to set ---------------------------------------------------------------


def test_the_render_ends_with_the_secrets_still_to_set(tmp_path: Path) -> None:
    result = render_cli("prod", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "needs: hfToken, sshPrivateKey, sshHostKeyWorker02, vllmApiKey, rolloutSalt "
        "(set each with `pulumi config set --secret <key>` before `pulumi up`)"
    )


def test_a_secret_set_in_the_stack_file_is_not_needed(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.set.yaml"
    stack.write_text(PROD + "  gpu-serving:hfToken:\n    secure: v1:abc:def\n  gpu-serving:sshPrivateKey:\n    secure: v1:abc:ghi\n")
    result = render_cli("set", "--stack-file", str(stack), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("needs: sshHostKeyWorker02, vllmApiKey, rolloutSalt (")
    every = {"hfToken": "x", "sshPrivateKey": "y", "sshHostKeyWorker02": "z", "vllmApiKey": "w", "rolloutSalt": "v"}
    assert run_program("prod", secret_values=every).missing_secrets == []


# --- item 8: a fresh folder, swapped in -------------------------------------------------------------


def test_a_renamed_node_leaves_no_stale_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert render_cli("prod", "--out", str(out)).returncode == 0
    renamed = tmp_path / "Pulumi.renamed.yaml"
    renamed.write_text(PROD.replace("k8s-worker-02", "k8s-worker-12"))
    assert render_cli("renamed", "--stack-file", str(renamed), "--out", str(out)).returncode == 0
    assert sorted(p.name for p in (out / "nodes").iterdir()) == ["k8s-worker-12"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.renamed.yaml", "out"]  # no temporary folder left


def test_a_failed_render_leaves_no_manifests_for_the_stack(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert render_cli("prod", "--out", str(out)).returncode == 0
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(PROD.replace("sizeGb: 1000", "sizeGb: -5"))
    result = render_cli("bad", "--stack-file", str(bad), "--out", str(out))
    assert result.returncode == 1
    assert not out.exists()


def test_a_mandatory_policy_violation_leaves_only_the_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    assert main(["prod", "--out", str(out)]) == 0
    monkeypatch.setattr(findings, "policy_config", lambda r: {"gpu-startup-probe": {"minStartupSeconds": 100_000}})
    assert main(["prod", "--out", str(out)]) == 1
    assert sorted(tree(out)) == ["policy.txt"]
    assert "mandatory gpu-startup-probe" in (out / "policy.txt").read_text()


def test_a_write_that_fails_half_way_leaves_the_previous_render(prod: Render, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    write(prod, out)
    before = tree(out)
    calls = []

    def failing(path: Path, text: str) -> Path:
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    monkeypatch.setattr(files, "_write", failing)
    with pytest.raises(OSError):
        write(prod, out)
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_folder_that_is_not_a_render_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = render_cli("prod", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "holds files but no previous render" in result.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("- a\n")
    assert render_cli("bad", "--stack-file", str(bad), "--out", str(tmp_path)).returncode == 1
    assert (tmp_path / "notes.txt").read_text() == "mine"


# --- item 9: the apply file ------------------------------------------------------------------------


def _documents(folder: Path) -> list[dict]:
    return list(yaml.safe_load_all((folder / "manifests.yaml").read_text()))


def test_manifests_follow_the_programs_dependencies(prod: Render, tmp_path: Path) -> None:
    write(prod, tmp_path)
    keys = [(d["kind"], d["metadata"]["name"]) for d in _documents(tmp_path)]
    assert keys[0] == ("Namespace", "ai")
    smoke = next(key for key in keys if key[1].startswith("vllm-qwen3-smoke-"))
    download = next(key for key in keys if key[1].startswith("vllm-qwen3-dl-"))
    # The complaint: the smoke-test Job came before the Deployment it tests.
    assert keys.index(download) < keys.index(("Deployment", "vllm-qwen3")) < keys.index(smoke), keys
    assert keys.index(("Service", "vllm-qwen3")) < keys.index(smoke), keys
    assert keys.index(("PersistentVolumeClaim", "models")) < keys.index(download), keys
    written = {r.urn: (r.inputs["kind"], r.inputs["metadata"]["name"]) for r in prod.kubernetes_resources()}
    for resource in prod.kubernetes_resources():
        me = written[resource.urn]
        for dep in resource.options.get("dependsOn", []):
            if dep in written and written[dep] in keys and me in keys:
                assert keys.index(written[dep]) < keys.index(me), f"{me} comes before {written[dep]}"


def test_the_apply_file_creates_no_secret_holding_a_placeholder(prod: Render, tmp_path: Path) -> None:
    write(prod, tmp_path)
    text = (tmp_path / "manifests.yaml").read_text()
    assert "[secret" not in text
    assert "Secret" not in {d["kind"] for d in _documents(tmp_path)}
    assert "#   Secret ai/vllm-qwen3-secrets (keys api-key, hf-token): kubectl -n ai create secret generic vllm-qwen3-secrets " \
           "--from-file=api-key=api-key.txt --from-file=hf-token=hf-token.txt\n" in text
    # Still declared, still in resources.json, still in the in-process view the e2e checks use.
    assert any(o["kind"] == "Secret" for o in prod.kubernetes_objects())
    assert any(r["type"] == "kubernetes:core/v1:Secret" for r in json.loads((tmp_path / "resources.json").read_text()))


def test_every_secret_bearing_object_is_left_out(render, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    models = yaml.safe_load(PROD)["config"]["gpu-serving:models"]
    # Without an API key (and so without a public ingress) the Secret holds the token alone.
    del models[0]["apiKeySecret"], models[0]["ingress"]
    result = render(models=models)
    write(result, tmp_path)
    text = (tmp_path / "manifests.yaml").read_text()
    assert "#   Secret ai/vllm-qwen3-secrets (keys hf-token): kubectl -n ai create secret generic vllm-qwen3-secrets " \
           "--from-file=hf-token=hf-token.txt\n" in text
    assert "[secret" not in text



@pytest.mark.parametrize("text", ["0" * 39 + "8", "08", "1e5", "0o17", "0X1F", "0b101", ".5e3", "1_000", "-7", "+3.0"])
def test_text_that_go_reads_as_a_number_is_quoted(text: str) -> None:
    # PyYAML (YAML 1.1) leaves these bare; Pulumi's and kubectl's Go YAML would read a number, and a
    # commit of digits only would lose its leading zeros before the program saw it.
    out = yaml.dump({"revision": text}, Dumper=ManifestDumper)
    assert out == f"revision: '{text}'\n"
    assert yaml.safe_load(out) == {"revision": text}


@pytest.mark.parametrize("text", ["main", "0a1b", "v1.2", "1.2.3", "org/model-008", "10.0.0.2"])
def test_other_text_stays_plain(text: str) -> None:
    assert yaml.dump({"k": text}, Dumper=ManifestDumper) == f"k: {text}\n"
