"""Checks 1–9: the real engine on the lab VM, the Kubernetes provider writing YAML."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stacks.config import parse
from testbed.e2e.run import CheckError, Run, object_key, provider_objects, rendering, require, stack_raw, tail
from tools.render import ROOT, RenderError, policy_config_json, run_program, write

LAB_SIZE_GB, GROWN_SIZE_GB = 2, 3
CANARY_FILE = "/mnt/models/e2e-canary.bin"
# Declared on the lab VM but plugged in only by the check that uses them: the blank disk that
# replaces a failed member (replace-disk), and two disks for the Ansible role's layout (adopt-ansible:
# its partition 5 starts at 34 GB; sparse files, so only what is written takes room).
SPARE_DISK = "gs-disk-c"
ROLE_DISKS = ("gs-role-a", "gs-role-b")


@dataclass
class EndToEnd(Run):
    """The nine checks of `make e2e`, each a method returning its one-line detail."""

    def __post_init__(self) -> None:
        self.yaml_prod = self.tmp / "yaml-prod"
        self.yaml_lab = self.tmp / "yaml-lab"
        self.plugins = Path(self.env["PULUMI_HOME"]) / "plugins"
        self.pinned_plugins = {("kubernetes", self.env["KUBERNETES_VERSION"]), ("command", self.env["COMMAND_VERSION"])}

    def vm_sh(self, command: str) -> str:
        return self.vm.ssh(command).stdout.strip()

    def installed_plugins(self) -> set[tuple[str, str]]:
        listed = json.loads(self.pulumi("plugin", "ls", "--json").stdout or "[]")
        return {(p["name"], p["version"]) for p in listed}

    def engine_versions(self) -> str:
        env = self.env
        cli = self.pulumi("version").stdout.strip()
        host = subprocess.run(["pulumi-language-python", "-version"], env=env, capture_output=True, text=True).stdout.strip()
        self.report["engine"] = {"pulumi": cli, "pulumi-language-python": host}
        for name, version in sorted(self.installed_plugins()):
            self.report["engine"][f"pulumi-resource-{name}"] = f"v{version}"
        require(cli == f"v{env['PULUMI_VERSION']}", f"pulumi version is {cli}, pinned v{env['PULUMI_VERSION']}")
        require(host == env["PYTHON_HOST_TAG"], f"language host reports {host!r}, pinned {env['PYTHON_HOST_TAG']}")
        require(self.installed_plugins() == self.pinned_plugins,
                 f"PULUMI_HOME plugins are {sorted(self.installed_plugins())}, pinned {sorted(self.pinned_plugins)}")
        for name, version in sorted(self.pinned_plugins):
            binary = self.plugins / f"resource-{name}-v{version}" / f"pulumi-resource-{name}"
            require(f"v{version}".encode() in binary.read_bytes(), f"{binary} carries no v{version} stamp")
        require(env.get("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION") == "true", "plugin downloads are not switched off")
        return ", ".join(f"{k} {v}" for k, v in self.report["engine"].items())

    def secret_values(self, raw: dict[str, Any], ssh_key: str) -> dict[str, str]:
        """A canary for every secret: those the stack reads, and the HF token and API key it leaves
        unread while it renders YAML (set anyway, as an operator's stack would have them)."""
        values = {"sshPrivateKey": ssh_key}
        for key in ("hfToken", "vllmApiKey", *parse(raw).secret_keys()):
            values.setdefault(key, self.canaries.setdefault(key, f"gs-canary-{key}-{secrets.token_hex(8)}"))
        return values

    def preview_prod(self) -> str:
        raw = rendering(stack_raw("prod"), self.yaml_prod)
        self.new_stack("prod", raw, self.secret_values(raw, self.canaries["sshPrivateKey"]))
        # As docs/deploying.md and preview.yml run it: the pack's config written by the render of the same stack.
        offline = self.offline_render("prod")
        config = self.project / "rendered" / "prod" / "policy-config.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(policy_config_json(offline))
        preview = json.loads(self.timed("previewSeconds", "preview", "--policy-pack", "policy", "--policy-pack-config",
                                        str(config.relative_to(self.project)), "--json", stack="prod").stdout)
        steps = [s for s in preview.get("steps", []) if not engine_owned(s["urn"])]
        self.report["figures"]["previewResources"] = len(steps)
        require(len(steps) == len(offline.resources),
                 f"preview declares {len(steps)} resources, the offline render {len(offline.resources)}: "
                 f"{sorted(set(s['urn'] for s in steps) ^ set(r.urn for r in offline.resources))[:5]}")
        require(all(s["op"] == "create" for s in steps), "a first preview that does not only create")
        return f"{len(steps)} resources, as the offline render; policy pack ran clean"

    def preview_policy_violation(self) -> str:
        # A start-up budget no model can meet: the real analyzer must stop the preview and name the rule.
        config = self.tmp / "policy-config.json"
        config.write_text(json.dumps({"gpu-startup-probe": {"minStartupSeconds": 86400}}))
        proc = self.pulumi("preview", "--policy-pack", "policy", "--policy-pack-config", str(config), stack="prod", check=False)
        text = proc.stdout + proc.stderr
        require(proc.returncode != 0, "the preview passed despite a mandatory violation")
        require("gpu-startup-probe" in text and "mandatory" in text, f"the failure does not name the rule: {tail(text)}")
        line = next(line.strip() for line in text.splitlines() if "gpu-startup-probe" in line)
        return f"preview failed (exit {proc.returncode}): {line}"

    def bench_engine_quick(self) -> str:
        """`make bench-engine BENCH_ARGS=--quick` on the real engine, through its test (tests/test_bench_fleet.py),
        which `make test` skips: it runs here, where the engine is built. Its own temporary project and backend."""
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_bench_fleet.py",
                               "-k", "quick_engine_bench"], cwd=ROOT, env={**self.env, "GS_ENGINE_TESTS": "1"},
                              capture_output=True, text=True, timeout=1200)
        with self.log.open("a") as log:
            log.write(f"$ GS_ENGINE_TESTS=1 pytest tests/test_bench_fleet.py -k quick_engine_bench\n{proc.stdout}{proc.stderr}\n")
        summary = tail(proc.stdout, 1)
        require(proc.returncode == 0 and "1 passed" in summary, f"the quick benchmark's test: {tail(proc.stdout + proc.stderr)}")
        return summary

    def preview_refuses_like_render(self) -> str:
        """Stack files the offline render refuses are refused by `pulumi preview` too, naming the same key."""
        seen = []
        for i, (what, mutate, key_path) in enumerate(REFUSED_FILES):
            raw = rendering(stack_raw("prod"), self.tmp / f"yaml-refused-{i}")
            mutate(raw)
            name = f"refused{i}"
            self.new_stack(name, raw, {"sshPrivateKey": self.canaries["sshPrivateKey"], "sshHostKeyWorker02": "unused"})
            try:
                run_program(name, stack_file=self.project / f"Pulumi.{name}.yaml")
                raise CheckError(f"{what}: the offline render accepted it")
            except RenderError as exc:
                require(str(exc).startswith(f"config error: {key_path}: "), f"{what}: the render names another key: {exc}")
            proc = self.pulumi("preview", stack=name, check=False)
            text = proc.stdout + proc.stderr
            line = next((line.strip() for line in text.splitlines() if f"config error: {key_path}: " in line), None)
            require(proc.returncode != 0 and line is not None, f"{what}: the preview did not refuse it naming {key_path}: {tail(text)}")
            seen.append(key_path)
        # A key given twice: the CLI refuses the file itself, the render says so with the key's path.
        stack_file = self.project / "Pulumi.refused-dup.yaml"
        self.new_stack("refused-dup", rendering(stack_raw("prod"), self.tmp / "yaml-dup"),
                       {"sshPrivateKey": self.canaries["sshPrivateKey"], "sshHostKeyWorker02": "unused"})
        # After `pulumi config set` the CLI has rewritten the file: its indentation is the CLI's.
        stack_file.write_text(_duplicate_revision(stack_file.read_text()))
        try:
            run_program("refused-dup", stack_file=stack_file)
            raise CheckError("the offline render accepted a duplicate key")
        except RenderError as exc:
            require("gpu-serving:models[0].revision is given twice" in str(exc), f"the render names another key: {exc}")
        proc = self.pulumi("preview", stack="refused-dup", check=False)
        require(proc.returncode != 0 and "revision" in proc.stdout + proc.stderr,
                f"the preview did not refuse the duplicate key: {tail(proc.stdout + proc.stderr)}")
        return f"render and preview refuse the same {len(seen) + 1} files, naming {', '.join(seen)} and the duplicate revision"

    def up_lab(self) -> str:
        from testbed.vm import DEFAULT_DISKS, GiB, Vm, ensure_booted_state, ensure_image

        # The image's saved boot, resumed (seconds; cached beside the image by the first run, VM
        # tests or e2e), then its two disks plugged in: the same disks at the same PCI slots as a boot.
        # The spare and the role's disks are declared, plugged in later by replace-disk and adopt-ansible.
        extra = ((SPARE_DISK, 4 * GiB), *((name, 40 * GiB) for name in ROLE_DISKS))
        image = ensure_image()
        # A machine loaded by other guests can take minutes under TCG.
        self.vm = Vm(self.tmp / "vm", (*DEFAULT_DISKS, *extra), image=image, booted=ensure_booted_state(image), boot_timeout=600)
        self.vm.start(attach=[name for name, _ in DEFAULT_DISKS])
        require(self.vm.resumed and self.vm.attached == list(dict(DEFAULT_DISKS)),
                f"the lab VM did not resume with its disks (resumed={self.vm.resumed}, disks {self.vm.attached})")
        raw = rendering(stack_raw("lab"), self.yaml_lab)
        raw["nodes"][0]["ssh"]["port"] = self.vm.port
        raw["models"][0]["apiKeySecret"] = "vllmApiKey"  # so the API key canary goes through state too
        self.new_stack("lab", raw, self.secret_values(raw, self.vm.key_path.read_text()))
        self.timed("upSeconds", "up", "--yes", "--skip-preview", stack="lab", timeout=3600)
        node = self.outputs("lab")["nodes"]["lab-node"]
        mount = self.vm_sh("findmnt -n -o FSTYPE,SOURCE /mnt/models")
        array_uuid = self.vm_sh("mdadm --detail --export /dev/md/models | sed -n 's/^MD_UUID=//p'")
        fs_uuid = self.vm_sh("blkid -s UUID -o value /dev/md/models")
        require(mount.startswith("xfs "), f"/mnt/models is not the XFS array: {mount!r}")
        require(node.get("arrayUuid") == array_uuid, f"output arrayUuid {node.get('arrayUuid')!r}, the node has {array_uuid!r}")
        require(node.get("filesystemUuid") == fs_uuid, f"output filesystemUuid {node.get('filesystemUuid')!r}, the node has {fs_uuid!r}")
        require(node.get("health") == "clean", f"health output is {node.get('health')!r}")
        return f"array {array_uuid} mounted ({mount}), filesystem {fs_uuid}, health clean"

    def render_matches_engine(self) -> str:
        engine = {object_key(o): o for o in provider_objects(self.yaml_lab)}
        offline = {object_key(o): o for o in self.offline_render("lab").kubernetes_objects()}
        differing = sorted(k for k in set(engine) | set(offline) if engine.get(k) != offline.get(k))
        self.report["figures"]["renderVsEngineDifferingObjects"] = len(differing)
        if differing:
            (self.out / "render-vs-engine").mkdir(exist_ok=True)
            for key in differing:
                name = key.replace("/", "_")
                for side, objects in (("engine", engine), ("offline", offline)):
                    (self.out / "render-vs-engine" / f"{name}.{side}.yaml").write_text(yaml.safe_dump(objects.get(key)))
        require(not differing, f"{len(differing)} of {len(offline)} objects differ (see e2e-out/render-vs-engine/): {differing[:4]}")
        return f"{len(engine)} objects written by the provider equal the offline render's"

    def second_up_no_changes(self) -> str:
        same = self.second_up_changes_nothing("lab", "noopUpSeconds")
        return f"preview and up: no changes ({same} resources the same, no Command ran)"

    def grow(self) -> str:
        before_sum = self.vm_sh(f"head -c 32M /dev/urandom > {CANARY_FILE} && sync && sha256sum {CANARY_FILE} | cut -d' ' -f1")
        before_size = int(self.vm_sh("df -B1 --output=size /mnt/models | tail -1"))
        expected = self.steps_carrying_size()
        self.edit_stack("lab", lambda config: config["gpu-serving:nodes"][0]["storage"].__setitem__("sizeGb", GROWN_SIZE_GB))
        preview = json.loads(self.pulumi("preview", "--json", stack="lab").stdout)
        updated = sorted(s["urn"].rsplit("::", 1)[1] for s in preview.get("steps", [])
                         if s["op"] != "same" and "command:remote:Command" in s["urn"])
        require(updated == expected, f"the size change updates the steps {updated}; the steps that carry the size are {expected}")
        self.timed("growSeconds", "up", "--yes", "--skip-preview", stack="lab", timeout=3600)
        after_size = int(self.vm_sh("df -B1 --output=size /mnt/models | tail -1"))
        after_sum = self.vm_sh(f"sha256sum {CANARY_FILE} | cut -d' ' -f1")
        require(after_size > before_size, f"the filesystem did not grow: {before_size} -> {after_size} bytes")
        require(after_sum == before_sum, "the file written before the grow changed")
        self.canary_sum = after_sum
        return f"updated {', '.join(updated)}; XFS {before_size} -> {after_size} bytes; file checksum kept"

    def steps_carrying_size(self) -> list[str]:
        """The node steps whose script text differs between the two sizes (what `pulumi up` must re-run)."""
        scripts = []
        for size in (LAB_SIZE_GB, GROWN_SIZE_GB):
            render = self.offline_render("lab", size_gb=size)
            scripts.append({c.name: c.inputs.get("create") for c in render.of_type("command:remote:Command")})
        return sorted(name for name in scripts[0] if scripts[0][name] != scripts[1].get(name))

    def destroy_keeps_data(self) -> str:
        self.timed("destroySeconds", "destroy", "--yes", "--skip-preview", stack="lab", timeout=3600)
        test = self.vm.ssh("mdadm --detail --test /dev/md/models >/dev/null", check=False).returncode
        mount = self.vm_sh("findmnt -n -o FSTYPE /mnt/models || true")
        fstab = self.vm_sh("grep -c ' /mnt/models xfs ' /etc/fstab || true")
        checksum = self.vm_sh(f"sha256sum {CANARY_FILE} | cut -d' ' -f1")
        require(test == 0, f"the array is not clean after destroy (mdadm --detail --test exit {test})")
        require(mount == "xfs", f"/mnt/models is not mounted after destroy ({mount!r})")
        require(fstab == "1", f"the fstab line is gone or doubled after destroy ({fstab} lines)")
        require(checksum == getattr(self, "canary_sum", None), "the file on the array changed")
        return "array clean and mounted, fstab line kept, file checksum kept"

    def no_secret_in_state(self) -> str:
        canaries = {key: needle(value) for key, value in self.canaries.items()}
        places = [p for p in (self.tmp / "state").rglob("*") if p.is_file()]
        places += sorted(self.project.glob("Pulumi.*.yaml")) + sorted(self.project.glob("examples/*/Pulumi.*.yaml"))
        places += [self.log, *sorted(self.yaml_prod.rglob("*")), *sorted(self.yaml_lab.rglob("*")),
                   *sorted((self.out / "rendered").rglob("*"))]
        leaks = []
        for place in (p for p in places if p.is_file()):
            text = place.read_text(errors="replace")
            leaks += [f"{key} in {place}" for key, needle in canaries.items() if needle in text]
        report = json.dumps(self.report)
        leaks += [f"{key} in the report" for key, needle in canaries.items() if needle in report]
        self.report["figures"]["secretLeaks"] = len(leaks)
        require(not leaks, f"{len(leaks)} leaks: {leaks[:4]}")
        return f"{len(canaries)} canaries ({', '.join(sorted(canaries))}) in none of {len(places)} files, the CLI output or the report"

    # ---- helpers --------------------------------------------------------------------------

    def offline_render(self, stack: str, size_gb: int | None = None) -> Any:
        """`make render` of the temporary stack's config (secret values never reach it)."""
        stack_file = self.project / f"Pulumi.{stack}.yaml"
        overrides = None
        if size_gb is not None:
            nodes = yaml.safe_load(stack_file.read_text())["config"]["gpu-serving:nodes"]
            nodes[0]["storage"]["sizeGb"] = size_gb
            overrides = {"gpu-serving:nodes": json.dumps(nodes)}
        try:
            render = run_program(stack, overrides=overrides, stack_file=stack_file)
        except RenderError as exc:
            raise CheckError(f"offline render of {stack}: {exc}") from None
        if size_gb is None:
            write(render, self.out / "rendered" / stack)
        return render


def _set(path: str, value: Any) -> Any:
    def mutate(raw: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = raw
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
    return mutate


def _second_node_on_the_same_disk(raw: dict[str, Any]) -> None:
    node = json.loads(json.dumps(raw["nodes"][0]))
    node.update(name="k8s-worker-03", ssh={"host": "k8s-worker-03", "user": "root"})
    node["storage"]["disks"] = [raw["nodes"][0]["storage"]["disks"][0], "/dev/sdd"]
    raw["nodes"].append(node)


# (what, the one mistake, the key path both the render and the preview name)
REFUSED_FILES = (
    ("an IP address as Ingress host", _set("models.0.ingress.host", "192.168.10.20"), "models[0].ingress.host"),
    ("a moving image tag", _set("models.0.image", "vllm/vllm-openai:nightly"), "models[0].image"),
    ("an SSH user that is not root", _set("nodes.0.ssh.user", "ubuntu"), "nodes[0].ssh.user"),
    ("one disk under two nodes", _second_node_on_the_same_disk, "nodes[1].storage.disks[0]"),
)


def _duplicate_revision(text: str) -> str:
    """The stack file with the model's `revision:` given twice in its mapping, at the file's own indent."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        found = re.match(r"^(\s*)(- )?revision: \S+$", line.rstrip("\n"))
        if found:
            lines.insert(i + 1, f"{found[1]}{'  ' if found[2] else ''}revision: v1\n")
            return "".join(lines)
    raise CheckError("no `revision:` line in the stack file to give twice")


def engine_owned(urn: str) -> bool:
    """Resources the engine adds on its own: the stack, and default providers."""
    kind = urn.split("::")[2]
    return kind == "pulumi:pulumi:Stack" or (kind.startswith("pulumi:providers:") and urn.split("::")[3].startswith("default"))


def needle(value: str) -> str:
    """What to look for: a key's longest line but its armour (`-----BEGIN …`, the same in every key)."""
    return max((line for line in value.strip().splitlines() if not line.startswith("-----")), key=len)
