"""The config `pulumi up` would hand the program, read from Pulumi.yaml and Pulumi.<stack>.yaml:
a malformed stack file is one line naming the file; a secret that is `secure:` or not set yet becomes
a placeholder that stays marked secret."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from tools.render.result import RenderError

ROOT = Path(__file__).resolve().parents[2]
"""The project: Pulumi.yaml, the stack files and the program."""
PLACEHOLDER = "[secret placeholder for {key}]"


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
        raise RenderError(yaml_error_line(path, exc)) from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise RenderError(f"{path.name}: the document is {_kind(document)}; it must be a mapping such as `config: {{...}}`")
    return document


def yaml_error_line(path: Path, exc: yaml.YAMLError) -> str:
    """A YAML syntax error as one line, `file:line:column: what`, as editors and CI annotations read it, in words
    for the usual slips (an indentation, a tab, a `: ` in a plain value) rather than the parser's states."""
    name = _shown(path)
    mark = getattr(exc, "problem_mark", None)
    if not isinstance(exc, yaml.MarkedYAMLError) or mark is None:
        return f"{name} is not valid YAML: {' '.join(str(exc).split())}"
    problem = " ".join((exc.problem or "").split())
    context, context_mark = exc.context, exc.context_mark
    if problem.startswith("expected <block end>, but found"):
        what = "this line is indented differently from the keys or list items above it"
        if context_mark is not None and context_mark.line != mark.line:
            what += f" (the block that starts on line {context_mark.line + 1}, column {context_mark.column + 1})"
        what += "; indent each key as far as its siblings, with spaces"
    elif problem == "mapping values are not allowed here":
        what = ("a `key: value` where a value was expected: a line indented deeper than the one above, or a value holding "
                "': ' that needs quotes")
    elif "'\\t' that cannot start any token" in problem:
        what = "a tab; YAML indents with spaces only"
    else:
        what = problem + (f" ({context} on line {context_mark.line + 1})" if context and context_mark is not None else "")
    return f"{name}:{mark.line + 1}:{mark.column + 1}: {what}"


def _shown(path: Path) -> str:
    """The stack file as the user can open it: relative to the current folder when under it, else its name."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


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


def add_missing_secrets(project: str, stack: Any, values: dict[str, str], secrets: set[str]) -> list[str]:
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
