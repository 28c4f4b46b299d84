"""The runbook's blocks (docs/operating.md, and the check of docs/deploying.md) are what `make e2e` runs
(testbed/e2e/runbook.py), and they work as printed: every block e2e runs is there, a curl of a keyed model's /v1 sends the key, and every
`pulumi stack output NAME` names an output the stack has."""

from __future__ import annotations

import re
import subprocess

import pytest

from testbed.e2e import runbook
from testbed.e2e.day_two import README_NAMES
from tools.render import ROOT, Render

# Every block a day-two check runs (the first argument of DayTwoEndToEnd.run_block or change_model).
E2E_BLOCKS = set(re.findall(r'(?:run_block|change_model)\("([a-z0-9-]+)"', (ROOT / "testbed/e2e/day_two.py").read_text()))


def test_every_block_e2e_runs_is_marked_in_the_docs() -> None:
    assert {"check", "grow", "rotate-api-key", "rotate-hf-token", "add-model", "remove-model", "refresh-drift", "drain-node", "add-node",
                          "change-revision", "upgrade-image",
                          "destroy-and-re-up", "replace-disk", "adopt-ansible"} <= E2E_BLOCKS
    blocks = runbook.blocks()
    assert set(blocks) >= E2E_BLOCKS, f"the docs lack the blocks {sorted(E2E_BLOCKS - set(blocks))}"
    assert all(blocks[name] for name in E2E_BLOCKS), "an empty block"


def test_a_block_is_read_as_the_shell_would() -> None:
    text = ("intro\n<!-- e2e: demo -->\n```bash\n# a comment line\npulumi up   # with a comment\n\n"
            "kubectl get pods -o 'jsonpath={.items[*].metadata.name} # not a comment'\n```\n")
    assert [c.text for c in runbook.blocks(text)["demo"]] == [
        "pulumi up", "kubectl get pods -o 'jsonpath={.items[*].metadata.name} # not a comment'"]
    with pytest.raises(ValueError, match="two blocks"):
        runbook.blocks(text + text)


def test_prod_names_become_the_e2e_stack_names() -> None:
    names = README_NAMES
    assert runbook.substitute("kubectl -n ai rollout status deploy/vllm-qwen3", names) == \
        "kubectl -n ai-cluster rollout status deploy/vllm-qwen25-05b"
    assert runbook.substitute("kubectl get pv ai-models", names) == "kubectl get pv ai-cluster-models"
    # Words that only contain a name stay.
    assert runbook.substitute("curl https://ai.primer.rs/v1/models --domain=ai.example", {"ai": "x"}) == \
        "curl https://ai.primer.rs/v1/models --domain=ai.example"


def test_a_curl_of_a_keyed_model_sends_its_key(prod: Render) -> None:
    """vLLM with --api-key answers /v1 with 401 without it: the docs' curl lines must send it."""
    text = "\n".join(path.read_text() for path in runbook.documents())
    curls = [line for line in text.splitlines() if re.search(r"\bcurl\b.*(localhost:8000|ai\.primer\.rs)/v1/", line)
             and not line.lstrip().startswith("|")]
    assert curls
    for line in curls:
        assert "Authorization: Bearer" in line, f"a curl without the API key: {line.strip()}"
        assert "pulumi config get vllmApiKey |" in line, f"the key should come through stdin, not the command line: {line.strip()}"


def test_every_stack_output_the_docs_name_exists(prod: Render) -> None:
    text = "\n".join(path.read_text() for path in runbook.documents())
    named = set(re.findall(r"pulumi stack output (?:--json )?([A-Za-z][A-Za-z0-9]*)", text))
    assert {"nodes", "models"} <= named
    assert named <= set(prod.outputs), f"the docs name outputs the stack does not have: {sorted(named - set(prod.outputs))}"


def test_kubectl_column_paths_keep_their_escaped_dots_through_the_shell() -> None:
    """`nvidia\\.com/gpu` is one key to kubectl only if the backslash reaches it: unquoted, the
    shell drops it and the column reads the path nvidia → com/gpu, `<none>` on every node."""
    texts = [path.read_text() for path in runbook.documents()]
    commands = [c for text in texts for c in re.findall(r"kubectl [^`\n]*\\\.[^`\n]*", text)]
    assert commands
    for command in commands:
        # What bash hands kubectl: the arguments, one per line.
        argv = subprocess.run(["bash", "-c", f"printf '%s\\n' {command.split(' ', 1)[1].split('#')[0]}"],
                              capture_output=True, text=True, check=True).stdout
        assert "\\." in argv, f"the shell removes the escape in: {command}"
