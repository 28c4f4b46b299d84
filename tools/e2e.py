"""make e2e: the program under the real Pulumi engine, end to end.

    python -m tools.e2e                 # all checks, report in e2e-out/report.json
    python -m tools.e2e --keep          # keep the temporary project, state and VM folder

Needs `make engine` (the CLI, the Python language host and the kubernetes and command providers,
built from pinned Go modules) and the VM image of tests/vm. Everything happens in a temporary
folder: a copy of the project's tracked files, a local file backend, secrets encrypted with a
random passphrase, and a throwaway VM (the lab node) reached over SSH on 127.0.0.1. The Kubernetes
provider writes YAML (`cluster.renderYamlTo`), so no cluster is needed.

One check per step, in order; a check that needs an earlier one's result fails when it failed.
Prints one line per check and exits 1 when any failed.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stacks.config import parse
from tools.render import ROOT, RenderError, run_program, write

OUT = ROOT / "e2e-out"
LAB_SIZE_GB, GROWN_SIZE_GB = 2, 3
CANARY_FILE = "/mnt/models/e2e-canary.bin"


class CheckError(Exception):
    """A check's assertion, with the detail that goes into the report."""


def engine_env() -> dict[str, str]:
    """The environment tools/engine/env.sh sets (PATH to the built engine, PULUMI_HOME, no downloads)."""
    out = subprocess.run(["bash", str(ROOT / "tools/engine/env.sh")], capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if not (Path(env["GS_ENGINE"]) / "bin" / "pulumi").exists():
        raise SystemExit(f"e2e: no engine in {env['GS_ENGINE']}: run `make engine` first")
    return env


@dataclass
class Run:
    """One e2e run: its temporary project, backend, VM and report."""

    tmp: Path
    env: dict[str, str]
    out: Path
    report: dict[str, Any] = field(default_factory=lambda: {"engine": {}, "checks": [], "figures": {}})
    canaries: dict[str, str] = field(default_factory=dict)
    vm: Any = None
    failed: set[str] = field(default_factory=set)

    @property
    def project(self) -> Path:
        return self.tmp / "project"

    @property
    def log(self) -> Path:
        return self.out / "pulumi.log"

    # ---- running the CLI ------------------------------------------------------------------

    def pulumi(self, *args: str, stack: str | None = None, stdin: str | None = None, check: bool = True,
               timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        argv = ["pulumi", *args, "--non-interactive", "--color=never"]
        if stack:
            argv += ["--stack", stack]
        proc = subprocess.run(argv, cwd=self.project, env=self.env, input=stdin, capture_output=True, text=True,
                              timeout=timeout)
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}[exit {proc.returncode}]\n\n")
        if check and proc.returncode != 0:
            raise CheckError(f"`pulumi {' '.join(args)}` exited {proc.returncode}: {_tail(proc.stdout + proc.stderr)}")
        return proc

    def timed(self, figure: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        proc = self.pulumi(*args, **kwargs)
        self.report["figures"][figure] = round(time.monotonic() - start, 1)
        return proc

    def new_stack(self, name: str, raw: dict[str, Any], secret_values: dict[str, str]) -> None:
        """`pulumi stack init` with a passphrase, the config written as the CLI would, secrets set from stdin
        (every one the stack reads, and any other given)."""
        self.pulumi("stack", "init", name, "--secrets-provider", "passphrase")
        path = self.project / f"Pulumi.{name}.yaml"
        document = yaml.safe_load(path.read_text()) or {}
        document["config"] = {f"gpu-serving:{key}": value for key, value in raw.items()}
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        missing = set(parse(raw).secret_keys()) - set(secret_values)
        if missing:
            raise CheckError(f"stack {name} reads secrets {sorted(missing)} that were not given")
        for key, value in sorted(secret_values.items()):
            self.pulumi("config", "set", "--secret", key, stack=name, stdin=value)

    def outputs(self, stack: str) -> dict[str, Any]:
        return json.loads(self.pulumi("stack", "output", "--json", stack=stack).stdout)

    def last_update_changes(self, stack: str) -> dict[str, int]:
        history = json.loads(self.pulumi("stack", "history", "--json", stack=stack).stdout)
        return history[0].get("resourceChanges") or {}

    # ---- checks ---------------------------------------------------------------------------

    def check(self, name: str, fn: Callable[[], str], needs: tuple[str, ...] = ()) -> None:
        start = time.monotonic()
        missing = [n for n in needs if n in self.failed]
        try:
            if missing:
                raise CheckError(f"skipped: needs {', '.join(missing)}")
            detail, ok = fn(), True
        except CheckError as exc:
            detail, ok = str(exc), False
        except Exception as exc:  # a crash in a check is that check's failure, reported like one
            detail, ok = f"{type(exc).__name__}: {exc}", False
        seconds = round(time.monotonic() - start, 1)
        if not ok:
            self.failed.add(name)
        self.report["checks"].append({"name": name, "ok": ok, "seconds": seconds, "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name:28} {seconds:7.1f}s  {detail}", flush=True)


def _tail(text: str, lines: int = 12) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise CheckError(detail)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------- set-up


def copy_project(dest: Path) -> None:
    """The project's tracked files (as a clean clone has them), with the venvs the CLI runs in."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        source = ROOT / name
        if source.is_file() and (name == "Pulumi.yaml" or not name.startswith("Pulumi.")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    # Pulumi.yaml and policy/PulumiPolicy.yaml name `venv`: the project's own has every package both need.
    (dest / "venv").symlink_to(ROOT / "venv")
    (dest / "policy" / "venv").symlink_to(ROOT / "venv")


def stack_raw(name: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / f"Pulumi.{name}.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in document.items()}


def rendering(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The config with the Kubernetes provider writing YAML into `folder` instead of a cluster."""
    raw = copy.deepcopy(raw)
    raw["cluster"].pop("kubeconfig", None)
    raw["cluster"]["renderYamlTo"] = str(folder)
    return raw


def provider_objects(folder: Path) -> list[dict[str, Any]]:
    """Every object the provider wrote under `folder` (its 0-crd/ and 1-manifest/ subfolders)."""
    objects = []
    for path in sorted(folder.rglob("*.yaml")):
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('namespace', '')}/{meta.get('name')}"


# ---------------------------------------------------------------------------- the checks


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
        _require(cli == f"v{env['PULUMI_VERSION']}", f"pulumi version is {cli}, pinned v{env['PULUMI_VERSION']}")
        _require(host == env["PYTHON_HOST_TAG"], f"language host reports {host!r}, pinned {env['PYTHON_HOST_TAG']}")
        _require(self.installed_plugins() == self.pinned_plugins,
                 f"PULUMI_HOME plugins are {sorted(self.installed_plugins())}, pinned {sorted(self.pinned_plugins)}")
        for name, version in sorted(self.pinned_plugins):
            binary = self.plugins / f"resource-{name}-v{version}" / f"pulumi-resource-{name}"
            _require(f"v{version}".encode() in binary.read_bytes(), f"{binary} carries no v{version} stamp")
        _require(env.get("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION") == "true", "plugin downloads are not switched off")
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
        preview = json.loads(self.timed("previewSeconds", "preview", "--policy-pack", "policy", "--json", stack="prod").stdout)
        steps = [s for s in preview.get("steps", []) if not _engine_owned(s["urn"])]
        offline = self.offline_render("prod")
        self.report["figures"]["previewResources"] = len(steps)
        _require(len(steps) == len(offline.resources),
                 f"preview declares {len(steps)} resources, the offline render {len(offline.resources)}: "
                 f"{sorted(set(s['urn'] for s in steps) ^ set(r.urn for r in offline.resources))[:5]}")
        _require(all(s["op"] == "create" for s in steps), "a first preview that does not only create")
        return f"{len(steps)} resources, as the offline render; policy pack ran clean"

    def preview_policy_violation(self) -> str:
        # A start-up budget no model can meet: the real analyzer must stop the preview and name the rule.
        config = self.tmp / "policy-config.json"
        config.write_text(json.dumps({"gpu-startup-probe": {"minStartupSeconds": 86400}}))
        proc = self.pulumi("preview", "--policy-pack", "policy", "--policy-pack-config", str(config), stack="prod", check=False)
        text = proc.stdout + proc.stderr
        _require(proc.returncode != 0, "the preview passed despite a mandatory violation")
        _require("gpu-startup-probe" in text and "mandatory" in text, f"the failure does not name the rule: {_tail(text)}")
        line = next(line.strip() for line in text.splitlines() if "gpu-startup-probe" in line)
        return f"preview failed (exit {proc.returncode}): {line}"

    def up_lab(self) -> str:
        from tests.vm.harness import DEFAULT_DISKS, Vm, ensure_image

        self.vm = Vm(self.tmp / "vm", DEFAULT_DISKS, image=ensure_image())
        self.vm.start()
        raw = rendering(stack_raw("lab"), self.yaml_lab)
        raw["nodes"][0]["ssh"]["port"] = self.vm.port
        raw["models"][0]["apiKeySecret"] = "vllmApiKey"  # so the API key canary goes through state too
        self.new_stack("lab", raw, self.secret_values(raw, self.vm.key_path.read_text()))
        self.timed("upSeconds", "up", "--yes", "--skip-preview", stack="lab", timeout=3600)
        node = self.outputs("lab")["nodes"]["lab-node"]
        mount = self.vm_sh("findmnt -n -o FSTYPE,SOURCE /mnt/models")
        array_uuid = self.vm_sh("mdadm --detail --export /dev/md/models | sed -n 's/^MD_UUID=//p'")
        fs_uuid = self.vm_sh("blkid -s UUID -o value /dev/md/models")
        _require(mount.startswith("xfs "), f"/mnt/models is not the XFS array: {mount!r}")
        _require(node.get("arrayUuid") == array_uuid, f"output arrayUuid {node.get('arrayUuid')!r}, the node has {array_uuid!r}")
        _require(node.get("filesystemUuid") == fs_uuid, f"output filesystemUuid {node.get('filesystemUuid')!r}, the node has {fs_uuid!r}")
        _require(node.get("health") == "clean", f"health output is {node.get('health')!r}")
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
        _require(not differing, f"{len(differing)} of {len(offline)} objects differ (see e2e-out/render-vs-engine/): {differing[:4]}")
        return f"{len(engine)} objects written by the provider equal the offline render's"

    def second_up_no_changes(self) -> str:
        self.pulumi("preview", "--expect-no-changes", stack="lab")
        self.timed("noopUpSeconds", "up", "--yes", "--skip-preview", "--expect-no-changes", stack="lab")
        changes = self.last_update_changes("lab")
        _require(set(changes) <= {"same"}, f"the second up changed {changes}")
        return f"preview and up: no changes ({changes.get('same', 0)} resources the same, no Command ran)"

    def grow(self) -> str:
        before_sum = self.vm_sh(f"head -c 32M /dev/urandom > {CANARY_FILE} && sync && sha256sum {CANARY_FILE} | cut -d' ' -f1")
        before_size = int(self.vm_sh("df -B1 --output=size /mnt/models | tail -1"))
        expected = self.steps_carrying_size()
        path = self.project / "Pulumi.lab.yaml"
        document = yaml.safe_load(path.read_text())
        document["config"]["gpu-serving:nodes"][0]["storage"]["sizeGb"] = GROWN_SIZE_GB
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        preview = json.loads(self.pulumi("preview", "--json", stack="lab").stdout)
        updated = sorted(s["urn"].rsplit("::", 1)[1] for s in preview.get("steps", [])
                         if s["op"] != "same" and "command:remote:Command" in s["urn"])
        _require(updated == expected, f"the size change updates the steps {updated}; the steps that carry the size are {expected}")
        self.timed("growSeconds", "up", "--yes", "--skip-preview", stack="lab", timeout=3600)
        after_size = int(self.vm_sh("df -B1 --output=size /mnt/models | tail -1"))
        after_sum = self.vm_sh(f"sha256sum {CANARY_FILE} | cut -d' ' -f1")
        _require(after_size > before_size, f"the filesystem did not grow: {before_size} -> {after_size} bytes")
        _require(after_sum == before_sum, "the file written before the grow changed")
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
        _require(test == 0, f"the array is not clean after destroy (mdadm --detail --test exit {test})")
        _require(mount == "xfs", f"/mnt/models is not mounted after destroy ({mount!r})")
        _require(fstab == "1", f"the fstab line is gone or doubled after destroy ({fstab} lines)")
        _require(checksum == getattr(self, "canary_sum", None), "the file on the array changed")
        return "array clean and mounted, fstab line kept, file checksum kept"

    def no_secret_in_state(self) -> str:
        canaries = {key: _needle(value) for key, value in self.canaries.items()}
        places = [p for p in (self.tmp / "state").rglob("*") if p.is_file()]
        places += sorted(self.project.glob("Pulumi.*.yaml"))
        places += [self.log, *sorted(self.yaml_prod.rglob("*")), *sorted(self.yaml_lab.rglob("*")),
                   *sorted((self.out / "rendered").rglob("*"))]
        leaks = []
        for place in (p for p in places if p.is_file()):
            text = place.read_text(errors="replace")
            leaks += [f"{key} in {place}" for key, needle in canaries.items() if needle in text]
        report = json.dumps(self.report)
        leaks += [f"{key} in the report" for key, needle in canaries.items() if needle in report]
        self.report["figures"]["secretLeaks"] = len(leaks)
        _require(not leaks, f"{len(leaks)} leaks: {leaks[:4]}")
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


def _engine_owned(urn: str) -> bool:
    """Resources the engine adds on its own: the stack, and default providers."""
    kind = urn.split("::")[2]
    return kind == "pulumi:pulumi:Stack" or (kind.startswith("pulumi:providers:") and urn.split("::")[3].startswith("default"))


def _needle(value: str) -> str:
    """What to look for: a key's longest line but its armour (`-----BEGIN …`, the same in every key)."""
    return max((line for line in value.strip().splitlines() if not line.startswith("-----")), key=len)


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (project copy, state, VM)")
    parser.add_argument("--out", type=Path, default=OUT, help="report folder (default e2e-out/)")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="gs-e2e-"))
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    env = {**os.environ, **engine_env()}
    env.update(PULUMI_BACKEND_URL=f"file://{tmp / 'state'}", PULUMI_CONFIG_PASSPHRASE=secrets.token_urlsafe(24))
    env.pop("PULUMI_ACCESS_TOKEN", None)
    env.pop("SSH_AUTH_SOCK", None)  # the command provider would try a dead agent first
    (tmp / "state").mkdir()
    (tmp / "project").mkdir()
    copy_project(tmp / "project")

    run = EndToEnd(tmp, env, args.out)
    # The prod stack's node is never reached (preview runs nothing): a throwaway key stands in.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "canary-key")], check=True)
    run.canaries = {"hfToken": f"gs-canary-hfToken-{secrets.token_hex(8)}", "sshPrivateKey": (tmp / "canary-key").read_text()}
    try:
        run.check("engine-versions", run.engine_versions)
        run.check("preview-prod", run.preview_prod)
        run.check("preview-policy-violation", run.preview_policy_violation, needs=("preview-prod",))
        run.check("up-lab", run.up_lab)
        run.check("render-matches-engine", run.render_matches_engine, needs=("up-lab",))
        run.check("second-up-no-changes", run.second_up_no_changes, needs=("up-lab",))
        run.check("grow", run.grow, needs=("up-lab",))
        run.check("destroy-keeps-data", run.destroy_keeps_data, needs=("grow",))
        # The lab's real SSH key went through state and logs as well: look for it too.
        if run.vm is not None:
            run.canaries["labSshPrivateKey"] = run.vm.key_path.read_text()
        run.check("no-secret-in-state", run.no_secret_in_state)
    finally:
        if run.vm is not None:
            run.vm.stop()
        added = run.installed_plugins() - run.pinned_plugins if run.plugins.exists() else set()
        run.report["figures"]["pluginsAdded"] = len(added)
        (args.out / "report.json").write_text(json.dumps(run.report, indent=2) + "\n")
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = [c["name"] for c in run.report["checks"] if not c["ok"]]
    if added:
        print(f"FAIL plugins appeared during the run: {sorted(added)}")
    print(f"e2e: {len(run.report['checks']) - len(failed)} passed, {len(failed)} failed; report {args.out / 'report.json'}")
    return 1 if failed or added else 0


if __name__ == "__main__":
    sys.exit(main())
