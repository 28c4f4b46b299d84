"""Issue 23: values the config accepted but the other end refuses or misreads. Each case is the prod
stack with one mistake, refused at load in one line that names the key path and what to write instead."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from stacks.config import ConfigError, parse
from stacks.config.load import MAX_REFUSAL
from stacks.config.secrets import looks_like_secret_value
from tests.test_config import error_of, prod_raw, with_change
from tools.render import ROOT, RenderError, run_program

PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfTheNode"


def second_model(**ingress: Any) -> dict[str, Any]:
    """Prod with a second model (one replica each, so the GPUs fit) exposed with `ingress`."""
    raw = prod_raw()
    raw["models"][0]["replicas"] = {"min": 1, "max": 1}
    other = copy.deepcopy(raw["models"][0])
    other.update(name="qwen3-b", ingress=ingress)
    raw["models"].append(other)
    return raw


def second_node(**changes: Any) -> dict[str, Any]:
    """Prod with a second GPU machine, `changes` merged into its `ssh` and `storage`."""
    raw = prod_raw()
    node = copy.deepcopy(raw["nodes"][0])
    node["name"] = "k8s-worker-03"
    node["ssh"] = {"host": "k8s-worker-03", "user": "root", "hostKeySecret": "sshHostKeyWorker03", **changes.get("ssh", {})}
    node["storage"] = {**node["storage"], "disks": ["/dev/sdc", "/dev/sdd"], **changes.get("storage", {})}
    raw["nodes"].append(node)
    return raw


def gitops(folder: str) -> dict[str, Any]:
    raw = prod_raw()
    raw["cluster"].pop("kubeconfig")
    raw["cluster"]["renderYamlTo"] = folder
    return raw


def one_serial_on_two_nodes() -> dict[str, Any]:
    """The disk one node knows as ata-… listed under another as scsi-SATA_… (one serial)."""
    raw = second_node(storage={"disks": ["/dev/disk/by-id/scsi-SATA_ST4000NM0035_ZC1AAAAA", "/dev/sdd"]})
    raw["nodes"][0]["storage"]["disks"] = ["/dev/disk/by-id/ata-ST4000NM0035_ZC1AAAAA", "/dev/disk/by-id/ata-ST4000NM0035_ZC1BBBBB"]
    return raw


# (the stack with one mistake, the key path named, words of the fix)
REFUSED = [
    # the same secret config key in two roles
    ("api key is the HF token key", with_change("models.0.apiKeySecret", "hfToken"), "models[0].apiKeySecret",
     "'hfToken' is already hfTokenSecret (the Hugging Face token)"),
    ("host key is the private key", with_change("nodes.0.ssh.hostKeySecret", "sshPrivateKey"), "nodes[0].ssh.hostKeySecret",
     "'sshPrivateKey' is already nodes[0].ssh.privateKeySecret (an SSH private key)"),
    ("private key is the HF token key", with_change("nodes.0.ssh.privateKeySecret", "hfToken"), "nodes[0].ssh.privateKeySecret",
     "give nodes[0].ssh.privateKeySecret a key of its own"),
    ("one host key for two machines", second_node(ssh={"hostKeySecret": "sshHostKeyWorker02"}), "nodes[1].ssh.hostKeySecret",
     "is already nodes[0].ssh.hostKeySecret (the SSH host key of k8s-worker-02)"),
    ("kubeconfig is the API key", with_change("cluster.kubeconfig", {"secret": "vllmApiKey"}), "models[0].apiKeySecret",
     "'vllmApiKey' is already cluster.kubeconfig.secret (the kubeconfig)"),
    # a secret's value where its key name goes (never repeated in the line)
    ("HF token pasted as its name", with_change("hfTokenSecret", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"), "hfTokenSecret",
     "looks like the secret's value, not the name of a secret config key"),
    ("API key pasted as its name", with_change("models.0.apiKeySecret", "sk-Q2x9LmT4vB8nR1kZ7pW3yH6c"), "models[0].apiKeySecret",
     "write that name here"),
    ("hex API key pasted as its name", with_change("models.0.apiKeySecret", "f39a0c1be4d27a6f58b0c3e1d9a47f20"), "models[0].apiKeySecret",
     "looks like the secret's value"),
    ("base64 key pasted as its name", with_change("models.0.apiKeySecret", "dGhpcyBpcyBub3Qg+YSBuYW1l/Zm9yIGEga2V5=="),
     "models[0].apiKeySecret", "the value given is not one, and is not repeated here"),
    # a credential written as a literal where it would land in the manifest (never repeated)
    ("HF token as --hf-token", with_change("models.0.extraArgs", ["--hf-token=hf_AbCdEfGhIjKlMnOpQrSt"]), "models[0].extraArgs[0]",
     "holds what looks like a credential"),
    ("API key in a header flag",
     with_change("models.0.extraArgs", ["--max-num-seqs=8", "--header=Authorization: Bearer sk-proj-abcdefghijklmnop"]),
     "models[0].extraArgs[1]", "the bundle passes the HF token from hfTokenSecret"),
    ("HF token as an env value", with_change("models.0.env", {"MY_HUB": "hf_AbCdEfGhIjKlMnOpQrSt"}), "models[0].env",
     "MY_HUB: its value looks like a credential"),
    # values the receiving side refuses or misreads
    ("IP as Ingress host", with_change("models.0.ingress.host", "192.168.10.20"), "models[0].ingress.host",
     "an IP address; Kubernetes accepts only a DNS name as an Ingress host"),
    ("ingress path ending in /v1", with_change("models.0.ingress.path", "/qwen/v1"), "models[0].ingress.path",
     "ends in /v1, which the edge appends itself (clients would need /qwen/v1/v1/...); write /qwen"),
    ("ingress path /v1/", with_change("models.0.ingress.path", "/v1/"), "models[0].ingress.path", "write /"),
    ("Prometheus URL with the API path", with_change("cluster.prometheusUrl", "http://prometheus-operated.monitoring.svc:9090/api/v1"),
     "cluster.prometheusUrl", "KEDA appends itself (/api/v1/query); give the server's base URL, e.g. http://prometheus-operated.monitoring.svc:9090"),
    ("Prometheus URL with the query path", with_change("cluster.prometheusUrl", "http://prom.monitoring.svc:9090/api/v1/query"),
     "cluster.prometheusUrl", "e.g. http://prom.monitoring.svc:9090"),
    ("Prometheus on loopback", with_change("cluster.prometheusUrl", "http://localhost:9090"), "cluster.prometheusUrl",
     "points at localhost, but KEDA's operator queries it from its own pod"),
    ("Prometheus on 127.0.0.1", with_change("cluster.prometheusUrl", "http://127.0.0.1:9090"), "cluster.prometheusUrl", "loopback"),
    ("auth service on loopback", with_change("models.0.ingress.authUrl", "http://127.0.0.1:4180/oauth2/auth"), "models[0].ingress.authUrl",
     "the ingress-nginx controller calls it from its own pod"),
    ("NFS server with a port",
     with_change("modelStorage", {"type": "nfs", "server": "nas.lan:2049", "path": "/export/models", "sizeGi": 500}),
     "modelStorage.server", "'nas.lan:2049' includes a port; write server: nas.lan"),
    ("NFS server on loopback", with_change("modelStorage", {"type": "nfs", "server": "127.0.0.1", "path": "/export", "sizeGi": 500}),
     "modelStorage.server", "every node would mount itself"),
    ("one TLS secret for two hosts under cert-manager", second_model(host="b.primer.rs", tlsSecret="ai-tls"),
     "models[1].ingress.tlsSecret", "'ai-tls' already holds the certificate cert-manager issues for ai.primer.rs (models[0])"),
    # moving image tags, on every image the stack deploys
    ("vLLM nightly", with_change("models.0.image", "vllm/vllm-openai:nightly"), "models[0].image", "not a release version"),
    ("vLLM release line", with_change("models.0.image", "vllm/vllm-openai:v0.11"), "models[0].image", "pin a release such as"),
    ("vLLM main", with_change("models.0.image", "vllm/vllm-openai:main"), "models[0].image", "or a digest"),
    ("vLLM major only", with_change("models.0.image", "vllm/vllm-openai:v0"), "models[0].image", "not a release version"),
    ("vLLM with a scheme", with_change("models.0.image", "docker://vllm/vllm-openai:v0.11.0"), "models[0].image",
     "has no scheme; write vllm/vllm-openai:v0.11.0"),
    ("device plugin latest", with_change("cluster.devicePlugin", {"enabled": True, "image": "nvcr.io/nvidia/k8s-device-plugin:latest"}),
     "cluster.devicePlugin.image", "not pinned"),
    ("device plugin stable", with_change("cluster.devicePlugin", {"image": "nvcr.io/nvidia/k8s-device-plugin:stable"}),
     "cluster.devicePlugin.image", "not a release version"),
    ("device plugin untagged", with_change("cluster.devicePlugin", {"image": "nvcr.io/nvidia/k8s-device-plugin"}),
     "cluster.devicePlugin.image", "must be an image with a pinned tag or digest"),
    # an SSH user the steps cannot work as
    ("SSH user ubuntu", with_change("nodes.0.ssh.user", "ubuntu"), "nodes[0].ssh.user", "do not use sudo; log in as root"),
    # outputs where the project's own tooling wipes them
    ("renderYamlTo inside rendered/", gitops("rendered/gitops"), "cluster.renderYamlTo",
     "lies inside rendered/, which `make clean` removes and `make render` replaces"),
    ("renderYamlTo rendered/ by a detour", gitops("gitops/../rendered"), "cluster.renderYamlTo", "lies inside rendered/"),
    ("renderYamlTo inside bench-out/", gitops("./bench-out/yaml"), "cluster.renderYamlTo", "lies inside bench-out/"),
    # one physical disk on two nodes, or twice on one
    ("one WWN on two nodes", second_node(storage={"disks": ["/dev/sdc", "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"]}),
     "nodes[1].storage.disks[1]", "the same physical disk (WWN 5000c500a1b2c3d4) as nodes[0].storage.disks[0] on k8s-worker-02"),
    ("one WWN, SCSI name, on two nodes", second_node(storage={"disks": ["/dev/disk/by-id/scsi-35000c500a1b2c3d5", "/dev/sdd"]}),
     "nodes[1].storage.disks[0]", "as nodes[0].storage.disks[1]"),
    ("one serial on two nodes", one_serial_on_two_nodes(), "nodes[1].storage.disks[0]", "(serial ZC1AAAAA) as nodes[0].storage.disks[0]"),
    ("one serial twice on one node", with_change("nodes.0.storage.disks", ["/dev/disk/by-id/ata-ST4000NM0035_ZC1AAAAA",
                                                                         "/dev/disk/by-id/scsi-SATA_ST4000NM0035_ZC1AAAAA"]),
     "nodes[0].storage.disks[1]", "are one physical disk (serial ZC1AAAAA: two paths to one device)"),
]


@pytest.mark.parametrize(("name", "raw", "key_path", "words"), REFUSED, ids=[c[0] for c in REFUSED])
def test_each_mistake_is_one_line_naming_the_key(name: str, raw: dict[str, Any], key_path: str, words: str) -> None:
    message = error_of(raw)
    assert message.startswith(f"{key_path}: "), message
    assert words in message, message
    # One line, and whole: a refusal over 300 characters (the device plugin's `stable`) is no longer cut mid-word (issue 39).
    assert "\n" not in message and len(message) <= MAX_REFUSAL and "…" not in message, message


@pytest.mark.parametrize("args", [["--api-key=sk-secret-123456"], ["--hf-token", "hf_AbCdEfGhIjKlMnOpQrSt"],
                                  ["--hf-token=hf_AbCdEfGhIjKlMnOpQrSt"]])
def test_a_secret_flag_is_refused_without_its_value(args: list[str]) -> None:
    message = error_of(with_change("models.0.extraArgs", args))
    assert message.startswith("models[0].extraArgs["), message
    assert "sk-secret" not in message and "hf_AbC" not in message, message


@pytest.mark.parametrize("value", ["hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "dGhpcyBpcyBub3Qg+YSBuYW1l/Zm9yIGEga2V5==",
                                   "3f9a0c1be4d27a6f58b0c3e1d9a47f20", "-----BEGIN OPENSSH PRIVATE KEY-----"])
def test_a_pasted_secret_is_never_repeated_in_the_error(value: str) -> None:
    for path in ("hfTokenSecret", "models.0.apiKeySecret", "nodes.0.ssh.hostKeySecret", "cluster.kubeconfig.secret"):
        raw = with_change(path, value) if path != "cluster.kubeconfig.secret" else with_change("cluster.kubeconfig", {"secret": value})
        message = error_of(raw)
        assert value not in message and value[:12] not in message, message


# --- what still loads: the checks are not a blanket refusal ---------------------------------------------

ACCEPTED = [
    ("two models share one API key", second_model(host="b.primer.rs", tlsSecret="b-tls")),
    ("two paths on one host share its secret", second_model(host="ai.primer.rs", path="/b", tlsSecret="ai-tls")),
    ("one secret for two hosts without cert-manager", (lambda r: (r["cluster"].pop("clusterIssuer"), r)[1])(
        second_model(host="b.primer.rs", tlsSecret="ai-tls"))),
    ("kernel disk names repeat across machines", second_node(storage={"disks": ["/dev/sda", "/dev/sdb"]})),
    ("by-path names repeat across machines", second_node(storage={"disks": ["/dev/disk/by-path/pci-0000:00:1f.2-ata-1",
                                                                           "/dev/disk/by-path/pci-0000:00:1f.2-ata-2"]})),
    ("Prometheus under a route prefix", with_change("cluster.prometheusUrl", "http://prometheus.monitoring.svc:9090/prometheus")),
    ("IP Prometheus in the cluster", with_change("cluster.prometheusUrl", "http://10.96.0.50:9090")),
    ("NFS server by IP", with_change("modelStorage", {"type": "nfs", "server": "10.0.0.9", "path": "/export", "sizeGi": 500})),
    ("NFS server by IPv6", with_change("modelStorage", {"type": "nfs", "server": "fd00::9", "path": "/export", "sizeGi": 500})),
    ("ingress path containing v1 in a word", with_change("models.0.ingress.path", "/v1beta")),
    ("vLLM release with suffix", with_change("models.0.image", "vllm/vllm-openai:v0.11.0-cu126")),
    ("vLLM four-part release", with_change("models.0.image", "vllm/vllm-openai:v0.10.1.1")),
    ("vLLM by digest", with_change("models.0.image", "vllm/vllm-openai@sha256:" + "a" * 64)),
    ("device plugin release", with_change("cluster.devicePlugin", {"image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0-ubi9"})),
    ("renderYamlTo outside", gitops("gitops")),
    ("renderYamlTo named like rendered", gitops("rendered-gitops")),
    ("long camelCase key names", with_change("models.0.apiKeySecret", "vllmApiKeyForTheProductionQwen3Model")),
    ("key names with a number", with_change("nodes.0.ssh.hostKeySecret", "sshHostKeyWorker02Rack3")),
    ("ordinary env values and flags", with_change("models.0", {**prod_raw()["models"][0],
     "env": {"VLLM_LOGGING_LEVEL": "DEBUG", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "GIT_SHA": "0123456789abcdef" * 2},
     "extraArgs": ["--max-num-seqs=64", "--seed", "-1", "--chat-template", "{{ messages }}", "--kv-cache-dtype=fp8"]})),
]


@pytest.mark.parametrize(("name", "raw"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_the_right_way_still_loads(name: str, raw: dict[str, Any]) -> None:
    parse(raw)


@pytest.mark.parametrize("name", ["hfToken", "vllmApiKey", "sshHostKeyWorker02", "sshPrivateKey", "kubeconfigProd",
                                  "HF_TOKEN_PRODUCTION_2026", "apiKey-qwen3-8b-awq-v2"])
def test_key_names_are_not_taken_for_values(name: str) -> None:
    assert not looks_like_secret_value(name)


# --- secret values of the wrong kind (checked where the program reads them, never printed) ----------------

WRONG_VALUES = [
    ({"sshHostKeyWorker02": PRIVATE_KEY}, "nodes[0].ssh.hostKeySecret: the secret sshHostKeyWorker02 holds an SSH private key"),
    ({"sshPrivateKey": HOST_KEY}, "nodes[0].ssh.privateKeySecret: the secret sshPrivateKey holds an SSH public key"),
    ({"vllmApiKey": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"}, "models[0].apiKeySecret: the secret vllmApiKey holds a Hugging Face token"),
    ({"hfToken": PRIVATE_KEY}, "hfTokenSecret: the secret hfToken holds an SSH key, not the Hugging Face token"),
    ({"hfToken": "one-credential-42", "vllmApiKey": "one-credential-42"},
     "models[0].apiKeySecret: the secret vllmApiKey holds the same value as hfToken (hfTokenSecret)"),
]


@pytest.mark.parametrize(("values", "expected"), WRONG_VALUES,
                         ids=[e.split(":")[0] + " " + e.split("holds ")[1][:20] for _, e in WRONG_VALUES])
def test_a_secret_of_the_wrong_kind_is_refused_without_its_value(values: dict[str, str], expected: str) -> None:
    with pytest.raises(RenderError) as caught:
        run_program("prod", secret_values=values)
    message = str(caught.value)
    assert message.startswith(f"config error: {expected}"), message
    for value in values.values():
        assert value.strip()[:12] not in message


def test_the_right_secret_values_render() -> None:
    values = {"sshPrivateKey": PRIVATE_KEY, "sshHostKeyWorker02": HOST_KEY, "hfToken": "hf_x" * 9, "vllmApiKey": "k" * 32}
    assert run_program("prod", secret_values=values).of_type("kubernetes:apps/v1:Deployment")


# --- a duplicate key in the stack file: refused as the Pulumi CLI refuses it ----------------------------------

PROD = (ROOT / "Pulumi.prod.yaml").read_text()
DUPLICATES = [
    (PROD.replace("    namespace: ai\n", "    namespace: ai\n    namespace: ai-test\n", 1), "gpu-serving:cluster.namespace"),
    (re.sub(r"^(      revision: \S+\n)", r"\1      revision: abc123\n", PROD, count=1, flags=re.M), "gpu-serving:models[0].revision"),
    (PROD.replace("        count: 2\n", "        count: 2\n        count: 4\n", 1), "gpu-serving:nodes[0].gpu.count"),
    (PROD + "  gpu-serving:modelStorage:\n    type: local\n    node: k8s-worker-02\n", "gpu-serving:modelStorage"),
    (PROD + "config:\n  gpu-serving:models: []\n", "config"),
]


@pytest.mark.parametrize(("text", "key"), DUPLICATES, ids=[k for _, k in DUPLICATES])
def test_a_duplicate_key_in_the_stack_file_is_refused_naming_it(tmp_path: Path, text: str, key: str) -> None:
    stack_file = tmp_path / "Pulumi.dup.yaml"
    stack_file.write_text(text)
    with pytest.raises(RenderError) as caught:
        run_program("dup", stack_file=stack_file)
    message = str(caught.value)
    assert message.startswith("Pulumi.dup.yaml line "), message
    assert f": {key} is given twice (first on line " in message, message
    assert message.endswith("the Pulumi CLI refuses a duplicate key: keep one of them")


def test_the_same_key_in_two_mappings_is_no_duplicate(tmp_path: Path) -> None:
    stack_file = tmp_path / "Pulumi.two.yaml"
    stack_file.write_text(PROD)  # `name:` appears under nodes[0] and models[0], `type:` and `node:` in several places
    assert run_program("two", stack_file=stack_file).of_type("kubernetes:apps/v1:Deployment")


def test_prod_and_lab_pass_every_check() -> None:
    for stack in ("prod", "lab"):
        try:
            run_program(stack)
        except (RenderError, ConfigError) as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{stack}: {exc}")


# --- a URL pasted where a part of it belongs: the hint says which part -------------------------------------

URL_HINTS = [
    ("models.0.huggingFaceId", "https://huggingface.co/Qwen/Qwen3-8B-AWQ", "give the repository id alone, e.g. Qwen/Qwen3-8B-AWQ"),
    ("models.0.huggingFaceId", "https://huggingface.co/Qwen/Qwen3-8B-AWQ/tree/main",
     "give the repository id alone, e.g. Qwen/Qwen3-8B-AWQ"),
    ("models.0.revision", "https://huggingface.co/Qwen/Qwen3-8B-AWQ/tree/v1.0", "give the revision alone, e.g. v1.0"),
    ("models.0.revision", "https://huggingface.co/Qwen/Qwen3-8B-AWQ/commit/0123abc", "give the revision alone, e.g. 0123abc"),
    ("models.0.revision", "https://huggingface.co/Qwen/Qwen3-8B-AWQ", "give the branch, tag or commit alone, e.g. main"),
    ("models.0.ingress.host", "https://ai.primer.rs/qwen", "give the host alone, e.g. ai.primer.rs"),
    ("nodes.0.ssh.host", "ssh://root@k8s-worker-02:22", "give the host alone, e.g. k8s-worker-02"),
]


@pytest.mark.parametrize(("path", "value", "hint"), URL_HINTS, ids=[f"{p}={v}" for p, v, _ in URL_HINTS])
def test_a_pasted_url_gets_the_hint_of_its_key(path: str, value: str, hint: str) -> None:
    message = error_of(with_change(path, value))
    assert message.startswith(path.replace(".0.", "[0].") + ": "), message
    assert message.endswith(f"; {hint})"), message
    if "host" not in path:
        assert "give the host alone" not in message


def test_failure_modes_quotes_the_real_lines(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "failure-modes.md").read_text()
    stack_file = tmp_path / "Pulumi.prod.yaml"
    stack_file.write_text(DUPLICATES[1][0])
    with pytest.raises(RenderError) as caught:
        run_program("prod", stack_file=stack_file)
    lines = [
        f"render prod: {caught.value}",
        error_of(with_change("models.0.apiKeySecret", "hfToken")),
        error_of(with_change("models.0.ingress.path", "/qwen/v1")),
        error_of(second_model(host="b.primer.rs", tlsSecret="ai-tls")),
        error_of(second_node(storage={"disks": ["/dev/sdc", "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"]})).split("; ")[0],
        error_of(with_change("models.0.image", "vllm/vllm-openai:nightly")).split(" (vllm/vllm-openai@")[0],
    ]
    for line in lines:
        assert line in doc, line
