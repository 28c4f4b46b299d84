"""docs/policy.md's rule table, generated from the policy pack itself (`policy.rules.ALL_RULES`).

`make docs` (tools/docs.py) writes it between the page's markers.
"""

from __future__ import annotations

from policy.rules import ALL_RULES
from tools.render import ROOT

PAGE = ROOT / "docs" / "policy.md"
BEGIN = "<!-- policy-rules:begin (generated: `make docs`) -->"
END = "<!-- policy-rules:end -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")


def reference() -> str:
    """One row per rule, in the pack's order: name, level, what it checks."""
    lines = ["| rule | level | what it checks |", "|---|---|---|"]
    lines += [f"| `{rule.name}` | {rule.level} | {_cell(rule.description)} |" for rule in ALL_RULES]
    return "\n".join(lines) + "\n"

