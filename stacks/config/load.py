"""Validating a decoded stack file into a `StackConfig`, with one line per error that names the key."""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Iterable
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from stacks.config.base import CONFIG_KEY, PATTERN_HELP, PROJECT, ConfigError, UnechoedError, _KeyPathError
from stacks.config.cluster import LABEL_KEY
from stacks.config.models import GPU_RESOURCE
from stacks.config.sharing import MIG_PROFILE
from stacks.config.stack import StackConfig

TOP_LEVEL_KEYS = ("cluster", "nodes", "modelStorage", "models", "tenants", "hfTokenSecret")
# Namespaces a stack file may legitimately hold besides ours: the engine's own, and the default
# providers of the packages this program uses.
OTHER_NAMESPACES = ("pulumi", "kubernetes", "command")
# Longest line of what an error echoes (a list of keys): a message that dumps a whole mapping helps nobody.
MAX_LINE = 300
# Longest refusal: past it (no check writes one so long) the line is cut at a clause's end.
MAX_REFUSAL = 1000
MAX_KEY = 60

# The expected form of every pattern-checked value, with an example. `tests/test_config.py`
# checks that every pattern of every config model is in this table.
FORMATS = {
    **PATTERN_HELP,
    r"^[^~]": "a path without `~` (nothing expands it here): absolute, or relative to the project folder, e.g. .kube/prod.yaml",
    r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$": "a label key, optionally with a DNS prefix, e.g. nvidia.com/gpu",
    r"^https?://[A-Za-z0-9.:_\[\]-]+(/[A-Za-z0-9._~/-]*)?$": "an http(s) URL, e.g. http://prometheus-operated.monitoring.svc:9090",
    r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$":
        "a lowercase DNS host name without scheme, port or path, e.g. ai.example.com (or *.example.com)",
    r"^/[A-Za-z0-9._~/-]*$": "a URL path starting with /, e.g. / or /qwen",
    r"^[a-z0-9][a-z0-9._/:-]*[a-z0-9](:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$":
        "an image with a pinned tag or digest, e.g. vllm/vllm-openai:v0.11.0 or vllm/vllm-openai@sha256:<64 hex digits>",
    r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$": "a Hugging Face repository id owner/name, e.g. Qwen/Qwen3-8B-AWQ",
    r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$": "a branch, tag or commit of the repository, e.g. main",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "an environment variable name of letters, digits and '_', e.g. VLLM_LOGGING_LEVEL",
    r"^[0-9]+(\.[0-9]+|m)?$": "a CPU quantity in cores or millicores, e.g. 4, 0.5 or 500m",
    r"^[0-9]+(Ki|Mi|Gi|Ti)$": "a memory quantity in Ki, Mi, Gi or Ti, e.g. 16Gi",
    r"^[A-Za-z0-9.:_-]+$": "a host name or IP address, e.g. k8s-worker-02 or 10.0.0.2",
    r"^[a-z_][a-z0-9_-]{0,31}$": "a Linux user name, e.g. root",
    r"^/dev/md(/[A-Za-z0-9_.:-]+|[0-9]+)$": "an md array device, e.g. /dev/md1 or /dev/md/models",
    GPU_RESOURCE: "a GPU resource after nvidia.com/: gpu, gpu.shared or mig-<profile>, e.g. mig-3g.40gb",
    MIG_PROFILE: "a MIG profile, compute slices and memory, e.g. 3g.40gb",
    LABEL_KEY: "a label key, optionally with a DNS prefix, e.g. release or app.kubernetes.io/part-of",
    r"^https?://[A-Za-z0-9.:_\[\]-]+(/[A-Za-z0-9._~/%?=&-]*)?$":
        "an http(s) URL of the auth service, e.g. http://oauth2-proxy.auth.svc/oauth2/auth",
}


def parse(raw: dict[str, Any]) -> StackConfig:
    """Validate the stack's non-secret top-level values (already decoded from YAML/JSON).

    Raises ConfigError with a one-line message naming the key path.
    """
    known = {key: value for key, value in raw.items() if key in TOP_LEVEL_KEYS}
    try:
        stack = StackConfig.model_validate(known)
    except ValidationError as exc:
        raise ConfigError(_cut(_describe(exc))) from None
    for key in sorted(set(raw) - set(TOP_LEVEL_KEYS)):
        if key in stack.secret_keys():
            raise ConfigError(f"{key}: holds a secret but is stored in plain text; set it with `pulumi config set --secret {key}`")
        raise ConfigError(_cut(
            f"{_key_name(key)}: unknown config key{_did_you_mean(str(key), TOP_LEVEL_KEYS)}; "
            f"allowed: {', '.join(TOP_LEVEL_KEYS)} and the stack's secret keys"
        ))
    return stack


def check_namespaces(names: Iterable[str]) -> list[str]:
    """Refuse config keys under a mistyped project namespace; return the other foreign keys.

    `names` are full config keys (`namespace:key`). A namespace close to ours, or one holding one
    of our top-level keys, is a typo whose keys would otherwise be silently ignored: ConfigError.
    Keys of namespaces this program does not know are returned for a warning (another program's
    or provider's config may legitimately be there).
    """
    foreign = []
    for name in sorted(names):
        namespace, _, key = name.partition(":")
        if namespace in (PROJECT, *OTHER_NAMESPACES):
            continue
        if key in TOP_LEVEL_KEYS or difflib.get_close_matches(namespace, [PROJECT], n=1, cutoff=0.7):
            raise ConfigError(
                f"{name}: unknown config namespace {namespace!r}, so this key would be ignored; "
                f"this project's keys are {PROJECT}:<key> (did you mean {PROJECT}:{key}?)"
            )
        foreign.append(name)
    return foreign


def _describe(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    ctx = error.get("ctx") or {}
    ctx_error = ctx.get("error")
    if isinstance(ctx_error, _KeyPathError):
        return f"{ctx_error.path}: {ctx_error}"
    path = _key_path(error["loc"])
    if isinstance(ctx_error, UnechoedError):
        return f"{path}: {ctx_error!s}"
    if ctx.get("pattern") == CONFIG_KEY:
        # Never repeat it: a secret's value pasted here would land in the error line and the CI log.
        return (f"{path}: must be {FORMATS[CONFIG_KEY]}, the name the value is stored under with "
                "`pulumi config set --secret <name>` (the value given is not one, and is not repeated here)")
    if isinstance(ctx_error, ValueError) and getattr(ctx_error, "sub_path", None):
        path += ctx_error.sub_path
    given = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        return f"{path}: required key is missing"
    if error["type"] == "string_pattern_mismatch":
        allowed = FORMATS.get(ctx.get("pattern", ""), "the documented format")
        hint = _hint(given, ctx.get("pattern", "")) if "`~`" not in allowed else ""
        return f"{path}: must be {allowed} (got {_short(given)}{hint})"
    if error["type"] == "extra_forbidden":
        keys = _allowed_keys(error["loc"][:-1])
        suggestion = _did_you_mean(str(error["loc"][-1]), keys or [])
        if suggestion:
            return f"{path}: unknown key{suggestion}"
        line = f"{path}: unknown key (check the spelling; keys are camelCase)"
        listed = f"{line}; keys here: {', '.join(keys)}" if keys else line
        return listed if len(listed) <= MAX_LINE else f"{line}; docs/configuration.md lists the keys"
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        tags = ", ".join(repr(t) for m in get_args(_strip(_annotation_at(error["loc"]))) for t in _tags(m))
        got = f" (got {_short(ctx['tag'])})" if "tag" in ctx else " (it is missing)"
        return f"{path}.type: must be one of {tags}{got}"
    if error["type"] in ("model_type", "model_attributes_type", "dict_type"):
        message = "must be a mapping of keys to values"
    elif error["type"] == "list_type":
        message = "must be a list"
    elif error["type"] == "string_type" and isinstance(given, int | float) and not isinstance(given, bool):
        # An unquoted commit of digits only (or 1e5…) reaches us as a number, leading zeros gone.
        return (f"{path}: must be text, but YAML read a number (got {_short(given)}); "
                f"quote the value in the stack file, e.g. {error['loc'][-1]}: \"0123…\"")
    if isinstance(given, dict | list) and error["type"] == "value_error":
        return f"{path}: {message}"  # our own checks say what is wrong with the value
    if isinstance(given, dict | list):
        # The whole mapping or list adds nothing to the reason: say what it was, not all of it.
        return f"{path}: {message} (got a {'mapping' if isinstance(given, dict) else 'list'})"
    return f"{path}: {message} (got {_short(given)})"


HOST_PATTERNS = (r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$", r"^[A-Za-z0-9.:_-]+$")
HF_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
REVISION = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$"


def _hint(value: Any, pattern: str) -> str:
    """A guess at what the user meant, for the usual slips (a URL pasted where a part of it belongs)."""
    if not isinstance(value, str):
        return ""
    if value.startswith("~"):
        return "; `~` is not expanded: write the full path"
    if "://" in value:
        rest = value.split("://", 1)[1]
        host, _, path = rest.partition("/")
        parts = [part for part in path.split("?", 1)[0].split("/") if part]
        if pattern in HOST_PATTERNS:
            host = host.rsplit("@", 1)[-1].split(":", 1)[0]
            return f"; give the host alone, e.g. {host}" if host else ""
        if pattern == HF_ID:
            return f"; give the repository id alone, e.g. {parts[0]}/{parts[1]}" if len(parts) >= 2 else ""
        if pattern == REVISION:
            marker = next((i for i, part in enumerate(parts) if part in ("tree", "commit", "blob")), None)
            if marker is not None and marker + 1 < len(parts):
                return f"; give the revision alone, e.g. {parts[marker + 1]}"
            return "; give the branch, tag or commit alone, e.g. main"
        return ""
    size = re.fullmatch(r"([0-9]+)\s*([KMGT])i?B", value, re.IGNORECASE)
    if size:
        return f"; Kubernetes writes GiB as Gi, e.g. {size[1]}{size[2].upper()}i"
    return ""


def _allowed_keys(loc: tuple[Any, ...]) -> list[str] | None:
    """The keys the model at `loc` accepts (None when the location is not a model)."""
    tp = _strip(_annotation_at(loc))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [str(f.alias) for f in tp.model_fields.values()]
    return None


def _annotation_at(loc: tuple[Any, ...]) -> Any:
    """The type the config models expect at `loc` (None when the location is not in them)."""
    tp: Any = StackConfig
    for part in loc:
        tp = _strip(tp)
        if isinstance(part, int):
            args = get_args(tp)
            tp = args[0] if args else None
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            tp = next((f.annotation for f in tp.model_fields.values() if f.alias == part), None)
        elif get_origin(tp) in (Union, types.UnionType):
            tp = next((m for m in get_args(tp) if part in _tags(m)), None)
        else:
            return None
    return tp


def _strip(tp: Any) -> Any:
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
            members = [m for m in get_args(tp) if m is not type(None)]
            tp = members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007 - built at run time
        else:
            return tp


def _tags(model: Any) -> tuple[Any, ...]:
    field = getattr(model, "model_fields", {}).get("type")
    return get_args(field.annotation) if field else ()


def _did_you_mean(key: str, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    same_case = [a for a in allowed if a.lower() == key.lower()]
    close = same_case or difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _key_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if part == "[key]":
            continue  # pydantic's marker for a mapping's key itself: the key is already the last part
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("local", "nfs", "storageClass") and path.endswith("modelStorage"):
            continue  # the discriminated union's tag is not a key the user wrote
        else:
            path += f".{_key_name(part)}" if path else _key_name(part)
    return path or "(stack)"


def _key_name(key: Any) -> str:
    """A key as the user can find it again: quoted when it is empty or holds odd characters,
    and shortened when it is long (its start is enough to find it)."""
    text = str(key)
    if len(text) > MAX_KEY:
        text = text[:MAX_KEY - 1] + "…"
    if re.fullmatch(r"[A-Za-z0-9_-]+", text):
        return text
    # Escaped as JSON escapes them: what prints as nothing or as a space (U+0085, U+00A0, U+2028...)
    # would otherwise vanish into the one-line message, and the key could not be found again.
    return "".join(ch if ch.isprintable() and (ch == " " or not ch.isspace()) else json.dumps(ch)[1:-1]
                   for ch in json.dumps(text, ensure_ascii=False))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _cut(line: str) -> str:
    """One line. What this program echoes is bounded where it is echoed (a value to 80 characters, a key to
    MAX_KEY, a list of keys to MAX_LINE), so a line over MAX_LINE is a refusal this program wrote, which is
    kept whole: its last clause is usually the fix (the issue: one refusal was cut mid-sentence). Only a line
    past MAX_REFUSAL, which no check writes, is cut, at the end of a clause and never inside the key path."""
    line = " ".join(line.split())
    if len(line) <= MAX_REFUSAL:
        return line
    end = _path_end(line)
    path, reason = line[:end], line[end:]
    room = max(MAX_REFUSAL - len(path), 60)
    cut = reason[:room - 1]
    clause = max(cut.rfind(mark) for mark in ("; ", ", ", " — ", ". ", " ("))
    return path + (cut[:clause] if clause > len(": ") else cut).rstrip(" ,;") + " …"


def _path_end(line: str) -> int:
    """Where the key path at the start of an error line ends (its quoted keys may hold ': ')."""
    i, quoted = 0, False
    while i < len(line):
        if quoted and line[i] == "\\":
            i += 2
            continue
        if line[i] == '"':
            quoted = not quoted
        elif not quoted and line.startswith(": ", i):
            return i
        i += 1
    return 0
