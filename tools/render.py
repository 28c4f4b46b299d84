"""Offline render: run the unchanged `__main__.py` under Pulumi's own mock engine.

    python -m tools.render prod            # writes rendered/prod/
    python -m tools.render prod --out DIR
    python -m tools.render prod --deployed outputs.json   # as if the stack's last up left these outputs

Config comes from `Pulumi.<stack>.yaml` exactly as the CLI would pass it; secrets that are
`secure:` or missing become placeholders that stay marked secret. No Pulumi CLI, provider
plugin or cluster is needed, so reviewers can run this in a pull request. The program reads
its own stack's previous outputs (to refuse shrinking a partition); the render answers with
none, as on a first `pulumi up`, or with `--deployed FILE` (`pulumi stack output --json`).

Writes `manifests.yaml` (every Kubernetes object, apply-ready, stable order), `resources.json`
(every Pulumi resource with the options that matter), `outputs.json` (stack outputs) and
`nodes/<node>/NN-<step>.sh` (the exact scripts `pulumi up` sends to each node) and
`policy.txt` (the policy pack's findings; a mandatory one fails the render). Secret
values are written as `[secret]`. Two renders of one config are byte-identical.
"""

from __future__ import annotations

import argparse
import json
import logging
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SECRET = "[secret]"
PLACEHOLDER = "[secret placeholder for {key}]"
# The marker Pulumi's RPC layer wraps secret values in (pulumi.runtime.rpc._special_secret_sig).
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
SIG_KEY = "4dabf18193072939515e22adb298388d"

# Apply order: what others depend on first (as `kubectl apply -f` of one file would need).
KIND_ORDER = [
    "Namespace", "StorageClass", "RuntimeClass", "PriorityClass", "PersistentVolume", "PersistentVolumeClaim",
    "ServiceAccount", "Secret", "ConfigMap", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding",
    "Node", "DaemonSet", "Job", "Deployment", "StatefulSet", "Service", "Ingress", "HorizontalPodAutoscaler",
    "ScaledObject", "PodDisruptionBudget", "NetworkPolicy",
]


class ManifestDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Safe YAML (libyaml's emitter when PyYAML has it) with multi-line strings as `|` blocks, so
    scripts embedded in manifests read as scripts in review and in `make diff`."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


ManifestDumper.add_representer(str, _str)


class RenderError(Exception):
    """The program refused to run (a config error): one line for the user."""


@dataclass
class Resource:
    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    options: dict[str, Any]


@dataclass
class Render:
    stack: str
    resources: list[Resource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    config: Any = None
    """The validated StackConfig the program ran with."""
    stack_reads: list[str] = field(default_factory=list)
    """Stack names the program read previous outputs of (a StackReference to itself)."""

    def kubernetes_objects(self) -> list[dict[str, Any]]:
        objects = [
            redact(r.inputs) for r in self.resources
            if r.custom and r.type.startswith("kubernetes:") and not r.type.startswith("pulumi:providers:")
        ]
        return sorted(objects, key=_manifest_key)

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]


def _manifest_key(obj: dict[str, Any]) -> tuple[Any, ...]:
    kind = obj.get("kind", "")
    meta = obj.get("metadata") or {}
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return (rank, kind, meta.get("namespace") or "", meta.get("name") or "")


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def redact(value: Any) -> Any:
    """Replace every secret-marked value by `[secret]`, keeping the shape of maps and lists."""
    if is_secret(value):
        return _blank(value.get("value"))
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the wire format has only doubles; 2.0 replicas read back as 2
    return value


def _blank(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _blank(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return SECRET


# ------------------------------------------------------------------------- config


def stack_config(stack: str, root: Path = ROOT, stack_file: Path | None = None) -> tuple[str, dict[str, str], set[str]]:
    """(project, config for `set_all_config`, secret keys) from Pulumi.yaml and Pulumi.<stack>.yaml."""
    project = yaml.safe_load((root / "Pulumi.yaml").read_text())["name"]
    path = stack_file or root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise RenderError(f"no stack file {path.name} (stacks here: {', '.join(_stacks(root)) or 'none'})")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RenderError(f"{path.name} is not valid YAML: {' '.join(str(exc).split())}") from None
    values: dict[str, str] = {}
    secrets: set[str] = set()
    for key, value in (document.get("config") or {}).items():
        full = key if ":" in key else f"{project}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            values[full] = PLACEHOLDER.format(key=full)
            secrets.add(full)
        elif isinstance(value, str):
            values[full] = value
        else:
            # The CLI hands structured values to the program as JSON text.
            values[full] = json.dumps(value)
    return project, values, secrets


def _stacks(root: Path) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))


# ------------------------------------------------------------------------- the mock engine


def run_program(stack: str, root: Path = ROOT, overrides: dict[str, str] | None = None,
                secret_values: dict[str, str] | None = None, stack_file: Path | None = None,
                deployed: dict[str, Any] | None = None) -> Render:
    """Run `__main__.py` once under mocks and record everything it declares.

    `overrides` replaces config values (tests); `secret_values` sets secret keys to real
    values (the secret canary test); other secrets the stack reads get placeholders.
    `deployed` is what the stack's previous `pulumi up` exported (default: nothing yet).
    """
    import pulumi
    from pulumi.runtime import mocks, rpc, settings
    from pulumi.runtime.stack import wait_for_rpcs
    from pulumi.runtime.sync_await import _sync_await

    from stacks import READ_STACK_OUTPUTS

    project, values, secrets = stack_config(stack, root, stack_file)
    values.update(overrides or {})
    for key, value in (secret_values or {}).items():
        values[f"{project}:{key}"] = value
        secrets.add(f"{project}:{key}")
    config = parsed_config(project, values, secrets)
    _add_missing_secrets(project, config, values, secrets)

    render = Render(stack, config=config)

    class Engine(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
            if args.token == READ_STACK_OUTPUTS:
                render.stack_reads.append(args.args["name"])
                return {"name": args.args["name"], "outputs": deployed or {}, "secretOutputNames": []}, []
            return {}, []

    class Monitor(mocks.MockMonitor):
        def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
            response = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                render.resources.append(_resource(request, response.urn, rpc))
            return response

        def RegisterResourceOutputs(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
            if request.urn.split("::")[-2] == "pulumi:pulumi:Stack":
                render.outputs = rpc.deserialize_properties(request.outputs)
            return super().RegisterResourceOutputs(request)

    class Warnings(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                render.warnings.append(record.getMessage())

    logger = logging.getLogger(f"gpu-serving-render-{id(render)}")
    logger.propagate = False
    logger.addHandler(Warnings())
    pulumi.runtime.set_all_config(values, sorted(secrets))
    settings.set_root_resource(None)
    engine = Engine()
    mocks.set_mocks(engine, project=project, stack=stack, preview=False, logger=logger, monitor=Monitor(engine),
                    organization="organization")

    sys.path.insert(0, str(root))
    try:
        runpy.run_path(str(root / "__main__.py"), run_name="__main__")
        _sync_await(wait_for_rpcs())
        # set_mocks registered the root stack before the program exported anything: register its
        # outputs again now that they exist.
        stack_resource = settings.get_root_resource()
        stack_resource._outputs_registered = False
        stack_resource._finish()
        _sync_await(wait_for_rpcs())
    except pulumi.RunError as exc:
        raise RenderError(str(exc)) from None
    finally:
        sys.path.remove(str(root))
    render.resources.sort(key=lambda r: r.urn)
    return render


def parsed_config(project: str, values: dict[str, str], secrets: set[str]) -> Any:
    """The StackConfig these values make, or None when the program will report a config error."""
    from stacks.config import ConfigError, parse

    raw = {}
    for full, value in values.items():
        if full.startswith(f"{project}:") and full not in secrets:
            try:
                raw[full.split(":", 1)[1]] = json.loads(value)
            except json.JSONDecodeError:
                raw[full.split(":", 1)[1]] = value
    try:
        return parse(raw)
    except ConfigError:
        return None


def _add_missing_secrets(project: str, stack: Any, values: dict[str, str], secrets: set[str]) -> None:
    """Give every secret the stack reads a placeholder, as `pulumi config set --secret` would a value."""
    for key in stack.secret_keys() if stack else []:
        full = f"{project}:{key}"
        if full not in values:
            values[full] = PLACEHOLDER.format(key=full)
            secrets.add(full)


def _resource(request: Any, urn: str, rpc: Any) -> Resource:
    timeouts = request.customTimeouts
    options = {
        "protect": bool(request.protect),
        "retainOnDelete": bool(request.retainOnDelete),
        "dependsOn": sorted(request.dependencies),
        "deleteBeforeReplace": bool(request.deleteBeforeReplace),
        "additionalSecretOutputs": sorted(request.additionalSecretOutputs),
        "ignoreChanges": sorted(request.ignoreChanges),
        "replaceOnChanges": sorted(request.replaceOnChanges),
        "customTimeouts": {k: v for k, v in (("create", timeouts.create), ("update", timeouts.update),
                                             ("delete", timeouts.delete)) if v},
        "provider": request.provider.rsplit("::", 1)[0] if request.provider else "",
    }
    return Resource(
        urn=urn,
        type=request.type,
        name=request.name,
        parent=request.parent,
        custom=bool(request.custom),
        inputs=rpc.deserialize_properties(request.object, keep_unknowns=True),
        options={k: v for k, v in options.items() if v not in (False, [], {}, "")},
    )


# ------------------------------------------------------------------------- files


def write(render: Render, out: Path) -> list[Path]:
    """Write the rendered stack into `out` (replacing what a previous render left)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in sorted(out.glob("nodes/*/*.sh")):
        stale.unlink()
    written = []
    manifests = yaml.dump_all(render.kubernetes_objects(), Dumper=ManifestDumper, sort_keys=True, default_flow_style=False, width=120)
    written.append(_write(out / "manifests.yaml", manifests))
    resources = [
        {"urn": r.urn, "type": r.type, "name": r.name, "parent": r.parent, "custom": r.custom,
         "inputs": redact(r.inputs), "options": r.options}
        for r in render.resources
    ]
    written.append(_write(out / "resources.json", json.dumps(resources, indent=2, sort_keys=True) + "\n"))
    written.append(_write(out / "policy.txt", "".join(f"{line}\n" for line in policy_lines(render, resources))))
    written.append(_write(out / "policy-config.json", policy_config_json(render)))
    written.append(_write(out / "outputs.json", json.dumps(redact(render.outputs), indent=2, sort_keys=True) + "\n"))
    for path, text in node_scripts(render).items():
        written.append(_write(out / path, text))
    return written


def policy_config(render: Render) -> dict[str, dict[str, Any]]:
    """The policy pack's thresholds that follow from the stack's own choices."""
    if render.config is None:
        return {}
    cluster = render.config.cluster
    return {
        "gpu-taint-toleration": {"gpuTaintKey": cluster.gpu_taint.key},
        "gpu-node-selector": {"gpuProductLabel": cluster.gpu_product_label},
        "gpu-capacity": {"gpuProductLabel": cluster.gpu_product_label},
        "ingress-vllm-streaming": {"ingressClassNames": [cluster.ingress_class]},
    }


def policy_config_json(render: Render) -> str:
    """policy_config as the file `pulumi preview --policy-pack policy --policy-pack-config` reads, so the
    engine's pack judges the stack by the same settings as this render (a custom taint, label or class)."""
    return json.dumps(policy_config(render), indent=2, sort_keys=True) + "\n"


def policy_violations(render: Render, resources: list[dict[str, Any]]) -> list[Any]:
    from policy.rules import check_resources

    return check_resources(resources, config=policy_config(render), source="resources.json")


def policy_lines(render: Render, resources: list[dict[str, Any]]) -> list[str]:
    from policy.rules import format_line

    return sorted(format_line(v) for v in policy_violations(render, resources))


def node_scripts(render: Render) -> dict[str, str]:
    """`nodes/<node>/NN-<step>.sh` → the script text a node step sends, from each Command's inputs."""
    scripts = {}
    for command in render.of_type("command:remote:Command"):
        node, _, step = command.name.partition(":")
        text = command.inputs.get("create")
        if step and isinstance(text, str):
            scripts[f"nodes/{node}/{step}.sh"] = text
    return dict(sorted(scripts.items()))


def _read_deployed(path: Path) -> dict[str, Any]:
    try:
        outputs = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RenderError(f"--deployed {path}: {exc}") from None
    if not isinstance(outputs, dict):
        raise RenderError(f"--deployed {path}: expected a JSON object of stack outputs (`pulumi stack output --json`)")
    return outputs


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("stack", nargs="?", default="prod")
    parser.add_argument("--out", type=Path, help="output folder (default rendered/<stack>)")
    parser.add_argument("--stack-file", type=Path, help="read the stack config from this file instead of Pulumi.<stack>.yaml")
    parser.add_argument("--deployed", type=Path, metavar="FILE",
                        help="the stack's outputs from its last pulumi up (`pulumi stack output --json`), for the checks against it")
    args = parser.parse_args(argv)
    try:
        deployed = _read_deployed(args.deployed) if args.deployed else None
        render = run_program(args.stack, stack_file=args.stack_file, deployed=deployed)
    except RenderError as exc:
        print(f"render {args.stack}: {exc}", file=sys.stderr)
        return 1
    out = args.out or ROOT / "rendered" / args.stack
    files = write(render, out)
    for warning in render.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    policy = (out / "policy.txt").read_text().splitlines()
    mandatory = [line for line in policy if line.startswith("mandatory ")]
    if mandatory:
        print("\n".join(mandatory), file=sys.stderr)
        print(f"render {args.stack}: {len(mandatory)} mandatory policy violation(s); see {out / 'policy.txt'}", file=sys.stderr)
        return 1
    kinds = len(render.kubernetes_objects())
    print(f"rendered {args.stack}: {len(render.resources)} resources, {kinds} Kubernetes objects, "
          f"{len(files)} files in {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
