"""Issue 15 item 7: compile caches survive restarts, and a non-root profile with a read-only root
filesystem whose writable paths are exactly the ones vLLM needs."""

from __future__ import annotations

import copy

import pytest

from components.serving.names import MODEL_MOUNT
from components.serving.profile import compile_cache_dir
from policy.rules import check_resources
from policy.rules.servers import writable_paths
from stacks.config import parse
from tests.test_serving import DEPLOYMENT, JOB, container, env_of, error_of, model_of, one, prod_model, with_models
from tools.render import Render


def test_compile_caches_live_on_the_model_volume_keyed_by_image_and_model(prod: Render) -> None:
    env = env_of(container(one(prod, DEPLOYMENT)))
    root = compile_cache_dir(prod.config.models[0])
    assert root.startswith(MODEL_MOUNT + "/")
    assert env["VLLM_CACHE_ROOT"] == f"{root}/vllm"
    assert env["TRITON_CACHE_DIR"] == f"{root}/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/inductor"
    assert env["XDG_CACHE_HOME"] == f"{root}/xdg"


def test_cache_key_follows_image_and_model_only() -> None:
    base = compile_cache_dir(model_of())
    assert compile_cache_dir(model_of()) == base
    assert compile_cache_dir(model_of(maxModelLen=4096)) == base  # vLLM keys its own config inside
    for change in ({"image": "vllm/vllm-openai:v0.32.0"}, {"revision": "0123abcd"}, {"huggingFaceId": "Qwen/Qwen3-4B"}):
        assert compile_cache_dir(model_of(**change)) != base, change


def test_root_profile_is_unchanged(prod: Render) -> None:
    pod = one(prod, DEPLOYMENT)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "readOnlyRootFilesystem" not in pod["containers"][0]["securityContext"]


@pytest.fixture(scope="module")
def non_root(request: pytest.FixtureRequest) -> Render:
    import json

    from tools.render import run_program

    model = prod_model(securityProfile="nonRoot")
    return run_program("prod", overrides={"gpu-serving:models": json.dumps([model])})


def test_non_root_profile(non_root: Render) -> None:
    pod = one(non_root, DEPLOYMENT)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
        "fsGroup": 65534, "fsGroupChangePolicy": "OnRootMismatch"}
    c = pod["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # Issue 24: a UID with a passwd entry in every image (nobody), and who it is without asking passwd.
    assert {k: env_of(c)[k] for k in ("HOME", "USER", "LOGNAME")} == {"HOME": "/home/vllm", "USER": "nobody", "LOGNAME": "nobody"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/home/vllm"]] and "emptyDir" in volumes[mounts["/tmp"]]
    # The download Job writes what the server locks and reads: the same user.
    job = one(non_root, JOB)["spec"]["template"]["spec"]
    assert job["securityContext"]["fsGroup"] == 65534 and job["containers"][0]["securityContext"]["runAsUser"] == 65534
    assert env_of(job["containers"][0])["HOME"] == "/tmp"  # its writable emptyDir


@pytest.mark.parametrize(("image", "refused"), [
    ("vllm/vllm-openai:v0.18.0", False),
    ("vllm/vllm-openai:v0.18.0@sha256:" + "0f" * 32, False),
    ("vllm/vllm-openai:v0.10.2", True),                     # older than the profile's gate
    ("vllm/vllm-openai@sha256:" + "0f" * 32, True),          # version unknown
])
def test_non_root_is_gated_on_the_image_version(image: str, refused: bool) -> None:
    stack = with_models(prod_model(securityProfile="nonRoot", image=image))
    if refused:
        assert error_of(stack).startswith("models[0].securityProfile: nonRoot needs a vLLM image of v0.11 or newer")
    else:
        parse(stack)


def test_every_path_vllm_writes_is_writable_and_nothing_else(non_root: Render) -> None:
    pod = one(non_root, DEPLOYMENT)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    needed = dict(writable_paths(c, pod))
    assert set(needed) == {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME",
                           "HF_HUB_CACHE", "TMPDIR", "HOME", "--download-dir"}
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    for what, path in needed.items():
        assert any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable), (what, path)
    # Each writable mount is needed by something: the model volume, /dev/shm (NCCL), HOME and /tmp.
    assert writable == {MODEL_MOUNT, "/dev/shm", "/home/vllm", "/tmp"}
    entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in non_root.resources if r.custom]
    assert not [v for v in check_resources(entries) if v.level == "mandatory"]


@pytest.mark.parametrize("dropped", ["/home/vllm", "/tmp"])
def test_the_pack_catches_a_missing_writable_mount(non_root: Render, dropped: str) -> None:
    (deployment,) = non_root.of_type(DEPLOYMENT)
    inputs = copy.deepcopy(deployment.inputs)
    c = inputs["spec"]["template"]["spec"]["containers"][0]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != dropped]
    found = [v.message for v in check_resources([{"type": DEPLOYMENT, "name": "d", "inputs": inputs}]) if v.policy == "vllm-writable-paths"]
    assert found and all(f"({dropped}" in m for m in found)


@pytest.mark.parametrize("name", ["VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "HOME"])
def test_cache_and_home_env_cannot_be_overridden(name: str) -> None:
    message = error_of(with_models(prod_model(env={name: "/x"})))
    assert message.startswith(f"models[0].env: {name} is set by the bundle from"), message


def test_unknown_profile_is_refused() -> None:
    message = error_of(with_models(prod_model(securityProfile="rootless")))
    assert message.startswith("models[0].securityProfile:"), message


