"""The files the node steps read and write between runs, in the states a crash or another tool
leaves them (issue 25, items 3, 5, 6, 7, 10, 11, 13): mdadm.conf without a final newline, the raid
step's `.new-array` record empty or without its newline, an unfinished XFS on an array the raid step
did not create, the boot unit's start timeout, a node lock folder someone else made, an fstab line
that names the array by another device path, a bitmap md cannot add while a check runs, and what
the mount step wrote (fstab, the boot unit and its helper, the unit enabled) through a power cut just
after it (issue 25: fsync of the unit files). Issue 44: mdadm.conf lines that would keep the array
from being assembled at boot (each checked against mdadm by stopping the array and replaying udev's
add events; the power cut then boots a DEVICE line fixed as the refusal said), and fstab lines of
another filesystem for the mountpoint under any spelling of its path. Issue 40: a step's Command as
`pulumi up` sends it, with the node's copy of the step files as delivered, changed, deleted and made again.

One VM with two blank 4 GiB disks. The record tests use a small scratch array on loop devices in
the guest, so only the filesystem step runs on it. Skipped unless GS_VM_TESTS=1
(tests/vm/conftest.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from testbed.vm import Vm
from testbed.vm.steps import create_scripts, install_step_files, rendered_steps

DISKS = ("gs-disk-a", "gs-disk-b")
CONF = "/etc/mdadm/mdadm.conf"
ORDER = ["10-preflight", "20-partition", "30-raid", "40-filesystem", "50-mount", "60-grow", "70-health"]
SCRATCH = "/dev/md/scratch"
RECORD = "/var/lib/gpu-serving/scratch.new-array"


def report(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stdout
    return json.loads(lines[-1])


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ERROR: ")]


@pytest.fixture(scope="module")
def node(vm: Vm) -> dict[str, Any]:
    # A hand-edited mdadm.conf whose last line has no newline (editors and `echo -n` leave such files).
    vm.ssh(f"printf '# edited by hand\\nHOMEHOST <system>\\nMAILADDR root' > {CONF}")
    storage = {"disks": [vm.disk_id(d) for d in DISKS], "sizeGb": 1, "raidName": "models", "mountpoint": "/mnt/models"}
    steps = create_scripts(storage)
    reports = {}
    for name in ORDER:
        result = vm.ssh(steps[name], check=False, timeout=900)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
        reports[name] = report(result.stdout)
    return {"steps": steps, "reports": reports, "scratch": create_scripts({**storage, "raidName": "scratch"}), "storage": storage}


def conf_lines(vm: Vm) -> list[str]:
    return vm.ssh(f"cat {CONF}").stdout.splitlines()


def test_an_array_line_goes_on_a_line_of_its_own(vm: Vm, node: dict[str, Any]) -> None:
    uuid = node["reports"]["30-raid"]["uuid"]
    lines = conf_lines(vm)
    assert "MAILADDR root" in lines, lines
    arrays = [line for line in lines if line.startswith("ARRAY")]
    assert len(arrays) == 1 and arrays[0].startswith(f"ARRAY /dev/md/models metadata=1.2 UUID={uuid} "), lines


def test_an_array_line_without_a_final_newline_is_still_found(vm: Vm, node: dict[str, Any]) -> None:
    # Its mtime kept: a newer mdadm.conf than the initramfs would (rightly) refresh the initramfs.
    vm.ssh(f"t=$(stat -c %Y {CONF}) && truncate -s -1 {CONF} && touch -d @$t {CONF}")
    assert vm.ssh(f"tail -c1 {CONF}").stdout != "\n"
    result = vm.ssh(node["steps"]["30-raid"], check=False, timeout=900)
    assert result.returncode == 0, result.stderr
    assert report(result.stdout)["result"] == "unchanged"
    assert len([line for line in conf_lines(vm) if line.startswith("ARRAY")]) == 1, conf_lines(vm)


# ------------------------------------------------------------ mdadm.conf lines that keep the array down at boot (#44)


def test_a_command_as_sent_runs_the_delivered_file_its_hash_names_and_no_other(vm: Vm, node: dict[str, Any]) -> None:
    # Issue 40: a node receives the step files once (its copy step); each Command carries its parameters, the file's
    # name and sha256, and run-step.sh. The other tests run each step made one script (testbed/vm/steps.py).
    sent = rendered_steps(node["storage"], as_sent=True)
    folder = install_step_files(vm)
    result = vm.ssh(sent["50-mount"]["create"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert report(result.stdout)["result"] == "unchanged", result.stdout

    # Changed on the node: refused, and the changed text is never run.
    vm.ssh(f"echo 'echo gs-changed-file-ran >&2' >> {folder}/50-mount.sh")
    result = vm.ssh(sent["50-mount"]["create"], check=False, timeout=300)
    assert result.returncode == 1 and "gs-changed-file-ran" not in result.stdout + result.stderr, result
    assert len(errors(result.stderr)) == 1 and "pulumi up --replace" in result.stderr, result.stderr

    # Deleted: a step is refused the same way; a delete (of a step or the stack) notes it and ends 0.
    vm.ssh(f"rm -r {folder}")
    result = vm.ssh(sent["70-health"]["create"], check=False, timeout=300)
    assert result.returncode == 1 and len(errors(result.stderr)) == 1, result
    result = vm.ssh(sent["50-mount"]["delete"], check=False, timeout=300)
    assert result.returncode == 0 and "nothing on this node was changed" in result.stdout, result
    assert vm.ssh("findmnt -n -o SOURCE /mnt/models", check=False).returncode == 0

    # The copy made again (what `pulumi up --replace` of the copy step does): the same Command runs.
    install_step_files(vm)
    result = vm.ssh(sent["70-health"]["create"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr


def members(vm: Vm) -> list[str]:
    md = vm.ssh("basename $(readlink -f /dev/md/models)").stdout.strip()
    return sorted(f"/dev/{s}" for s in vm.ssh(f"ls /sys/block/{md}/slaves").stdout.split())


def assembles_as_at_boot(vm: Vm, parts: list[str]) -> bool:
    """A stand-in for a reboot: the array stopped, then udev's add event for each member, which runs
    `mdadm --incremental` with /etc/mdadm/mdadm.conf as at boot. Does /dev/md/models come back running?"""
    state = vm.run_script(
        "set -u\numount /mnt/models\nmdadm --stop /dev/md/models >/dev/null\nudevadm settle\n"
        f"udevadm trigger --action=add --settle {' '.join(parts)}\nudevadm settle\n"
        'md=$(readlink -f /dev/md/models); if [ -b /dev/md/models ]; then cat "/sys/block/${md##*/}/md/array_state"; else echo none; fi\n'
    ).stdout.split()[-1]  # fmt: skip
    return state not in ("none", "inactive", "clear")


def running_again(vm: Vm, parts: list[str]) -> None:
    """mdadm.conf as it was, the array running (a member left inactive by a refused line stopped first) and mounted."""
    vm.run_script(
        f"cp -p /root/mdadm.conf.kept {CONF}\n"
        'for s in /sys/block/md*/md/array_state; do [ "$(cat "$s")" = inactive ] || continue\n'
        '  d=${s%/md/array_state}; mdadm --stop "/dev/${d##*/}"\ndone\n'
        f"[ -b /dev/md/models ] || mdadm --assemble /dev/md/models {' '.join(parts)}\n"
        "udevadm settle; findmnt -n /mnt/models >/dev/null || mount /mnt/models\n"
    )  # fmt: skip
    assert vm.ssh("findmnt -n -o SOURCE /mnt/models").stdout.strip() == vm.ssh("readlink -f /dev/md/models").stdout.strip()


def added(*lines: str) -> Any:
    return lambda text, uuid: text.rstrip("\n") + "\n" + "".join(line.format(uuid=uuid) + "\n" for line in lines)


def ours_with(extra: str, *lines: str) -> Any:
    """Our ARRAY line with EXTRA appended, and LINES added."""
    def edit(text: str, uuid: str) -> str:
        text = re.sub(r"^(ARRAY /dev/md/models .*)$", rf"\1 {extra}", text, count=1, flags=re.M)
        return added(*lines)(text, uuid)
    return edit


# (edit of mdadm.conf, the line the refusal names, or None: mdadm assembles the array with it).
CONF_LINES = {
    # DEVICE (glob, keyword abbreviated in any case, `containers`) that leaves out both members or one.
    "DEVICE /dev/sd*": (added("DEVICE /dev/sd*"), "'DEVICE /dev/sd*'"),
    "dev /dev/nvme*": (added("dev /dev/nvme*"), "'dev /dev/nvme*'"),
    "DEVICE containers": (added("DEVICE containers"), "'DEVICE containers'"),
    "DEVICE /dev/vdb*": (added("DEVICE /dev/vdb*"), "'DEVICE /dev/vdb*'"),
    # A second ARRAY line that matches the array: mdadm assembles neither.
    "ARRAY same UUID": (added("ARRAY /dev/md/old UUID={uuid}"), "'ARRAY /dev/md/old UUID={uuid}'"),
    "ARRAY same name": (added("ARRAY /dev/md/other name=any:models"), "'ARRAY /dev/md/other name=any:models'"),
    "ARRAY <ignore>": (added("ARRAY <ignore> UUID={uuid}"), "'ARRAY <ignore> UUID={uuid}'"),
    # No ARRAY line matches (devices= leaves the members out), and AUTO keeps such arrays down.
    "AUTO -all, ours unmatched": (ours_with("devices=/dev/sd*", "AUTO -all"), "'AUTO -all'"),
    # Harmless: mdadm assembles the array with these, and the step accepts them.
    "DEVICE /dev/sd* /dev/vd*": (added("DEVICE /dev/sd* /dev/vd*"), None),
    "DEVICE partitions": (added("DEVICE partitions"), None),
    "DEVICE by-id glob": (added("DEVICE /dev/disk/by-id/virtio-gs-disk-*"), None),
    "AUTO -all": (added("AUTO -all"), None),
    "AUTO +homehost -1.x": (added("AUTO +homehost -1.x"), None),
    "HOMEHOST elsewhere": (lambda text, uuid: text.replace("HOMEHOST <system>", "HOMEHOST another-node"), None),
}


@pytest.mark.parametrize("case", list(CONF_LINES))
def test_an_mdadm_conf_line_that_would_keep_the_array_from_assembling_at_boot_is_refused(vm: Vm, node: dict[str, Any], case: str) -> None:
    edit, named = CONF_LINES[case]
    uuid = node["reports"]["30-raid"]["uuid"]
    parts = members(vm)
    vm.ssh(f"cp -p {CONF} /root/mdadm.conf.kept")
    try:
        vm.put_file(edit(vm.ssh(f"cat {CONF}").stdout, uuid), CONF)
        vm.ssh(f"touch -d 2020-01-01 {CONF}")  # older than the initramfs: no refresh in the accepted cases
        files = f"sha256sum {CONF} /boot/initrd.img-*; stat -c '%n %Y' {CONF} /boot/initrd.img-*"
        before = vm.ssh(files).stdout
        result = vm.ssh(node["steps"]["30-raid"], check=False, timeout=300)
        assert vm.ssh(files).stdout == before
        if named is None:
            assert result.returncode == 0, result.stderr
            assert report(result.stdout)["result"] == "unchanged"
        else:
            assert result.returncode != 0, result.stdout
            [error] = errors(result.stderr) or [result.stderr]
            assert error.startswith(
                f"ERROR: {CONF} would keep /dev/md/models from being assembled at the next boot: {named.format(uuid=uuid)}"
                " (mdadm --incremental /dev/vd"
            ), error
            assert error.endswith(f"; then run pulumi up again. {CONF} was not changed"), error
        # What mdadm itself does with the file when the array starts: the ground truth of the check.
        assert assembles_as_at_boot(vm, parts) == (named is None)
    finally:
        running_again(vm, parts)


def test_once_the_refused_line_is_fixed_the_array_is_assembled_under_our_name_at_boot(vm: Vm, node: dict[str, Any]) -> None:
    # An image made for SATA nodes on virtio disks. The boot that proves the fix is the power cut at
    # the end of this module (test_what_the_mount_step_wrote_survives_a_power_cut_just_after_it).
    vm.put_file(added("DEVICE /dev/sd*")(vm.ssh(f"cat {CONF}").stdout, ""), CONF)
    result = vm.ssh(node["steps"]["30-raid"], check=False, timeout=300)
    assert result.returncode != 0
    assert "Fix: add a pattern that matches /dev/vd" in result.stderr and "(e.g. /dev/vd*), or make it 'DEVICE partitions'" in result.stderr
    vm.ssh(f"sed -i 's|^DEVICE /dev/sd\\*$|DEVICE /dev/sd* /dev/vd*|' {CONF}")
    result = vm.ssh(node["steps"]["30-raid"], check=False, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "refreshing the initramfs" in result.stdout  # the boot reads the fixed line


@pytest.fixture(scope="module")
def scratch(vm: Vm, node: dict[str, Any]) -> str:
    """A RAID1 of two 320 MiB loop devices named like ours, without a filesystem; its UUID."""
    vm.run_script(
        "set -euo pipefail\n"
        "truncate -s 320M /root/scratch0 /root/scratch1\n"
        "a=$(losetup -f --show /root/scratch0); b=$(losetup -f --show /root/scratch1)\n"
        f"mdadm --create {SCRATCH} --name=scratch --level=1 --raid-devices=2 --metadata=1.2 --homehost=any --run $a $b\n"
        "udevadm settle\n"
    )
    return vm.ssh(f"mdadm --detail --export {SCRATCH} | sed -n 's/^MD_UUID=//p'").stdout.strip()


def filesystem_step(vm: Vm, node: dict[str, Any]) -> Any:
    return vm.ssh(node["scratch"]["40-filesystem"], check=False, timeout=300)


def fs_uuid(vm: Vm) -> str:
    return vm.ssh(f"blkid -p -s UUID -o value {SCRATCH}", check=False).stdout.strip()


def test_an_empty_record_is_refused_with_one_error_line(vm: Vm, node: dict[str, Any], scratch: str) -> None:
    # What a crash between mdadm --create and the record's write could leave.
    vm.ssh(f"mkdir -p /var/lib/gpu-serving && : > {RECORD}")
    result = filesystem_step(vm, node)
    assert result.returncode != 0
    assert len(errors(result.stderr)) == 1 and "not an array this program has just created" in result.stderr, result.stderr
    assert fs_uuid(vm) == ""  # nothing formatted


def test_a_record_without_its_newline_still_names_the_array(vm: Vm, node: dict[str, Any], scratch: str) -> None:
    vm.ssh(f"printf %s {scratch} > {RECORD}")
    result = filesystem_step(vm, node)
    assert result.returncode == 0, result.stderr
    assert report(result.stdout)["result"] == "changed" and fs_uuid(vm)
    assert vm.ssh(f"test -e {RECORD}", check=False).returncode == 1  # consumed once XFS is made


def test_an_unfinished_xfs_on_an_array_we_did_not_just_create_is_kept(vm: Vm, node: dict[str, Any], scratch: str) -> None:
    # An interrupted xfs_copy or xfs_mdrestore leaves sb_inprogress=1 too, over data. No record.
    before = fs_uuid(vm)
    assert before, "the previous test made XFS on the scratch array"
    vm.ssh(f"xfs_db -x -c 'sb 0' -c 'write inprogress 1' {SCRATCH} >/dev/null")
    assert "inprogress = 1" in vm.ssh(f"xfs_db -r -c 'sb 0' -c 'p inprogress' {SCRATCH}").stdout
    result = filesystem_step(vm, node)
    assert result.returncode != 0
    assert len(errors(result.stderr)) == 1 and "sb_inprogress=1" in result.stderr, result.stderr
    assert fs_uuid(vm) == before  # not made again
    # With the record naming the array (what the raid step leaves when mkfs was killed), it is redone.
    vm.ssh(f"echo {scratch} > {RECORD}")
    result = filesystem_step(vm, node)
    assert result.returncode == 0, result.stderr
    assert fs_uuid(vm) not in ("", before)


def test_the_boot_unit_cannot_hold_the_kubelet_back_forever(vm: Vm, node: dict[str, Any]) -> None:
    # Type=oneshot has no start timeout by default: a hung mdadm or mount would block the kubelet at boot.
    unit = "gpu-serving-array-models.service"
    assert vm.ssh(f"systemctl show -p TimeoutStartUSec --value {unit}").stdout.strip() == "3min"
    assert "kubelet.service" in vm.ssh(f"systemctl show -p Before --value {unit}").stdout
    assert "kubelet.service" not in vm.ssh(f"systemctl show -p RequiredBy -p RequisiteOf --value {unit}").stdout


@pytest.mark.parametrize(
    ("made_by", "says"),
    [
        # A local user's folder (under /run/lock anyone could hold the lock or pre-create it).
        ("mkdir -m 0777 /run/gpu-serving && chown nobody /run/gpu-serving", "is owned by uid 65534 with mode 777, not by root"),
        ("mkdir -m 0775 /run/gpu-serving", "is owned by uid 0 with mode 775, not by root and writable by root only"),
        ("ln -s /tmp /run/gpu-serving", "/run/gpu-serving is not a folder"),
        # Something in the lock's place that cannot be opened for writing.
        ("mkdir -m 0700 -p /run/gpu-serving/lock", "cannot open the node lock /run/gpu-serving/lock"),
    ],
)
def test_a_lock_someone_else_made_is_refused_with_one_error_line(vm: Vm, node: dict[str, Any], made_by: str, says: str) -> None:
    vm.ssh(f"rm -rf /run/gpu-serving && {made_by}")
    try:
        result = vm.ssh(node["steps"]["70-health"], check=False, timeout=300)
        assert result.returncode != 0
        assert errors(result.stderr) == [line for line in result.stderr.splitlines() if line.strip()], result.stderr
        assert len(errors(result.stderr)) == 1 and says in result.stderr, result.stderr
    finally:
        vm.ssh("rm -rf /run/gpu-serving")
    result = vm.ssh(node["steps"]["70-health"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr  # the step makes its own folder again
    assert vm.ssh("stat -c '%u %a' /run/gpu-serving").stdout.split() == ["0", "700"]


def test_every_step_waits_for_the_lock_and_names_who_holds_it(vm: Vm, node: dict[str, Any]) -> None:
    # A step that holds it (its pid alive, as the holder file says), not a bare flock.
    pid = vm.ssh("setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!").stdout.strip()
    group = vm.ssh(f"echo '{pid} 30-raid, pid 4121, since 2026-12-04 14:35:38' > /run/gpu-serving/holder\n"
                   "setsid flock /run/gpu-serving/lock sleep 600 </dev/null >/dev/null 2>&1 & echo $!\n"
                   "while flock -n /run/gpu-serving/lock true; do sleep 0.2; done").stdout.strip()  # fmt: skip
    try:
        for name in ORDER:
            result = vm.ssh("export GS_LOCK_WAIT=1\n" + node["steps"][name], check=False, timeout=120)
            assert result.returncode != 0, name
            assert errors(result.stderr) == [
                "ERROR: another gpu-serving step (30-raid, pid 4121, since 2026-12-04 14:35:38) has held /run/gpu-serving/lock on"
                " this node for 1s (a second pulumi up, or two nodes[] entries for this machine); see 'fuser -v /run/gpu-serving/lock',"
                " wait for it to finish and run pulumi up again"
            ], (name, result.stderr)
    finally:
        vm.ssh(f"kill -- -{group}; kill {pid}", check=False)
    assert vm.ssh(node["steps"]["70-health"], check=False, timeout=300).returncode == 0


def test_the_lock_folder_an_earlier_version_made_is_taken_over(vm: Vm, node: dict[str, Any]) -> None:
    # Root's, 0755: what the runtime step's restart marker left before the lock moved there.
    vm.ssh("rm -rf /run/gpu-serving && mkdir -m 0755 /run/gpu-serving")
    result = vm.ssh(node["steps"]["70-health"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert vm.ssh("stat -c '%u %a' /run/gpu-serving").stdout.split() == ["0", "700"]


def test_an_fstab_line_naming_the_array_by_another_device_path_is_replaced(vm: Vm, node: dict[str, Any]) -> None:
    # Preflight takes such a line (an adopted role's, say) as the array's own; the mount step used to
    # compare strings and refuse it after partition and raid had run.
    uuid = node["reports"]["30-raid"]["uuid"]
    by_id = f"/dev/disk/by-id/md-uuid-{uuid}"
    assert vm.ssh(f"readlink -f {by_id}").stdout.strip() == vm.ssh("readlink -f /dev/md/models").stdout.strip()
    vm.ssh(f"sed -i 's|^UUID=[^ ]* /mnt/models |{by_id} /mnt/models |' /etc/fstab && grep -q '^{by_id} ' /etc/fstab")
    result = vm.ssh(node["steps"]["50-mount"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert report(result.stdout)["result"] == "changed"
    fstab = vm.ssh("cat /etc/fstab").stdout
    assert by_id not in fstab and fstab.count(" /mnt/models xfs ") == 1, fstab
    assert vm.ssh("findmnt -n -o TARGET /mnt/models").stdout.strip() == "/mnt/models"


# ------------------------------------------------------------ fstab: any spelling of the mountpoint (#44)

# Spellings of /mnt/models that mount(8) or systemd's fstab generator take for it: a trailing slash
# (also as the octal escape \057), doubled slashes, `.` and `..`, an octal escape of a plain letter,
# a symlinked parent, a symlink to the mountpoint.
SPELLINGS = [
    "/mnt/models/", "/mnt/models//", "//mnt//models", "/mnt/./models", "/mnt/gs-up/../models", "/mnt/\\155odels",
    "/mnt/models\\057", "/mnt/gs-link/models", "/srv/gs-models-alias",
]


@pytest.fixture
def fstab_kept(vm: Vm) -> Any:
    """/etc/fstab as the test found it, put back afterwards, the array mounted again by the mount step."""
    vm.ssh("cp -p /etc/fstab /root/fstab.kept && ln -sfn /mnt /mnt/gs-link && ln -sfn /mnt/models /srv/gs-models-alias"
           " && mkdir -p /mnt/gs-up")
    yield
    # After a failure: whatever a test left mounted there goes, and the array is mounted again.
    vm.ssh("rm -f /usr/local/sbin/mount; cp -p /root/fstab.kept /etc/fstab\n"
           '[ "$(findmnt -n -o SOURCE /mnt/models)" = "$(readlink -f /dev/md/models)" ] || { umount /mnt/models; mount /mnt/models; }',
           check=False)  # fmt: skip


def with_first_fstab_line(vm: Vm, line: str) -> str:
    """Puts LINE before every other line of /etc/fstab (mount(8) takes the first that matches); the
    sha256 and mtime of the result."""
    vm.put_file(line + "\n" + vm.ssh("cat /etc/fstab").stdout, "/etc/fstab")
    return vm.ssh("sha256sum /etc/fstab; stat -c %Y /etc/fstab").stdout


def mounted_again(vm: Vm, node: dict[str, Any]) -> None:
    vm.ssh("cp -p /root/fstab.kept /etc/fstab")
    result = vm.ssh(node["steps"]["50-mount"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert vm.ssh("findmnt -n -o SOURCE /mnt/models").stdout.strip() == vm.ssh("readlink -f /dev/md/models").stdout.strip()


@pytest.mark.parametrize("target", SPELLINGS)
def test_a_foreign_fstab_line_for_the_mountpoint_is_refused_however_spelt(vm: Vm, node: dict[str, Any], fstab_kept: Any,
                                                                          target: str) -> None:
    # The array unmounted (a reboot with a disk late, an operator's umount): `mount /mnt/models` used
    # to take a tmpfs line written `/mnt/models/` and the step reported the array mounted.
    vm.ssh("umount /mnt/models")
    before = with_first_fstab_line(vm, f"tmpfs {target} tmpfs size=1m 0 0")
    result = vm.ssh(node["steps"]["50-mount"], check=False, timeout=300)
    assert result.returncode != 0, result.stdout
    assert errors(result.stderr) == [
        f"ERROR: /etc/fstab line 1 mounts tmpfs at {target}, which is storage.mountpoint /mnt/models: 'mount /mnt/models' and the"
        " next boot would mount that instead of our array. Remove or comment out that line (or choose another"
        " storage.mountpoint), then run pulumi up again"
    ], result.stderr
    assert vm.ssh("sha256sum /etc/fstab; stat -c %Y /etc/fstab").stdout == before
    assert vm.ssh("findmnt -n /mnt/models", check=False).returncode == 1  # nothing mounted there
    mounted_again(vm, node)


def test_a_foreign_fstab_line_is_refused_on_a_serving_node_too(vm: Vm, node: dict[str, Any], fstab_kept: Any) -> None:
    # Mounted: the next boot would mount whichever line systemd's generator reads first.
    before = with_first_fstab_line(vm, "tmpfs /mnt/models/ tmpfs size=1m 0 0")
    result = vm.ssh(node["steps"]["50-mount"], check=False, timeout=300)
    assert result.returncode != 0 and len(errors(result.stderr)) == 1 and "line 1 mounts tmpfs at /mnt/models/" in result.stderr
    assert vm.ssh("sha256sum /etc/fstab; stat -c %Y /etc/fstab").stdout == before
    assert vm.ssh("findmnt -n -o SOURCE /mnt/models").stdout.strip() == vm.ssh("readlink -f /dev/md/models").stdout.strip()
    mounted_again(vm, node)


@pytest.mark.parametrize("target", ["/mnt/models/", "//mnt/./models", "/mnt/gs-link/models"])
def test_our_own_line_under_another_spelling_is_replaced_and_nothing_is_unmounted(vm: Vm, node: dict[str, Any], fstab_kept: Any,
                                                                                 target: str) -> None:
    device = vm.ssh("findmnt -n -o MAJ:MIN /mnt/models").stdout
    vm.ssh(f"sed -i 's|^\\(UUID=[^ ]*\\) /mnt/models |\\1 {target} |' /etc/fstab && grep -q ' {target} ' /etc/fstab")
    result = vm.ssh(node["steps"]["50-mount"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "replacing the fstab line: UUID=" in result.stdout and "unmounting" not in result.stdout, result.stdout
    assert vm.ssh("cat /etc/fstab").stdout == vm.ssh("cat /root/fstab.kept").stdout
    assert vm.ssh("findmnt -n -o MAJ:MIN /mnt/models").stdout == device


def test_a_mountpoint_configured_through_a_symlink_is_the_same_mountpoint(vm: Vm, node: dict[str, Any], fstab_kept: Any) -> None:
    # storage.mountpoint /srv/gs-link/models, /srv/gs-link -> /mnt: the directory the array is mounted
    # on. The mount step took its own line for the old mountpoint and unmounted the serving array.
    storage = {"disks": [vm.disk_id(d) for d in DISKS], "sizeGb": 1, "raidName": "models", "mountpoint": "/srv/gs-link/models"}
    steps = create_scripts(storage)
    vm.ssh("ln -sfn /mnt /srv/gs-link")
    device = vm.ssh("findmnt -n -o MAJ:MIN /mnt/models").stdout
    try:
        results = {name: vm.ssh(steps[name], check=False, timeout=300) for name in ("10-preflight", "50-mount", "70-health")}
        assert {name: r.returncode for name, r in results.items()} == dict.fromkeys(results, 0), {n: r.stderr for n, r in results.items()}
        assert "unmounting" not in results["50-mount"].stdout, results["50-mount"].stdout
        assert report(results["70-health"].stdout)["mounted"] is True
        assert vm.ssh("findmnt -n -o MAJ:MIN /mnt/models").stdout == device
        fstab = vm.ssh("cat /etc/fstab").stdout.splitlines()
        assert [line.split()[1] for line in fstab if "/models " in line] == ["/srv/gs-link/models"], fstab
        again = vm.ssh(steps["50-mount"], check=False, timeout=300)
        assert again.returncode == 0 and report(again.stdout)["result"] == "unchanged", again.stderr
    finally:
        vm.ssh("rm -f /srv/gs-link")
    mounted_again(vm, node)


MOUNT_STAND_IN = """#!/bin/sh
# Test stand-in: mount(8) taking the path to another filesystem's fstab line.
for a; do t=$a; done
exec /usr/bin/mount -t tmpfs -o size=1m gs-foreign "$t"
"""


def test_the_mount_step_reports_the_array_mounted_only_when_it_is(vm: Vm, node: dict[str, Any], fstab_kept: Any) -> None:
    # Whatever sends `mount /mnt/models` elsewhere (a spelling no check foresaw), the step looks at
    # what is mounted there before it says so.
    vm.ssh("umount /mnt/models")
    vm.put_file(MOUNT_STAND_IN, "/usr/local/sbin/mount", "0755")
    try:
        result = vm.ssh(node["steps"]["50-mount"], check=False, timeout=300)
    finally:
        vm.ssh("rm -f /usr/local/sbin/mount")
    assert result.returncode != 0, result.stdout
    assert errors(result.stderr) == [
        "ERROR: after 'mount /mnt/models', gs-foreign (unmounted again) is mounted there, not our array /dev/md/models (device "
        + vm.ssh("cat /sys/class/block/$(basename $(readlink -f /dev/md/models))/dev").stdout.strip()
        + "). See which line mount(8) takes for it: 'findmnt --fstab --target /mnt/models'; remove that line or choose another"
        " storage.mountpoint, then run pulumi up again"
    ], result.stderr
    assert vm.ssh("findmnt -n /mnt/models", check=False).returncode == 1
    mounted_again(vm, node)


def test_a_bitmap_that_cannot_be_added_during_a_check_is_not_called_a_grow(vm: Vm, node: dict[str, Any]) -> None:
    # Nothing to grow, no bitmap (an adopted array below 100 GB has none), and a check running:
    # md refuses the bitmap until it ends. The step said "has grown" although nothing grew.
    md = vm.ssh("basename $(readlink -f /dev/md/models)").stdout.strip()
    sysfs = f"/sys/block/{md}/md"
    vm.ssh(f"mdadm --grow /dev/md/models --bitmap=none && echo 1000 > {sysfs}/sync_speed_max && echo check > {sysfs}/sync_action")
    try:
        result = vm.ssh(node["steps"]["60-grow"], check=False, timeout=300)
        assert result.returncode != 0
        assert errors(result.stderr) == [
            "ERROR: /dev/md/models has no write-intent bitmap, and md cannot add one during the check that runs now"
            " (watch 'cat /proc/mdstat'); run pulumi up again when it has finished"
        ], result.stderr
    finally:
        vm.ssh(f"echo idle > {sysfs}/sync_action; echo system > {sysfs}/sync_speed_max; mdadm --wait /dev/md/models || true")
    result = vm.ssh(node["steps"]["60-grow"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "adding it" in result.stdout and report(result.stdout)["result"] == "changed"
    assert vm.ssh(f"cat {sysfs}/bitmap/location").stdout.strip() != "none"


def test_a_command_killed_in_any_step_ends_it_with_one_error_line_and_the_next_run_converges(vm: Vm, node: dict[str, Any]) -> None:
    # Induced failures on a converged node (what a re-run meets): each tool a disk step needs is,
    # in turn, SIGKILLed whenever the step runs it (a stand-in earlier in PATH). A step may still
    # succeed (the tool was not needed, or its failure is handled); if it fails it says so.
    sweep = ["set -u; rm -f /root/sweep.out"]
    for name in ORDER:
        tools = re.findall(r"^need_tools ([a-z0-9_. -]+)$", node["steps"][name], re.M)
        assert tools, name
        vm.put_file(node["steps"][name], f"/root/{name}.sh", "0700")
        for tool in tools[0].split():
            sweep.append(
                f"printf '#!/bin/sh\\nkill -KILL $$\\n' > /usr/local/sbin/{tool}; chmod 755 /usr/local/sbin/{tool}\n"
                f"bash /root/{name}.sh </dev/null >/dev/null 2>/root/err; rc=$?; rm -f /usr/local/sbin/{tool}\n"
                f"bash /root/{name}.sh </dev/null >/dev/null 2>/root/err2; again=$?\n"
                f"echo \"{name} {tool} $rc $(grep -c '^ERROR: ' /root/err) $again\" >> /root/sweep.out"
            )
    vm.run_script("\n".join(sweep), timeout=1800)
    rows = [line.split() for line in vm.ssh("cat /root/sweep.out").stdout.splitlines()]
    assert len(rows) >= 7 * 5, rows
    silent = [r for r in rows if r[2] != "0" and r[3] != "1"]
    assert not silent, f"failed without exactly one ERROR line (step tool rc errors): {silent}"
    assert [r for r in rows if r[4] != "0"] == [], rows
    assert any(r[2] != "0" for r in rows)  # the sweep did make steps fail


def test_what_the_mount_step_wrote_survives_a_power_cut_just_after_it(vm: Vm, node: dict[str, Any]) -> None:
    # ext4 commits its journal every 5 s and the kernel writes dirty pages back after 30 s: widen
    # both to ten minutes, so that only what the step syncs itself is on the disk when the power goes.
    unit = "gpu-serving-array-models.service"
    files = [f"/etc/systemd/system/{unit}", "/usr/local/sbin/gpu-serving-start-array", "/etc/fstab"]
    written = {path: vm.ssh(f"cat {path}").stdout for path in files}
    # What the mount step wrote on the first run goes (durably), so that this run writes it all again.
    vm.ssh(f"systemctl -q disable {unit} && rm {' '.join(files[:2])} && sed -i '\\| /mnt/models |d' /etc/fstab && sync")
    vm.ssh("mount -o remount,commit=600 / && sysctl -q vm.dirty_expire_centisecs=60000 vm.dirty_writeback_centisecs=0")
    result = vm.ssh(node["steps"]["50-mount"], check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert report(result.stdout)["result"] == "changed"
    vm.power_cut()
    assert {path: vm.ssh(f"cat {path}", check=False).stdout for path in files} == written
    assert vm.ssh(f"systemctl is-enabled {unit}", check=False).stdout.strip() == "enabled"
    assert vm.ssh("findmnt -n -o SOURCE /mnt/models").stdout.strip() == vm.ssh("readlink -f /dev/md/models").stdout.strip()
    # Assembled at that boot under our name, by the mdadm.conf whose DEVICE line an operator fixed as
    # the raid step said (test_once_the_refused_line_is_fixed_the_array_is_assembled_under_our_name_at_boot).
    assert "DEVICE /dev/sd* /dev/vd*" in conf_lines(vm)
    assert "ARRAY /dev/md/models " in vm.ssh("mdadm --detail --scan").stdout
