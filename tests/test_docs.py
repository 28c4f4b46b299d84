"""The documentation as a whole: the generated pages are current (`make docs` would change nothing), they list
what the code has, and the site builds in strict mode, so a broken link or anchor fails `make test`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from policy.rules import ALL_RULES
from tools import docs, docs_site
from tools.render import ROOT

MAKEFILE = (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("page", sorted(docs.GENERATED))
def test_a_generated_page_is_current(page: str) -> None:
    now, then = docs.regenerated()[page]
    assert now == then, f"{page} is stale: run `make docs`"


def test_make_docs_regenerates_every_generated_page() -> None:
    recipe = re.search(r"^docs: .*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert recipe and "$(PY) -m tools.docs" in recipe.group(1)
    assert set(docs.GENERATED) == {"docs/configuration.md", "docs/policy.md"}
    # Each generated page says so where it is generated, and names the command.
    for page, (begin, _end, _write) in docs.GENERATED.items():
        text = (ROOT / page).read_text()
        assert begin in text and "(generated: `make docs`)" in begin, page


def test_a_stale_page_is_found_and_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the staleness test relies on: a hand edit inside the markers is a difference `make docs` undoes."""
    page = ROOT / "docs/policy.md"
    edited = page.read_text().replace("| `gpu-limit-only` | mandatory |", "| `gpu-limit-only` | advisory |")
    assert edited != page.read_text()
    begin, end, write = docs.GENERATED["docs/policy.md"]
    assert docs.replace_between(edited, begin, end, write()) == page.read_text()
    copy = tmp_path / "docs"
    copy.mkdir()
    for name in docs.GENERATED:
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "docs/policy.md").write_text(edited)
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    assert docs.stale() == ["docs/policy.md"]
    assert docs.main(["--check"]) == 1
    assert docs.main([]) == 0 and docs.stale() == []


def test_the_policy_page_lists_every_rule_of_the_pack() -> None:
    text = (ROOT / "docs/policy.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (mandatory|advisory) \| (.+) \|$", text, re.M)
    assert [(name, level) for name, level, _ in rows] == [(rule.name, rule.level) for rule in ALL_RULES]
    assert all(description.strip() for _, _, description in rows)


def test_the_configuration_page_is_its_own_page() -> None:
    assert "config-reference:begin" not in (ROOT / "README.md").read_text()
    assert "config-reference:begin" in (ROOT / "docs/configuration.md").read_text()


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    home = (tmp_path / "site/index.html").read_text()
    assert "Who it is for" in home and 'href="deploying.html#what-the-cluster-must-already-have"' in home
    assert (tmp_path / "site/configuration.html").is_file() and (tmp_path / "site/policy.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    """The same config over a copy of docs/ with one broken link of each kind: each is a warning, so strict fails."""
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "README.md"):
        (copy / name).write_text((ROOT / name).read_text())
    (copy / "tools").mkdir()
    (copy / "tools/docs_site.py").write_text((ROOT / "tools/docs_site.py").read_text())
    (copy / "docs").mkdir()
    for page in (ROOT / "docs").glob("*.md"):
        (copy / "docs" / page.name).write_text(page.read_text())
    (copy / "docs/fleets.md").write_text((copy / "docs/fleets.md").read_text() + "\n[a](nodes.md#no-such-section) [b](no-such-page.md) "
                                         "[c](../no/such/file.py) [d](#no-such-anchor)\n")
    # The hook checks outside links against the real tree: point it at the copy.
    (copy / "tools/docs_site.py").write_text((copy / "tools/docs_site.py").read_text().replace(
        "ROOT = Path(__file__).resolve().parent.parent", f"ROOT = Path({str(ROOT)!r})"))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=copy, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode != 0
    for needle in ("no-such-section", "no-such-page.md", "no/such/file.py", "no-such-anchor"):
        assert needle in result.stderr, (needle, result.stderr[-3000:])


def test_the_hook_points_readme_links_at_the_pages_and_shows_code_links_as_paths() -> None:
    readme = "[deploying](docs/deploying.md#step-by-step) and `[x](docs/no.md)` and [policy](policy/README.md)"
    text, problems = docs_site.rewrite(readme, "README.md", "index.md")
    assert text == "[deploying](deploying.md#step-by-step) and `[x](docs/no.md)` and policy (`policy/README.md`)"
    assert problems == []
    page = "[home](../README.md#quick-start) [runbook](operating.md) [vm](../testbed/vm/README.md) [gone](../nothing.py)"
    text, problems = docs_site.rewrite(page + "\n```bash\n[not](../a/link.py)\n```", "docs/testbed.md", "testbed.md")
    assert text.splitlines()[0] == ("[home](index.md#quick-start) [runbook](operating.md) [vm](../testbed/vm/README.md) "
                                    "(`testbed/vm/README.md`) gone (`nothing.py`)").replace("[vm](../testbed/vm/README.md) ", "vm ")
    assert "[not](../a/link.py)" in text
    assert problems == ["docs/testbed.md: links to ../nothing.py, which is not a file of the repository (nothing.py)"]


def test_every_page_reads_on_a_forge() -> None:
    """Relative links between the files, no site-only syntax (admonitions, snippets, absolute links)."""
    for path in docs.documents():
        text = path.read_text()
        assert not re.search(r"^!!! |^\?\?\? |--8<--", text, re.M), path.name
        assert not re.findall(r"\]\(/[^)]*\)", text), path.name
        if path.parent.name == "docs":
            assert "](docs/" not in text, f"{path.name}: a link relative to the repository root, not to the page"
