"""Layers point one way: tests import the test bed (testbed/), never the reverse. Equipment a test and
the test bed both use (the VM harness, its fakes and step helpers) lives in testbed/; a module of
testbed/ that imported tests/ would make the two folders a cycle again."""

from __future__ import annotations

import ast
from pathlib import Path

from tools.render import ROOT

TESTBED = ROOT / "testbed"


def imports_of_tests(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of tests/ in a file, at any depth (a function's lazy import counts)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return [(line, module) for line, module in found if module == "tests" or module.startswith("tests.")]


def test_no_module_of_the_testbed_imports_tests() -> None:
    files = sorted(TESTBED.rglob("*.py"))
    # The walk must see the test bed, the VM harness included, or the check below passes on nothing.
    assert TESTBED / "vm" / "machine.py" in files and len(files) > 20, files
    upward = [f"{path.relative_to(ROOT)}:{line}: imports {module}" for path in files for line, module in imports_of_tests(path)]
    assert not upward, "testbed/ must not import tests/ (move what both need into testbed/):\n" + "\n".join(upward)


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import tests\nimport os, tests.vm.harness as h\nfrom tests import checkers\n"
                      "def f():\n    from tests.vm.fakes import X\nfrom testsuite import y\nfrom . import tests\n")
    assert sorted(imports_of_tests(module)) == [(1, "tests"), (2, "tests.vm.harness"), (3, "tests"), (5, "tests.vm.fakes")]
