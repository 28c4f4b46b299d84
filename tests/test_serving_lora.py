"""LoRA adapters (issue #26 item 3): config refusals, the rendered flags, Job and smoke test, and
the download script against the stand-in hub, on an example stack with two adapters."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.serving.jobs import DOWNLOAD_SCRIPT, EACH_REPO_SCRIPT, EXIT_NOT_FOUND, SMOKE_SCRIPT
from components.serving.lora import RUNTIME_UPDATES_ENV
from components.serving.names import MODEL_MOUNT
from policy.rules import check_resources
from tests.test_config import error_of, prod_raw
from tests.test_serving import DEPLOYMENT, JOB, assert_valid, container, env_of, one, prod_model
from tools.render import Render, run_program

SQL = "1f0c1a7d3e5b9a2c4d6e8f0a1b3c5d7e9f1a2b3c"
CHAT = "aa0c1a7d3e5b9a2c4d6e8f0a1b3c5d7e9f1a2b3c"
# The example: the prod model with two adapters (not in Pulumi.prod.yaml, whose render stays as it was).
LORA = {
    "maxLoras": 2,
    "maxLoraRank": 32,
    "adapters": [
        {"name": "qwen3-sql", "huggingFaceId": "acme/qwen3-8b-sql-lora", "revision": SQL, "weightsGb": 0.2},
        {"name": "qwen3-chat", "huggingFaceId": "acme/qwen3-8b-chat-lora", "revision": CHAT, "weightsGb": 0.3},
    ],
}
SQL_PATH = f"{MODEL_MOUNT}/hub/models--acme--qwen3-8b-sql-lora/snapshots/{SQL}"
CHAT_PATH = f"{MODEL_MOUNT}/hub/models--acme--qwen3-8b-chat-lora/snapshots/{CHAT}"


def lora(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(LORA), **changes}


def with_lora(value: Any, model: int = 0, **model_changes: Any) -> dict[str, Any]:
    raw = prod_raw()
    raw["models"][model].update(lora=value, **model_changes)
    return raw


@pytest.fixture(scope="module")
def example() -> Render:
    return run_program("prod", overrides={"gpu-serving:models": json.dumps([prod_model(lora=LORA)])})


def smoke_container(result: Render) -> dict[str, Any]:
    (job,) = [j for j in result.of_type(JOB) if "-smoke-" in j.inputs["metadata"]["name"]]
    return job.inputs["spec"]["template"]["spec"]["containers"][0]


# ---------------------------------------------------------------------------- refused at load


REFUSALS = [
    (with_lora(lora(adapters=[LORA["adapters"][0], {**LORA["adapters"][1], "name": "qwen3-sql"}])),
     "models[0].lora.adapters[1].name: 'qwen3-sql' is already served as models[0].lora.adapters[0].name"),
    (with_lora(lora(adapters=[{**LORA["adapters"][0], "name": "qwen3"}], maxLoras=1)),
     "models[0].lora.adapters[0].name: 'qwen3' is already served as models[0].name"),
    (with_lora(lora(adapters=[{**LORA["adapters"][0], "revision": "main"}], maxLoras=1)),
     "models[0].lora.adapters[0].revision: a branch or tag: pin the 40-hex commit"),
    (with_lora(lora(maxLoras=3)), "models[0].lora.maxLoras: 3, but the model serves 2 adapter(s)"),
    (with_lora(lora(maxLoras=0)), "models[0].lora.maxLoras: "),
    (with_lora(lora(maxLoraRank=24)), "models[0].lora.maxLoraRank: "),
    (with_lora(lora(maxLoraRank=1)), "models[0].lora.maxLoraRank: "),
    (with_lora(lora(adapters=[])), "models[0].lora.adapters: "),
    (with_lora({"maxLoras": 1}), "models[0].lora.adapters: "),
    (with_lora(lora(adapters=[{k: v for k, v in LORA["adapters"][0].items() if k != "weightsGb"}], maxLoras=1)),
     "models[0].lora.adapters[0].weightsGb: "),
    (with_lora(lora(runtimeUpdates=True)),
     "models[0].lora.runtimeUpdates: not for a model with ingress: /v1/load_lora_adapter sits under the /v1 the edge forwards"),
    (with_lora(None, extraArgs=["--enable-lora"]),
     "models[0].extraArgs[0]: '--enable-lora': --enable-lora is set by the bundle from lora"),
    (with_lora(None, extraArgs=["--lora-modules", "x=/tmp/x"]),
     "models[0].extraArgs[0]: '--lora-modules': --lora-modules is set by the bundle"),
    (with_lora(None, extraArgs=["--max_loras=4"]), "--max-loras is set by the bundle from lora.maxLoras"),
    (with_lora(None, extraArgs=["--max-lora-rank", "64"]), "--max-lora-rank is set by the bundle from lora.maxLoraRank"),
    (with_lora(None, env={RUNTIME_UPDATES_ENV: "True"}),
     f"models[0].env: {RUNTIME_UPDATES_ENV} is set by the bundle from lora.runtimeUpdates"),
    (with_lora(lora(adapters=[{**a, "weightsGb": 400} for a in LORA["adapters"]]), weightsGb=500),
     "models: the weights and adapters add up to 1300 GB but the model volume holds"),
]


@pytest.mark.parametrize(("raw", "starts"), REFUSALS, ids=[s[:60] for _, s in REFUSALS])
def test_each_wrong_lora_config_is_one_line_naming_the_key(raw: dict[str, Any], starts: str) -> None:
    message = error_of(raw)
    assert message.startswith(starts) or starts in message, message
    assert "\n" not in message and len(message) <= 300


def test_an_adapter_name_may_not_be_another_models_name() -> None:
    raw = prod_raw()
    other = copy.deepcopy(raw["models"][0])
    other.update(name="small", ingress={"host": "ai.primer.rs", "path": "/small", "tlsSecret": "ai-tls"},
                 replicas={"min": 1, "max": 1}, lora=lora(adapters=[{**LORA["adapters"][0], "name": "qwen3"}], maxLoras=1))
    raw["models"][0]["replicas"] = {"min": 1, "max": 1}
    raw["models"].append(other)
    assert error_of(raw).startswith("models[1].lora.adapters[0].name: 'qwen3' is already served as models[0].name")


def test_the_refusal_lines_are_quoted_in_failure_modes() -> None:
    from tools.render import ROOT

    doc = (ROOT / "docs" / "failure-modes.md").read_text()
    for raw, _ in [REFUSALS[0], REFUSALS[2], REFUSALS[3], REFUSALS[10]]:
        assert error_of(raw) in doc, error_of(raw)


# ---------------------------------------------------------------------------- rendered


def test_the_server_loads_the_adapters_from_the_snapshot_folders(example: Render) -> None:
    args = container(one(example, DEPLOYMENT))["args"]
    i = args.index("--lora-modules")
    assert args[i - 1] == "--enable-lora"
    assert args[i + 1:i + 3] == [f"qwen3-sql={SQL_PATH}", f"qwen3-chat={CHAT_PATH}"]
    assert args[i + 3:i + 5] == ["--max-loras=2", "--max-lora-rank=32"]
    assert RUNTIME_UPDATES_ENV not in env_of(container(one(example, DEPLOYMENT)))


def test_the_download_job_fetches_adapters_then_the_model(example: Render, prod: Render) -> None:
    job = one(example, JOB)
    c = container({"spec": job["spec"]})
    assert c["command"] == ["python3", "-c", EACH_REPO_SCRIPT, DOWNLOAD_SCRIPT]
    assert json.loads(env_of(c)["GS_REPOS"]) == [["acme/qwen3-8b-sql-lora", SQL], ["acme/qwen3-8b-chat-lora", CHAT],
                                                  ["Qwen/Qwen3-8B-AWQ", "4da05a8edb55c6046cce958586c33b61da07bb79"]]
    # Adding adapters is a new Job (Jobs are immutable); the model alone keeps its name and script.
    alone = one(prod, JOB)
    assert job["metadata"]["name"] != alone["metadata"]["name"]
    assert container({"spec": alone["spec"]})["command"] == ["python3", "-c", DOWNLOAD_SCRIPT]
    assert "GS_REPOS" not in env_of(container({"spec": alone["spec"]}))
    assert job["spec"]["activeDeadlineSeconds"] >= alone["spec"]["activeDeadlineSeconds"]


def test_the_smoke_test_asks_for_every_adapter_in_v1_models(example: Render, prod: Render) -> None:
    smoke = smoke_container(example)
    assert env_of(smoke)["ADAPTERS"] == "qwen3-sql qwen3-chat"
    listed = '{"data":[{"id":"qwen3"},{"id":"qwen3-sql"}]}'
    check = subprocess.run(["sh", "-c", smoke["command"][2].split("answer=$(curl")[0].split("models=$(curl")[1].split("\n", 1)[1]],
                           env={"models": listed, "MODEL": "qwen3", "ADAPTERS": "qwen3-sql qwen3-chat"},
                           capture_output=True, text=True)
    assert check.returncode == 1 and "does not list the adapter qwen3-chat" in check.stderr
    assert smoke_container(prod)["command"][2] == SMOKE_SCRIPT and "ADAPTERS" not in env_of(smoke_container(prod))


def test_runtime_updates_only_on_request_and_only_inside_the_cluster(render) -> None:  # type: ignore[no-untyped-def]
    model = prod_model(lora=lora(runtimeUpdates=True, maxLoras=4))
    del model["ingress"]
    result = render(models=[model])
    assert env_of(container(one(result, DEPLOYMENT)))[RUNTIME_UPDATES_ENV] == "True"
    assert "--max-loras=4" in container(one(result, DEPLOYMENT))["args"]


def test_the_example_is_valid_and_passes_the_pack(example: Render) -> None:
    assert assert_valid(example) >= 10
    entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in example.resources if r.custom]
    assert not [v for v in check_resources(entries) if v.level == "mandatory"]


# ---------------------------------------------------------------------------- against the stand-in hub


def test_the_paths_the_server_gets_are_what_the_download_job_writes(example: Render, tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub", reason="requirements-dev.txt pins the client the download Job runs")
    from testbed.standins.hub import Hub, Repo
    from tests.test_standins import FILES, HF_TOKEN, container_env

    adapter = {"adapter_config.json": b'{"r": 16, "peft_type": "LORA"}\n', "adapter_model.safetensors": b"\0" * 64}
    repos = [Repo("acme/qwen3-8b-sql-lora", adapter, SQL), Repo("acme/qwen3-8b-chat-lora", adapter, CHAT),
             Repo("Qwen/Qwen3-8B-AWQ", FILES, "4da05a8edb55c6046cce958586c33b61da07bb79", access="gated", token=HF_TOKEN)]
    job = one(example, JOB)
    c = container({"spec": job["spec"]})
    volume = tmp_path / "models"

    def run(hub: Hub, **env: str) -> subprocess.CompletedProcess[str]:
        run_env = {**container_env(c, volume, {"hf-token": HF_TOKEN}), "HF_ENDPOINT": hub.url, **env}
        return subprocess.run([sys.executable, *c["command"][1:]], env=run_env, capture_output=True, text=True, timeout=120)

    with Hub(repos) as hub:
        done = run(hub)
        assert done.returncode == 0, done.stderr
        asked = len(hub.requests)
        again = run(hub)
        assert again.returncode == 0 and again.stdout.count("nothing to do") == 3, again.stdout
        assert len(hub.requests) == asked
    for path in (SQL_PATH, CHAT_PATH):
        local = volume / Path(path).relative_to(MODEL_MOUNT)
        assert (local / "adapter_config.json").read_bytes() == adapter["adapter_config.json"]

    missing = json.dumps([["acme/no-such-lora", SQL], ["Qwen/Qwen3-8B-AWQ", "4da05a8edb55c6046cce958586c33b61da07bb79"]])
    with Hub(repos) as hub:
        failed = run(hub, GS_REPOS=missing)
    assert failed.returncode == EXIT_NOT_FOUND and "ERROR: acme/no-such-lora@" in failed.stderr
    assert "Qwen/Qwen3-8B-AWQ" not in failed.stdout, "the model was fetched after an adapter failed"
