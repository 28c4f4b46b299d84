"""Config checks for the node disks and SSH endpoints (issue 13): refused at load, before anything reaches a node."""

from __future__ import annotations

import copy

import pytest

from stacks.config import parse
from tests.test_config import error_of, prod_raw, with_change


@pytest.mark.parametrize(
    "partition",
    ["/dev/sda1", "/dev/vdb2", "/dev/xvdc3", "/dev/nvme0n1p1", "/dev/mmcblk0p2", "/dev/disk/by-id/ata-ST4000_ZC1ABCDE-part5"],
)
def test_a_partition_is_refused_at_load(partition: str) -> None:
    message = error_of(with_change("nodes.0.storage.disks", ["/dev/disk/by-id/ata-ST4000NM0035_ZC1AAAAA", partition]))
    assert message.startswith("nodes[0].storage.disks: "), message
    assert f"{partition!r} is a partition; list whole disks" in message


@pytest.mark.parametrize("disk", ["/dev/sda", "/dev/nvme0n1", "/dev/disk/by-id/nvme-SAMSUNG_MZQL23T8HCLS-00A07_S64HNE0R1234"])
def test_whole_disk_names_load(disk: str) -> None:
    parse(with_change("nodes.0.storage.disks", ["/dev/disk/by-id/ata-ST4000NM0035_ZC1AAAAA", disk]))


def test_a_port_in_the_ssh_host_is_refused_naming_the_port_key() -> None:
    message = error_of(with_change("nodes.0.ssh.host", "k8s-worker-02:2222"))
    assert message.startswith("nodes[0].ssh.host: "), message
    assert "the port in `port` (ssh.port: 2222)" in message


@pytest.mark.parametrize("host", ["fe80::1", "2001:db8::10", "10.0.0.7", "k8s-worker-02"])
def test_ipv6_and_plain_hosts_load(host: str) -> None:
    parse(with_change("nodes.0.ssh.host", host))


def twin(port: int | None) -> dict:
    """The prod config plus a second node entry on the same SSH host, with the same mountpoint."""
    raw = prod_raw()
    other = copy.deepcopy(raw["nodes"][0])
    other["name"] = "k8s-worker-02-b"
    other["storage"].update(disks=["/dev/sdc", "/dev/sdd"], raidName="models2")
    if port is not None:
        other["ssh"]["port"] = port
        other["ssh"]["hostKeySecret"] = f"sshHostKey{port}"  # another port may be another machine, with its own host key
    raw["nodes"].append(other)
    return raw


def test_the_same_host_and_port_is_one_machine() -> None:
    assert error_of(twin(22)).startswith(
        "nodes[1].storage.mountpoint: '/mnt/ollama-models' is already used by nodes[0] on the same machine (k8s-worker-02 port 22)"
    )


def test_the_same_host_on_another_port_is_another_machine() -> None:
    stack = parse(twin(2222))
    assert [n.ssh.port for n in stack.nodes] == [22, 2222]
