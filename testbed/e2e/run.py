"""What every e2e check stands on: the engine's environment, a temporary copy of the project, the
CLI run with its output kept, stacks made as an operator makes them, and the report."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from stacks.config import ConfigError, parse
from tools.render import ROOT, ManifestDumper


def stack_yaml(document: dict[str, Any]) -> str:
    """A stack file as Pulumi's Go YAML reads it back: text that looks like a number to it (a commit of
    digits only, 08, 1e5) quoted, which PyYAML's own dumper leaves bare."""
    return yaml.dump(document, Dumper=ManifestDumper, sort_keys=False)


class CheckError(Exception):
    """A check's assertion, with the detail that goes into the report."""


def engine_env() -> dict[str, str]:
    """The environment testbed/engine/env.sh sets (PATH to the built engine, PULUMI_HOME, no downloads)."""
    out = subprocess.run(["bash", str(ROOT / "testbed/engine/env.sh")], capture_output=True, text=True, check=True).stdout
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
    skip: set[str] = field(default_factory=set)
    """`--skip`: checks left out of a development run (a check that needs one of them still runs)."""

    @property
    def project(self) -> Path:
        return self.tmp / "project"

    @property
    def log(self) -> Path:
        return self.out / "pulumi.log"

    # ---- running the CLI ------------------------------------------------------------------

    def logged(self, argv: list[str], *, shown: str, stdin: str | None = None, check: bool = True, timeout: float = 1800,
               env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command of the e2e in the project copy (or `cwd`), its output appended to the run's log."""
        proc = subprocess.run(argv, cwd=cwd or self.project, env={**self.env, **(env or {})}, input=stdin, capture_output=True,
                              text=True, timeout=timeout)
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}[exit {proc.returncode}]\n\n")
        if check and proc.returncode != 0:
            raise CheckError(f"`{shown}` exited {proc.returncode}: {tail(proc.stdout + proc.stderr)}")
        return proc

    def pulumi(self, *args: str, stack: str | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        argv = ["pulumi", *args, "--non-interactive", "--color=never", *(["--stack", stack] if stack else [])]
        return self.logged(argv, shown=f"pulumi {' '.join(args)}", **kwargs)

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
        path.write_text(stack_yaml(document))
        try:
            missing = set(parse(raw).secret_keys()) - set(secret_values)
        except ConfigError:
            missing = set()  # a config the program refuses: the engine is to report it, not this set-up
        if missing:
            raise CheckError(f"stack {name} reads secrets {sorted(missing)} that were not given")
        for key, value in sorted(secret_values.items()):
            self.pulumi("config", "set", "--secret", key, stack=name, stdin=value)

    def edit_stack(self, stack: str, edit: Callable[[dict[str, Any]], Any]) -> None:
        """What an operator changes in Pulumi.<stack>.yaml, done to the file: `edit` gets its config mapping."""
        path = self.project / f"Pulumi.{stack}.yaml"
        document = yaml.safe_load(path.read_text())
        edit(document["config"])
        path.write_text(stack_yaml(document))

    def outputs(self, stack: str) -> dict[str, Any]:
        return json.loads(self.pulumi("stack", "output", "--json", stack=stack).stdout)

    def last_update_changes(self, stack: str) -> dict[str, int]:
        history = json.loads(self.pulumi("stack", "history", "--json", stack=stack).stdout)
        return history[0].get("resourceChanges") or {}

    def second_up_changes_nothing(self, stack: str, figure: str) -> int:
        """`preview --expect-no-changes`, then a timed `up` that must change nothing (so runs no Command);
        the number of resources it left the same."""
        self.pulumi("preview", "--expect-no-changes", stack=stack)
        self.timed(figure, "up", "--yes", "--skip-preview", "--expect-no-changes", stack=stack)
        changes = self.last_update_changes(stack)
        require(set(changes) <= {"same"}, f"the second up changed {changes}")
        return changes.get("same", 0)

    # ---- checks ---------------------------------------------------------------------------

    def check(self, name: str, fn: Callable[[], str], needs: tuple[str, ...] = ()) -> None:
        if name in self.skip:
            self.report.setdefault("skipped", []).append(name)
            print(f"skip {name}", flush=True)
            return
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


class JsonHandler(BaseHTTPRequestHandler):
    """What the checks' small stand-in servers share: a JSON answer, and no access log on stderr."""

    def reply_json(self, status: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def tail(text: str, lines: int = 12) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def require(condition: bool, detail: str) -> None:
    if not condition:
        raise CheckError(detail)


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
