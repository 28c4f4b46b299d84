"""The runbook's blocks, as e2e runs them: one source for the operator and the test.

A block is a fenced `bash` block right after a line `<!-- e2e: NAME -->`, in any page of the docs
(docs/operating.md holds most; docs/deploying.md the check after a first deployment, docs/nodes.md the
destroy and re-up). Its commands are the
prod stack's (namespace `ai`, model `qwen3`); e2e runs them against its own stack with those names
replaced (`SUBSTITUTIONS`), in the project copy with the stack selected, as an operator's shell
would after `pulumi stack select`. What e2e cannot do on its loopback cluster is dropped and said
so in the check's detail: `port-forward` (kwok runs no container to forward to).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tools.render import ROOT

MARKER = re.compile(r"^[ \t]*<!-- e2e: ([a-z0-9-]+) -->[ \t]*\n[ \t]*```bash\n(.*?)^[ \t]*```", re.M | re.S)


@dataclass(frozen=True)
class Command:
    text: str
    """The command as the docs print it (comment removed)."""

    @property
    def program(self) -> str:
        """The first word after any pipe-free prefix: `pulumi`, `kubectl`, `curl`…"""
        return self.text.split()[0]


def documents() -> list[Path]:
    """The README and every page of docs/, where the marked blocks are."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(readme: str | None = None) -> dict[str, list[Command]]:
    """Every marked block of the docs (or of the text given), its commands in order (comments and
    blank lines dropped)."""
    texts = [("the text", readme)] if readme is not None else [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in documents()]
    found: dict[str, list[Command]] = {}
    where: dict[str, str] = {}
    for source, text in texts:
        for name, commands in _blocks_of(text, source).items():
            if name in found:
                raise ValueError(f"{source}: two blocks are marked e2e: {name} (the other in {where[name]})")
            found[name], where[name] = commands, source
    return found


def _blocks_of(text: str, source: str) -> dict[str, list[Command]]:
    found: dict[str, list[Command]] = {}
    for match in MARKER.finditer(text):
        name, body = match.group(1), match.group(2)
        if name in found:
            raise ValueError(f"{source}: two blocks are marked e2e: {name}")
        commands = []
        for line in body.splitlines():
            line = strip_comment(line).strip()
            if line:
                commands.append(Command(line))
        found[name] = commands
    return found


def strip_comment(line: str) -> str:
    """A shell line without its trailing `# comment` (a `#` inside quotes, or part of a word, stays)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index].rstrip()
    return line


def substitute(command: str, names: dict[str, str]) -> str:
    """The prod names of a runbook command replaced by the e2e stack's (whole words only)."""
    for old, new in names.items():
        command = re.sub(rf"(?<![\w.-]){re.escape(old)}(?![\w.-])", new, command)
    return command
