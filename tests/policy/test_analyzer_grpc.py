"""Drive the pack the way `pulumi preview --policy-pack policy` does.

The CLI starts `python -u -m pulumi.policy <engine-address> .` inside policy/
(pulumi-analyzer-policy-python), reads the port the pack prints on stdout and
talks to the Analyzer gRPC service.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from policy_factory import good
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

POLICY_DIR = Path(__file__).resolve().parents[2] / "policy"
UNKNOWN_NUMBER = "3eeb2bf0-c639-47a8-9e75-3b44932eb421"
UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


@pytest.fixture(scope="module")
def analyzer():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "."],
        cwd=POLICY_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    try:
        port = proc.stdout.readline().decode().strip()
        assert port.isdigit(), proc.stderr.read().decode() if proc.poll() is not None else port
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=10)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def analyze(stub, type_, name, props, secret_outputs=()):
    request = analyzer_pb2.AnalyzeRequest(
        type=type_, name=name, urn=f"urn:pulumi:prod::gpu-serving::{type_}::{name}", properties=struct(props),
        options=analyzer_pb2.AnalyzerResourceOptions(additionalSecretOutputs=list(secret_outputs)),
    )
    return stub.Analyze(request).diagnostics


def test_analyzer_info_lists_every_rule(analyzer):
    from policy.rules import ALL_RULES

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "gpu-serving"
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert levels == {r.name: (analyzer_pb2.MANDATORY if r.level == "mandatory" else analyzer_pb2.ADVISORY)
                      for r in ALL_RULES}
    startup = next(p for p in info.policies if p.name == "gpu-startup-probe")
    assert startup.configSchema.properties["minStartupSeconds"]["default"] == 600


def test_analyze_reports_latest_image(analyzer):
    deployment = good("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:latest"
    diagnostics = analyze(analyzer, "kubernetes:apps/v1:Deployment", "vllm", deployment)
    assert [(d.policyName, d.enforcementLevel) for d in diagnostics] == [("vllm-image-pinned", analyzer_pb2.MANDATORY)]
    assert ":latest" in diagnostics[0].message


def test_unknowns_during_preview_give_no_diagnostic(analyzer):
    deployment = good("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["image"] = UNKNOWN_STRING
    container["resources"]["limits"]["nvidia.com/gpu"] = UNKNOWN_NUMBER
    deployment["spec"]["template"]["spec"]["tolerations"] = [UNKNOWN_STRING]
    assert list(analyze(analyzer, "kubernetes:apps/v1:Deployment", "vllm", deployment)) == []


def test_analyze_sees_additional_secret_outputs(analyzer):
    props = {"connection": {"host": "10.0.0.2", "hostKey": "ssh-ed25519 AAAA"},
             "create": "echo $HF_TOKEN | huggingface-cli login --token-stdin"}
    missing = analyze(analyzer, "command:remote:Command", "login", props)
    assert [d.policyName for d in missing] == ["command-secret-outputs"]
    assert list(analyze(analyzer, "command:remote:Command", "login", props, ["stdout", "stderr"])) == []


def test_analyze_stack_checks_capacity(analyzer):
    deployment = good("Deployment")
    deployment["spec"]["replicas"] = 3
    node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                                                    "nvidia.com/gpu.count": "4"}}}
    urn = "urn:pulumi:prod::gpu-serving::kubernetes:apps/v1:Deployment::vllm"
    resources = [
        analyzer_pb2.AnalyzerResource(type="kubernetes:apps/v1:Deployment", name="vllm", urn=urn,
                                      properties=struct(deployment)),
        analyzer_pb2.AnalyzerResource(type="kubernetes:core/v1:NodePatch", name="n1", urn="urn:n1",
                                      properties=struct(node)),
    ]
    diagnostics = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources)).diagnostics
    assert [(d.policyName, d.urn) for d in diagnostics] == [("gpu-capacity", urn)]
    assert "want 6 but the stack's nodes declare only 4" in diagnostics[0].message
