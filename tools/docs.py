"""The documentation: the pages an operator reads, and every generated page (`make docs` regenerates them).

    python -m tools.docs           # regenerate every generated page (make docs)
    python -m tools.docs --check   # exit 1 naming each page `make docs` would change

Two pages hold generated tables between markers, each written by its generator from the code it
documents: the configuration reference from the config models (tools/config_doc.py) and the policy
rules from the pack (tools/policy_doc.py). The site (mkdocs.yml) is built from docs/, with the README
as its home (tools/docs_site.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from tools import config_doc, policy_doc
from tools.render import ROOT

# Page (relative to the repository) → the function that rewrites its generated part.
GENERATED: dict[str, Callable[[str], str]] = {
    "docs/configuration.md": config_doc.replace_in,
    "docs/policy.md": policy_doc.replace_in,
}


def documents() -> list[Path]:
    """The README, then every page of docs/ (not the example stacks)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def regenerated() -> dict[str, tuple[str, str]]:
    """Page → (its text now, its text after `make docs`)."""
    pages = {}
    for name, rewrite in GENERATED.items():
        text = (ROOT / name).read_text()
        pages[name] = (text, rewrite(text))
    return pages


def stale() -> list[str]:
    return [name for name, (now, then) in regenerated().items() if now != then]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        names = stale()
        for name in names:
            print(f"{name} is stale: run `make docs`", file=sys.stderr)
        return 1 if names else 0
    for name, (now, then) in regenerated().items():
        if now != then:
            (ROOT / name).write_text(then)
            print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
