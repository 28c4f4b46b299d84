"""Check plain Kubernetes manifests with the policy pack's rules.

    python -m policy.check_yaml [--config pack-config.json] a.yaml b.yaml

Prints `<level> <policy-name> <file> <Kind>/<name>: <message>` per
violation; exit 1 when a mandatory rule is violated, 2 when a file cannot
be read or is not Kubernetes YAML, 0 otherwise. Stack rules see the
documents of all files together.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .rules import Resource, check_resources, format_line, has_mandatory


class InputError(Exception):
    """A file the checker cannot use; reported on one line, exit 2."""


def type_token(api_version: str, kind: str) -> str:
    """apps/v1 + Deployment -> kubernetes:apps/v1:Deployment; v1 -> core/v1."""
    group, _, version = api_version.rpartition("/")
    return f"kubernetes:{group or 'core'}/{version}:{kind}"


def _objects(doc: Any) -> list[Mapping]:
    """A document, or the items of a `kind: List`."""
    if isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        return [d for item in doc["items"] for d in _objects(item)]
    return [doc]


def to_resource(obj: Any, source: str, index: int) -> Resource:
    if not isinstance(obj, Mapping):
        raise InputError(f"{source}: document {index} is not a mapping")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise InputError(f"{source}: document {index} has no apiVersion/kind")
    name = obj.get("metadata", {}).get("name") if isinstance(obj.get("metadata"), Mapping) else None
    return Resource(type=type_token(api_version, kind), name=str(name or f"#{index}"), props=obj,
                    source=source)


def load_file(path: str) -> list[Resource]:
    try:
        docs = list(yaml.safe_load_all(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from e
    except yaml.YAMLError as e:
        raise InputError(f"{path}: invalid YAML: {' '.join(str(e).split())}") from e
    objects = [obj for doc in docs if doc is not None for obj in _objects(doc)]
    return [to_resource(obj, path, i) for i, obj in enumerate(objects, 1)]


def load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read policy config: {e}") from e
    if not isinstance(config, dict):
        raise InputError(f"{path}: policy config must be a JSON object keyed by policy name")
    return config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.check_yaml", description=__doc__.split("\n")[1])
    parser.add_argument("files", nargs="+", help="Kubernetes YAML files")
    parser.add_argument("--config", help="JSON policy config, as for pulumi --policy-pack-config")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        resources = [r for path in args.files for r in load_file(path)]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    violations = check_resources(resources, config)
    for violation in violations:
        print(format_line(violation))
    return 1 if has_mandatory(violations) else 0


if __name__ == "__main__":
    sys.exit(main())
