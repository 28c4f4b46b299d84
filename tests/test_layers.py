"""Layers point one way: components → stacks → policy. A lower layer that imports a higher one (even inside a
function, where no import cycle would betray it) is refused here."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each layer and the packages it must never import.
# The component package (package/) sits on top, beside __main__.py: nothing imports it.
FORBIDDEN = {
    "components": ("package",),
    "stacks": ("components", "package"),
    "policy": ("stacks", "components", "package"),
}


def imported_modules(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, at any depth; relative ones resolved against `module`."""
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield node.lineno, ".".join([*base, node.module] if node.module else base)
            else:
                yield node.lineno, node.module or ""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def upward_imports(layer: str) -> Iterator[str]:
    for path in sorted((ROOT / layer).rglob("*.py")):
        if "venv" in path.relative_to(ROOT).parts:
            continue  # the pack's own virtualenv (policy/venv), when `make policy` made one
        module = module_name(path)
        if path.name == "__init__.py":
            module += ".__init__"  # relative imports in a package's __init__ are relative to the package itself
        for line, name in imported_modules(path.read_text(), module):
            if name.split(".")[0] in FORBIDDEN[layer]:
                yield f"{path.relative_to(ROOT)}:{line} imports {name}"


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_a_higher_one(layer: str) -> None:
    assert any((ROOT / layer).rglob("*.py")), f"no module under {layer}/"
    found = list(upward_imports(layer))
    assert not found, "\n".join(found)


def test_function_level_and_relative_imports_are_seen() -> None:
    source = ("def f():\n    from components.serving.sizing import shm_size_gi\n\n"
              "import stacks.config\nfrom .k8s import as_map\nfrom .. import rules\n")
    assert sorted(imported_modules(source, "policy.rules.edge")) == [
        (2, "components.serving.sizing"),
        (4, "stacks.config"),
        (5, "policy.rules.k8s"),
        (6, "policy"),
    ]
