"""docs/configuration.md's table of every key, generated from the pydantic models (the one source of truth).

`make docs` (tools/docs.py) writes it between the page's markers.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from stacks.config import ClassStorage, LocalStorage, NfsStorage, NodeCacheStorage, StackConfig
from tools.render import ROOT

PAGE = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- config-reference:begin (generated: `make docs`) -->"
END = "<!-- config-reference:end -->"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(get_args(annotation)[0])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType) and all(_models_in(a) for a in get_args(annotation)):
        return "object, by `type`"
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in get_args(annotation) if a is not type(None)) + (
            " or unset" if type(None) in get_args(annotation) else "")
    if origin is list:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is dict:
        value = _type_name(get_args(annotation)[1])
        return "map of string" if value == "str" else f"map of {value}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    value = field.default if field.default is not PydanticUndefined else field.default_factory()
    if isinstance(value, BaseModel):
        return "(see below)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`" if value not in ([], {}) else f"`{value!r}`"


def rows(model: type[BaseModel], prefix: str) -> list[str]:
    lines = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        description = " ".join((field.description or "").split())
        lines.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
        nested = _models_in(field.annotation)
        list_suffix = "[]" if get_origin(field.annotation) is list else ""
        for sub in nested:
            if sub in (LocalStorage, NfsStorage, ClassStorage, NodeCacheStorage):
                continue
            lines += rows(sub, f"{key}{list_suffix}.")
    return lines


def reference() -> str:
    header = "| key | type | default | meaning |\n|---|---|---|---|"
    parts = [header, *rows(StackConfig, "gpu-serving:")]
    for variant in (LocalStorage, NfsStorage, ClassStorage, NodeCacheStorage):
        parts.append(f"| *modelStorage, `type: {variant.model_fields['type'].annotation.__args__[0]}`* | | | "
                     f"{' '.join((variant.__doc__ or '').split())} |")
        parts += [r for r in rows(variant, "gpu-serving:modelStorage.") if "modelStorage.type`" not in r]
    return "\n".join(parts) + "\n"

