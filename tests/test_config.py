"""Stack config validation: good configs load, bad ones fail with the key path that is wrong."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from stacks.config import ConfigError, StackConfig, parse, usable_gib
from tools.render import ROOT


def prod_raw() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in document.items()}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """The prod config with one value replaced (or deleted when value is DELETE). Path like `nodes.0.gpu.count`."""
    raw = copy.deepcopy(prod_raw())
    *parents, last = path.split(".")
    target: Any = raw
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del target[key]
    else:
        target[key] = value
    return raw


class _Delete:
    """The key is removed (its repr names it: test ids must be the same in every pytest worker)."""

    def __repr__(self) -> str:
        return "<deleted>"


DELETE = _Delete()


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    return str(caught.value)


def test_prod_config_loads_with_the_seed_values() -> None:
    stack = parse(prod_raw())
    node = stack.nodes[0]
    assert node.name == "k8s-worker-02"
    assert node.storage is not None
    assert node.storage.disks == ["/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", "/dev/disk/by-id/wwn-0x5000c500a1b2c3d5"]
    assert node.storage.size_gb == 1000
    assert node.storage.mountpoint == "/mnt/ollama-models"
    assert node.storage.device == "/dev/md/models"
    assert stack.cluster.namespace == "ai"
    assert stack.model_storage.type == "local"
    assert [m.name for m in stack.models] == ["qwen3"]


def test_defaults_come_from_the_models() -> None:
    stack = parse(prod_raw())
    assert stack.cluster.gpu_taint.key == "nvidia.com/gpu"
    assert stack.cluster.gpu_taint.effect == "NoSchedule"
    assert stack.nodes[0].ssh.port == 22
    assert stack.nodes[0].ssh.private_key_secret == "sshPrivateKey"
    assert stack.hf_token_secret == "hfToken"


def test_secret_keys_are_listed_once_in_a_stable_order() -> None:
    stack = parse(prod_raw())
    assert stack.secret_keys() == ["hfToken", "sshPrivateKey", "sshHostKeyWorker02", "vllmApiKey", "rolloutSalt"]
    raw = prod_raw()
    raw["cluster"]["kubeconfig"] = {"secret": "kubeconfig"}
    assert parse(raw).secret_keys() == ["hfToken", "kubeconfig", "sshPrivateKey", "sshHostKeyWorker02", "vllmApiKey", "rolloutSalt"]


def test_node_without_disks_does_no_disk_work() -> None:
    raw = prod_raw()
    raw["nodes"].append({"name": "k8s-worker-03", "ssh": {"host": "10.0.0.3"}, "gpu": {"product": "nvidia-a100", "count": 1},
                         "storage": {"disks": []}})
    raw["nodes"].append({"name": "k8s-worker-04", "ssh": {"host": "10.0.0.4"}, "gpu": {"product": "nvidia-a100", "count": 1}})
    stack = parse(raw)
    assert [n.prepares_disks for n in stack.nodes] == [True, False, False]


@pytest.mark.parametrize(
    ("size_gb", "gib"),
    [(1000, 912), (1, 0), (2, 1), (4000, 3650)],
)
def test_capacity_is_derived_from_the_partition(size_gb: int, gib: int) -> None:
    assert usable_gib(size_gb) == gib


def test_capacity_never_exceeds_the_partition() -> None:
    for size_gb in (1, 3, 10, 100, 999, 1000, 12345):
        assert usable_gib(size_gb) * 2**30 < size_gb * 10**9


# Each bad input: (what to change, new value, the key path the error must name, a word the message must contain).
BAD_INPUTS = [
    ("cluster.namespace", "AI", "cluster.namespace", "Kubernetes name"),
    ("cluster.namespace", "x" * 64, "cluster.namespace", "at most 63"),
    ("cluster.kubeconfig", {}, "cluster.kubeconfig", "exactly one"),
    ("cluster.kubeconfig", {"path": "a", "secret": "b"}, "cluster.kubeconfig", "exactly one"),
    ("cluster.kubeconfig", {"path": "~/.kube/config"}, "cluster.kubeconfig.path", "got '~/.kube/config'"),
    ("cluster.kubeconfig", DELETE, "cluster.kubeconfig", "renderYamlTo"),
    ("cluster.renderYamlTo", "out/yaml", "cluster.kubeconfig", "talks to no cluster"),
    ("cluster.autoscaling", "cpu", "cluster.autoscaling", "'hpa', 'keda' or 'none'"),
    ("cluster.gpuTaint", {"key": "nvidia.com/gpu", "effect": "Sometimes"}, "cluster.gpuTaint.effect", "NoSchedule"),
    ("cluster.ingressClas", "nginx", "cluster.ingressClas", "unknown key"),
    ("nodes", [], "nodes", "at least 1"),
    ("nodes.0.name", "K8S_worker", "nodes[0].name", "node name"),
    ("nodes.0.ssh.port", 70000, "nodes[0].ssh.port", "65535"),
    ("nodes.0.ssh.port", "twenty-two", "nodes[0].ssh.port", "integer"),
    ("nodes.0.ssh", {"user": "root"}, "nodes[0].ssh.host", "required"),
    ("nodes.0.ssh.host", "host; rm -rf /", "nodes[0].ssh.host", "got"),
    ("nodes.0.gpu.count", 0, "nodes[0].gpu.count", "greater than or equal to 1"),
    ("nodes.0.storage.sizeGb", -5, "nodes[0].storage.sizeGb", "greater than or equal to 1"),
    ("nodes.0.storage.sizeGb", 1.5, "nodes[0].storage.sizeGb", "integer"),
    ("nodes.0.storage.disks", ["/dev/sda"], "nodes[0].storage.disks", "exactly 2"),
    ("nodes.0.storage.disks", ["/dev/sda", "/dev/sda"], "nodes[0].storage.disks", "must differ"),
    ("nodes.0.storage.disks", ["/dev/sda", "/dev/sd b"], "nodes[0].storage.disks[1]", "no spaces"),
    ("nodes.0.storage.disks", ["/dev/sda", "/dev/sdb", "/dev/sdc"], "nodes[0].storage.disks", "at most 2"),
    ("nodes.0.storage.disks", ["/dev/sda", "$(reboot)"], "nodes[0].storage.disks[1]", "absolute path"),
    ("nodes.0.storage.mountpoint", "/var", "nodes[0].storage.mountpoint", "system directory"),
    ("nodes.0.storage.mountpoint", "relative/dir", "nodes[0].storage.mountpoint", "absolute path"),
    ("nodes.0.storage.mountpoint", "/mnt/a/../b", "nodes[0].storage.mountpoint", "normalised"),
    ("nodes.0.storage.raidName", "md/1", "nodes[0].storage.raidName", "mdadm array name"),
    ("nodes.0.storage.filesystem", "ext4", "nodes[0].storage.filesystem", "'xfs'"),
    ("nodes.0.containerRuntime", "docker", "nodes[0].containerRuntime", "containerd"),
    ("modelStorage.type", "hostpath", "modelStorage.type", "'local', 'nfs', 'storageClass'"),
    ("modelStorage.node", "k8s-worker-09", "modelStorage.node", "not a configured node"),
    ("modelStorage", {"type": "nfs", "server": "nas", "path": "/export/models"}, "modelStorage.sizeGi", "required"),
    ("models.0.name", "Qwen3", "models[0].name", "Kubernetes name"),
    ("models.0.image", "vllm/vllm-openai:latest", "models[0].image", "not pinned"),
    ("models.0.image", "vllm/vllm-openai", "models[0].image", "got 'vllm/vllm-openai'"),
    ("models.0.gpuProduct", "nvidia-h100", "models[0].gpuProduct", "matches no node"),
    ("models.0.gpusPerReplica", 4, "models[0].gpusPerReplica", "one pod cannot span nodes"),
    ("models.0.replicas", {"min": 3, "max": 2}, "models[0].replicas", "must be ≤ max"),
    ("models.0.replicas", {"min": 1, "max": 3}, "models", "Insufficient nvidia.com/gpu"),
    ("models.0.weightsGb", 5000, "models", "the weights add up to 5000 GB"),
    ("models.0.gpuMemoryUtilization", 1.5, "models[0].gpuMemoryUtilization", "less than or equal to 1"),
    ("models.0.env", {"HF_TOKEN": "hf_abc"}, "models[0].env", "looks like a secret"),
    ("models.0.huggingFaceId", "qwen3", "models[0].huggingFaceId", "got 'qwen3'"),
    ("models.0.flavour", "spicy", "models[0].flavour", "unknown key"),
    ("hfTokenSecret", "hf token", "hfTokenSecret", "Pulumi config key name"),
]


@pytest.mark.parametrize(("path", "value", "key_path", "words"), BAD_INPUTS, ids=[f"{b[0]}={b[1]!r}"[:60] for b in BAD_INPUTS])
def test_bad_input_names_the_key_path(path: str, value: Any, key_path: str, words: str) -> None:
    message = error_of(with_change(path, value))
    assert message.startswith(f"{key_path}: "), message
    assert words in message, message
    assert "\n" not in message


def test_duplicate_node_names_are_refused() -> None:
    raw = prod_raw()
    raw["nodes"].append(copy.deepcopy(raw["nodes"][0]))
    raw["nodes"][1]["ssh"]["host"] = "other-host"
    assert error_of(raw) == "nodes[1].name: 'k8s-worker-02' is already used by nodes[0]"


def test_duplicate_model_names_are_refused() -> None:
    raw = prod_raw()
    raw["models"].append(copy.deepcopy(raw["models"][0]))
    raw["models"][0]["replicas"] = raw["models"][1]["replicas"] = {"min": 1, "max": 1}
    assert error_of(raw).startswith("models[1].name: 'qwen3' is already used by models[0]")


def test_mountpoint_collision_on_one_host_is_refused() -> None:
    raw = prod_raw()
    twin = copy.deepcopy(raw["nodes"][0])
    twin["name"] = "k8s-worker-02-b"
    twin["storage"].update(disks=["/dev/sdc", "/dev/sdd"], raidName="models2")
    raw["nodes"].append(twin)
    message = error_of(raw)
    assert message.startswith("nodes[1].storage.mountpoint: '/mnt/ollama-models' is already used by nodes[0]"), message


def test_local_storage_node_without_disks_is_refused() -> None:
    raw = with_change("nodes.0.storage.disks", [])
    assert error_of(raw).startswith("modelStorage.node: node 'k8s-worker-02' has no `storage.disks`")


def test_local_storage_keeps_every_replica_on_one_node() -> None:
    raw = prod_raw()
    raw["nodes"].append({"name": "k8s-worker-03", "ssh": {"host": "10.0.0.3"}, "gpu": {"product": "nvidia-a100", "count": 2}})
    raw["models"][0]["replicas"] = {"min": 1, "max": 3}
    message = error_of(raw)
    assert message.startswith("models: at max replicas the models need 3 GPUs, but node-local storage keeps every pod on k8s-worker-02")
    assert "ReadWriteOnce" in message and "modelStorage.type: nfs or storageClass" in message
    raw["modelStorage"] = {"type": "nfs", "server": "nas.lan", "path": "/export/models", "sizeGi": 500}
    assert parse(raw).models[0].replicas.max == 3


def test_plain_text_secret_is_refused_with_the_fix() -> None:
    raw = prod_raw()
    raw["hfToken"] = "hf_plain"
    assert error_of(raw) == "hfToken: holds a secret but is stored in plain text; set it with `pulumi config set --secret hfToken`"


def test_unknown_top_level_key_is_refused() -> None:
    raw = prod_raw()
    raw["model"] = []
    assert error_of(raw).startswith("model: unknown config key")


def test_config_is_immutable() -> None:
    stack: StackConfig = parse(prod_raw())
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its own ValidationError subclass
        stack.cluster.namespace = "other"  # type: ignore[misc]


def test_the_config_reference_page_is_current() -> None:
    from tools.config_doc import PAGE, reference

    assert PAGE == ROOT / "docs/configuration.md"
    assert reference() in PAGE.read_text(), "run: make docs"


def test_every_config_key_is_documented() -> None:
    from tools.config_doc import reference

    undocumented = [row.split("|")[1].strip() for row in reference().splitlines()[2:] if row.split("|")[4].strip() == ""]
    assert undocumented == []


def test_project_config_schema_agrees_with_the_models() -> None:
    # The CLI refuses a stack that lacks a key Pulumi.yaml declares without a default, before the
    # program runs: a key optional in the models must carry the models' own default there.
    schema = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    fields = {info.alias: info for info in StackConfig.model_fields.values()}
    for key, declared in schema.items():
        info = fields[key.split(":", 1)[1]]
        if info.is_required():
            assert "default" not in declared, key
        else:
            assert "default" in declared, f"{key} is optional in the config models: give it their default"
            assert declared["default"] == info.get_default(call_default_factory=True), key
    assert sorted(k.split(":", 1)[1] for k in schema) == sorted(fields)
