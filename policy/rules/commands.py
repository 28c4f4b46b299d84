"""pulumi_command remote Commands that prepare GPU nodes over SSH."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from . import k8s
from .core import ADVISORY, MANDATORY, Resource, Rule, attempt
from .k8s import as_map

# What the offline renderer writes instead of a secret value.
SECRET_PLACEHOLDER = "[secret]"

SCRIPT_FIELDS = ("create", "update", "delete", "stdin")
_VAR_RE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)|\b([A-Za-z_][A-Za-z0-9_]*)=")
_LITERAL_SECRET_RE = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----|\bhf_[A-Za-z0-9]{20,}")


def check_host_key(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    connection = as_map(resource.view.get("connection"))
    if not connection.get("hostKey"):
        host = connection.get("host", "?")
        yield (f"SSH connection to {host} does not pin connection.hostKey, so host-key checking is "
               f"off: whatever machine answers on that address (a reinstalled node, a wrong DHCP "
               f"lease) gets the session and runs the disk script. Set connection.host_key to the "
               f"node's key from `ssh-keyscan -t ed25519 {host}`.")


def _script_secret_hint(text: str) -> str | None:
    if text == SECRET_PLACEHOLDER:
        return "a secret value"
    if _LITERAL_SECRET_RE.search(text):
        return "an embedded key/token"
    names = {a or b for a, b in _VAR_RE.findall(text)}
    secret = sorted(n for n in names if k8s.looks_secret(n))
    return f"${secret[0]}" if secret else None


def secret_inputs(props: Mapping) -> list[str]:
    """Why the script itself sees a secret. connection.privateKey does not
    count: sshd consumes it, the script never does."""
    reasons = []
    for field_name in SCRIPT_FIELDS:
        text = attempt(props.get, field_name)
        hint = _script_secret_hint(text) if isinstance(text, str) else None
        if hint:
            reasons.append(f"{field_name} uses {hint}")
    environment = as_map(attempt(props.get, "environment"))
    for key in environment:
        value = attempt(environment.get, key)
        if value == SECRET_PLACEHOLDER or k8s.looks_secret(key):
            reasons.append(f"environment {key}")
    return reasons


def _secret_outputs(options: Mapping[str, Any]) -> set[str]:
    outputs = options.get("additionalSecretOutputs") or ()
    return {str(o) for o in outputs}


def check_secret_outputs(resource: Resource, _cfg: Mapping) -> Iterator[str]:
    reasons = secret_inputs(resource.view)
    declared = _secret_outputs(resource.options)
    missing = [o for o in ("stdout", "stderr") if o not in declared]
    if reasons and missing:
        yield (f"script receives a secret ({'; '.join(reasons)}) but {' and '.join(missing)} "
               f"{'is' if len(missing) == 1 else 'are'} not secret outputs: anything the script "
               f"prints (set -x, an error message) is stored in plain text in the stack state and "
               f"shown by `pulumi up`. Add additional_secret_outputs=[\"stdout\", \"stderr\"] to "
               f"the Command's ResourceOptions.")


RULES = [
    Rule("command-host-key-pinned", "Remote Commands pin the node's SSH host key (connection.hostKey).",
         ADVISORY, check_host_key, frozenset({k8s.COMMAND})),
    Rule("command-secret-outputs",
         "Remote Commands whose script receives a secret mark stdout and stderr as secret outputs.",
         MANDATORY, check_secret_outputs, frozenset({k8s.COMMAND})),
]
