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


# --- kernel disk names are warned at render (issue 39) ----------------------------------------------


@pytest.mark.parametrize("kernel", ["/dev/sdb", "/dev/nvme0n1", "/dev/vda", "/dev/xvdc", "/dev/mmcblk0"])
def test_a_kernel_disk_name_is_warned_naming_the_key_and_the_fix(kernel: str) -> None:
    raw = prod_raw()
    disks = raw["nodes"][0]["storage"]["disks"]
    disks[1] = kernel
    [warning] = parse(raw).warnings()
    assert warning == (f"nodes[0].storage.disks: {kernel} is a kernel name, which can name another disk after a reboot or a disk "
                       "change; list k8s-worker-02's disks by the names `ls -l /dev/disk/by-id/` shows on it")
    disks[0] = "/dev/sda"
    [warning] = parse(raw).warnings()
    assert warning.startswith(f"nodes[0].storage.disks: /dev/sda and {kernel} are kernel names, which")


@pytest.mark.parametrize("disk", ["/dev/disk/by-id/ata-ST4000NM0035_ZC1ABCDE", "/dev/disk/by-path/pci-0000:00:1f.2-ata-2"])
def test_by_id_and_by_path_names_are_not_warned(disk: str) -> None:
    raw = prod_raw()
    raw["nodes"][0]["storage"]["disks"][1] = disk
    assert parse(raw).warnings() == []


def test_the_render_prints_the_kernel_name_warning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from tools.render import ROOT

    stack = tmp_path / "Pulumi.kernel.yaml"
    stack.write_text((ROOT / "Pulumi.prod.yaml").read_text().replace("/dev/disk/by-id/wwn-0x5000c500a1b2c3d5", "/dev/nvme0n1"))
    result = subprocess.run([sys.executable, "-m", "tools.render", "kernel", "--stack-file", str(stack), "--out", str(tmp_path / "out")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr  # a warning, not a refusal
    assert result.stderr == ("warning: nodes[0].storage.disks: /dev/nvme0n1 is a kernel name, which can name another disk after a "
                             "reboot or a disk change; list k8s-worker-02's disks by the names `ls -l /dev/disk/by-id/` shows on it\n")


def test_no_committed_stack_file_lists_a_kernel_name() -> None:
    """The examples a newcomer copies (the lab VM's disks too: they have virtio by-id names) render without it."""
    from tests.test_stack_files import stack_files
    from tools.render.stack_file import parsed_config, stack_config

    for path in stack_files():
        stack = parsed_config(*stack_config(path.stem.removeprefix("Pulumi."), stack_file=path))
        assert stack is not None, path
        assert not [w for w in stack.warnings() if "kernel name" in w], (path, stack.warnings())
