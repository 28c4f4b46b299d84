"""The offline checkers of testbed/checkers: promtool and the CRD schemas (OpenAPI v3 in the CRD YAML).

Tests that need them skip, with the reason, only when they are absent; `make test` builds them first.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD_GROUPS = frozenset({"keda.sh", "http.keda.sh", "monitoring.coreos.com", "gateway.networking.k8s.io"})


@functools.cache
def _paths() -> tuple[Path, Path]:
    result = subprocess.run(["bash", str(ROOT / "testbed/checkers/build.sh"), "--print"], capture_output=True, text=True, check=False)
    promtool, crds = result.stdout.split()
    return Path(promtool), Path(crds)


def promtool() -> Path:
    path = _paths()[0]
    if not path.is_file():
        pytest.skip(f"promtool is not built ({path}): run `make checkers` (`make test` does)")
    return path


def crd_dir() -> Path:
    path = _paths()[1]
    if not (path / ".complete").exists():
        pytest.skip(f"CRD schemas are not fetched ({path}): run `make checkers` (`make test` does)")
    return path


def _closed(schema: Any) -> Any:
    """The schema with unknown fields refused: the API server would silently prune them, so a
    misspelt field would pass the dry run and do nothing."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        pattern = out.get("pattern")
        if isinstance(pattern, str) and "(?i)" in pattern[1:]:
            # Go's RE2 takes an inline flag anywhere; Python only at the start.
            out["pattern"] = "(?i)" + pattern.replace("(?i)", "")
        if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@functools.cache
def _schema(api_version: str, kind: str) -> dict[str, Any]:
    group, version = api_version.split("/")
    for path in sorted(crd_dir().glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            if spec["group"] != group or spec["names"]["kind"] != kind:
                continue
            for v in spec["versions"]:
                if v["name"] == version:
                    schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
                    # metadata is the API server's ObjectMeta, not described in the CRD.
                    schema.get("properties", {}).pop("metadata", None)
                    if "required" in schema:  # InterceptorRoute's CRD requires it; the object is checked without it
                        schema["required"] = [key for key in schema["required"] if key != "metadata"]
                    return _closed(schema)
    raise AssertionError(f"no CRD for {kind} {api_version} in {crd_dir()}")


def validate(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when `obj` does not fit its CRD's schema."""
    schema = _schema(obj["apiVersion"], obj["kind"])
    jsonschema.Draft202012Validator(schema).validate({k: v for k, v in obj.items() if k != "metadata"})
