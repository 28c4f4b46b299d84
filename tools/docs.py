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

# Page (relative to the repository) → its generator: the markers around the generated part, and the
# function that writes that part from the code it documents.
GENERATED: dict[str, tuple[str, str, Callable[[], str]]] = {
    "docs/configuration.md": (config_doc.BEGIN, config_doc.END, config_doc.reference),
    "docs/policy.md": (policy_doc.BEGIN, policy_doc.END, policy_doc.reference),
}


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    """TEXT with what stands between the markers BEGIN and END replaced by BODY."""
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + body + text[stop:]


def documents() -> list[Path]:
    """The README, then every page of docs/ (not the example stacks)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def regenerated() -> dict[str, tuple[str, str]]:
    """Page → (its text now, its text after `make docs`)."""
    pages = {}
    for name, (begin, end, write) in GENERATED.items():
        text = (ROOT / name).read_text()
        pages[name] = (text, replace_between(text, begin, end, write()))
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
