"""The offline render: what `make render` writes, that it is deterministic, valid and leaks no secret."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tools.render import ROOT, Render, run_program, write

KUBERNETES_VERSION = "1.37.0"
# Custom resources have no schema in kubernetes-validate; everything else is checked strictly.
# Custom resources: kubernetes-validate has no schema for them (tests/checkers.py checks them against their CRDs).
NO_SCHEMA = {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "PodMonitor"),
             ("monitoring.coreos.com/v1", "PrometheusRule"), ("gateway.networking.k8s.io/v1", "HTTPRoute")}


def render_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.render", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_render_writes_the_prod_files(tmp_path: Path) -> None:
    result = render_cli("prod", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert {"manifests.yaml", "resources.json", "outputs.json"} <= set(tree(tmp_path))
    objects = list(yaml.safe_load_all((tmp_path / "manifests.yaml").read_text()))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("PersistentVolume", "ai-models") in kinds
    assert ("PersistentVolumeClaim", "models") in kinds
    pv = next(o for o in objects if o["kind"] == "PersistentVolume")
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["k8s-worker-02"]
    assert f"{len(json.loads((tmp_path / 'resources.json').read_text()))} resources" in result.stdout


def test_two_renders_are_byte_identical(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert render_cli("prod", "--out", str(first)).returncode == 0
    assert render_cli("prod", "--out", str(second)).returncode == 0
    assert tree(first) == tree(second)
    assert len(tree(first)) >= 3


def test_in_process_renders_are_identical(prod: Render, tmp_path: Path) -> None:
    again = run_program("prod")
    write(prod, tmp_path / "a")
    write(again, tmp_path / "b")
    assert tree(tmp_path / "a") == tree(tmp_path / "b")


def test_bad_config_fails_with_one_line(tmp_path: Path) -> None:
    document = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    document["config"]["gpu-serving:nodes"][0]["storage"]["sizeGb"] = -5
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(yaml.safe_dump(document))
    result = render_cli("bad", "--stack-file", str(bad), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "render bad: config error: nodes[0].storage.sizeGb: Input should be greater than or equal to 1 (got -5)"
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_stack_file_is_one_line() -> None:
    result = render_cli("nosuchstack")
    assert result.returncode == 1
    assert result.stderr.startswith("render nosuchstack: no stack file Pulumi.nosuchstack.yaml (stacks here: ")
    assert "prod" in result.stderr


def test_manifests_are_valid_kubernetes(prod: Render) -> None:
    objects = prod.kubernetes_objects()
    assert objects
    checked = 0
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in NO_SCHEMA:
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 3


def test_validator_rejects_an_unknown_field(prod: Render) -> None:
    """The schema check is real: a misspelt field fails it."""
    pv = next(o for o in prod.kubernetes_objects() if o["kind"] == "PersistentVolume")
    pv["spec"]["reclaimPolicy"] = "Retain"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pv, KUBERNETES_VERSION, strict=True)


def test_every_kubernetes_object_is_named_and_uses_the_explicit_provider(prod: Render) -> None:
    for resource in prod.resources:
        if resource.custom and resource.type.startswith("kubernetes:"):
            assert resource.inputs["metadata"]["name"], resource.urn
            assert resource.options["provider"].endswith("pulumi:providers:kubernetes::kubernetes"), resource.urn
    providers = prod.of_type("pulumi:providers:kubernetes")
    assert [p.inputs.get("kubeconfig") for p in providers] == [".kube/prod.yaml"]
    assert providers[0].inputs.get("context") == "prod"


def test_render_yaml_to_needs_no_cluster(render, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # An operator's shell with KUBECONFIG set: the SDK would pass it on, and the provider refuses a
    # kubeconfig beside renderYamlToDirectory (found by `make e2e` adopt-ansible).
    monkeypatch.setenv("KUBECONFIG", "/home/operator/.kube/config")
    result = render(cluster={"namespace": "ai", "renderYamlTo": "out/yaml"})
    [provider] = result.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["renderYamlToDirectory"] == "out/yaml"
    assert not provider.inputs.get("kubeconfig")
    assert result.of_type("kubernetes:apps/v1:Deployment"), "objects are still declared, on the rendering provider"


def test_render_yaml_to_writes_no_secret_and_says_what_to_create(render) -> None:  # type: ignore[no-untyped-def]
    # The provider writes secret values in plain text into the folder: the Secret is left to the cluster.
    result = render(cluster={"namespace": "ai", "renderYamlTo": "out/yaml"})
    assert not result.of_type("kubernetes:core/v1:Secret")
    assert "hfToken" not in result.config.secret_keys()
    [warning] = [w for w in result.warnings if "renderYamlTo" in w]
    assert "Secret ai/vllm-qwen3-secrets (keys hf-token, api-key)" in warning
    assert ("kubectl -n ai create secret generic vllm-qwen3-secrets --from-file=hf-token=hf-token.txt "
            "--from-file=api-key=api-key.txt") in warning
    [job] = [j for j in result.of_type("kubernetes:batch/v1:Job") if "-dl-" in j.inputs["metadata"]["name"]]
    env = job.inputs["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "vllm-qwen3-secrets", "key": "hf-token"} in [e.get("valueFrom", {}).get("secretKeyRef") for e in env]


def test_components_have_the_project_type_tokens(prod: Render) -> None:
    components = {r.type for r in prod.resources if not r.custom}
    assert "gpu-serving:storage:ModelStorage" in components
    assert all(t.startswith("gpu-serving:") for t in components if not t.startswith("pulumi:"))


def test_secret_placeholders_stay_secret(render) -> None:  # type: ignore[no-untyped-def]
    canary = "CANARY-kubeconfig-7f3a"
    result = render(cluster={"namespace": "ai", "kubeconfig": {"secret": "kubeconfig"}}, secrets={"kubeconfig": canary})
    provider = result.of_type("pulumi:providers:kubernetes")[0]
    from tools.render import is_secret, redact

    assert is_secret(provider.inputs["kubeconfig"])
    assert redact(provider.inputs)["kubeconfig"] == "[secret]"
    out = json.dumps([redact(r.inputs) for r in result.resources]) + json.dumps(redact(result.outputs))
    assert canary not in out


@pytest.mark.parametrize("stack", ["prod", "lab", "fewgpus"])
def test_every_stack_renders_without_a_mandatory_policy_violation(stack: str, tmp_path: Path) -> None:
    result = render_cli(stack, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    policy = (tmp_path / "policy.txt").read_text()
    assert "mandatory " not in policy


def test_the_few_gpus_example_puts_three_models_on_two_cards(tmp_path: Path) -> None:
    """docs/few-gpus.md "Many models on few GPUs": one card time-sliced between a model always up and one held at zero,
    the other card whole for a base model with two adapters; every check and rule passes."""
    result = render_cli("fewgpus", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "policy.txt").read_text().strip() == ""
    objects = [o for o in yaml.safe_load_all((tmp_path / "manifests.yaml").read_text()) if o]
    gpus = {}
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        gpus[deployment["metadata"]["name"]] = {k: v for k, v in limits.items() if k.startswith("nvidia.com/")}
    assert gpus == {"vllm-qwen3-chat": {"nvidia.com/gpu.shared": "1"}, "vllm-qwen3-rare": {"nvidia.com/gpu.shared": "1"},
                    "vllm-qwen3-base": {"nvidia.com/gpu": "1"}}
    cards = {o["metadata"]["name"]: o["metadata"]["labels"] for o in objects if o["kind"] == "Node"}
    assert sum(int(labels["gpu-serving/gpu.count"]) for labels in cards.values()) == 2
    assert cards["gpu-shared-1"]["nvidia.com/device-plugin.config"].startswith("gpu-serving-time-slicing-")
    holds = [o for o in objects if o["kind"] == "InterceptorRoute"]
    assert [h["spec"]["target"]["service"] for h in holds] == ["vllm-qwen3-rare"]
    scaled = {o["metadata"]["name"]: o["spec"]["minReplicaCount"] for o in objects if o["kind"] == "ScaledObject"}
    assert scaled == {"vllm-qwen3-rare": 0}
    base = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "vllm-qwen3-base")
    args = base["spec"]["template"]["spec"]["containers"][0]["args"]
    modules = [a for a in args if "=/models/hub/models--acme--" in a]
    assert "--enable-lora" in args and [m.split("=", 1)[0] for m in modules] == ["qwen3-sql", "qwen3-support"]


def test_a_mandatory_policy_violation_fails_the_render(tmp_path: Path) -> None:
    """A stack the config accepts but the pack refuses: the render must stop, pointing at policy.txt."""
    from tools.render import findings, main

    original = findings.policy_config
    try:
        # A cluster whose policy demands a longer startup probe than any model here has.
        findings.policy_config = lambda r: {"gpu-startup-probe": {"minStartupSeconds": 100_000}}  # type: ignore[assignment]
        assert main(["prod", "--out", str(tmp_path)]) == 1
    finally:
        findings.policy_config = original  # type: ignore[assignment]
    assert "mandatory gpu-startup-probe" in (tmp_path / "policy.txt").read_text()


def test_every_object_applied_to_a_cluster_takes_its_fields_back_from_a_hand_edit(render: Callable[..., Render], prod: Render) -> None:
    """Server-side apply refuses a field a `kubectl patch` now owns unless the apply forces it: every
    object the stack applies carries `pulumi.com/patchForce`, so `pulumi up` restores what it declares.
    YAML written with `renderYamlTo` (applied by someone else) carries no such Pulumi-only annotation."""
    applied = prod.kubernetes_resources()
    assert len({r.type for r in applied}) >= 8
    unforced = [r.urn for r in applied if (r.inputs["metadata"].get("annotations") or {}).get("pulumi.com/patchForce") != "true"]
    assert not unforced, f"objects a hand edit would lock out of `pulumi up`: {unforced}"
    cluster = {**yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"], "renderYamlTo": "out"}
    del cluster["kubeconfig"]
    written = [r for r in render(cluster=cluster).kubernetes_resources() if not r.type.endswith("Patch")]
    assert written and not [r.urn for r in written if "pulumi.com/patchForce" in (r.inputs["metadata"].get("annotations") or {})]
