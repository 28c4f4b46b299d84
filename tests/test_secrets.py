"""Secret canary: every secret the stack reads holds a unique string that must never appear in plain text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stacks.config import parse
from tests.test_config import prod_raw
from tools.render import Render, is_secret, run_program, write


def canaries_for(raw: dict[str, Any]) -> dict[str, str]:
    return {key: f"CANARY-{key}-4b1d" for key in parse(raw).secret_keys()}


def plain_strings(value: Any) -> list[str]:
    """Every string in a value that is not inside a secret-marked part."""
    if is_secret(value):
        return []
    if isinstance(value, dict):
        return [s for v in value.values() for s in plain_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in plain_strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.fixture(scope="module")
def canary_render(tmp_path_factory: pytest.TempPathFactory) -> tuple[Render, dict[str, str], Path]:
    raw = prod_raw()
    raw["models"][0]["apiKeySecret"] = "vllmApiKey"
    canaries = canaries_for(raw)
    result = run_program("prod", overrides={"gpu-serving:models": json.dumps(raw["models"])}, secret_values=canaries)
    out = tmp_path_factory.mktemp("canary")
    write(result, out)
    return result, canaries, out


def test_every_secret_key_gets_a_canary(canary_render: tuple[Render, dict[str, str], Path]) -> None:
    _, canaries, _ = canary_render
    assert set(canaries) >= {"hfToken", "sshPrivateKey", "sshHostKeyWorker02", "vllmApiKey"}


def test_no_canary_in_rendered_files(canary_render: tuple[Render, dict[str, str], Path]) -> None:
    _, canaries, out = canary_render
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "manifests.yaml" for p in files)
    for path in files:
        text = path.read_text()
        for key, canary in canaries.items():
            assert canary not in text, f"{key} leaks into {path.relative_to(out)}"


def test_no_canary_in_plain_inputs_outputs_or_logs(canary_render: tuple[Render, dict[str, str], Path]) -> None:
    result, canaries, _ = canary_render
    for resource in result.resources:
        for text in plain_strings(resource.inputs):
            for key, canary in canaries.items():
                assert canary not in text, f"{key} in plain inputs of {resource.urn}"
    for text in plain_strings(result.outputs) + result.warnings:
        for canary in canaries.values():
            assert canary not in text


def test_secrets_are_carried_only_as_secret_values(canary_render: tuple[Render, dict[str, str], Path]) -> None:
    """The canaries are really used (so the checks above are not vacuous), and only secret-marked."""
    result, canaries, _ = canary_render
    dumped = json.dumps([r.inputs for r in result.resources])
    used = {key for key, canary in canaries.items() if canary in dumped}
    assert "hfToken" in used and "sshPrivateKey" in used


def test_canary_does_not_reach_the_cli_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tools.render import cli

    raw = prod_raw()
    canaries = canaries_for(raw)
    original = cli.run_program
    try:
        cli.run_program = lambda stack, **kw: original(stack, secret_values=canaries, **kw)  # type: ignore[assignment]
        assert cli.main(["prod", "--out", str(tmp_path)]) == 0
    finally:
        cli.run_program = original  # type: ignore[assignment]
    captured = capsys.readouterr()
    for canary in canaries.values():
        assert canary not in captured.out + captured.err
