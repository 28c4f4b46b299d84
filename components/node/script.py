"""The text of one node step: its script file, linked with the helpers it calls, and the Command that runs it.

A step's linked script is `set -euo pipefail`, the shared helpers (`lib.sh`) the step calls, then the step's body:
the same on every node, so the node receives it once (`linked_script`, delivered by the node's copy step) rather
than in every Command. The Command (`render_invocation`) is the step's parameters as `shlex.quote`d assignments, the
linked script's name and sha256, and `run-step.sh`, which finds that file by its hash and sources it. Nothing is
spliced into a body, and the same parameters render byte-identical text. `render_script` is the whole text as one
script (the offline render shows it; the VM tests run it).
"""

from __future__ import annotations

import functools
import hashlib
import re
import shlex
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
HEADER = "#!/usr/bin/env bash\nset -euo pipefail\n"
# The second line of every rendered script. It names where the scripts lived when the first stacks
# were deployed, on purpose: the line is part of each Command's input, so new wording would run
# every step of every node again at the next `up`; testbed/standins/ssh.py reads the step from it.
ORIGIN = "# gpu-serving: components/node_scripts/{filename}, rendered by components/node.py\n"


def assignments(params: dict[str, str | list[str]]) -> str:
    """`NAME=<quoted>` lines (bash arrays for lists), in the given order."""
    lines = []
    for name, value in params.items():
        if not name.isidentifier() or not name.isupper():
            raise ValueError(f"bad parameter name {name!r}")
        if isinstance(value, list):
            lines.append(f"{name}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            lines.append(f"{name}={shlex.quote(value)}")
    return "".join(line + "\n" for line in lines)


def _body(filename: str) -> str:
    text = (SCRIPTS / filename).read_text()
    if not text.startswith(HEADER):
        raise ValueError(f"{filename} must start with {HEADER!r}")
    return text[len(HEADER):]


FUNCTION = re.compile(r"([a-z_][a-z0-9_]*)\(\) *\{")


@functools.cache
def lib_parts(lib: str) -> tuple[tuple[str | None, str], ...]:
    """lib.sh cut into its functions, each with the comment lines right above it, and the lines
    between functions (name None), in order: joined, they are lib.sh again. A function starts with
    `name() {` at the start of a line and ends on that line or at the next line that is `}` alone."""
    parts: list[tuple[str | None, str]] = []
    lines, loose = lib.splitlines(keepends=True), []
    i = 0
    while i < len(lines):
        start = FUNCTION.match(lines[i])
        if not start:
            loose.append(lines[i])
            i += 1
            continue
        comment = len(loose)
        while comment and loose[comment - 1].startswith("#"):
            comment -= 1
        if loose[:comment]:
            parts.append((None, "".join(loose[:comment])))
        end: int | None = i  # `say() { ...; }` on one line
        if not lines[i].rstrip().endswith("}"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip("\n") == "}"), None)
            if end is None:
                raise ValueError(f"lib.sh: {start.group(1)}() has no closing `}}` alone on a line")
        parts.append((start.group(1), "".join(loose[comment:] + lines[i:end + 1])))
        loose, i = [], end + 1
    if loose:
        parts.append((None, "".join(loose)))
    return tuple(parts)


def _called(text: str, names: set[str]) -> set[str]:
    """The names that occur in `text` outside comment lines (a mention in a string counts: it may be
    a trap's command, and one function too many costs only bytes)."""
    code = re.sub(r"^\s*#.*$", "", text, flags=re.MULTILINE)
    return {name for name in names if re.search(rf"(?<![\w-]){name}(?![\w-])", code)}


def lib_for(body: str) -> str:
    """The part of lib.sh a step's body needs: every line outside a function, and each function that
    the body or those lines call, directly or through other functions. So a helper's change re-runs
    only the steps that call it, and every Command's script (held twice in the state, as input and
    output, and written with the whole state after every step of an `up`) carries no dead code."""
    return _lib_for(_body("lib.sh"), body)


@functools.cache
def _lib_for(lib: str, body: str) -> str:
    """lib_for, once per text: every node's steps share the same bodies."""
    parts = lib_parts(lib)
    functions = {name: text for name, text in parts if name is not None}
    needed = _called(body + "".join(text for name, text in parts if name is None), set(functions))
    pending = list(needed)
    while pending:
        found = _called(functions[pending.pop()], set(functions)) - needed
        needed |= found
        pending += found
    return "".join(text for name, text in parts if name is None or name in needed)


def render_script(filename: str, params: dict[str, str | list[str]], with_lib: bool = True) -> str:
    """The exact text a node runs: header, quoted parameters, the lib.sh helpers it calls, the script's body."""
    parts = [HEADER, ORIGIN.format(filename=filename)]
    parts.append(assignments(params))
    body = _body(filename)
    if with_lib:
        parts += ["# ---- lib.sh\n", lib_for(body)]
    parts += [f"# ---- {filename}\n", body]
    return "".join(parts)


RUNNER = "run-step.sh"
STEPS_DIR = "/var/lib/gpu-serving/steps"
"""Where the node's copy step puts the linked scripts, a folder per version (components/node/component.py)."""


def linked_script(filename: str) -> str:
    """What the node receives for a step, the same on every node: header, the lib.sh helpers it calls, its body."""
    body = _body(filename)
    return "".join([HEADER, ORIGIN.format(filename=filename), "# ---- lib.sh\n", lib_for(body), f"# ---- {filename}\n", body])


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def linked_delete() -> str:
    """delete.sh as the node receives it: it calls no helper."""
    return "".join([HEADER, ORIGIN.format(filename="delete.sh"), "# ---- delete.sh\n", _body("delete.sh")])


def render_invocation(filename: str, params: dict[str, str | list[str]], copy_step: str, *, delete: bool = False) -> str:
    """The Command of a step: its parameters, which linked script (by name and sha256), and the runner. It changes
    only when the step's own linked text or its parameters do."""
    text = linked_delete() if delete else linked_script(filename)
    named = {**params, "GS_STEPS_DIR": STEPS_DIR, "GS_SCRIPT": filename, "GS_SCRIPT_SHA256": sha256(text), "GS_COPY_STEP": copy_step}
    if delete:
        named["GS_IF_MISSING"] = "note"
    # Its comments stay in the file: in every Command of every node they would be bytes of the state and nothing else.
    runner = "".join(line for line in _body(RUNNER).splitlines(keepends=True)
                     if not line.startswith("#") or line.startswith("# shellcheck"))
    # The parameters are read by the sourced script, which shellcheck cannot follow from here (a directive before the
    # first command holds for the whole file).
    shebang, strict = HEADER.splitlines(keepends=True)
    return "".join([shebang, "# shellcheck disable=SC2034\n", strict, ORIGIN.format(filename=filename), assignments(named),
                    f"# ---- {RUNNER}\n", runner])
