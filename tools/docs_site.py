"""MkDocs hook (mkdocs.yml `hooks:`): the pages read the same on a forge and on the site.

On a forge the README is the front door and links into docs/; the pages link back with `../README.md`
and to the code with `../components/…`. The site is built from docs/ alone, so this hook

- serves the README as the site's home page (`index.md`), its `docs/<page>` links pointing at the pages;
- turns a page's link to `../README.md` into one to the home page (its anchors checked like any other);
- checks that a link to a file outside docs/ (a script, a stack file, another README) names a file that
  exists, and shows it on the site as its path: the site has no copy of the code to link to. A link
  to a file that does not exist is a warning, which `mkdocs build --strict` turns into a failure.

Links inside code (fenced blocks, `inline code`) are left alone.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOME = "index.md"

log = logging.getLogger("mkdocs.hooks.gpu_serving")

FENCE = re.compile(r"^[ \t]*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^()\s]+)\)")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, HOME, content=(ROOT / "README.md").read_text()))
    return files


def source_of(src_uri: str) -> str:
    """The repository path a page was read from."""
    return "README.md" if src_uri == HOME else f"docs/{src_uri}"


def rewrite_link(target: str, source: str, page_uri: str) -> tuple[str | None, str | None]:
    """(the target on the site, or None: no link; a problem to warn about, or None)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return target, None
    path, hash_, anchor = target.partition("#")
    in_repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    here = posixpath.dirname(page_uri) or "."
    if in_repo == "README.md":
        return posixpath.relpath(HOME, here) + hash_ + anchor, None
    if in_repo.startswith("docs/"):
        return posixpath.relpath(in_repo[len("docs/"):], here) + hash_ + anchor, None
    if in_repo.startswith("../") or not (ROOT / in_repo).exists():
        return None, f"{source}: links to {target}, which is not a file of the repository ({in_repo})"
    return None, None


def rewrite(markdown: str, source: str, page_uri: str) -> tuple[str, list[str]]:
    """The page's Markdown for the site, and the broken links found."""
    problems: list[str] = []

    def link(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        new, problem = rewrite_link(target, source, page_uri)
        if problem:
            problems.append(problem)
        if new is not None:
            return f"{bang}[{text}]({new})"
        path = posixpath.normpath(posixpath.join(posixpath.dirname(source), target.partition("#")[0]))
        return text if path in text else f"{text} (`{path}`)"

    def outside_code(line: str) -> str:
        parts, last = [], 0
        for span in CODE_SPAN.finditer(line):
            parts += [LINK.sub(link, line[last:span.start()]), span.group(0)]
            last = span.end()
        return "".join(parts) + LINK.sub(link, line[last:])

    out, fence = [], None
    for line in markdown.split("\n"):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and opened and opened.group(1) == fence:
            fence = None
        elif fence is None:
            line = outside_code(line)
        out.append(line)
    return "\n".join(out), problems


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    text, problems = rewrite(markdown, source_of(page.file.src_uri), page.file.src_uri)
    for problem in problems:
        log.warning(problem)
    return text
