"""GpuNode at render level: the scripts each node receives, their inputs, options and outputs.

The scripts themselves run on a real kernel in tests/vm/test_node_scripts.py.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.node import component as node_component
from components.node import reports as node_reports
from components.node import script as node_script
from components.node import steps as node_steps
from stacks.config import parse, partition_bytes, size_gb_for
from tools.render import node_scripts

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "components" / "node" / "scripts"
SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
COMMAND = "command:remote:Command"
NODE = "k8s-worker-02"
PROD_DISKS = ["/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", "/dev/disk/by-id/wwn-0x5000c500a1b2c3d5"]

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def prod_nodes() -> list[dict[str, Any]]:
    import yaml

    return yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:nodes"]


def with_storage(**storage: Any) -> list[dict[str, Any]]:
    nodes = prod_nodes()
    nodes[0]["storage"] = {**nodes[0]["storage"], **storage}
    return nodes


def commands(render) -> dict[str, Any]:
    return {r.name.split(":", 1)[1]: r for r in render.of_type(COMMAND) if r.name.startswith(f"{NODE}:")}


def shellcheck(*paths: Path) -> None:
    proc = subprocess.run([SHELLCHECK, "--severity=style", *map(str, paths)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------- scripts


def test_raw_scripts_are_shellcheck_clean_and_strict():
    files = sorted(SCRIPTS.glob("*.sh"))
    assert {f.name for f in files} >= {f"{s}.sh" for s in node_steps.STEP_PARAMS} | {"lib.sh", "delete.sh"}
    for f in files:
        assert f.read_text().startswith(node_script.HEADER), f.name
    shellcheck(*files)


def test_rendered_scripts_are_shellcheck_clean(prod, tmp_path):
    """Each Command as sent, and all a step runs as one script (the Command, then the linked file it sources)."""
    paths = []
    shown = node_scripts(prod)
    for name, cmd in commands(prod).items():
        for field, text in (("create", cmd.inputs["create"]), ("delete", cmd.inputs["delete"]),
                            ("full", shown[f"nodes/{NODE}/{name}.sh"])):
            path = tmp_path / f"{name}.{field}.sh"
            path.write_text(text)
            paths.append(path)
    assert len(paths) == 24
    shellcheck(*paths)


def test_the_linked_snapshot_is_what_the_generator_makes():
    """components/node/linked/ is what each node's copy step delivers: exactly `step_files()` (`make node-scripts`)."""
    on_disk = {p.name: p.read_text() for p in node_steps.LINKED.glob("*.sh")}
    assert on_disk == node_steps.step_files(), "run `make node-scripts` and commit components/node/linked/"


def test_a_stale_snapshot_is_refused_before_any_node_is_touched(tmp_path, monkeypatch):
    for name, text in node_steps.step_files().items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(node_steps, "LINKED", tmp_path)
    assert node_steps.checked_files() == node_steps.step_files()
    (tmp_path / "30-raid.sh").write_text((tmp_path / "30-raid.sh").read_text() + "# edited by hand\n")
    with pytest.raises(ValueError, match=r"^components/node/linked is not what components/node/scripts make \(30-raid.sh\): "
                                         r"run `make node-scripts`"):
        node_steps.checked_files()


def invocation_in(folder: Path, create: str) -> str:
    return create.replace(f"GS_STEPS_DIR={node_script.STEPS_DIR}\n", f"GS_STEPS_DIR={folder}\n")


@pytest.mark.parametrize("damage", ["none", "missing", "changed"])
def test_a_step_runs_only_the_file_its_command_names(prod, tmp_path, damage):
    """The Command finds its linked script by sha256 among the copied versions and sources it; a file deleted or
    edited on the node is refused with one ERROR line naming the copy step to run again, and nothing runs."""
    create = commands(prod)["70-health"].inputs["create"]
    version = tmp_path / "steps" / "0123456789abcdef" / "linked"
    version.mkdir(parents=True)
    stand_in = "#!/usr/bin/env bash\nset -euo pipefail\necho ran \"$GS_RAID_NAME\"\n"
    # A stand-in body under the real name, and the Command's hash made to match it: what runs is what is named.
    (version / "70-health.sh").write_text(stand_in)
    named = re.sub(r"^GS_SCRIPT_SHA256=\S+$", f"GS_SCRIPT_SHA256={node_script.sha256(stand_in)}", create, flags=re.M)
    if damage == "missing":
        (version / "70-health.sh").unlink()
    if damage == "changed":
        (version / "70-health.sh").write_text(stand_in + "echo injected\n")
    result = subprocess.run(["bash", "-c", invocation_in(tmp_path / "steps", named)], capture_output=True, text=True)
    if damage == "none":
        assert (result.returncode, result.stdout) == (0, "ran models\n"), result.stderr
        return
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("ERROR: no 70-health.sh with sha256 ") and f"{NODE}:steps" in line


# systemctl verbs that return without waiting for a unit (every other one, and a verb in a variable,
# may wait for a start or stop job); `--now` and `--wait` make any of them wait.
SYSTEMCTL_NO_WAIT = {"daemon-reload", "is-active", "is-enabled", "is-failed", "show", "status", "cat", "reset-failed",
                     "enable", "disable", "reenable", "mask", "unmask", "preset", "kill", "list-units", "list-jobs"}
SYSTEMCTL_VALUE_OPTIONS = {"-p", "-t", "-s", "-H", "-M", "-n", "-o", "--property", "--type", "--state", "--signal",
                           "--kill-whom", "--job-mode", "--root", "--lines", "--output", "--host", "--machine"}
TIMEOUT = r"\btimeout(?:\s+-[ks]\s*\S+|\s+--[\w-]+(?:=\S+)?)*\s+\S+\s*$"
COMMAND_POSITION = r"(?:^|[;&|({!]|\$\(|\b(?:then|do|else|if|elif|while|until|exec|command)\b)\s*$"


def unbounded_systemctl(script: str) -> list[str]:
    """The systemctl commands in `script` that may wait for a unit without a bound: a verb that can
    wait (start, restart, stop, reload-or-restart, enable --now, a variable, ...) with neither
    `--no-block` nor a `timeout N` in front. A systemctl inside a message ('restart it yourself:
    systemctl restart k3s') is no command: only one where a command starts counts."""
    code = re.sub(r"\\\n", " ", script)
    found = []
    for line in code.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for match in re.finditer(r"(?<![\w-])systemctl(?![\w-])", line):
            before = line[:match.start()]
            bounded = re.search(TIMEOUT, before) is not None
            if not bounded and not re.search(COMMAND_POSITION, before):
                continue  # text, not a command
            words = re.split(r"[;&|)]", line[match.end():], maxsplit=1)[0].split()
            verb, skip = None, False
            for word in words:
                if skip:
                    skip = False
                elif word in SYSTEMCTL_VALUE_OPTIONS:
                    skip = True
                elif not word.startswith("-"):
                    verb = word
                    break
            waits = verb not in SYSTEMCTL_NO_WAIT or bool({"--now", "--wait"} & set(words))
            if waits and not bounded and "--no-block" not in words:
                found.append(line.strip())
    return found


@pytest.mark.parametrize(("line", "unbounded"), [
    ("systemctl restart containerd", True),
    ("  systemctl restart \"$agent\"", True),
    ("x=1; systemctl reload-or-restart k3s-agent", True),
    ("cond || systemctl start foo", True),
    ("systemctl -q enable --now foo", True),
    ("if ! systemctl stop foo; then", True),
    ("out=$(systemctl \"$verb\" foo 2>&1)", True),
    ("systemctl --no-block restart containerd", False),
    ("UNIT_ERROR=$(timeout -k 5 \"$UNIT_WAIT\" systemctl restart -- \"$1\" 2>&1 >/dev/null) || rc=$?", False),
    ("timeout 60 systemctl start foo", False),
    ("systemctl daemon-reload && systemctl -q enable \"$unit\"", False),
    ("systemctl reset-failed containerd 2>/dev/null || true", False),
    ("done < <(systemctl show -p ActiveState -p SubState -- \"$1\")", False),
    ("die \"restart it yourself when that is safe ('systemctl restart $server'), then run pulumi up again\"", False),
    ("# a comment: systemctl restart foo", False),
])
def test_the_systemctl_check_finds_a_plain_restart(line: str, unbounded: bool) -> None:
    assert bool(unbounded_systemctl(line)) is unbounded


def test_no_systemctl_in_a_step_waits_without_a_bound(prod):
    """A plain `systemctl restart` of a Type=notify unit with TimeoutStartSec=0 (k3s, rke2) waits for
    READY=1 forever: the step, `pulumi up` and the disk steps waiting on the node lock would hang.
    Every systemctl that can wait for a job is bounded (`timeout N`, or `--no-block` and a bounded
    wait), in every rendered script and in every script file (lib.sh whole)."""
    texts = {f"{name}.{field}": cmd.inputs[field] for name, cmd in commands(prod).items() for field in ("create", "delete")}
    texts |= {f.name: f.read_text() for f in SCRIPTS.glob("*.sh")}
    texts |= {f"linked/{name}": text for name, text in node_steps.step_files().items()}
    assert "systemctl restart" in texts["linked/80-runtime.sh"]  # the check sees the restarts it is about
    for name, text in texts.items():
        assert unbounded_systemctl(text) == [], name


def test_rendered_files_are_the_commands_and_the_files_they_source(prod):
    files = node_scripts(prod)
    assert sorted(files) == [f"nodes/{NODE}/{s}.sh" for s in node_steps.STEP_PARAMS]
    linked = node_steps.step_files()
    for name, cmd in commands(prod).items():
        create = cmd.inputs["create"]
        assert files[f"nodes/{NODE}/{name}.sh"] == f"{create}# ---- sourced: components/node/linked/{name}.sh\n{linked[f'{name}.sh']}"
        assert f"GS_SCRIPT_SHA256={node_script.sha256(linked[f'{name}.sh'])}" in create.splitlines()
        # The Command carries its parameters and a name, not the script: a step costs the state about a kilobyte.
        assert len(create) < 1500, (name, len(create))


def lib_of(script: str) -> str:
    return script.split("# ---- lib.sh\n", 1)[1].rsplit("\n# ---- ", 1)[0]


def test_each_step_carries_the_helpers_it_calls_and_no_other(prod):
    lib = node_script._body("lib.sh")
    functions = {name for name, _ in node_script.lib_parts(lib) if name}
    assert "".join(text for _, text in node_script.lib_parts(lib)) == lib
    assert len(functions) > 25
    for step in commands(prod):
        script = node_steps.step_files()[f"{step}.sh"]
        # What bash itself defines from the step's helpers, not what the selection thinks it kept.
        listed = subprocess.run(["bash", "-c", lib_of(script) + "\ndeclare -F"], capture_output=True, text=True, check=True)
        defined = {line.split()[-1] for line in listed.stdout.splitlines()}
        code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
        words = re.findall(r"[a-z_][a-z0-9_]*", code)
        calls = {name for name in functions if words.count(name) > (name in defined)}  # more than its definition
        assert calls - defined == set(), f"{step} calls helpers it lacks"
        assert defined - calls == set(), f"{step} carries helpers it never calls"
        assert len(script) < len(lib) + len(node_script._body(f"{step}.sh")), step


@pytest.mark.parametrize(("helper", "steps"), [
    ("cri_up", {"80-runtime"}),
    ("kube_units", {"50-mount"}),
    ("scan_disk", {"10-preflight", "20-partition", "30-raid", "60-grow"}),
    ("die", set(node_steps.STEP_PARAMS)),
])
def test_a_helper_change_re_runs_only_the_steps_that_call_it(helper: str, steps: set[str], monkeypatch) -> None:
    config = parse({k.split(":", 1)[1]: v for k, v in yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"].items()
                    if k.startswith("gpu-serving:")})
    before = {s.name: s.create for s in node_steps.steps(config.nodes[0], config.cluster)}
    body = node_script._body
    changed = body("lib.sh").replace(f"{helper}() {{", f"{helper}() {{\n  : a release changed this helper", 1)
    monkeypatch.setattr(node_script, "_body", lambda f: changed if f == "lib.sh" else body(f))
    after = {s.name: s.create for s in node_steps.steps(config.nodes[0], config.cluster)}
    assert {name for name in before if before[name] != after[name]} == steps


def test_parameters_come_first_and_quoted(prod):
    create = commands(prod)["20-partition"].inputs["create"]
    lines = create.splitlines()
    assert lines[:3] == ["#!/usr/bin/env bash", "# shellcheck disable=SC2034", "set -euo pipefail"]
    assert lines[4:7] == [f"GS_DISKS=({PROD_DISKS[0]} {PROD_DISKS[1]})", "GS_PART_NAME=gs-models", "GS_PART_BYTES=999999668224"]
    body = node_steps.step_files()["20-partition.sh"].split("# ---- 20-partition.sh\n", 1)[1]
    assert body == (SCRIPTS / "20-partition.sh").read_text().split("set -euo pipefail\n", 1)[1]


def test_quoting_does_not_depend_on_config_validation(tmp_path):
    nasty = ["/dev/disk/by-id/a b'c", "/dev/$(touch /tmp/pwned)`x`;rm -rf /"]
    params = {"GS_DISKS": nasty, "GS_RAID_NAME": "m'; reboot #", "GS_PART_NAME": "gs-x", "GS_PART_BYTES": "1048576"}
    text = node_script.render_script("10-preflight.sh", params)
    expected_disks = "GS_DISKS=(" + " ".join(shlex.quote(d) for d in nasty) + ")"
    assert expected_disks in text.splitlines()
    assert "GS_RAID_NAME='m'\"'\"'; reboot #'" in text.splitlines()
    script = tmp_path / "x.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # Executing the assignments gives back exactly the values, and runs nothing they contain.
    header = text.split("# ---- lib.sh\n", 1)[0]
    probe = tmp_path / "probe.sh"
    probe.write_text(header + 'printf "%s\\n" "${GS_DISKS[@]}" "$GS_RAID_NAME"\n')
    result = subprocess.run(["bash", str(probe)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [*nasty, "m'; reboot #"]
    assert not Path("/tmp/pwned").exists()
    # bash reads the values back unchanged.
    probe = node_script.assignments(params) + 'printf "%s\\n" "${GS_DISKS[@]}" "$GS_RAID_NAME"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [*nasty, "m'; reboot #"]


def test_bad_parameter_names_are_refused():
    with pytest.raises(ValueError):
        node_script.assignments({"X; rm": "1"})


def test_render_is_deterministic(render):
    first = node_scripts(render())
    second = node_scripts(render())
    assert first == second and first


def test_partition_bytes_are_whole_mib():
    assert partition_bytes(1000) == 999999668224
    assert partition_bytes(1000) % 2**20 == 0
    assert partition_bytes(2) == 1999634432
    assert [size_gb_for(partition_bytes(n)) for n in (1, 2, 999, 1000, 7681)] == [1, 2, 999, 1000, 7681]


# ---------------------------------------------------------------------------- what re-runs


def scripts_with(render, **storage: Any) -> dict[str, str]:
    return {name: cmd.inputs["create"] for name, cmd in commands(render(nodes=with_storage(**storage))).items()}


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before if before[name] != after[name]}


def test_each_step_sees_only_its_parameters(prod):
    scripts = {name: cmd.inputs["create"] for name, cmd in commands(prod).items()}
    assert "/mnt/ollama-models" not in scripts["20-partition"] + scripts["30-raid"] + scripts["60-grow"]
    assert "/dev/sda" not in scripts["80-runtime"] + scripts["50-mount"] + scripts["40-filesystem"]
    assert "GS_PART_BYTES" not in scripts["30-raid"].split("# ---- lib.sh")[0]


def test_mountpoint_change_reruns_only_preflight_mount_and_health(render):
    before = scripts_with(render)
    # Preflight is read-only: it checks the new mountpoint is free before anything is written.
    assert changed(before, scripts_with(render, mountpoint="/mnt/models2")) == {"10-preflight", "50-mount", "70-health"}


def test_size_change_reruns_preflight_partition_and_grow_only(render):
    before = scripts_with(render)
    assert changed(before, scripts_with(render, sizeGb=1200)) == {"10-preflight", "20-partition", "60-grow"}


def test_a_replaced_disk_reruns_the_disk_steps_and_health(render):
    """The health output must describe the array after the replacement (the rebuild), not before it."""
    before = scripts_with(render)
    disks = [prod_nodes()[0]["storage"]["disks"][0], "/dev/disk/by-id/wwn-0x5000c500a0e1f2a3"]
    assert changed(before, scripts_with(render, disks=disks)) == {"10-preflight", "20-partition", "30-raid", "60-grow", "70-health"}


@pytest.mark.parametrize(("rc", "state", "health"), [
    (0, "clean", "clean"),
    (0, "clean, resyncing", "resyncing"),
    (0, "active, resyncing (DELAYED)", "resyncing"),
    # A replaced or re-added member being rebuilt: mdadm --test says degraded, nothing is left to do.
    (1, "clean, degraded, recovering", "resyncing"),
    (1, "clean, degraded", "degraded"),
    (1, "active, degraded", "degraded"),
    (2, "clean, FAILED", "failed"),
    (4, "", "unknown"),
])
def test_array_health_from_mdadm(rc, state, health):
    script = f"source {shlex.quote(str(SCRIPTS / 'lib.sh'))}; array_health {rc} {shlex.quote(state)}; echo $ARRAY_HEALTH"
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.strip() == health


# Partitions a refusal may meet: exact sizes of earlier configs, a GB boundary, one byte either side
# of a MiB-rounded size, an adopted array's odd size, and the smallest.
@pytest.mark.parametrize("part_bytes", [
    partition_bytes(2), partition_bytes(2) + 1, partition_bytes(3) - 1, 2 * 10**9, 2 * 10**9 + 1,
    1_999_999_999, 3_500_000_000, 1, 10**12 + 12345,
])
def test_the_size_a_node_refusal_suggests_is_one_the_config_accepts(part_bytes: int) -> None:
    """The node steps' shrink refusals name the smallest sizeGb that holds the partition, as the config
    layer computes it: a floor or plain ceiling of GB would suggest a size that is refused again."""
    script = f"source {shlex.quote(str(SCRIPTS / 'lib.sh'))}; size_gb_for {part_bytes}; echo $SIZE_GB"
    suggested = int(subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout)
    assert suggested == size_gb_for(part_bytes)
    assert partition_bytes(suggested) >= part_bytes and (suggested == 1 or partition_bytes(suggested - 1) < part_bytes)


def test_timeout_change_reruns_only_mount(render):
    before = scripts_with(render)
    assert changed(before, scripts_with(render, deviceTimeoutSeconds=90)) == {"50-mount"}


def test_runtime_change_reruns_mount_and_runtime_only(render, prod):
    """The mount is ordered before the unit that runs the kubelet, which the runtime decides."""
    before = {name: cmd.inputs["create"] for name, cmd in commands(prod).items()}
    nodes = prod_nodes()
    nodes[0]["containerRuntime"] = "k3s"
    import yaml

    cluster = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]["gpu-serving:cluster"]
    k3s = render(nodes=nodes, cluster={**cluster, "runtimeClassName": "nvidia"})
    after = {name: cmd.inputs["create"] for name, cmd in commands(k3s).items()}
    assert changed(before, after) == {"50-mount", "80-runtime"}
    assert "GS_KUBELET=k3s" in after["50-mount"].split("# ---- lib.sh")[0]


def test_a_runtime_step_switched_off_reruns_no_mount(render, prod):
    """containerd and `none` run the kubelet the same way: only the runtime step comes or goes
    (make e2e runtime-chain saw the mount step run again when it switched the runtime on)."""
    before = {name: cmd.inputs["create"] for name, cmd in commands(prod).items()}
    nodes = prod_nodes()
    assert nodes[0]["containerRuntime"] == "containerd"
    nodes[0]["containerRuntime"] = "none"
    after = {name: cmd.inputs["create"] for name, cmd in commands(render(nodes=nodes)).items()}
    assert set(before) - set(after) == {"80-runtime"}
    assert {name for name in after if before[name] != after[name]} == set()


def test_unrelated_config_changes_rerun_nothing(render, prod):
    before = {name: cmd.inputs for name, cmd in commands(prod).items()}
    nodes = prod_nodes()
    nodes[0]["gpu"]["count"] = 1
    after = {name: cmd.inputs for name, cmd in commands(render(nodes=nodes, models=[])).items()}
    assert before == after


# ---------------------------------------------------------------------------- options


def test_chain_retain_secret_outputs_and_timeouts(prod):
    cmds = commands(prod)
    assert list(cmds) == list(node_steps.STEP_PARAMS)
    urn = {name: cmd.urn for name, cmd in cmds.items()}
    disk = list(node_steps.DISK_STEPS)
    (copy,) = [r for r in prod.of_type("command:remote:CopyToRemote") if r.name == f"{NODE}:steps"]
    assert cmds[disk[0]].options["dependsOn"] == [copy.urn]
    for previous, step in itertools.pairwise(disk):
        assert cmds[step].options["dependsOn"] == [urn[previous], copy.urn]
    assert cmds["80-runtime"].options["dependsOn"] == [copy.urn]  # independent of the disks
    for name in disk:
        assert cmds[name].options.get("retainOnDelete") is True, name
        assert "stdout" not in cmds[name].options.get("additionalSecretOutputs", []), name
    assert {"stdout", "stderr"} <= set(cmds["80-runtime"].options["additionalSecretOutputs"])
    for name in ("30-raid", "40-filesystem", "60-grow"):
        assert cmds[name].options["customTimeouts"]["create"] == "30m"
    for cmd in cmds.values():
        assert cmd.parent.endswith(f"gpu-serving:node:GpuNode::{NODE}")
        assert cmd.inputs["addPreviousOutputInEnv"] is False


def test_the_node_lock_waits_as_long_as_the_longest_step_may_run():
    """A step waiting for the lock must outlast any step holding it (its Pulumi timeout)."""
    import re

    def seconds(t: str) -> int:
        return int(t[:-1]) * {"s": 1, "m": 60, "h": 3600}[t[-1]]

    longest = max(seconds(t.create) for t in node_component.TIMEOUTS.values())
    lib = (SCRIPTS / "lib.sh").read_text()
    wait = re.search(r"wait=\$\{GS_LOCK_WAIT:-(\d+)\}", lib)
    assert wait and int(wait.group(1)) == longest
    assert "LOCK_DIR=/run/gpu-serving\n" in lib  # root-only, not the world-writable /run/lock
    for step in node_steps.STEP_PARAMS:
        assert f"\nnode_lock {step}\n" in (SCRIPTS / f"{step}.sh").read_text(), step


def test_runtime_steps_run_one_node_at_a_time(render):
    """Each node's runtime step waits for the previous node's (by name, whatever the config order):
    a release never restarts every node's container runtime at once. Disk steps stay parallel."""
    nodes = prod_nodes()
    for name, runtime in (("gpu-c", "containerd"), ("gpu-a", "containerd"), ("gpu-b", "none"), ("a-first", "containerd")):
        nodes.append({"name": name, "ssh": {"host": name}, "gpu": {"product": "nvidia-a100", "count": 1}, "containerRuntime": runtime})
    r = render(nodes=nodes)
    runtime = {c.name.split(":")[0]: c for c in r.of_type(COMMAND) if c.name.endswith(":80-runtime")}
    assert sorted(runtime) == ["a-first", "gpu-a", "gpu-c", NODE]

    def steps_before(command: Any) -> list[str]:
        """What a step waits for besides its own node's copy of the step files."""
        return [u for u in command.options.get("dependsOn", []) if "CopyToRemote" not in u]

    assert steps_before(runtime["a-first"]) == []
    chain = ["a-first", "gpu-a", "gpu-c", NODE]  # gpu-b has no runtime step: skipped
    for previous, name in itertools.pairwise(chain):
        assert steps_before(runtime[name]) == [runtime[previous].urn], name
    preflight = next(c for c in r.of_type(COMMAND) if c.name == f"{NODE}:10-preflight")
    assert steps_before(preflight) == []
    # Reordering the config list does not change the chain.
    again = render(nodes=list(reversed(nodes)))
    chained = {c.name: steps_before(c) for c in again.of_type(COMMAND) if c.name.endswith(":80-runtime")}
    assert chained == {c.name: steps_before(c) for c in runtime.values()}


def test_connection_uses_secret_keys_and_dial_retries(render):
    r = render(secrets={"sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----canary", "sshHostKeyWorker02": "ssh-ed25519 AAAAcanary"})
    cmd = commands(r)["30-raid"]
    conn = cmd.inputs["connection"]
    # The whole connection is one secret value (it contains the key).
    from tools.render import is_secret, redact

    assert is_secret(conn)
    value = conn["value"]
    assert value["privateKey"].endswith("canary") and value["hostKey"] == "ssh-ed25519 AAAAcanary"
    assert value["host"] == NODE and value["user"] == "root"
    assert value["dialErrorLimit"] == node_component.DIAL_ERROR_LIMIT and value["perDialTimeout"] == node_component.PER_DIAL_TIMEOUT
    for name, c in commands(r).items():
        assert "canary" not in c.inputs["create"] + c.inputs["delete"], name
        assert "canary" not in json.dumps(redact(c.inputs)), name


def test_no_host_key_means_none_sent(render):
    nodes = prod_nodes()
    del nodes[0]["ssh"]["hostKeySecret"]
    conn = commands(render(nodes=nodes))["10-preflight"].inputs["connection"]["value"]
    assert "hostKey" not in conn


def test_delete_scripts_keep_everything(prod, tmp_path):
    linked = node_steps.step_files()["delete.sh"]
    body = linked.split("# ---- delete.sh\n", 1)[1]
    for word in ("mdadm --stop", "wipefs", "umount", "rm ", "parted", "mkfs", "systemctl"):
        # Commands appear only inside the printed explanation, never as commands.
        for line in body.splitlines():
            assert not line.strip().startswith(word), line
    folder = tmp_path / "steps" / "0123456789abcdef" / "linked"
    folder.mkdir(parents=True)
    (folder / "delete.sh").write_text(linked)
    for name, cmd in commands(prod).items():
        delete = cmd.inputs["delete"]
        # With the step files on the node it explains what it kept; without them (deleted by hand, a node rebuilt) it
        # still ends well: a delete never stops the removal of a step or a stack.
        for present in (True, False):
            script = invocation_in(tmp_path / "steps" if present else tmp_path / "nowhere", delete)
            out = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            assert "nothing on this node was changed" in out.stdout
            assert ("Kept:" in out.stdout) is present, (name, out.stdout)


def test_node_without_disks_has_only_runtime(render):
    nodes = prod_nodes()
    nodes.append({"name": "gpu-3", "ssh": {"host": "gpu-3"}, "gpu": {"product": "nvidia-a100", "count": 1}})
    r = render(nodes=nodes)
    names = sorted(c.name for c in r.of_type(COMMAND) if c.name.startswith("gpu-3:"))
    assert names == ["gpu-3:80-runtime"]
    assert r.outputs["nodes"]["gpu-3"]["health"] == "no disk work"


def test_runtime_none_and_set_as_default(render):
    nodes = prod_nodes()
    nodes[0]["containerRuntime"] = "none"
    assert "80-runtime" not in commands(render(nodes=nodes))
    assert "GS_SET_AS_DEFAULT=true" in commands(render())["80-runtime"].inputs["create"]


# ---------------------------------------------------------------------------- Kubernetes side


def test_node_patch_labels_and_taint(prod):
    patches = prod.of_type("kubernetes:core/v1:NodePatch")
    assert len(patches) == 1
    patch = patches[0]
    assert patch.inputs["metadata"]["name"] == NODE
    # The project's own keys: GPU Feature Discovery owns nvidia.com/gpu.product and .count.
    assert patch.inputs["metadata"]["labels"] == {
        "gpu-serving/gpu.product": "nvidia-a100",
        "nvidia.com/gpu.present": "true",
        "gpu-serving/gpu.count": "2",
    }
    assert patch.inputs["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    runtime = commands(prod)["80-runtime"]
    assert patch.options["dependsOn"] == [runtime.urn]


def test_custom_label_and_taint(render):
    raw = parse_raw()
    cluster = {**raw["cluster"], "gpuProductLabel": "gpu", "gpuTaint": {"key": "gpu", "value": "yes", "effect": "NoExecute"}}
    r = render(cluster=cluster)
    patch = r.of_type("kubernetes:core/v1:NodePatch")[0]
    assert patch.inputs["metadata"]["labels"]["gpu"] == "nvidia-a100"
    assert patch.inputs["spec"]["taints"] == [{"key": "gpu", "value": "yes", "effect": "NoExecute"}]


def parse_raw() -> dict[str, Any]:
    import yaml

    config = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    return {k.split(":", 1)[1]: v for k, v in config.items()}


def test_runtime_class_and_device_plugin(render):
    raw = parse_raw()
    cluster = {**raw["cluster"], "runtimeClassName": "nvidia", "devicePlugin": {"enabled": True}}
    r = render(cluster=cluster)
    objects = {o["kind"]: o for o in r.kubernetes_objects()}
    assert objects["RuntimeClass"]["handler"] == "nvidia"
    ds = objects["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    image = pod["containers"][0]["image"]
    assert ":" in image and not image.endswith(":latest")
    assert "GS_SET_AS_DEFAULT=false" in commands(r)["80-runtime"].inputs["create"]
    # Without a class: none created, plugin off by default.
    kinds = {o["kind"] for o in render().kubernetes_objects()}
    assert "RuntimeClass" not in kinds and "DaemonSet" not in kinds


def test_k3s_needs_a_runtime_class():
    raw = parse_raw()
    raw["nodes"][0]["containerRuntime"] = "k3s"
    from stacks.config import ConfigError

    with pytest.raises(ConfigError, match=r"nodes\[0\]\.containerRuntime: .*runtimeClassName"):
        parse(raw)
    raw["cluster"]["runtimeClassName"] = "nvidia"
    parse(raw)


def test_pv_waits_for_the_last_disk_step(prod):
    pv = prod.of_type("kubernetes:core/v1:PersistentVolume")[0]
    grow = commands(prod)["60-grow"]
    assert grow.urn in pv.options["dependsOn"]


# ---------------------------------------------------------------------------- outputs and health


def test_outputs_under_mocks_say_unknown(prod):
    out = prod.outputs["nodes"][NODE]
    assert out == {
        "arrayDevice": "/dev/md/models",
        "disks": PROD_DISKS,
        "partitionBytes": node_reports.UNKNOWN,
        "arrayUuid": node_reports.UNKNOWN,
        "filesystemUuid": node_reports.UNKNOWN,
        "mountpoint": "/mnt/ollama-models",
        "usableBytes": node_reports.UNKNOWN,
        "health": node_reports.UNKNOWN,
    }
    assert not prod.warnings


ARRAY_HEALTH = {
    "step": "health", "result": "unchanged", "device": "/dev/md/models", "health": "degraded",
    "state": "clean, degraded", "activeDevices": 1, "raidDevices": 2, "arrayUuid": "a:b:c:d",
    "filesystemUuid": "f-u", "mountpoint": "/mnt/models", "mounted": True, "usableBytes": 1000,
}  # fmt: skip


def test_parse_report_takes_the_last_json_line():
    assert node_reports.parse_report("noise\n" + json.dumps(ARRAY_HEALTH) + "\n") == ARRAY_HEALTH
    assert node_reports.parse_report(None) is None
    assert node_reports.parse_report("") is None
    assert node_reports.parse_report("{broken") is None


def test_degraded_health_is_an_output_and_a_warning():
    node = parse(parse_raw()).nodes[0]
    out = node_reports.storage_outputs(json.dumps(ARRAY_HEALTH), None, node)
    assert out["health"] == "degraded" and out["usableBytes"] == 1000 and out["arrayUuid"] == "a:b:c:d"
    warning = node_reports.health_warning(node.name, out)
    assert warning and "degraded" in warning
    assert node_reports.health_warning(node.name, {**out, "health": "clean"}) is None


def warning_logger(name: str) -> tuple[Any, list[str]]:
    """A logger for `set_mocks` that keeps the messages of warnings and worse in the returned list."""
    import logging

    warnings: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    logger = logging.getLogger(name)
    logger.propagate = False
    logger.addHandler(Capture())
    return logger, warnings


def test_degraded_stdout_warns_through_the_component():
    """A real GpuNode under mocks whose health Command returns a degraded report."""
    import pulumi

    from stacks.config import parse as parse_config

    config = parse_config(parse_raw())

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            state = dict(args.inputs)
            if args.name.endswith(":70-health"):
                state["stdout"] = "x\n" + json.dumps(ARRAY_HEALTH) + "\n"
            return f"{args.name}-id", state

        def call(self, args):
            return {}, None

    logger, warnings = warning_logger("test-node-health")
    pulumi.runtime.set_mocks(Mocks(), project="gpu-serving", stack="test", preview=False, logger=logger)
    pulumi.runtime.set_all_config({"gpu-serving:sshPrivateKey": "k"}, ["gpu-serving:sshPrivateKey"])
    node = node_component.GpuNode(NODE, node_component.GpuNodeArgs(node=config.nodes[0], cluster=config.cluster, private_key="k"))

    result: dict[str, Any] = {}
    done = node.outputs.apply(lambda o: result.update(o))
    from tools.render import sdk

    sdk.sync_await(done.future())
    sdk.settle()
    assert result["health"] == "degraded"
    assert any("degraded" in w for w in warnings), warnings


# ---------------------------------------------------------------------------- shrinking, refused at config load

GROW = {"step": "grow", "result": "changed", "device": "/dev/md/models", "partitionBytes": partition_bytes(1000),
        "filesystemBytes": 979_000_000_000}  # fmt: skip


def deployed(**node_outputs: Any) -> dict[str, Any]:
    """Stack outputs as the last `pulumi up` of prod would have left them."""
    prod_outputs = {
        "arrayDevice": "/dev/md/models", "disks": PROD_DISKS, "partitionBytes": partition_bytes(1000),
        "arrayUuid": "a:b:c:d", "filesystemUuid": "f-u", "mountpoint": "/mnt/ollama-models",
        "usableBytes": 979_000_000_000, "health": "clean",
    }  # fmt: skip
    return {"namespace": "ai", "nodes": {NODE: {**prod_outputs, **node_outputs}}}


def render_sized(size_gb: int, outputs: dict[str, Any], **storage: Any):
    from tools.render import run_program

    nodes = json.dumps(with_storage(sizeGb=size_gb, **storage))
    return run_program("prod", overrides={"gpu-serving:nodes": nodes}, deployed=outputs)


def test_partition_bytes_output_comes_from_the_grow_report():
    node = parse(parse_raw()).nodes[0]
    out = node_reports.storage_outputs(json.dumps(ARRAY_HEALTH), "grew\n" + json.dumps(GROW), node)
    assert out["partitionBytes"] == partition_bytes(1000)
    assert out["disks"] == PROD_DISKS
    assert node_reports.storage_outputs(json.dumps(ARRAY_HEALTH), None, node)["partitionBytes"] == node_reports.UNKNOWN


def test_smaller_size_than_deployed_is_a_config_error():
    from tools.render import RenderError

    with pytest.raises(RenderError) as error:
        render_sized(500, deployed())
    message = str(error.value)
    assert message.startswith("config error: nodes[0].storage.sizeGb: 500 would shrink")
    assert NODE in message and "Allowed: 1000 or more" in message


def test_one_replaced_disk_still_counts_as_the_same_array():
    from tools.render import RenderError

    with pytest.raises(RenderError, match="would shrink"):
        render_sized(999, deployed(disks=[PROD_DISKS[0], "/dev/disk/by-id/wwn-0x5000c500a1b2c3d6"]))


@pytest.mark.parametrize(
    ("size_gb", "outputs"),
    [
        (1000, deployed()),  # unchanged
        (1500, deployed()),  # grow
        (500, deployed(partitionBytes=node_reports.UNKNOWN)),  # the grow step never finished
        (500, deployed(arrayDevice="/dev/md/old")),  # another array: nothing shrinks
        (500, deployed(disks=["/dev/sdc", "/dev/sdd"])),  # other disks
        (500, {}),  # first pulumi up
    ],
)
def test_sizes_that_do_not_shrink_the_deployed_partitions_render(size_gb, outputs):
    render = render_sized(size_gb, outputs)
    assert render.stack_reads == ["organization/gpu-serving/prod"]
    assert commands(render)["60-grow"].inputs["create"].count(f"GS_PART_BYTES={partition_bytes(size_gb)}\n") == 1


def deployed_outputs_when(answer) -> tuple[dict[str, Any], list[str], Any]:
    """`stacks.deployed_outputs()` under mocks whose engine answers the stack read with `answer(name)`:
    (outputs, warnings, the RPC manager's unhandled exception)."""
    import pulumi
    from pulumi.runtime.settings import _get_rpc_manager

    import stacks
    from tools.render import sdk

    class Engine(pulumi.runtime.Mocks):
        def new_resource(self, args):
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args):
            return answer(args.args["name"])

    logger, warnings = warning_logger(f"test-deployed-{id(answer)}")
    pulumi.runtime.set_mocks(Engine(), project="gpu-serving", stack="prod", preview=True, logger=logger, organization="acme")
    outputs = stacks.deployed_outputs()
    sdk.settle()
    return outputs, warnings, _get_rpc_manager().unhandled_exception


def test_unreadable_previous_outputs_warn_and_do_not_fail_the_run():
    asked: list[str] = []

    def answer(name):
        asked.append(name)
        if "/" in name:  # a DIY backend made before Pulumi 3.61 knows only bare stack names
            return {}, [("name", f"unknown stack {name!r}")]
        return {"name": name, "outputs": deployed(), "secretOutputNames": []}, []

    outputs, warnings, unhandled = deployed_outputs_when(answer)
    assert asked == ["acme/gpu-serving/prod", "prod"]
    assert outputs == deployed() and not warnings and unhandled is None

    outputs, warnings, unhandled = deployed_outputs_when(lambda name: ({}, [("name", "backend unreachable")]))
    assert outputs == {} and unhandled is None
    assert len(warnings) == 1 and "cannot read this stack's outputs" in warnings[0] and "backend unreachable" in warnings[0]
