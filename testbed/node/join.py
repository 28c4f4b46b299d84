"""The lab VM as a real Kubernetes node: containerd, runc, CNI, kubelet and kube-proxy in the guest,
joined to the loopback cluster (testbed/cluster) with nothing outside the machine.

    make_bundle(vm.disk_path(BUNDLE_DISK), cluster_bin, images_archive)   # before vm.start()
    node = RealNode(vm, "real-node", cluster_dir, apiserver_port, image_names, work, hub_port)
    node.join(kubectl)                                      # Ready, with nvidia.com/gpu: 1

What is real: the kubelet and kube-proxy of the cluster's Kubernetes version, containerd v2 with the
runc shim, Debian's runc and CNI plugins (bridge, host-local, portmap), the guest's kernel (cgroup
v2, overlayfs, nftables): pods, mounts, probes, signals and Services work as on a node.
What stands in: the GPU (the node's `nvidia.com/gpu` capacity is patched into its status, no device
plugin), the registry (images are imported from an OCI archive, testbed/node/images.py), cluster
DNS (testbed/node/dns, a stand-in answering `<service>.<namespace>.svc.cluster.local` from the API
server, on the node's address).

How the pieces reach each other, all on loopback or the VM's own user network (10.0.2.0/24):
- kubelet and kube-proxy -> API server: an `ssh -R` forward of the guest's 127.0.0.1:6443 to the
  host's API server port (the API server's certificate names 127.0.0.1);
- pods -> the host's stand-in hub: an `ssh -R` forward of the guest's port HUB_GUEST_PORT on every
  guest address (the guest sshd allows it with GatewayPorts clientspecified): pods reach it at the
  node's address and at their bridge's gateway, two host names for the hub and its CDN;
- the API server -> kubelet (logs, exec, port-forward): a qemu `hostfwd` of a free port on the host's
  127.0.0.1 to the kubelet, which listens on that same port number. The kubelet refuses a loopback
  node IP, so it runs with `--cloud-provider=external` and the join, standing in for a cloud
  controller, sets the node's address to 127.0.0.1 (a kubelet keeps the addresses a provider set)
  and lifts the provider's `uninitialized` taint.
The binaries come from the cluster build (testbed/cluster/build.sh), Debian's packages from the
host's apt, both on a read-only disk plugged into the guest: nothing is copied through SSH.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.node.images import apt_candidates, build_go, fetch_debs, gs_cache

GUEST_IP = "10.0.2.15"
"""qemu's user network always gives the guest this address."""
APISERVER_GUEST_PORT = 6443
HUB_GUEST_PORT = 18080
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
"""The loopback API server's --service-cluster-ip-range."""
POD_GATEWAY = "10.244.0.1"
"""The bridge's address, which the CNI's host-local IPAM gives the gateway: the node as pods see it."""
LINK_PREFIX = "192.168.77"
"""The guests' own link (RealNode.link): node i is LINK_PREFIX.i on it."""
BUNDLE_DISK = "gs-node-bundle"
BUNDLE_MOUNT = "/opt/gs-node"

PACKAGES = ("runc", "containernetworking-plugins", "iptables", "nftables", "netbase", "libip4tc2", "libip6tc2",
            "libxtables12", "libnetfilter-conntrack3", "libnfnetlink0", "libnftables1", "libnftnl11", "libjansson4",
            "libmnl0", "libseccomp2")
"""Debian bookworm's runc (1.1.5), CNI plugins (1.1.1, in /usr/lib/cni) and what they need beyond the
VM image. runc from Debian rather than built: it needs cgo and libseccomp's headers on the host, and
1.1.5 runs every pod these checks start (containerd recommends 1.5+; a build from the Go proxy is the
upgrade path when a check needs it)."""

BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "kubelet", "kube-proxy")
"""From the cluster build; the bundle adds gs-dns, built from testbed/node/dns."""
DNS_SOURCE = Path(__file__).parent / "dns"

CONTAINERD_CONFIG = """\
version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = 'docker.io/gs-testbed/pause:3.10.2'
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni']
  conf_dir = '/etc/cni/net.d'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
  BinaryName = '/usr/sbin/runc'
"""



def cni_config(pod_cidr: str) -> str:
    """The bridge CNI's configuration: pods of this node in `pod_cidr` (distinct per node: a peer's pods are
    reached by a static route over the guests' link, see RealNode.link)."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": "gs-pods",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=1)


CNI_CONFIG = cni_config(POD_CIDR)

UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"

KUBELET_CONFIG = f"""\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: /etc/kubernetes/pki/ca.crt}}
authorization: {{mode: Webhook}}
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
clusterDomain: cluster.local
clusterDNS: [{GUEST_IP}]
# The guest's 3 GiB root holds images and logs: the default thresholds (10 %, 15 %) would evict at once.
evictionHard: {{memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
readOnlyPort: 0
"""

def kube_proxy_config(pod_cidr: str) -> str:
    """kube-proxy's configuration. `clusterCIDR` is this node's pods: a connection to a Service from anything else
    (the host's `ssh -L` through this node's sshd) is masqueraded, so a peer node's pod answers it over the link."""
    return f"""\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {{kubeconfig: /etc/kubernetes/kube-proxy.kubeconfig}}
clusterCIDR: {pod_cidr}
"""


KUBE_PROXY_CONFIG = kube_proxy_config(POD_CIDR)


def unit(description: str, exec_start: str, *, after: str = "network.target", notify: bool = False) -> str:
    # KillMode=process: a containerd restart (the runtime step) must leave the shims, and so the
    # pods, running, as the packaged unit does.
    kill = "KillMode=process\nDelegate=yes\nLimitNOFILE=infinity\n" if notify else ""
    return (f"[Unit]\nDescription={description} (gpu-serving real node)\nAfter={after}\n[Service]\n"
            f"ExecStart={exec_start}\n{'Type=notify' + chr(10) if notify else ''}{kill}Restart=always\nRestartSec=2\n")


def kubeconfig(user: str) -> str:
    return f"""\
apiVersion: v1
kind: Config
clusters:
- name: gs
  cluster: {{server: 'https://127.0.0.1:{APISERVER_GUEST_PORT}', certificate-authority: /etc/kubernetes/pki/ca.crt}}
users:
- name: {user}
  user: {{client-certificate: /etc/kubernetes/pki/{user}.crt, client-key: /etc/kubernetes/pki/{user}.key}}
contexts:
- name: gs
  context: {{cluster: gs, user: {user}}}
current-context: gs
"""


def sign(pki: Path, out: Path, name: str, cn: str, org: str) -> None:
    """A client certificate from the loopback cluster's CA (its key never leaves the host's cache)."""
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/O={org}/CN={cn}",
                    "-keyout", out / f"{name}.key", "-out", out / f"{name}.csr"], check=True, capture_output=True)
    (out / f"{name}.ext").write_text("extendedKeyUsage=clientAuth\n")
    subprocess.run(["openssl", "x509", "-req", "-in", out / f"{name}.csr", "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key",
                    "-CAcreateserial", "-CAserial", out / "ca.srl", "-days", "30", "-extfile", out / f"{name}.ext",
                    "-out", out / f"{name}.crt"], check=True, capture_output=True)


def debs() -> list[Path]:
    """PACKAGES as .deb files at the versions the host's apt lists name (bookworm, as the guest),
    checked against their listed sha256 and kept beside the images' in $GS_CACHE/node/debs."""
    fetched = fetch_debs(apt_candidates(PACKAGES), gs_cache() / "node")
    return [fetched[name] for name in PACKAGES]


def make_bundle(disk: Path, cluster_bin: Path, images_archive: Path, extra: dict[str, Path] | None = None) -> None:
    """The read-only disk the guest mounts at BUNDLE_MOUNT: bin/, debs/, images.tar and any `extra` files by name
    (an ext4 image made from a folder, sparse, ~size of its files)."""
    packages = debs()
    with tempfile.TemporaryDirectory(prefix="gs-bundle-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        (root / "debs").mkdir()
        for name in BINARIES:
            shutil.copy2(cluster_bin / name, root / "bin" / name)
        build_go(DNS_SOURCE, root / "bin" / "gs-dns")
        for deb in packages:
            shutil.copy2(deb, root / "debs" / deb.name)
        shutil.copy2(images_archive, root / "images.tar")
        for name, path in (extra or {}).items():
            shutil.copy2(path, root / name)
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        disk.unlink(missing_ok=True)
        subprocess.run(["mkfs.ext4", "-q", "-L", "gs-node", "-d", str(root), str(disk), f"{size * 5 // 4 // 2**20 + 64}M"],
                       check=True, capture_output=True)


def ssh_forward(vm: Any, forwards: list[str], *, stderr: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """`ssh -N` with these `-R`/`-L` forwards to the VM, on a connection of its own (not the shared
    master, which a reopen would take the forwards down with) that exits if a forward cannot be set up."""
    argv = vm.ssh_argv(direct=True)
    return subprocess.Popen([*argv[:-1], "-o", "ExitOnForwardFailure=yes", "-N", *forwards, argv[-1]],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)


class RealNode:
    """One lab VM joined to the loopback cluster as Node `name` (see the module's docstring)."""

    def __init__(self, vm: Any, name: str, cluster_dir: Path, apiserver_port: int, images: list[str], work: Path,
                 hub_port: int | None = None, kubelet_port: int = 10250, pod_cidr: str = POD_CIDR) -> None:
        self.vm, self.name, self.cluster_dir = vm, name, cluster_dir
        self.pod_cidr = pod_cidr
        """This node's pods (the bridge's host-local range); a second node takes another /24."""
        self.kubelet_port = kubelet_port
        """The kubelet's port in the guest and, forwarded, on the host's 127.0.0.1: the API server dials it."""
        self.apiserver_port, self.hub_port = apiserver_port, hub_port
        self.images = images
        """Image names (as the stack gives them) in the bundle's archive."""
        self.work = work
        self.forward: subprocess.Popen[bytes] | None = None
        self.timings: dict[str, float] = {}

    def _step(self, name: str, command: str, timeout: float = 600) -> str:
        start = time.monotonic()
        out = self.vm.ssh(command, timeout=timeout).stdout
        self.timings[name] = round(time.monotonic() - start, 1)
        return out

    def _files(self) -> dict[str, tuple[str, str]]:
        """Guest path -> (mode, content) of everything the node's services read."""
        pki = self.work / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        sign(self.cluster_dir / "pki", pki, "kubelet", f"system:node:{self.name}", "system:nodes")
        sign(self.cluster_dir / "pki", pki, "kube-proxy", "system:kube-proxy", "system:node-proxier")
        bin_ = f"{BUNDLE_MOUNT}/bin"
        files = {
            "/etc/kubernetes/pki/ca.crt": ("0644", (self.cluster_dir / "pki" / "ca.crt").read_text()),
            "/etc/kubernetes/kubelet.kubeconfig": ("0600", kubeconfig("kubelet")),
            "/etc/kubernetes/kube-proxy.kubeconfig": ("0600", kubeconfig("kube-proxy")),
            "/etc/containerd/config.toml": ("0644", CONTAINERD_CONFIG),
            "/etc/cni/net.d/10-gs-pods.conflist": ("0644", cni_config(self.pod_cidr)),
            "/var/lib/kubelet/config.yaml": ("0644", f"{KUBELET_CONFIG}port: {self.kubelet_port}\n"),
            "/etc/kubernetes/kube-proxy.yaml": ("0644", f"{kube_proxy_config(self.pod_cidr)}hostnameOverride: {self.name}\n"),
            # br_netfilter is never loaded on demand: without it a reply from a Service's pod on the
            # same bridge skips the un-DNAT.
            "/etc/modules-load.d/gs-node.conf": ("0644", "overlay\nbr_netfilter\n"),
            "/etc/sysctl.d/90-gs-node.conf": ("0644", "net.bridge.bridge-nf-call-iptables=1\nnet.ipv4.ip_forward=1\n"),
            "/etc/ssh/sshd_config.d/20-gs-node.conf": ("0644", "GatewayPorts clientspecified\n"),
            "/etc/systemd/system/containerd.service": ("0644", unit("containerd", f"{bin_}/containerd", notify=True)),
            "/etc/systemd/system/kubelet.service": ("0644", unit(
                "kubelet", f"{bin_}/kubelet --config=/var/lib/kubelet/config.yaml --kubeconfig=/etc/kubernetes/kubelet.kubeconfig"
                f" --hostname-override={self.name} --node-ip={GUEST_IP} --cloud-provider=external --v=1", after="containerd.service")),
            "/etc/systemd/system/gs-dns.service": ("0644", unit(
                "cluster DNS stand-in", f"{bin_}/gs-dns -listen {GUEST_IP}:53 -server https://127.0.0.1:{APISERVER_GUEST_PORT}"
                " -ca /etc/kubernetes/pki/ca.crt -cert /etc/kubernetes/pki/kubelet.crt -key /etc/kubernetes/pki/kubelet.key")),
            "/etc/systemd/system/kube-proxy.service": ("0644", unit(
                "kube-proxy", f"{bin_}/kube-proxy --config=/etc/kubernetes/kube-proxy.yaml")),
        }
        for name in ("kubelet", "kube-proxy"):
            files[f"/etc/kubernetes/pki/{name}.crt"] = ("0644", (pki / f"{name}.crt").read_text())
            files[f"/etc/kubernetes/pki/{name}.key"] = ("0600", (pki / f"{name}.key").read_text())
        return files

    def start_forwards(self) -> None:
        """The `ssh -R` forwards (the API server; the hub when given), on a connection of their own
        that fails at once if a forward cannot be set up."""
        self.stop_forwards()
        forwards = ["-R", f"127.0.0.1:{APISERVER_GUEST_PORT}:127.0.0.1:{self.apiserver_port}"]
        if self.hub_port:
            forwards += ["-R", f"0.0.0.0:{HUB_GUEST_PORT}:127.0.0.1:{self.hub_port}"]
        self.forward = ssh_forward(self.vm, forwards, stderr=subprocess.PIPE)
        for _ in range(100):
            if self.forward.poll() is not None:
                raise RuntimeError(f"ssh forwards failed: {self.forward.stderr.read().decode() if self.forward.stderr else ''}")
            if self.vm.ssh(f"ss -Hltn 'sport = :{APISERVER_GUEST_PORT}' | grep -q .", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError("the API server forward did not come up in 20 s")

    def link(self, index: int, local_port: int, peer_port: int, routes: dict[str, int]) -> str:
        """A second NIC hot-plugged into the running guest (its saved boot has one): a qemu `socket` netdev over
        UDP between two ports of the host's 127.0.0.1, this guest's `local_port` to its peer's `peer_port`, so the
        two guests share an Ethernet link and nothing else does. The guest is LINK_PREFIX.`index` on it, and
        `routes` (a peer's pod CIDR -> that peer's index) send each peer node's pods over it: pods and
        Services of one node reach the other's pods, unmasqueraded. systemd-networkd configures the NIC from
        a .network file matching its MAC, written before the plug. Returns the guest's interface name."""
        mac = f"52:54:00:77:00:{index:02x}"
        network = (f"[Match]\nMACAddress={mac}\n[Network]\nAddress={LINK_PREFIX}.{index}/24\nLinkLocalAddressing=no\n"
                   + "".join(f"[Route]\nDestination={cidr}\nGateway={LINK_PREFIX}.{peer}\n" for cidr, peer in routes.items()))
        self.vm.put_file(network, "/etc/systemd/network/05-gs-link.network", "0644")
        self.vm.ssh("networkctl reload")
        # The last root port: the extra disks take the first ones, in declaration order.
        bus = f"gs-rp{self.vm.root_ports - 1}"
        for command in (f"netdev_add socket,id=link0,udp=127.0.0.1:{peer_port},localaddr=127.0.0.1:{local_port}",
                        f"device_add virtio-net-pci,netdev=link0,id=link0nic,mac={mac},bus={bus},romfile="):
            out = self.vm.monitor(command, timeout=30)
            reply = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out.split(command, 1)[-1]).replace("(qemu)", "").strip()
            if reply not in ("", "OK"):
                raise RuntimeError(f"monitor {command!r}: {reply}")
        return self.vm.ssh(
            f"for i in $(seq 150); do dev=$(ip -o link | awk -F': ' '/{mac}/{{print $2}}');"
            f" [ -n \"$dev\" ] && ip -o -4 addr show dev \"$dev\" | grep -q ' {LINK_PREFIX}.{index}/'"
            f" && ip route show {next(iter(routes))} | grep -q . && echo \"$dev\" && exit 0; sleep 0.2; done;"
            " echo 'the link NIC did not come up' >&2; ip -o addr >&2; exit 1").stdout.strip()

    def stop_forwards(self) -> None:
        if self.forward is not None:
            self.forward.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.forward.wait(10)
            self.forward = None

    def join(self, kubectl: Any) -> None:
        """Install, configure and start the node; wait until the API server has it Ready with its GPU.
        `kubectl(*args, stdin=None)` runs the host's kubectl as cluster admin."""
        self._step("mount", f"mkdir -p {BUNDLE_MOUNT} && (mountpoint -q {BUNDLE_MOUNT} || "
                   f"mount -o ro /dev/disk/by-id/virtio-{BUNDLE_DISK} {BUNDLE_MOUNT})")
        self._step("packages", f"command -v runc >/dev/null || dpkg -i {BUNDLE_MOUNT}/debs/*.deb >/tmp/gs-dpkg.log 2>&1 "
                   "|| { tail -n 20 /tmp/gs-dpkg.log >&2; exit 1; }", timeout=300)
        for path, (mode, content) in self._files().items():
            self.vm.put_file(content, path, mode)
        self._step("configure", "modprobe overlay && modprobe br_netfilter && sysctl -q --system && systemctl reload ssh"
                   f" && ln -sf {BUNDLE_MOUNT}/bin/ctr {BUNDLE_MOUNT}/bin/containerd /usr/local/bin/"
                   f" && ln -sf {BUNDLE_MOUNT}/bin/containerd-shim-runc-v2 /usr/local/bin/ && systemctl daemon-reload"
                   # The guest has no default route (qemu's restrict=on): without a route to the
                   # Service range, a connection to a ClusterIP fails before kube-proxy's DNAT sees it.
                   f" && ip route replace {SERVICE_CIDR} dev $(ip -o -4 addr show | awk '/ {GUEST_IP}\\//{{print $2}}')")
        self.start_forwards()
        self._step("containerd", "systemctl start containerd && for i in $(seq 100); do ctr version >/dev/null 2>&1 && exit 0;"
                   " sleep 0.2; done; exit 1")
        # The archive names each image as the CRI looks it up (docker.io/…, and by digest); the sandbox
        # image pinned, so the kubelet's image GC never removes it.
        self._step("images", f"ctr -n k8s.io images import --platform linux/amd64 {BUNDLE_MOUNT}/images.tar >/dev/null"
                   " && ctr -n k8s.io images label docker.io/gs-testbed/pause:3.10.2 io.cri-containerd.pinned=pinned >/dev/null",
                   timeout=600)
        self._step("kubelet", "systemctl start gs-dns kubelet kube-proxy")
        start = time.monotonic()
        while not self.ready(kubectl, self.name):
            if time.monotonic() - start > 180:
                raise RuntimeError("the node did not become Ready in 180 s: " + self.vm.ssh(
                    "journalctl -u kubelet --no-pager -n 15", check=False).stdout[-1500:])
            time.sleep(1)
        self.timings["ready"] = round(time.monotonic() - start, 1)
        # The cloud controller's part: the address the API server can reach the kubelet at, the taint lifted.
        out = self.vm.monitor(f"hostfwd_add n0 tcp:127.0.0.1:{self.kubelet_port}-:{self.kubelet_port}")
        if "rror" in out.split("hostfwd_add", 1)[-1]:
            raise RuntimeError(f"forwarding the kubelet's port failed: {out}")
        # InternalIP alone: the API server tries a Hostname address first, and the host cannot resolve the node's name.
        kubectl("patch", "node", self.name, "--subresource=status", "--type=merge", "-p", json.dumps(
            {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}))
        kubectl("taint", "node", self.name, f"{UNINITIALIZED_TAINT}-")
        # No device plugin: the capacity is patched in. The kubelet keeps an extended resource it
        # does not manage (it zeroes it only when its device-manager checkpoint is missing).
        kubectl("patch", "node", self.name, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"capacity": {"nvidia.com/gpu": "1"}}}))

    @staticmethod
    def ready(kubectl: Any, name: str) -> bool:
        proc = kubectl("get", "node", name, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        conditions = json.loads(proc.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

