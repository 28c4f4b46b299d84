"""An operator's first mistakes (issue #16): each one is one line that names the key and the fix."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from stacks.config import ConfigError, StackConfig, parse
from stacks.config.load import FORMATS, check_namespaces
from tests.test_config import error_of, prod_raw, with_change

# --- one flag parser for every form vLLM accepts (item 3) ------------------------------------

BUNDLE_FLAG_FORMS = [
    (["--tensor-parallel-size 2"], 0, "--tensor-parallel-size is set by the bundle from gpusPerReplica"),
    (["--tensor-parallel-size=2"], 0, "--tensor-parallel-size is set by the bundle"),
    (["--enable-prefix-caching", "--tensor-parallel-size", "2"], 1, "--tensor-parallel-size is set by the bundle"),
    (["--tensor_parallel_size", "2"], 0, "--tensor-parallel-size is set by the bundle"),
    (["--tensor_parallel_size 2"], 0, "--tensor-parallel-size is set by the bundle"),
    (["-tp", "2"], 0, "-tp is set by the bundle from gpusPerReplica"),
    (["-tp=2"], 0, "-tp is set by the bundle"),
    (["-tp2"], 0, "-tp is set by the bundle"),
    (["-tp 2"], 0, "-tp is set by the bundle"),
    (["--max-num-seqs=8", "--download_dir /tmp"], 1, "--download-dir is set by the bundle"),
    (["--max-num-seqs 64"], 0, "a flag and its value in one element reach vLLM as one argument; write --max-num-seqs=64"),
    (["--enable-prefix-caching --tensor-parallel-size=2"], 0, "--tensor-parallel-size is set by the bundle"),
    (["--enable-prefix-caching --max-num-seqs=8"], 0, "in one element reach vLLM as one argument; give each flag and each value"),
]


@pytest.mark.parametrize(("args", "index", "words"), BUNDLE_FLAG_FORMS, ids=[" ".join(a) for a, _, _ in BUNDLE_FLAG_FORMS])
def test_extra_args_are_refused_at_load_in_every_form(args: list[str], index: int, words: str) -> None:
    message = error_of(with_change("models.0.extraArgs", args))
    assert message.startswith(f"models[0].extraArgs[{index}]: {args[index]!r}: "), message
    assert words in message, message
    assert "\n" not in message


def test_values_and_other_flags_pass() -> None:
    args = ["--max-num-seqs=64", "--chat-template", "{{ messages }}", "--override-generation-config={\"a\": \"b c\"}",
            "--seed", "-1", "--enable-prefix-caching"]
    assert parse(with_change("models.0.extraArgs", args)).models[0].extra_args == args


def test_a_refused_flag_never_reaches_the_manifests(render) -> None:  # type: ignore[no-untyped-def]
    from tools.render import RenderError

    raw = prod_raw()
    raw["models"][0]["extraArgs"] = ["--tensor-parallel-size 2"]
    with pytest.raises(RenderError, match=r"^config error: models\[0\]\.extraArgs\[0\]: "):
        render(models=raw["models"])


# --- the expected form, with an example (item 4) -----------------------------------------------

FORMAT_ERRORS = [
    ("models.0.image", "vllm/vllm-openai", "models[0].image", "pinned tag or digest, e.g. vllm/vllm-openai:v0.11.0"),
    ("models.0.memory", "16GB", "models[0].memory", "e.g. 16Gi (got '16GB'; Kubernetes writes GiB as Gi, e.g. 16Gi)"),
    ("models.0.ingress.host", "https://ai.primer.rs/", "models[0].ingress.host", "without scheme, port or path, e.g. ai.example.com"),
    ("models.0.ingress.host", "https://ai.primer.rs/", "models[0].ingress.host", "give the host alone, e.g. ai.primer.rs"),
    ("models.0.huggingFaceId", "Qwen3-8B", "models[0].huggingFaceId", "owner/name, e.g. Qwen/Qwen3-8B-AWQ"),
    ("cluster.kubeconfig.path", "~/.kube/config", "cluster.kubeconfig.path", "a path without `~`"),
    ("nodes.0.storage.mountpoint", "~/models", "nodes[0].storage.mountpoint", "`~` is not expanded"),
    ("models.0.cpu", "4 cores", "models[0].cpu", "e.g. 4, 0.5 or 500m"),
]


@pytest.mark.parametrize(("path", "value", "key_path", "words"), FORMAT_ERRORS, ids=[f"{p}={v}" for p, v, _, _ in FORMAT_ERRORS])
def test_format_errors_say_the_form_with_an_example(path: str, value: Any, key_path: str, words: str) -> None:
    message = error_of(with_change(path, value))
    assert message.startswith(f"{key_path}: must be "), message
    assert words in message, message
    assert "documented format" not in message


def _patterns(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Every regex a config model (and the models inside it) checks a string against."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    found: set[str] = set()

    def walk(value: Any) -> None:
        pattern = getattr(value, "pattern", None)
        if isinstance(pattern, str):
            found.add(pattern)
        if isinstance(value, type) and issubclass(value, BaseModel):
            found.update(_patterns(value, seen))
        for inner in getattr(value, "__args__", ()) or ():
            walk(inner)
        for meta in getattr(value, "__metadata__", ()) or ():
            walk(meta)

    for info in model.model_fields.values():
        walk(info.annotation)
        for meta in info.metadata:
            walk(meta)
    return found


def test_every_pattern_has_a_form_with_an_example() -> None:
    patterns = _patterns(StackConfig)
    assert len(patterns) >= 15, patterns  # the walk is real: it finds the nested models' patterns
    missing = sorted(p for p in patterns if p not in FORMATS)
    assert missing == [], "add these to stacks/config/load.py FORMATS"
    assert [p for p in patterns if "e.g. " not in FORMATS[p]] == []


MISSPELT = [
    ("cluster", "ingressClas", "cluster.ingressClas: unknown key; did you mean ingressClass?"),
    ("models.0", "hugginFaceId", "models[0].hugginFaceId: unknown key; did you mean huggingFaceId?"),
    ("models.0", "extraargs", "models[0].extraargs: unknown key; did you mean extraArgs?"),
    ("nodes.0.storage", "sizeGB", "nodes[0].storage.sizeGB: unknown key; did you mean sizeGb?"),
    ("modelStorage", "nodes", "modelStorage.nodes: unknown key; did you mean node?"),
    ("models.0.replicas", "maximum", "models[0].replicas.maximum: unknown key; did you mean max?"),
]


@pytest.mark.parametrize(("parent", "key", "expected"), MISSPELT, ids=[k for _, k, _ in MISSPELT])
def test_a_misspelt_key_suggests_the_closest_one(parent: str, key: str, expected: str) -> None:
    raw = prod_raw()
    target: Any = raw
    for part in parent.split("."):
        target = target[int(part)] if part.isdigit() else target[part]
    target[key] = 1
    assert error_of(raw) == expected


def test_a_key_like_nothing_lists_the_keys_there() -> None:
    raw = prod_raw()
    raw["models"][0]["replicas"]["zzz"] = 1
    assert error_of(raw) == (
        "models[0].replicas.zzz: unknown key (check the spelling; keys are camelCase); keys here: min, max, targetRequestsWaiting, "
        "coldStartTimeoutSeconds, idleAfter"
    )


def test_a_misspelt_top_level_key_suggests_the_closest_one() -> None:
    raw = prod_raw()
    raw["modelStorge"] = raw.pop("modelStorage")
    # The missing key is reported first; once it is back, the typo is named with its fix.
    raw["modelStorage"] = prod_raw()["modelStorage"]
    assert error_of(raw).startswith("modelStorge: unknown config key; did you mean modelStorage?")


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("modelStorage", {"type": "hostpath", "node": "k8s-worker-02", "path": "/x" * 100},
         "modelStorage.type: must be one of 'local', 'nfs', 'storageClass', 'nodeCache' (got 'hostpath')"),
        ("models.0.replicas", [1, 2] * 50, "models[0].replicas: must be a mapping of keys to values (got a list)"),
        ("models", {"name": "qwen3", "huggingFaceId": "Qwen/Qwen3-8B-AWQ" * 10}, "models: must be a list (got a mapping)"),
        ("cluster", "ai", "cluster: must be a mapping of keys to values (got 'ai')"),
    ],
)
def test_long_messages_are_cut_to_the_key_and_the_reason(path: str, value: Any, expected: str) -> None:
    assert error_of(with_change(path, value)) == expected


def test_no_error_line_is_longer_than_the_limit() -> None:
    raw = prod_raw()
    raw["models"][0]["zzz" * 200] = 1
    message = error_of(raw)
    assert len(message) <= 300 and "\n" not in message


def test_a_long_refusal_is_whole_with_its_fix() -> None:
    """Issue 39: a refusal was cut mid-sentence at 300 characters, losing its last clause, which is the fix. What a line
    echoes is bounded where it is echoed; the refusal itself is kept whole."""
    from tests.test_sharing import SHARED_B, SLICED, example_raw

    raw = example_raw()
    raw["nodes"][SLICED]["gpu"]["count"] = 2
    raw["models"][SHARED_B]["replicas"] = {"min": 2, "max": 2}
    raw["nodes"][SLICED]["gpu"]["sharing"]["timeSlicing"]["replicas"] = 3
    message = error_of(raw)
    assert len(message) > 300 and "\n" not in message and "…" not in message, message
    assert message.endswith("lower gpuMemoryUtilization until any 3 of them add up to 1.0 or less, or lower timeSlicing.replicas")

    from tests.test_placement import shared_stack

    with pytest.raises(ConfigError) as error:
        parse(shared_stack([(1, 2), (2, 1)], nodes=2))
    assert str(error.value).endswith("give the models on these nodes the same gpusPerReplica, lower replicas.max, or add a node")


def test_a_line_past_any_refusal_is_cut_at_a_clause_not_a_word() -> None:
    from stacks.config.load import MAX_REFUSAL, _cut

    line = "models[0].x: " + "; ".join(f"clause number {i} says something" for i in range(100))
    cut = _cut(line)
    assert len(cut) <= MAX_REFUSAL + 2 and cut.startswith("models[0].x: clause number 0 says something; "), cut
    assert cut.endswith(" says something …"), cut[-60:]


# --- unknown project namespaces (item 2) -------------------------------------------------------


@pytest.mark.parametrize("name", ["gpu-servng:models", "gpu_serving:models", "GPU-serving:cluster", "serving:models", "gpuserving:foo"])
def test_a_mistyped_project_namespace_is_an_error(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_namespaces(["gpu-serving:cluster", name])
    key = name.split(":", 1)[1]
    assert str(caught.value).startswith(f"{name}: unknown config namespace "), caught.value
    assert f"did you mean gpu-serving:{key}?" in str(caught.value)


def test_other_namespaces_are_returned_for_a_warning() -> None:
    names = ["gpu-serving:models", "pulumi:tags", "kubernetes:context", "aws:region", "other-app:setting"]
    assert check_namespaces(names) == ["aws:region", "other-app:setting"]


def test_a_mistyped_namespace_fails_the_program_instead_of_rendering_no_models() -> None:
    from tools.render import RenderError, run_program

    with pytest.raises(RenderError) as caught:
        run_program("prod", overrides={"gpu-servng:models": json.dumps(prod_raw()["models"])})
    assert str(caught.value).startswith("config error: gpu-servng:models: unknown config namespace 'gpu-servng'"), caught.value


def test_a_foreign_namespace_is_a_warning_that_names_the_keys() -> None:
    from tools.render import run_program

    result = run_program("prod", overrides={"aws:region": "eu-west-1"})
    assert "config keys this program does not read (another program's or provider's?): aws:region" in result.warnings
    assert result.of_type("kubernetes:apps/v1:Deployment")


# --- disks that nothing uses (item 6) ------------------------------------------------------------

NFS = {"type": "nfs", "server": "nas.lan", "path": "/export/models", "sizeGi": 500}


def test_shared_storage_warns_about_node_disks_nothing_uses(render) -> None:  # type: ignore[no-untyped-def]
    result = render(modelStorage=NFS)
    assert (
        "nodes[0].storage.disks: k8s-worker-02 partitions, mirrors and mounts "
        "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4 and /dev/disk/by-id/wwn-0x5000c500a1b2c3d5 at /mnt/ollama-models "
        "but nothing uses that array (modelStorage.type is nfs); set `storage.disks: []` to skip its disk steps"
    ) in result.warnings
    # Warned, not skipped: the steps still run as the config says.
    assert any(r.name == "k8s-worker-02:20-partition" for r in result.of_type("command:remote:Command"))


def test_disks_off_means_no_warning_and_no_disk_steps(render) -> None:  # type: ignore[no-untyped-def]
    nodes = prod_raw()["nodes"]
    nodes[0]["storage"]["disks"] = []
    result = render(modelStorage=NFS, nodes=nodes)
    assert not [w for w in result.warnings if "storage.disks" in w]
    assert not [r for r in result.of_type("command:remote:Command") if "partition" in r.name]


def test_local_storage_warns_only_for_the_other_nodes() -> None:
    raw = prod_raw()
    assert parse(raw).warnings() == []
    other = {"name": "k8s-worker-03", "ssh": {"host": "10.0.0.3"}, "gpu": {"product": "nvidia-a100", "count": 2},
             "storage": {"disks": ["/dev/disk/by-id/wwn-0x5000c500a1b2c3e1", "/dev/disk/by-id/wwn-0x5000c500a1b2c3e2"]}}
    raw["nodes"].append(other)
    [warning] = parse(raw).warnings()  # by-id names: kernel names would add their own warning
    assert warning.startswith("nodes[1].storage.disks: k8s-worker-03 partitions")
    assert "(the model volume lives on k8s-worker-02)" in warning


# --- the documentation quotes the real lines -------------------------------------------------------


def test_failure_modes_quotes_the_real_messages() -> None:
    from tools.render import ROOT

    doc = (ROOT / "docs" / "failure-modes.md").read_text()
    lines = [
        error_of(with_change("models.0.memory", "16GB")),
        error_of(with_change("models.0.ingress.host", "https://ai.primer.rs")),
        error_of(with_change("cluster.ingressClas", "nginx")),
        error_of(with_change("models.0.extraArgs", ["--tensor-parallel-size 2"])),
        error_of(with_change("models.0.extraArgs", ["--max-num-seqs 64"])),
        error_of(with_change("models.0.replicas", [1])),
        error_of(with_change("nodes.0.storage.disks", ["/dev/sda", "/dev/sd b"])),
        parse(with_change("modelStorage", NFS)).warnings()[0],
        error_of(with_change("models.0.replicas", {"min": 0, "max": 2})),
    ]
    with pytest.raises(ConfigError) as caught:
        check_namespaces(["gpu-servng:models"])
    lines.append(str(caught.value))
    for line in lines:
        assert line in doc, line


@pytest.mark.parametrize("key", ["-" * 300, "a: b" * 100, "z" * 61])
def test_a_long_key_is_shortened_and_the_reason_kept(key: str) -> None:
    raw = prod_raw()
    raw["cluster"][key] = None
    message = error_of(raw)
    assert len(message) <= 300 and "\n" not in message, message
    assert message.startswith('cluster."' + key[:20]), message
    assert '…": unknown key (check the spelling; keys are camelCase)' in message, message
    assert message.endswith("docs/configuration.md lists the keys") or message.endswith("runtimeClassName, prometheusUrl")


@pytest.mark.parametrize("key", ["\x85", "a\u2028b", "\xa0x", "tab\tkey", "\u200b"])
def test_a_key_of_invisible_or_spacing_characters_is_named_escaped(key: str) -> None:
    # The one-line message folds whitespace; such a key would be shown as a space, or as nothing.
    raw = prod_raw()
    raw[key] = None
    message = error_of(raw)
    named = json.JSONDecoder().raw_decode(message)[0]
    assert named == key and message[len(json.dumps(named)):].startswith(": unknown config key"), message
    raw = prod_raw()
    raw["cluster"][key] = None
    assert json.JSONDecoder().raw_decode(error_of(raw), len("cluster."))[0] == key


# --- a value YAML read as a number -------------------------------------------------------------

@pytest.mark.parametrize(("key", "value"), [("models.0.revision", 8), ("models.0.revision", 1e40), ("nodes.0.name", 7)])
def test_an_unquoted_number_where_text_belongs_says_to_quote_it(key: str, value: float) -> None:
    # An all-digit commit such as 0000…08 is an int to YAML 1.2 (Pulumi's reader): its leading zeros
    # are gone before the program sees it, so the message cannot repeat the value, only say to quote it.
    field = key.rsplit(".", 1)[-1]
    message = error_of(with_change(key, value))
    assert message.startswith(f"{key.replace('.0.', '[0].')}: must be text, but YAML read a number"), message
    assert f'quote the value in the stack file, e.g. {field}: "' in message, message


def test_a_boolean_is_not_taken_for_a_number() -> None:
    assert "YAML read a number" not in error_of(with_change("models.0.revision", True))
