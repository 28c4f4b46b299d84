"""Secret values out of what a render writes: each becomes `[secret]`, in the shape it had."""

from __future__ import annotations

from typing import Any

from tools.render.sdk import SECRET_SIG, SIG_KEY

SECRET = "[secret]"


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def redact(value: Any) -> Any:
    """Replace every secret-marked value by `[secret]`, keeping the shape of maps and lists."""
    if is_secret(value):
        return _blank(value.get("value"))
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the wire format has only doubles; 2.0 replicas read back as 2
    return value


def _blank(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _blank(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return SECRET


def holds_secret(value: Any) -> bool:
    if is_secret(value):
        return True
    if isinstance(value, dict):
        return any(holds_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_secret(v) for v in value)
    return False
