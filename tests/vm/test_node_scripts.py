"""The node scripts on a real kernel: the RENDERED scripts, run over SSH in order, as `pulumi up` would.

One VM (two blank 4 GiB disks that first get an OS-like layout, like the seed's sda/sdb) is shared
by the whole module and the tests build on each other, in file order:

    foreign data refused -> first run (killed once midway, then converging) -> second run changes
    nothing -> reboot keeps the name and the mount -> grow 2 GB -> 3 GB with data intact ->
    runtime step (FAKE nvidia-ctk/containerd, then FAKE k3s) -> delete scripts keep everything -> one disk
    missing: degraded, still mounted, health says so -> disk back: re-added.

Scripts are sent exactly as pulumi_command sends `create`: the whole text as the SSH command, run
by root's login shell. Skipped unless GS_VM_TESTS=1 (tests/vm/conftest.py).
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Any

import pytest

from components.node.reports import storage_outputs
from stacks.config import Node, usable_gib
from testbed.vm import SshError, Vm, make_os_like_layout, os_layout_sha256s
from testbed.vm.fakes import FAKE_K3S_START, fake_k3s_unit, install_fake_containerd
from testbed.vm.steps import prod_node, rendered_steps
from tools.render import RenderError

NODE = "k8s-worker-02"
DISKS = ("gs-disk-a", "gs-disk-b")
SIZE_A, SIZE_B = 2, 3  # GB; the disks are 4 GiB with 289 MiB of OS partitions in front
MOUNT = "/mnt/models"
MD = "/dev/md/models"
DISK_STEPS = ["10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health"]
FILES = "/etc/fstab /etc/mdadm/mdadm.conf /boot/initrd.img-*"

TIMINGS: dict[str, float] = {}


# ---------------------------------------------------------------------------- helpers


def vm_storage(size_gb: int) -> dict[str, Any]:
    """The prod node's storage pointed at the VM's disks."""
    return {"disks": [Vm.by_id(d) for d in DISKS], "sizeGb": size_gb, "raidName": "models", "mountpoint": MOUNT}


def render_steps(size_gb: int, deployed: dict[str, Any] | None = None, runtime: str = "containerd") -> dict[str, dict[str, str]]:
    """{step: {"create", "delete"}} for the prod node pointed at the VM's disks, via the offline render."""
    return rendered_steps(vm_storage(size_gb), runtime=runtime, deployed=deployed)


def run(vm: Vm, text: str, *, check: bool = True, timeout: float = 900):
    """Like pulumi_command: the script text is the SSH command."""
    result = vm.ssh(text, check=False, timeout=timeout)
    if check and result.returncode != 0:
        error = SshError(result.returncode, text, result.stdout, result.stderr)
        error.report = vm.guest_report()
        raise error
    return result


def report(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stdout
    return json.loads(lines[-1])


def run_steps(vm: Vm, steps: dict[str, dict[str, str]], names: list[str], label: str) -> dict[str, dict[str, Any]]:
    reports = {}
    started = time.monotonic()
    for name in names:
        t = time.monotonic()
        reports[name] = report(run(vm, steps[name]["create"]).stdout)
        TIMINGS[f"{label} {name}"] = round(time.monotonic() - t, 1)
    TIMINGS[f"{label} total"] = round(time.monotonic() - started, 1)
    return reports


def snapshot(vm: Vm) -> str:
    """mtime, size and sha256 of fstab, mdadm.conf, the initramfs and both partition tables."""
    script = (
        f"stat -c '%n %Y %s' {FILES}; sha256sum {FILES}; "
        + " ".join(f"sgdisk -p {Vm.by_id(d)} | sha256sum; dd if={Vm.by_id(d)} bs=1M count=1 status=none | sha256sum;" for d in DISKS)
    )
    return vm.ssh(script).stdout


def sha(vm: Vm, path: str) -> str:
    return vm.ssh(f"sha256sum {shlex.quote(path)}").stdout.split()[0]


def write_file(vm: Vm, path: str, mib: int) -> str:
    vm.ssh(f"head -c {mib}M /dev/urandom > {shlex.quote(path)} && sync")
    return sha(vm, path)


@pytest.fixture(scope="module")
def node(vm: Vm) -> dict[str, Any]:
    """Module state: the VM after the OS-like layout, with the checksums of the OS partitions."""
    t = time.monotonic()
    layout = make_os_like_layout(vm, DISKS)
    TIMINGS["os-like layout"] = round(time.monotonic() - t, 1)
    yield {"layout": layout, "steps": render_steps(SIZE_A)}
    print("\nVM timings (s):", json.dumps(TIMINGS, indent=1))


def assert_os_intact(vm: Vm, node: dict[str, Any]) -> None:
    assert os_layout_sha256s(vm, DISKS) == node["layout"]


# ---------------------------------------------------------------------------- tests, in order


def test_foreign_data_is_refused_and_kept(vm, node):
    steps = node["steps"]
    part_b = f"{Vm.by_id(DISKS[1])}-part5"
    # Our partitions, then a foreign filesystem with a file on disk b's.
    run(vm, steps["20-partition"]["create"])
    try:
        vm.wait_block(part_b)
        vm.ssh(f"mkfs.ext4 -q {part_b} && mkdir -p /mnt/x && mount {part_b} /mnt/x && head -c 1M /dev/urandom > /mnt/x/keep && sync")
        kept = sha(vm, "/mnt/x/keep")
        vm.ssh("umount /mnt/x")
        for step in ("10-preflight", "30-raid"):
            proc = run(vm, steps[step]["create"], check=False)
            assert proc.returncode != 0, step
            assert "ext4" in proc.stderr and "not our array" in proc.stderr, proc.stderr
        assert vm.ssh(f"test -e {MD}", check=False).returncode != 0
        vm.wait_block(part_b)
        vm.ssh(f"mount -o ro {part_b} /mnt/x")
        assert sha(vm, "/mnt/x/keep") == kept
    finally:
        # The operator decides the data is disposable: wipe it, as the message says (also when the
        # test failed, so the module's later tests start from our partitions, not from its ext4).
        vm.wait_block(part_b)
        vm.ssh(f"umount /mnt/x 2>/dev/null; wipefs -a -q {part_b}")
    assert_os_intact(vm, node)


def test_first_run_killed_midway_then_converges(vm, node):
    steps = node["steps"]
    run_steps(vm, steps, ["10-preflight", "20-partition"], "first")
    # Kill the raid step while it refreshes the initramfs (after mdadm --create and mdadm.conf).
    vm.put_file(steps["30-raid"]["create"], "/root/raid.sh", "0700")
    # SIGKILL to the step's whole session (update-initramfs included) once mkinitramfs runs: a
    # fixed delay would miss it on a faster guest.
    proc = vm.ssh(
        "setsid bash /root/raid.sh >/root/raid.out 2>&1 </dev/null & pid=$!\n"
        "until pgrep -s $pid -x mkinitramfs >/dev/null; do kill -0 $pid 2>/dev/null || break; sleep 0.2; done\n"
        'kill -KILL -- -$pid; wait $pid; echo "exit $?"; cat /root/raid.out',
        check=False, timeout=600,
    )  # fmt: skip
    assert proc.stdout.startswith("exit 137\n"), proc.stdout + proc.stderr
    assert "refreshing the initramfs" in proc.stdout
    # Rerun everything, as the next `pulumi up` would (the failed step and all after it).
    reports = run_steps(vm, steps, DISK_STEPS, "first")
    raid = reports["30-raid"]
    assert raid["result"] == "changed"  # the initramfs refresh the kill interrupted
    health = reports["70-health"]
    assert health["health"] in ("clean", "resyncing") and health["mounted"] is True
    assert health["device"] == MD and health["arrayUuid"] and health["filesystemUuid"]
    node["health"] = health
    detail = vm.ssh(f"mdadm --detail {MD}").stdout
    assert "raid1" in detail and "Intent Bitmap : Internal" in detail and "any:models" in detail
    assert vm.ssh(f"findmnt -n -o FSTYPE {MOUNT}").stdout.strip() == "xfs"
    fstab = vm.ssh("cat /etc/fstab").stdout
    assert fstab.count(f"UUID={health['filesystemUuid']} ") == 1
    assert f" {MOUNT} xfs noatime,nofail,x-systemd.device-timeout=30s,x-systemd.before=kubelet.service 0 0" in fstab
    assert vm.ssh("grep -c '^ARRAY' /etc/mdadm/mdadm.conf").stdout.strip() == "1"
    assert vm.ssh(f"grep -c 'UUID={health['arrayUuid']}' /etc/mdadm/mdadm.conf").stdout.strip() == "1"
    # The declared PV capacity fits the fresh filesystem.
    assert usable_gib(SIZE_A) * 2**30 <= health["usableBytes"]
    node["file"] = write_file(vm, f"{MOUNT}/model.bin", 64)
    assert_os_intact(vm, node)


def test_second_run_changes_nothing(vm, node):
    before = snapshot(vm)
    reports = run_steps(vm, node["steps"], DISK_STEPS, "second")
    for name, rep in reports.items():
        assert rep["result"] == "unchanged", (name, rep)
    assert snapshot(vm) == before


def test_reboot_keeps_name_and_mount(vm, node):
    old_boot = vm.boot_id()
    vm.ssh("echo survived > /root/marker && sync")
    t = time.monotonic()
    vm.reboot()
    TIMINGS["reboot"] = round(time.monotonic() - t, 1)
    # The harness's reboot is a real one that keeps the root disk (checked here rather than on a VM of its own).
    assert vm.boot_id() != old_boot
    assert vm.ssh("cat /root/marker").stdout == "survived\n"
    assert_os_intact(vm, node)
    assert vm.ssh(f"test -b {MD} && findmnt -n -o SOURCE {MOUNT}").stdout.strip().startswith("/dev/md")
    assert "md/models" in vm.ssh("mdadm --detail --scan").stdout
    assert sha(vm, f"{MOUNT}/model.bin") == node["file"]
    reports = run_steps(vm, node["steps"], DISK_STEPS, "after-reboot")
    assert all(r["result"] == "unchanged" for r in reports.values()), reports


def test_grow_keeps_data(vm, node):
    bigger = render_steps(SIZE_B)
    before = node["health"]["usableBytes"]
    reports = run_steps(vm, bigger, DISK_STEPS, "grow")
    assert reports["60-grow"]["result"] == "changed"
    assert reports["30-raid"]["result"] == "unchanged" and reports["40-filesystem"]["result"] == "unchanged"
    after = reports["70-health"]["usableBytes"]
    assert after > before + 900 * 10**6
    assert usable_gib(SIZE_B) * 2**30 <= after
    assert sha(vm, f"{MOUNT}/model.bin") == node["file"]
    assert "Intent Bitmap : Internal" in vm.ssh(f"mdadm --detail {MD}").stdout
    again = run_steps(vm, bigger, ["60-grow"], "grow-again")
    assert again["60-grow"]["result"] == "unchanged"
    # Shrinking back is refused at config load, against the outputs these real reports make...
    outputs = storage_outputs(
        json.dumps(reports["70-health"]),
        json.dumps(reports["60-grow"]),
        Node.model_validate({**prod_node(), "storage": vm_storage(SIZE_B)}),
    )
    with pytest.raises(RenderError, match=rf"nodes\[0\]\.storage\.sizeGb: {SIZE_A} would shrink .* Allowed: {SIZE_B} or more"):
        render_steps(SIZE_A, deployed={"nodes": {NODE: outputs}})
    # ...and on the node, before any write, with a message that says what to do.
    proc = run(vm, render_steps(SIZE_A)["10-preflight"]["create"], check=False)
    assert proc.returncode != 0 and "shrinking is not supported" in proc.stderr
    # The size it suggests is the one the config allows (a floor of GB would suggest a refused one).
    assert proc.stderr.strip().splitlines()[-1].endswith(f"set storage.sizeGb back to at least {SIZE_B}"), proc.stderr
    node["steps"] = bigger
    assert_os_intact(vm, node)


def test_runtime_step_with_fake_nvidia_ctk(vm, node):
    """FAKE nvidia-ctk and containerd: NVIDIA's packages are not installable here."""
    install_fake_containerd(vm)
    invocation = "systemctl show -p InvocationID --value containerd"
    first_id = vm.ssh(invocation).stdout.strip()
    script = node["steps"]["80-runtime"]["create"]
    first = report(run(vm, script).stdout)
    assert first["result"] == "changed" and first["setAsDefault"] is True
    second_id = vm.ssh(invocation).stdout.strip()
    assert second_id != first_id  # restarted once
    dropin = vm.ssh("cat /etc/containerd/conf.d/99-nvidia.toml").stdout
    assert 'default_runtime_name = "nvidia"' in dropin and "nvidia-container-runtime" in dropin
    assert "--drop-in-config=/etc/containerd/conf.d/99-nvidia.toml" in vm.ssh("cat /var/log/fake-nvidia-ctk.log").stdout
    files = "stat -c '%n %Y' /etc/containerd/config.toml /etc/containerd/conf.d/99-nvidia.toml; sha256sum /etc/containerd/config.toml"
    before = vm.ssh(files).stdout
    time.sleep(1.1)
    again = report(run(vm, script).stdout)
    assert again["result"] == "unchanged"
    assert vm.ssh(invocation).stdout.strip() == second_id  # not restarted
    assert vm.ssh(files).stdout == before  # the tool's rewrite left no trace
    assert vm.ssh("test -e /run/gpu-serving/containerd-restart-pending", check=False).returncode == 1

    # A run cut short after the toolkit wrote and before the restart leaves its marker; the
    # files it wrote look unchanged to the next run, which must restart all the same.
    vm.ssh(": >/run/gpu-serving/containerd-restart-pending")
    resumed = report(run(vm, script).stdout)
    assert resumed["result"] == "changed"
    third_id = vm.ssh(invocation).stdout.strip()
    assert third_id != second_id
    assert report(run(vm, script).stdout)["result"] == "unchanged"
    assert vm.ssh(invocation).stdout.strip() == third_id


K3S_CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"


def test_runtime_step_for_k3s_with_fake_service(vm, node):
    """FAKE k3s service and nvidia-container-runtime: the k3s branch restarts the agent only while
    its generated containerd config lacks the nvidia runtime (k3s adds it itself at start)."""
    script = render_steps(SIZE_B, runtime="k3s")["80-runtime"]["create"]
    assert "GS_RUNTIME=k3s" in script and "GS_SET_AS_DEFAULT=false" in script
    vm.ssh("rm -f /usr/bin/nvidia-container-runtime")
    missing = run(vm, script, check=False)
    assert missing.returncode == 1 and "nvidia-container-runtime is not installed" in missing.stderr

    vm.put_file("#!/bin/sh\nexit 0\n", "/usr/bin/nvidia-container-runtime", "0755")
    vm.put_file(FAKE_K3S_START, "/usr/local/bin/fake-k3s-start", "0755")
    vm.put_file(fake_k3s_unit("k3s", "k3s-agent.service"), "/etc/systemd/system/k3s-agent.service")
    vm.ssh("rm -f /etc/fake-k3s.detects && systemctl daemon-reload && systemctl start k3s-agent")
    vm.ssh("touch /etc/fake-k3s.detects")  # k3s will find the runtime at its next start
    invocation = "systemctl show -p InvocationID --value k3s-agent"
    before = vm.ssh(invocation).stdout.strip()
    first = report(run(vm, script).stdout)
    assert first == {"step": "runtime", "result": "changed", "runtime": "k3s", "setAsDefault": False}
    restarted = vm.ssh(invocation).stdout.strip()
    assert restarted != before

    # What k3s writes once it has seen nvidia-container-runtime at start.
    generated = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]\n  runtime_type = "io.containerd.runc.v2"\n'
    vm.put_file(generated, K3S_CONFIG)
    again = report(run(vm, script).stdout)
    assert again["result"] == "unchanged"
    assert vm.ssh(invocation).stdout.strip() == restarted
    vm.ssh("systemctl stop k3s-agent && rm -rf /etc/systemd/system/k3s-agent.service /var/lib/rancher /usr/bin/nvidia-container-runtime"
           " /etc/fake-k3s.detects"
           " && systemctl daemon-reload")


def test_delete_scripts_keep_everything(vm, node):
    before = snapshot(vm)
    for name, step in node["steps"].items():
        out = run(vm, step["delete"]).stdout
        assert "nothing on this node was changed" in out, name
    assert snapshot(vm) == before
    assert vm.ssh(f"mdadm --detail --test {MD} >/dev/null && findmnt -n {MOUNT} >/dev/null", check=False).returncode == 0
    assert sha(vm, f"{MOUNT}/model.bin") == node["file"]


def test_missing_member_degraded_but_mounted(vm, node):
    vm.ssh("echo before-detach > /root/detach-marker && sync")
    vm.stop()
    t = time.monotonic()
    vm.start(attach=[DISKS[0]])
    # The harness boots (not resumes) the same root disk, with the detached disk's file kept and no trace of it in
    # the guest.
    assert not vm.resumed and vm.attached == [DISKS[0]]
    ids = vm.ssh("ls /dev/disk/by-id/").stdout.split()
    assert f"virtio-{DISKS[0]}" in ids and f"virtio-{DISKS[1]}" not in ids
    assert vm.ssh("readlink -f " + Vm.by_id(DISKS[0])).stdout.strip() == "/dev/vdb"
    assert vm.ssh("cat /root/detach-marker").stdout == "before-detach\n"
    assert vm.disk_path(DISKS[1]).exists()
    # Debian leaves the incomplete array inactive; the mount step's boot unit starts it after ~15 s.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if vm.ssh(f"findmnt -n {MOUNT}", check=False).returncode == 0:
            break
        time.sleep(5)
    TIMINGS["degraded boot until mounted"] = round(time.monotonic() - t, 1)
    # The boot unit the mount step installed started the array degraded and mounted it.
    diagnostics = "cat /proc/mdstat; journalctl -b --no-pager | tail -40"
    assert vm.ssh(f"findmnt -n {MOUNT}", check=False).returncode == 0, vm.ssh(diagnostics).stdout
    health = report(run(vm, node["steps"]["70-health"]["create"]).stdout)
    assert health["health"] == "degraded" and health["activeDevices"] == 1 and health["mounted"] is True, health
    assert sha(vm, f"{MOUNT}/model.bin") == node["file"]
    # The disk steps refuse to work without the missing disk, with a clear message.
    proc = run(vm, node["steps"]["10-preflight"]["create"], check=False)
    assert proc.returncode != 0 and "not a block device" in proc.stderr


def test_member_back_is_readded(vm, node):
    vm.stop()
    vm.start(attach=list(DISKS))
    reports = run_steps(vm, node["steps"], DISK_STEPS, "readd")
    assert reports["70-health"]["activeDevices"] == 2 or reports["70-health"]["health"] == "resyncing"
    assert sha(vm, f"{MOUNT}/model.bin") == node["file"]
    assert_os_intact(vm, node)
