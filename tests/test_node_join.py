"""The real node's configuration (testbed/node/join.py), checked offline: what the e2e's real-node
checks would otherwise find out minutes into a run."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from testbed.node import join


def test_containerd_config_is_version_3_with_the_pinned_sandbox_and_debian_cni() -> None:
    config = tomllib.loads(join.CONTAINERD_CONFIG)
    assert config["version"] == 3  # containerd 2.x: a version 2 file is migrated, with a warning, at every start
    plugins = config["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "docker.io/gs-testbed/pause:3.10.2"
    assert plugins["io.containerd.cri.v1.runtime"]["cni"]["bin_dirs"] == ["/usr/lib/cni"]  # Debian's path, not /opt/cni/bin
    runc = plugins["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is True


def test_cni_config_gives_pods_the_bridge_and_a_default_route() -> None:
    config = json.loads(join.CNI_CONFIG)
    bridge = next(p for p in config["plugins"] if p["type"] == "bridge")
    assert bridge["isGateway"] and bridge["ipam"]["ranges"] == [[{"subnet": join.POD_CIDR}]]
    assert {"dst": "0.0.0.0/0"} in bridge["ipam"]["routes"]
    # host-local gives the bridge the range's first address: the hub's second host name for pods
    assert ipaddress.ip_address(join.POD_GATEWAY) == next(ipaddress.ip_network(join.POD_CIDR).hosts())


def test_kubelet_and_kube_proxy_configs_parse() -> None:
    kubelet = yaml.safe_load(join.KUBELET_CONFIG)
    assert kubelet["kind"] == "KubeletConfiguration" and kubelet["cgroupDriver"] == "systemd"
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    proxy = yaml.safe_load(join.KUBE_PROXY_CONFIG)
    assert proxy["mode"] == "nftables" and proxy["clusterCIDR"] == join.POD_CIDR
    config = yaml.safe_load(join.kubeconfig("kubelet"))
    assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{join.APISERVER_GUEST_PORT}"


def test_containerd_unit_keeps_the_pods_when_containerd_restarts() -> None:
    unit = join.unit("containerd", "/opt/gs-node/bin/containerd", notify=True)
    assert "KillMode=process" in unit and "Type=notify" in unit and "Delegate=yes" in unit
    assert "KillMode" not in join.unit("kubelet", "/opt/gs-node/bin/kubelet")


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0, reason="no openssl")
def test_node_certificates_name_the_node_and_its_group(tmp_path: Path) -> None:
    pki = tmp_path / "ca"
    pki.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
                    "-keyout", pki / "ca.key", "-out", pki / "ca.crt"], check=True, capture_output=True)
    join.sign(pki, tmp_path, "kubelet", "system:node:real-node", "system:nodes")
    subject = subprocess.run(["openssl", "x509", "-in", tmp_path / "kubelet.crt", "-noout", "-subject"],
                             capture_output=True, text=True, check=True).stdout
    assert "O = system:nodes" in subject and "CN = system:node:real-node" in subject
    usage = subprocess.run(["openssl", "x509", "-in", tmp_path / "kubelet.crt", "-noout", "-ext", "extendedKeyUsage"],
                           capture_output=True, text=True, check=True).stdout
    assert "TLS Web Client Authentication" in usage
    assert not (pki / "ca.srl").exists(), "the serial file belongs beside the node's certificates, not in the cluster's CA folder"


def test_a_second_node_takes_its_own_pod_range_and_gateway() -> None:
    """The two-node checks (testbed/e2e/real_cache.py): pods of each node in a /24 of their own, each node's hub
    CDN at its own bridge, kube-proxy treating only its own pods as local (the rest is masqueraded, so a peer's
    pod answers the host's tunnel over the link), and disks whose serials differ from the first node's."""
    from testbed.e2e import real_cache

    bridge = next(p for p in json.loads(join.cni_config(real_cache.POD_CIDR_B))["plugins"] if p["type"] == "bridge")
    assert bridge["ipam"]["ranges"] == [[{"subnet": real_cache.POD_CIDR_B}]]
    assert not ipaddress.ip_network(real_cache.POD_CIDR_B).overlaps(ipaddress.ip_network(join.POD_CIDR))
    assert ipaddress.ip_address(real_cache.POD_GATEWAY_B) == next(ipaddress.ip_network(real_cache.POD_CIDR_B).hosts())
    assert yaml.safe_load(join.kube_proxy_config(real_cache.POD_CIDR_B))["clusterCIDR"] == real_cache.POD_CIDR_B
    assert not {name for name, _ in real_cache.DISKS_B} & {"gs-disk-a", "gs-disk-b"}
    assert real_cache.weights_sha256(real_cache.WEIGHTS_B) != real_cache.weights_sha256(real_cache.WEIGHTS)
    assert set(real_cache.REAL_NODE_CHECKS) < set(real_cache.ALL_REAL_CHECKS)
