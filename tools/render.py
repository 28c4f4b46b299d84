"""Offline render: run the unchanged `__main__.py` under Pulumi's own mock engine.

    python -m tools.render prod            # writes rendered/prod/
    python -m tools.render prod --out DIR
    python -m tools.render prod --deployed outputs.json   # as if the stack's last up left these outputs

Config comes from `Pulumi.<stack>.yaml` exactly as the CLI would pass it; secrets that are
`secure:` or missing become placeholders that stay marked secret. No Pulumi CLI, provider
plugin or cluster is needed, so reviewers can run this in a pull request. The program reads
its own stack's previous outputs (to refuse shrinking a partition); the render answers with
none, as on a first `pulumi up`, or with `--deployed FILE` (`pulumi stack output --json`).

Writes `manifests.yaml` (every Kubernetes object in the order `pulumi up` creates them, objects
holding a secret value left out and named in its header), `resources.json` (every Pulumi resource
with the options that matter), `outputs.json` (stack outputs), `nodes/<node>/NN-<step>.sh` (the
exact scripts `pulumi up` sends to each node) and `policy.txt` (the policy pack's findings; a
mandatory one fails the render and leaves only that file). Everything is written into a fresh
folder that replaces the previous one; a failed render leaves no manifests for the stack. Secret
values are written as `[secret]`. Two renders of one config are byte-identical. The last line
printed lists the secrets still to set (`needs: …`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import runpy
import shutil
import sys
import tempfile
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


# Plain scalars that Go's YAML readers (Pulumi's stack files, kubectl) take for numbers, as YAML 1.2 and
# Go's strconv do, but PyYAML's YAML 1.1 resolver takes for text and so leaves unquoted: a commit of
# digits only, 08, 1e5, 0o17, 0x1F, 0b101, .5e3, 1_000.
GO_NUMBER = re.compile(r"[-+]?([0-9][0-9_]*|0[oO][0-7_]+|0[xX][0-9a-fA-F_]+|0[bB][01_]+|(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)")


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else "'" if GO_NUMBER.fullmatch(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


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
    missing_secrets: list[str] = field(default_factory=list)
    """Secret config keys the stack reads that are not set yet (the render used placeholders)."""

    def kubernetes_objects(self) -> list[dict[str, Any]]:
        """Every Kubernetes object, redacted, in apply order (see `apply_order`)."""
        return [redact(r.inputs) for r in self.kubernetes_resources()]

    def kubernetes_resources(self) -> list[Resource]:
        return apply_order(self.resources)

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]


def apply_order(resources: list[Resource]) -> list[Resource]:
    """The Kubernetes objects in the order `pulumi up` can create them: each after every object it
    depends on (explicit `depends_on` and input dependencies; a dependency on a component means
    all the objects in it), ties broken by kind (KIND_ORDER), namespace and name."""
    by_urn = {r.urn: r for r in resources}
    objects = {r.urn: r for r in resources if is_kubernetes_object(r)}
    inside: dict[str, list[str]] = {}
    for urn in objects:
        parent = by_urn[urn].parent
        while parent in by_urn:
            inside.setdefault(parent, []).append(urn)
            parent = by_urn[parent].parent
    waits = {
        urn: {d for dep in r.options.get("dependsOn", []) for d in ([dep] if dep in objects else inside.get(dep, []))} - {urn}
        for urn, r in objects.items()
    }
    key = {urn: (_manifest_key(r.inputs), urn) for urn, r in objects.items()}
    ordered: list[Resource] = []
    while waits:
        ready = [urn for urn, deps in waits.items() if not deps] or list(waits)  # a cycle cannot happen; never hang on one
        first = min(ready, key=key.__getitem__)
        ordered.append(objects[first])
        del waits[first]
        for deps in waits.values():
            deps.discard(first)
    return ordered


def is_kubernetes_object(resource: Resource) -> bool:
    return resource.custom and resource.type.startswith("kubernetes:")


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
    project_file = _read_yaml_mapping(root / "Pulumi.yaml")
    project = project_file.get("name")
    if not isinstance(project, str):
        raise RenderError("Pulumi.yaml: no project `name:`")
    path = stack_file or root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise RenderError(f"no stack file {path.name} (stacks here: {', '.join(_stacks(root)) or 'none'})")
    values: dict[str, str] = {}
    secrets: set[str] = set()
    for key, value in _config_section(path).items():
        full = key if ":" in key else f"{project}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            if not isinstance(value["secure"], str):
                raise RenderError(f"{path.name}: {key}: `secure:` holds {_kind(value['secure'])}; "
                                  "it must be the ciphertext `pulumi config set --secret` writes")
            values[full] = PLACEHOLDER.format(key=full)
            secrets.add(full)
        elif isinstance(value, str):
            values[full] = value
        else:
            # The CLI hands structured values to the program as JSON text.
            values[full] = json.dumps(value)
    return project, values, secrets


# What a Pulumi stack file may hold at its top level.
STACK_FILE_KEYS = ("config", "environment", "secretsprovider", "encryptedkey", "encryptionsalt")


def _config_section(path: Path) -> dict[str, Any]:
    """The stack file's `config:` mapping, or one line naming the file and what is wrong with it."""
    document = _read_yaml_mapping(path)
    for key in document:
        if key not in STACK_FILE_KEYS:
            close = difflib.get_close_matches(str(key), STACK_FILE_KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise RenderError(f"{path.name}: unknown top-level key {key!r}{hint}; a stack file holds {', '.join(STACK_FILE_KEYS)}")
    if "config" not in document:
        raise RenderError(f"{path.name}: no `config:` section (Pulumi.prod.yaml shows one)")
    config = document["config"] or {}
    if not isinstance(config, dict):
        raise RenderError(f"{path.name}: `config:` is {_kind(config)}; it must be a mapping of `namespace:key: value`, "
                          "e.g. `gpu-serving:models: [...]`")
    for key in config:
        if not isinstance(key, str) or not key.strip(":"):
            raise RenderError(f"{path.name}: config key {key!r} is not a `namespace:key` name, e.g. gpu-serving:models")
    return config


def _read_yaml_mapping(path: Path) -> dict[Any, Any]:
    try:
        text = path.read_bytes().decode("utf-8")
        _refuse_duplicate_keys(path.name, yaml.compose(text, Loader=yaml.SafeLoader))
        document = yaml.safe_load(text)
    except OSError as exc:
        raise RenderError(f"{path.name}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise RenderError(f"{path.name}: is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise RenderError(f"{path.name} is not valid YAML: {' '.join(str(exc).split())}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise RenderError(f"{path.name}: the document is {_kind(document)}; it must be a mapping such as `config: {{...}}`")
    return document


def _refuse_duplicate_keys(name: str, node: yaml.Node | None, path: str = "") -> None:
    """The Pulumi CLI refuses a stack file with a key given twice in one mapping (YAML 1.2 forbids
    it); PyYAML silently keeps the last one, so the render would show a config `pulumi up` never runs."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(name, item, f"{path}[{i}]")
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[Any, int] = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
        where = f"{path}.{key}" if path else str(key)
        if key in first:
            raise RenderError(f"{name} line {key_node.start_mark.line + 1}: {where} is given twice (first on line "
                              f"{first[key]}); the Pulumi CLI refuses a duplicate key: keep one of them")
        first[key] = key_node.start_mark.line + 1
        # The CLI hands the program `namespace:key` values; their paths read as the config errors do.
        _refuse_duplicate_keys(name, value_node, "" if where == "config" else where)


def _kind(value: Any) -> str:
    """What a YAML value is, with an article: `a list`, `a string ('x')`."""
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    return f"{'a boolean' if isinstance(value, bool) else 'a number'} ({value!r})"


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
    missing = _add_missing_secrets(project, config, values, secrets)

    render = Render(stack, config=config, missing_secrets=missing)

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


def _add_missing_secrets(project: str, stack: Any, values: dict[str, str], secrets: set[str]) -> list[str]:
    """Give every secret the stack reads a placeholder, as `pulumi config set --secret` would a
    value; return the keys that got one (still to be set before `pulumi up`)."""
    missing = []
    for key in stack.secret_keys() if stack else []:
        full = f"{project}:{key}"
        if full not in values:
            values[full] = PLACEHOLDER.format(key=full)
            secrets.add(full)
            missing.append(key)
    return missing


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
    """Write the rendered stack into a fresh folder and swap it in for `out`.

    Nothing of a previous render survives (a renamed node's scripts, say), and `out` is never
    half-written. With a mandatory policy violation the folder holds only `policy.txt`.
    """
    resources = resources_json(render)
    policy = policy_lines(render, resources)
    files = {"policy.txt": "".join(f"{line}\n" for line in policy)}
    if not any(line.startswith("mandatory ") for line in policy):
        files |= {
            "manifests.yaml": manifests_yaml(render),
            "resources.json": json.dumps(resources, indent=2, sort_keys=True) + "\n",
            "policy-config.json": policy_config_json(render),
            "outputs.json": json.dumps(redact(render.outputs), indent=2, sort_keys=True) + "\n",
            **node_scripts(render),
        }
    return swap_in(out, dict(sorted(files.items())))


def resources_json(render: Render) -> list[dict[str, Any]]:
    return [
        {"urn": r.urn, "type": r.type, "name": r.name, "parent": r.parent, "custom": r.custom,
         "inputs": redact(r.inputs), "options": r.options}
        for r in render.resources
    ]


def manifests_yaml(render: Render) -> str:
    """The apply file: objects in apply order; objects holding a secret value are left out (a
    `kubectl apply -f` of the file must never create a Secret whose value is the placeholder),
    and the header says how to create them."""
    objects, withheld = [], []
    for resource in render.kubernetes_resources():
        (withheld if holds_secret(resource.inputs) else objects).append(resource)
    body = yaml.dump_all([redact(r.inputs) for r in objects], Dumper=ManifestDumper, sort_keys=True,
                         default_flow_style=False, width=120)
    return manifests_header(render.stack, withheld) + body


def manifests_header(stack: str, withheld: list[Resource]) -> str:
    lines = [
        f"Rendered by `make render STACK={stack}` (tools/render.py): every Kubernetes object the stack declares,",
        "each after the objects it depends on, in the order `pulumi up` creates them.",
    ]
    if withheld:
        lines += ["Left out because they hold secret values (this file never carries a placeholder);",
                  "create them before `kubectl apply -f manifests.yaml`:"]
        lines += [f"  {_create_hint(redact(r.inputs))}" for r in withheld]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def _create_hint(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace") or "default", meta.get("name") or "?"
    if obj.get("kind") != "Secret":
        return f"{obj.get('kind')} {namespace}/{name}: holds a secret value (its inputs are in resources.json)"
    keys = sorted({*(obj.get("stringData") or {}), *(obj.get("data") or {})})
    files = " ".join(f"--from-file={k}={k}.txt" for k in keys)
    return f"Secret {namespace}/{name} (keys {', '.join(keys)}): kubectl -n {namespace} create secret generic {name} {files}"


def holds_secret(value: Any) -> bool:
    if is_secret(value):
        return True
    if isinstance(value, dict):
        return any(holds_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_secret(v) for v in value)
    return False


def swap_in(out: Path, files: dict[str, str]) -> list[Path]:
    """Write `files` into a fresh sibling folder of `out`, then rename it into place (two renames:
    the old folder aside, the new one in). A failure on the way leaves `out` as it was."""
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    aside = fresh.with_name(f".{out.name}.old-{fresh.name.rsplit('-', 1)[1]}")
    try:
        fresh.chmod(0o755)
        for name, text in files.items():
            _write(fresh / name, text)
        if out.exists():
            os.rename(out, aside)
        try:
            os.rename(fresh, out)
        except OSError:
            if aside.exists():
                os.rename(aside, out)
            raise
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(aside, ignore_errors=True)
    return [out / name for name in files]


def check_replaceable(out: Path) -> None:
    """Refuse to replace a folder that is neither empty nor a previous render (`--out ~` must not wipe a home)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise RenderError(f"{out} is not a folder")
    if any(out.iterdir()) and not _is_render(out):
        raise RenderError(f"{out} holds files but no previous render (manifests.yaml or policy.txt); choose an empty folder")


def remove_render(out: Path) -> None:
    """After a failed render: no manifests of that stack may stay behind to be applied by mistake."""
    if out.is_dir() and _is_render(out):
        shutil.rmtree(out)


def _is_render(folder: Path) -> bool:
    return (folder / "manifests.yaml").is_file() or (folder / "policy.txt").is_file()


def policy_config(render: Render) -> dict[str, dict[str, Any]]:
    """The policy pack's thresholds that follow from the stack's own choices."""
    if render.config is None:
        return {}
    cluster = render.config.cluster
    config: dict[str, dict[str, Any]] = {
        "gpu-taint-toleration": {"gpuTaintKey": cluster.gpu_taint.key},
        "gpu-node-selector": {"gpuProductLabel": cluster.gpu_product_label},
        "gpu-capacity": {"gpuProductLabel": cluster.gpu_product_label},
        "ingress-vllm-streaming": {"ingressClassNames": [cluster.ingress_class]},
        "vllm-revision-pinned": {"requireCommit": cluster.require_commit_revisions},
    }
    if any(n.gpu.sharing is not None and n.gpu.sharing.time_slicing is not None for n in render.config.nodes):
        config["gpu-shared-memory"] = {"gpuProductLabel": cluster.gpu_product_label}
    if any(m.scales_to_zero for m in render.config.models):
        config["vllm-request-hold"] = {"ingressClassNames": [cluster.ingress_class]}
    return config


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
    out = args.out or ROOT / "rendered" / args.stack
    try:
        check_replaceable(out)
        deployed = _read_deployed(args.deployed) if args.deployed else None
        render = run_program(args.stack, stack_file=args.stack_file, deployed=deployed)
        files = write(render, out)
    except RenderError as exc:
        remove_render(out)
        print(f"render {args.stack}: {exc}", file=sys.stderr)
        return 1
    for warning in render.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    policy = (out / "policy.txt").read_text().splitlines()
    mandatory = [line for line in policy if line.startswith("mandatory ")]
    if mandatory:
        print("\n".join(mandatory), file=sys.stderr)
        print(f"render {args.stack}: {len(mandatory)} mandatory policy violation(s); see {out / 'policy.txt'} "
              "(no manifests were written)", file=sys.stderr)
        return 1
    kinds = len(render.kubernetes_objects())
    print(f"rendered {args.stack}: {len(render.resources)} resources, {kinds} Kubernetes objects, "
          f"{len(files)} files in {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    print(needs_line(render))
    return 0


def needs_line(render: Render) -> str:
    """What still has to be set before `pulumi up`: the secrets the render used placeholders for."""
    if not render.missing_secrets:
        return "needs: nothing (every secret the stack reads is set)"
    return (f"needs: {', '.join(render.missing_secrets)} "
            "(set each with `pulumi config set --secret <key>` before `pulumi up`)")


if __name__ == "__main__":
    sys.exit(main())
