"""Property: any structured config either loads or fails with the one-line error that names a key path.

Fed through `stacks.load()`, the very path `__main__.py` uses (Pulumi config → JSON → pydantic).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pulumi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stacks
from stacks.config import TOP_LEVEL_KEYS, StackConfig
from tests.test_config import prod_raw
from tests.test_sharing import example_raw

ERROR = re.compile(r"^config error: (?P<path>.+?): \S")
NASTY_TEXT = st.sampled_from(
    ["", " ", "/dev/sd a", "/dev/sda; rm -rf /", "$(reboot)", "`id`", "'\"", "\n", "../../etc", "/mnt/mödels", "💾",
     "-" * 300, "/dev/disk/by-id/ata-X\tY", "nvidia.com/gpu", "latest", "NaN", "0", "-1"]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), NASTY_TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12) | NASTY_TEXT, inner, max_size=4),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


PROD = prod_raw()
# The GPU sharing example: time-slicing and MIG layouts, models asking for slices and instances.
SHARING = example_raw()


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """The config with a few values replaced, deleted, duplicated or added."""
    raw = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(base)))
        parent: Any = raw
        try:
            for part in path[:-1]:
                parent = parent[part]
            action = draw(st.sampled_from(["replace", "delete", "duplicate", "add"]))
            if action == "replace":
                parent[path[-1]] = draw(JSON)
            elif action == "delete":
                del parent[path[-1]]
            elif action == "duplicate" and isinstance(parent, list):
                parent.append(copy.deepcopy(parent[path[-1]]))
            elif isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=10))] = draw(JSON)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    return raw


def load(raw: dict[str, Any]) -> StackConfig:
    values = {f"gpu-serving:{key}": value if isinstance(value, str) else json.dumps(value) for key, value in raw.items()}
    secrets = ["gpu-serving:hfToken", "gpu-serving:sshPrivateKey", "gpu-serving:sshHostKeyWorker02", "gpu-serving:vllmApiKey",
               "gpu-serving:rolloutSalt"]
    values.update({key: f"value of {key}" for key in secrets})  # distinct: one value under two roles is refused
    pulumi.runtime.set_all_config(values, secrets)
    return stacks.load()


def assert_loads_or_names_a_key(raw: dict[str, Any]) -> None:
    try:
        load(raw)
    except pulumi.RunError as exc:
        message = str(exc)
        assert "\n" not in message, message
        match = ERROR.match(message)
        assert match, message
        path = match["path"]
        quoted = path.startswith('"')
        top = json.JSONDecoder().raw_decode(message, len("config error: "))[0] if quoted else re.split(r"[.\[]", path, maxsplit=1)[0]
        assert top in raw or top in TOP_LEVEL_KEYS, message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(PROD))
def test_mutated_prod_config_loads_or_names_a_key(raw: dict[str, Any]) -> None:
    assert_loads_or_names_a_key(raw)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(SHARING))
def test_mutated_sharing_config_loads_or_names_a_key(raw: dict[str, Any]) -> None:
    assert_loads_or_names_a_key(raw)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["cluster", "nodes", "modelStorage", "models", "hfTokenSecret", "typo"]), JSON))
def test_arbitrary_top_level_values_load_or_name_a_key(raw: dict[str, Any]) -> None:
    assert_loads_or_names_a_key(raw)


def test_the_unmutated_prod_config_loads() -> None:
    assert load(copy.deepcopy(PROD)).nodes[0].name == "k8s-worker-02"


@pytest.mark.parametrize("bad", [{"nodes": "not a list"}, {"cluster": None}, {"models": [None]}, {"modelStorage": {"type": []}}])
def test_wrong_shapes_are_config_errors(bad: dict[str, Any]) -> None:
    raw = copy.deepcopy(PROD)
    raw.update(bad)
    with pytest.raises(pulumi.RunError, match=r"^config error: "):
        load(raw)
