"""PersistentVolume and remote Command rules."""

from __future__ import annotations

import pytest
from policy_factory import check, good, policies

from policy.rules import check_resources

SCRIPT = "set -eu\nmdadm --detail --test /dev/md/models\n"


def test_good_pv_passes():
    assert check(good("PersistentVolume")) == []


def test_hostpath_pv_without_node_affinity():
    pv = good("PersistentVolume")
    pv["spec"].pop("nodeAffinity")
    found = check(pv)
    assert policies(found) == {"local-pv-node-affinity"}
    assert "/mnt/models" in found[0].message
    assert "kubernetes.io/hostname or a label" in found[0].message


@pytest.mark.parametrize("source", ["hostPath", "local"])
@pytest.mark.parametrize(
    ("expressions", "violates"),
    [
        ([{"key": "kubernetes.io/hostname", "operator": "In", "values": ["k8s-worker-02"]}], False),
        # The node cache's volume: every node carrying the label holds the directory.
        ([{"key": "cache.gpu-serving.io/ai", "operator": "In", "values": ["ready"]}], False),
        ([], True),  # a term with no requirement matches no node
    ],
)
def test_local_pv_is_placed_by_a_hostname_or_a_label(source, expressions, violates):
    pv = good("PersistentVolume")
    path = pv["spec"].pop("hostPath", None) or pv["spec"].pop("local")
    pv["spec"][source] = {"path": path["path"]}
    pv["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}}
    assert ("local-pv-node-affinity" in policies(check(pv))) is violates


@pytest.mark.parametrize(
    ("spec", "violates"),
    [
        ({"persistentVolumeReclaimPolicy": "Delete"}, True),
        ({"persistentVolumeReclaimPolicy": "Recycle"}, True),
        ({}, False),  # static PVs default to Retain
    ],
)
def test_model_pv_retain(spec, violates):
    pv = good("PersistentVolume")
    pv["spec"].pop("persistentVolumeReclaimPolicy")
    pv["spec"].update(spec)
    assert ("model-pv-retain" in policies(check(pv))) is violates


def test_non_model_nfs_pv_may_delete():
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "logs"},
          "spec": {"persistentVolumeReclaimPolicy": "Delete", "nfs": {"server": "nas", "path": "/logs"}}}
    assert check(pv) == []


def command(options=None, **props):
    inputs = {"connection": {"host": "10.0.0.2", "user": "root", "privateKey": "[secret]",
                             "hostKey": "ssh-ed25519 AAAA"}, "create": SCRIPT}
    inputs.update(props)
    return {"type": "command:remote:Command", "name": "node-02:10-raid", "inputs": inputs,
            "options": options or {}}


def test_pinned_command_with_secret_key_only_passes():
    # The private key is consumed by SSH, not by the script: no secret outputs needed.
    assert check_resources([command()]) == []


def test_host_key_not_pinned_is_advisory():
    cmd = command()
    cmd["inputs"]["connection"].pop("hostKey")
    (found,) = check_resources([cmd])
    assert (found.policy, found.level, found.kind, found.name) == (
        "command-host-key-pinned", "advisory", "Command", "node-02:10-raid")
    assert "ssh-keyscan" in found.message


@pytest.mark.parametrize(
    "props",
    [
        {"environment": {"HF_TOKEN": "x"}},
        {"environment": {"MODE": "[secret]"}},
        {"create": "[secret]"},
        {"stdin": "[secret]"},
        {"create": 'curl -H "Authorization: Bearer $HF_TOKEN" https://hf.co\n'},
        {"update": "printf '%s' -----BEGIN OPENSSH PRIVATE KEY----- > k"},
    ],
)
def test_secret_script_needs_secret_outputs(props):
    found = check_resources([command(**props)])
    assert policies(found) == {"command-secret-outputs"}
    assert found[0].level == "mandatory"
    assert "stdout and stderr" in found[0].message
    assert check_resources([command({"additionalSecretOutputs": ["stderr", "stdout"]}, **props)]) == []
    only_stdout = check_resources([command({"additionalSecretOutputs": ["stdout"]}, **props)])
    assert "stderr is not" in only_stdout[0].message


def test_secret_envelope_of_an_in_memory_render_counts_as_secret():
    envelope = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": "s3cr3t"}
    assert policies(check_resources([command(stdin=envelope)])) == {"command-secret-outputs"}
