"""Node steps re-run on a LIVE node (issue 14): a release that changes a step's text (or only lib.sh)
runs it again on a node whose pods use the volume and whose runtime runs GPU pods. Nothing it does
may take serving down.

One VM for the module; the tests build on each other, in file order:

    first run with a DKMS rollback initramfs beside the real one (kept, second run unchanged) ->
    kubelet-like bind mounts + a process holding a model file open -> every step again, as is and
    with a comment changed in lib.sh (all survive) -> device timeout change (fstab rewritten,
    synced before the rename, nothing unmounted) -> k3s and rke2 ordering -> mountpoint change refused
    until drained (and a new one inside the old one refused before anything is unmounted) ->
    runtime: invalid TOML restored without restart, a config that loads but leaves containerd
    without its CRI restored and restarted again (issue 25), imports kept and a big --help read
    under pipefail, overridden settings named -> k3s server never restarted, agent checked -> a k3s
    or rke2 agent and a containerd that never get ready (Type=notify, TimeoutStartSec=0): the step
    ends within its bound (issue 44).

Container runtimes are STAND-INS (testbed/vm/fakes): the guest cannot install containerd, the
NVIDIA toolkit or k3s. The kubelet is simulated by its bind mounts. Skipped unless GS_VM_TESTS=1.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from typing import Any

import pytest

from testbed.vm import Vm
from testbed.vm.fakes import FAKE_K3S_START, fake_k3s_unit, install_fake_containerd
from testbed.vm.steps import create_scripts

NODE = "k8s-worker-02"
DISKS = ("gs-disk-a", "gs-disk-b")
MOUNT = "/mnt/models"
MD = "/dev/md/models"
DISK_STEPS = ["10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health"]
ALL_STEPS = [*DISK_STEPS, "80-runtime"]
PODS = [f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~local-volume/models" for uid in ("7c1e-pod-a", "9f02-pod-b")]
HOLDER = "gs-test-holder"
INVOCATION = "systemctl show -p InvocationID --value {}"


def render_steps(runtime: str = "containerd", **storage: Any) -> dict[str, str]:
    """{step: create script} for the prod node pointed at the VM's disks (offline render)."""
    disks = [Vm.by_id(d) for d in DISKS]
    return create_scripts({"disks": disks, "sizeGb": 2, "raidName": "models", "mountpoint": MOUNT, **storage}, runtime=runtime)


def with_lib_comment(script: str) -> str:
    """The same step after a release that changed only a comment in lib.sh."""
    assert "# ---- lib.sh\n" in script
    return script.replace("# ---- lib.sh\n", "# ---- lib.sh\n# a comment a release changed\n", 1)


def report(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stdout
    return json.loads(lines[-1])


def run(vm: Vm, script: str, *, check: bool = True):
    """As pulumi_command runs `create`: the script text is the SSH command."""
    return vm.ssh(script, check=check, timeout=900)


def sha(vm: Vm, path: str) -> str:
    return vm.ssh(f"sha256sum < {shlex.quote(path)}").stdout.split()[0]


def live_state(vm: Vm) -> dict[str, str]:
    """What pods see: every mount of the array, the holder's open file, model data through a pod's mount."""
    pid = vm.ssh(f"systemctl show -p MainPID --value {HOLDER}").stdout.strip()
    return {
        "mounts": vm.ssh("findmnt -rn -o TARGET,SOURCE,MAJ:MIN | sort").stdout,
        "holder": pid,
        "open": vm.ssh(f"readlink /proc/{pid}/fd/3").stdout.strip(),
        "open-data": sha(vm, f"/proc/{pid}/fd/3"),
        "pod-data": sha(vm, f"{PODS[1]}/model.bin"),
    }


@pytest.fixture(scope="module")
def node(vm: Vm) -> dict[str, Any]:
    return {"steps": render_steps()}


# ---------------------------------------------------------------------------- initramfs (item 3)


def test_initramfs_refresh_keeps_the_dkms_rollback_image(vm, node):
    kernel = vm.ssh("uname -r").stdout.strip()
    rollback, bak = f"/boot/initrd.img-{kernel}.old-dkms", f"/boot/initrd.img-{kernel}.bak"
    # DKMS's rollback copy (and a hand-made one), older than the mdadm.conf the raid step writes.
    vm.ssh(f"head -c 4M /dev/urandom > {rollback} && cp {rollback} {bak} && touch -d 2020-01-01 {rollback} {bak}")
    kept = {p: sha(vm, p) for p in (rollback, bak)}
    real = sha(vm, f"/boot/initrd.img-{kernel}")
    for name in DISK_STEPS:
        proc = run(vm, node["steps"][name], check=False)
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
        if name == "30-raid":
            assert f"refreshing the initramfs for {kernel} (" in proc.stdout
            assert ".old-dkms" not in proc.stdout and ".bak" not in proc.stdout
    assert {p: sha(vm, p) for p in kept} == kept
    assert sha(vm, f"/boot/initrd.img-{kernel}") != real  # the installed kernel's image was refreshed
    again = report(run(vm, node["steps"]["30-raid"]).stdout)
    assert again["result"] == "unchanged"
    assert {p: sha(vm, p) for p in kept} == kept


# ---------------------------------------------------------------------------- a serving node (items 1, 4, 5)


def test_reruns_keep_pod_mounts_and_open_files(vm, node):
    vm.ssh(f"head -c 8M /dev/urandom > {MOUNT}/model.bin && sync")
    # kubelet's bind mounts of the local PV into two pods, and a container process reading a model.
    for pod in PODS:
        vm.ssh(f"mkdir -p {pod} && mount --bind {MOUNT} {pod}")
    vm.ssh(f"systemd-run --unit={HOLDER} --quiet bash -c 'exec 3<{PODS[0]}/model.bin; exec sleep infinity'")
    vm.ssh(f"for i in $(seq 50); do test -e /proc/$(systemctl show -p MainPID --value {HOLDER})/fd/3 && exit 0; sleep 0.2; done; exit 1")
    # The runtime stand-ins, so the re-run covers every step (containerd configured once first).
    install_fake_containerd(vm)
    run(vm, node["steps"]["80-runtime"])
    before = live_state(vm)
    assert before["open"] == f"{PODS[0]}/model.bin"
    fstab = sha(vm, "/etc/fstab")
    for variant in (lambda s: s, with_lib_comment):
        for name in ALL_STEPS:
            proc = run(vm, variant(node["steps"][name]), check=False)
            assert proc.returncode == 0, (name, proc.stderr[-2000:])
            assert report(proc.stdout)["result"] == "unchanged", (name, proc.stdout)
        assert live_state(vm) == before
    assert sha(vm, "/etc/fstab") == fstab


SYNC_SPY = r"""#!/bin/bash
# Test spy: records what the steps sync (a file's content hash, or /etc/fstab's when a folder is
# synced), then runs the real sync.
for a in "$@"; do
  if [[ -f $a ]]; then
    echo "file $a $(sha256sum <"$a" | cut -d' ' -f1)"
  elif [[ -d $a ]]; then
    echo "dir $a fstab=$(sha256sum </etc/fstab | cut -d' ' -f1)"
  fi
done >>/var/log/sync-spy.log
exec /usr/bin/sync "$@"
"""


def test_timeout_change_rewrites_fstab_synced_and_unmounts_nothing(vm, node):
    before = live_state(vm)
    vm.put_file(SYNC_SPY, "/usr/local/bin/sync", "0755")
    try:
        vm.ssh("rm -f /var/log/sync-spy.log")
        slower = render_steps(deviceTimeoutSeconds=45)
        assert report(run(vm, slower["50-mount"]).stdout)["result"] == "changed"
        spy = vm.ssh("cat /var/log/sync-spy.log").stdout.splitlines()
    finally:
        vm.ssh("rm -f /usr/local/bin/sync")
    assert "x-systemd.device-timeout=45s" in vm.ssh("cat /etc/fstab").stdout
    new = sha(vm, "/etc/fstab")
    # The new content reached the disk under the temporary name, then the folder after the rename.
    assert f"file /etc/.fstab.gpu-serving {new}" in spy, spy
    assert f"dir /etc fstab={new}" in spy, spy
    assert spy.index(f"file /etc/.fstab.gpu-serving {new}") < spy.index(f"dir /etc fstab={new}")
    assert live_state(vm) == before
    assert report(run(vm, node["steps"]["50-mount"]).stdout)["result"] == "changed"  # back to 30 s
    assert live_state(vm) == before


@pytest.mark.parametrize(
    ("runtime", "units"), [("k3s", ["k3s.service", "k3s-agent.service"]), ("rke2", ["rke2-server.service", "rke2-agent.service"])]
)
def test_k3s_and_rke2_order_the_mount_before_their_own_units(vm, node, runtime, units):
    before = live_state(vm)
    mount = render_steps(runtime=runtime)["50-mount"]
    assert report(run(vm, mount).stdout)["result"] == "changed"
    fstab = vm.ssh(f"grep ' {MOUNT} ' /etc/fstab").stdout
    assert ",".join(f"x-systemd.before={u}" for u in units) in fstab
    assert "kubelet.service" not in fstab
    order = vm.ssh("systemctl show -p Before mnt-models.mount").stdout.split("=", 1)[1].split()
    assert set(units) <= set(order)
    unit = vm.ssh("systemctl show -p Before gpu-serving-array-models.service").stdout
    assert all(u in unit for u in units)
    assert live_state(vm) == before
    assert report(run(vm, node["steps"]["50-mount"]).stdout)["result"] == "changed"
    assert "x-systemd.before=kubelet.service 0 0" in vm.ssh("cat /etc/fstab").stdout


def test_mountpoint_change_is_refused_until_the_node_is_drained(vm, node):
    before = live_state(vm)
    files = "sha256sum /etc/fstab /etc/systemd/system/gpu-serving-array-models.service; stat -c '%n %Y' /etc/fstab"
    kept = vm.ssh(files).stdout
    moved = render_steps(mountpoint="/mnt/models2")["50-mount"]
    proc = run(vm, moved, check=False)
    assert proc.returncode == 1
    assert "Drain the node first" in proc.stderr and "Nothing was changed" in proc.stderr
    assert vm.ssh(files).stdout == kept
    assert live_state(vm) == before
    # Drained: no pod mounts, no readers. Then the move goes through, and back again.
    vm.ssh(f"systemctl stop {HOLDER}; umount {' '.join(PODS)}")
    # Not into the volume, nor under the old mountpoint (immutable once unmounted): refused first.
    proc = run(vm, render_steps(mountpoint=f"{MOUNT}/v2")["50-mount"], check=False)
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if line.startswith("ERROR: ")] == [
        f"ERROR: storage.mountpoint {MOUNT}/v2 is inside {MOUNT}, where the model filesystem is (or was) mounted;"
        " choose a path outside it. Nothing was changed"
    ], proc.stderr
    assert vm.ssh(files).stdout == kept
    assert vm.ssh(f"findmnt -rn -o TARGET --source $(readlink -f {MD}); test ! -e {MOUNT}/v2").stdout.split() == [MOUNT]
    assert report(run(vm, moved).stdout)["result"] == "changed"
    targets = f"findmnt -rn -o TARGET --source $(readlink -f {MD})"
    assert vm.ssh(targets).stdout.split() == ["/mnt/models2"]
    assert report(run(vm, node["steps"]["50-mount"]).stdout)["result"] == "changed"
    assert vm.ssh(targets).stdout.split() == [MOUNT]
    assert sha(vm, f"{MOUNT}/model.bin") == before["pod-data"]


# ---------------------------------------------------------------------------- runtime (items 2, 6)

CONFIG = "/etc/containerd/config.toml"
DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
SITE_CONFIG = """version = 2
imports = ["/etc/containerd/site.d/*.toml"]

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example/pause:3.9"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
  endpoint = ["https://mirror.example"]
"""


def fresh_containerd_config(vm: Vm, mode: str) -> None:
    install_fake_containerd(vm)  # already there after the re-run test; each runtime test also stands alone
    vm.put_file(SITE_CONFIG, CONFIG, "0600")
    vm.ssh(f"rm -rf /etc/containerd/conf.d /var/log/fake-nvidia-ctk.log && touch -d 2024-05-01 {CONFIG}"
           f" && echo {mode} > /etc/fake-nvidia-ctk.mode")


def runtime_step_fails_and_restores(vm: Vm, node: dict[str, Any], mode: str) -> tuple[Any, str]:
    """The runtime step, the toolkit behaving as `mode`, fails and leaves config.toml as it was (content,
    mtime, mode), no drop-in, no restart marker, the configuration unprinted. Returns its result and
    containerd's InvocationID from before the run."""
    fresh_containerd_config(vm, mode)
    files = f"sha256sum {CONFIG}; stat -c '%n %Y %a' {CONFIG}"
    before = vm.ssh(files).stdout
    invocation = vm.ssh(INVOCATION.format("containerd")).stdout.strip()
    proc = run(vm, node["steps"]["80-runtime"], check=False)
    assert proc.returncode == 1
    assert vm.ssh(files).stdout == before
    assert vm.ssh(f"test -e {DROPIN}", check=False).returncode == 1
    assert vm.ssh("test -e /run/gpu-serving/containerd-restart-pending", check=False).returncode == 1
    assert "mirror.example" not in proc.stdout + proc.stderr  # configuration is never printed
    return proc, invocation


def test_runtime_invalid_toml_is_restored_without_restart(vm, node):
    proc, invocation = runtime_step_fails_and_restores(vm, node, "invalid")
    assert "containerd cannot load the configuration" in proc.stderr and "restored" in proc.stderr
    assert vm.ssh(INVOCATION.format("containerd")).stdout.strip() == invocation


def test_runtime_without_a_cri_after_the_restart_is_restored_and_restarted(vm, node):
    # The toolkit's config loads (config dump passes) but names a default runtime it does not
    # configure: containerd starts without its CRI plugin, and the kubelet would find no runtime.
    proc, invocation = runtime_step_fails_and_restores(vm, node, "noruntime")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR: ")]
    # The status ctr showed, not the restored daemon's (make e2e runtime-chain printed "()").
    assert len(errors) == 1 and "CRI plugin did not come up (io.containerd.grpc.v1 cri: error)" in errors[0], proc.stderr
    assert "restarted with them" in errors[0]
    assert vm.ssh(INVOCATION.format("containerd")).stdout.strip() != invocation
    cri = [line.split() for line in vm.ssh("ctr plugins ls").stdout.splitlines() if line.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
    assert cri and cri[0][-1] == "ok"  # running on the restored files
    # A node without config.toml: the step makes one first (in the version this containerd speaks),
    # and the restore removes it again (make e2e runtime-chain found it left behind). By then
    # containerd has started five times in a few seconds: systemd's start limit refused the
    # restore's restart and left the node without containerd, until the step reset the count.
    vm.ssh(f"rm -rf {CONFIG} /etc/containerd/conf.d && systemctl restart containerd")
    proc = run(vm, node["steps"]["80-runtime"], check=False)
    assert proc.returncode == 1 and "restarted with them" in proc.stderr, proc.stderr
    assert vm.ssh(f"test -e {CONFIG} || test -e {DROPIN}", check=False).returncode == 1
    # A fixed toolkit: the next run goes through.
    vm.ssh("echo good > /etc/fake-nvidia-ctk.mode")
    assert report(run(vm, node["steps"]["80-runtime"]).stdout)["result"] == "changed"


def test_runtime_keeps_imports_and_reads_big_help(vm, node):
    fresh_containerd_config(vm, "1.18.0")
    invocation = vm.ssh(INVOCATION.format("containerd")).stdout.strip()
    proc = run(vm, node["steps"]["80-runtime"])
    assert report(proc.stdout)["result"] == "changed"
    restarted = vm.ssh(INVOCATION.format("containerd")).stdout.strip()
    assert restarted != invocation
    # The help text was read whole: the drop-in flag was found.
    assert f"--drop-in-config={DROPIN}" in vm.ssh("cat /var/log/fake-nvidia-ctk.log").stdout
    imports = vm.ssh(f"grep '^imports' {CONFIG}").stdout.strip()
    assert imports == 'imports = ["/etc/containerd/site.d/*.toml", "/etc/containerd/conf.d/*.toml"]'
    files = f"stat -c '%n %Y' {CONFIG} {DROPIN}; sha256sum {CONFIG} {DROPIN}"
    before = vm.ssh(files).stdout
    again = run(vm, node["steps"]["80-runtime"])
    assert report(again.stdout)["result"] == "unchanged"
    assert vm.ssh(INVOCATION.format("containerd")).stdout.strip() == restarted
    assert vm.ssh(files).stdout == before  # the rewrites (toolkit, imports put back) left no trace


def test_runtime_names_settings_the_drop_in_overrides(vm, node):
    fresh_containerd_config(vm, "good")
    proc = run(vm, node["steps"]["80-runtime"])
    assert report(proc.stdout)["result"] == "changed"
    # containerd 1.7 takes the drop-in's CRI section whole: the settings it lacks are named, values not shown.
    for key in ("SystemdCgroup", "endpoint", "sandbox_image"):
        assert key in proc.stderr, proc.stderr
    assert "upgrade containerd to 2.1" in proc.stderr
    assert "mirror.example" not in proc.stdout + proc.stderr and "registry.example" not in proc.stdout + proc.stderr


K3S_GENERATED = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"


@pytest.fixture
def fake_k3s(vm):
    """Stand-in k3s server and agent units (neither started), nvidia-container-runtime present."""
    vm.put_file("#!/bin/sh\nexit 0\n", "/usr/bin/nvidia-container-runtime", "0755")
    vm.put_file(FAKE_K3S_START, "/usr/local/bin/fake-k3s-start", "0755")
    vm.put_file(fake_k3s_unit("k3s", "k3s.service"), "/etc/systemd/system/k3s.service")
    vm.put_file(fake_k3s_unit("k3s", "k3s-agent.service"), "/etc/systemd/system/k3s-agent.service")
    vm.ssh("rm -f /etc/fake-k3s.detects && systemctl daemon-reload")
    yield render_steps(runtime="k3s")["80-runtime"]
    vm.ssh("systemctl stop k3s k3s-agent; rm -rf /etc/systemd/system/k3s*.service /var/lib/rancher /etc/fake-k3s.detects"
           " /usr/bin/nvidia-container-runtime; systemctl daemon-reload", check=False)


def test_k3s_server_is_never_restarted(vm, fake_k3s):
    vm.ssh("systemctl start k3s")
    server = vm.ssh(INVOCATION.format("k3s")).stdout.strip()
    proc = run(vm, fake_k3s, check=False)
    assert proc.returncode == 1 and "never restarts a server" in proc.stderr, proc.stderr
    assert vm.ssh(INVOCATION.format("k3s")).stdout.strip() == server


def test_k3s_agent_restart_is_checked(vm, fake_k3s):
    vm.ssh("systemctl start k3s-agent")
    # The agent restarts but does not pick up the runtime: a clear failure, not "changed".
    proc = run(vm, fake_k3s, check=False)
    assert proc.returncode == 1 and f"{K3S_GENERATED} has no nvidia runtime" in proc.stderr, proc.stderr
    vm.ssh("touch /etc/fake-k3s.detects")
    assert report(run(vm, fake_k3s).stdout)["result"] == "changed"
    assert report(run(vm, fake_k3s).stdout)["result"] == "unchanged"


# ---------------------------------------------------------------------------- units that never get ready (issue 44)

UNIT_WAIT = 10  # GS_UNIT_WAIT: the step's bound on a restart in these tests (120 s on a node)


def bounded_run(vm: Vm, script: str) -> tuple[Any, float]:
    """The step with its restart bound at UNIT_WAIT, and its seconds. The SSH call's own timeout is far
    above any bound the step has: a step that waits without one fails the test instead of hanging it."""
    start, limit = time.monotonic(), UNIT_WAIT * 3 + 120
    try:
        proc = vm.ssh(f"export GS_UNIT_WAIT={UNIT_WAIT}\n" + script, check=False, timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the step still ran after {limit} s (its bound: {UNIT_WAIT} s a restart): it waits for a unit without a bound")
    return proc, time.monotonic() - start


def lock_is_free(vm: Vm, node: dict[str, Any]) -> None:
    """A disk step gets the node lock at once: the runtime step left nothing behind that holds it."""
    assert report(vm.ssh("export GS_LOCK_WAIT=5\n" + node["steps"]["70-health"], timeout=120).stdout)["step"] == "health"


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ERROR: ")]


@pytest.fixture(params=["k3s", "rke2"])
def never_ready_agent(vm, request):
    """A running FAKE k3s or rke2 agent whose next start never ends: its unit becomes Type=notify with
    TimeoutStartSec=0, as the real ones, and its daemon never sends READY=1. Yields (runtime, step)."""
    kind = request.param
    unit = f"/etc/systemd/system/{kind}-agent.service"
    vm.put_file("#!/bin/sh\nexit 0\n", "/usr/bin/nvidia-container-runtime", "0755")
    vm.put_file(FAKE_K3S_START, "/usr/local/bin/fake-k3s-start", "0755")
    vm.put_file(fake_k3s_unit(kind, f"{kind}-agent.service"), unit)
    vm.ssh(f"rm -f /etc/fake-k3s.* && systemctl daemon-reload && systemctl start {kind}-agent")
    vm.put_file(fake_k3s_unit(kind, f"{kind}-agent.service", ready=False), unit)
    vm.ssh("systemctl daemon-reload")
    yield kind, render_steps(runtime=kind)["80-runtime"]
    vm.ssh(f"systemctl stop {kind}-agent; rm -rf {unit} /var/lib/rancher /etc/fake-k3s.* /usr/bin/nvidia-container-runtime;"
           " systemctl daemon-reload", check=False)


def test_an_agent_that_never_gets_ready_does_not_hang_the_step(vm, node, never_ready_agent):
    """A plain `systemctl restart` waited for READY=1 for ever: the step, `pulumi up` and every disk
    step behind the node lock hung. Now the restart is bounded: an agent that cannot reach its server
    (its containerd config not rewritten) fails the step in one line that says what to check; one
    that wrote the config with the nvidia runtime and is not ready yet is a warning."""
    kind, script = never_ready_agent
    agent = f"{kind}-agent"
    vm.ssh("touch /etc/fake-k3s.detects /etc/fake-k3s.unreachable")
    proc, seconds = bounded_run(vm, script)
    assert proc.returncode == 1 and len(errors(proc.stderr)) == 1, proc.stderr
    error = errors(proc.stderr)[0]
    assert f"{agent} did not come back within {UNIT_WAIT} s of its restart (activating (start))" in error, error
    assert f"journalctl -u {agent}" in error and "cannot reach its server" in error
    assert seconds < UNIT_WAIT + 60, seconds
    # The wait ended, not the start: systemd goes on with it (a real agent comes up once it reaches its server).
    assert vm.ssh(f"systemctl show -p ActiveState --value {agent}").stdout.strip() == "activating"
    lock_is_free(vm, node)

    # Its server reachable, the agent writes its config with the runtime, and is still not ready.
    vm.ssh("rm /etc/fake-k3s.unreachable")
    proc, seconds = bounded_run(vm, script)
    assert proc.returncode == 0 and report(proc.stdout)["result"] == "changed", proc.stderr
    assert not errors(proc.stderr), proc.stderr
    assert f"WARNING: {agent} wrote its containerd config with the nvidia runtime, but is not ready" in proc.stderr
    assert seconds < UNIT_WAIT + 60, seconds
    # A re-run restarts nothing: the runtime is in place.
    invocation = vm.ssh(INVOCATION.format(agent)).stdout.strip()
    again, _ = bounded_run(vm, script)
    assert report(again.stdout)["result"] == "unchanged" and vm.ssh(INVOCATION.format(agent)).stdout.strip() == invocation
    lock_is_free(vm, node)


def test_a_containerd_that_never_gets_ready_does_not_hang_the_step(vm, node):
    """The same for containerd (Type=notify; a drop-in with no start timeout, a daemon that never says
    ready): the restart's wait is bounded, the files are restored, and the step fails in one line."""
    fresh_containerd_config(vm, "good")
    files = f"sha256sum {CONFIG}; stat -c '%n %Y %a' {CONFIG}"
    before = vm.ssh(files).stdout
    install_fake_containerd(vm, ready=False)  # the running daemon stays; its next start never ends
    try:
        proc, seconds = bounded_run(vm, node["steps"]["80-runtime"])
        assert proc.returncode == 1 and len(errors(proc.stderr)) == 1, proc.stderr
        error = errors(proc.stderr)[0]
        assert f"containerd did not come back within {UNIT_WAIT} s of its restart: activating (start)" in error, error
        assert "journalctl -u containerd" in error
        assert seconds < 2 * UNIT_WAIT + 60, seconds  # the toolkit's files, then the restored ones
        assert vm.ssh(files).stdout == before and vm.ssh(f"test -e {DROPIN}", check=False).returncode == 1
        lock_is_free(vm, node)
    finally:
        install_fake_containerd(vm)
