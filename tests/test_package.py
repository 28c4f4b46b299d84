"""The component package (package/, issue 42): its argument types are the stack config's models, it validates a
document as a stack file is validated, and its `GpuServing` declares what the program declares for the same config.

Here under Pulumi's mock engine (tools/render); the e2e previews the package from a YAML program on the real engine.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from stacks.config import StackConfig
from tools import package_args
from tools.render import ROOT, run_program

PROJECT = "gpu-serving"


def document(stack: str) -> dict[str, Any]:
    """A stack file's config as the package takes it: its keys without the project's prefix."""
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    return {key.removeprefix(f"{PROJECT}:"): value for key, value in config.items() if key.startswith(f"{PROJECT}:")}


def secret_values(stack: str) -> dict[str, str]:
    from stacks.config import parse

    return {key: f"gs-package-test-{key}" for key in parse(document(stack)).secret_keys()}


def test_the_args_file_is_what_the_models_make() -> None:
    assert package_args.OUT.read_text() == package_args.source(), "package/args.py is stale: run `make package-args`"


def _fields(model: type[BaseModel]) -> dict[str, bool]:
    return {field.alias or name: field.is_required() for name, field in model.model_fields.items()}


def test_each_model_s_keys_and_required_keys_are_its_typed_dict_s() -> None:
    from package import args

    for model, typed in ((StackConfig, args.StackConfigArgs), (StackConfig.model_fields["nodes"].annotation.__args__[0],
                                                                 args.NodeArgs)):
        fields = _fields(model)
        assert set(typing.get_type_hints(typed)) == set(fields), model
        assert typed.__required_keys__ == {key for key, required in fields.items() if required}, model


def test_the_storage_kinds_are_one_type_whose_type_key_names_them_all() -> None:
    from package import args

    hints = typing.get_type_hints(args.ModelStorageArgs)
    assert {"type", "node", "server", "path", "sizeGi", "storageClass", "nodes", "name"} == set(hints)
    assert args.ModelStorageArgs.__required_keys__ == {"type"}
    assert "`local`, `nfs`, `storageClass`, `nodeCache`" in package_args.source()


def test_pulumi_infers_a_schema_whose_inputs_are_the_stack_file_s_keys() -> None:
    from pulumi.provider.experimental.analyzer import Analyzer

    from package.serving import GpuServing
    from stacks.config.load import TOP_LEVEL_KEYS

    component = Analyzer(PROJECT).analyze_component(GpuServing)
    assert set(component.inputs) == {*TOP_LEVEL_KEYS, "secrets"}
    assert {name for name, prop in component.inputs.items() if not prop.optional} == {"cluster", "nodes", "modelStorage"}
    assert set(component.outputs) == {"namespace", "nodes", "modelStorage", "models"}


def _without_package(resources: list[Any]) -> list[tuple[Any, ...]]:
    """Each resource as (type, name, URN, inputs, options), its URN without the parents' types (the package's
    component is one more parent)."""
    outer = "gpu-serving:index:GpuServing"

    def plain(text: Any) -> Any:
        if isinstance(text, str) and text.startswith("urn:pulumi:"):
            *head, qualified, name = text.split("::")
            return "::".join([*head, qualified.rsplit("$", 1)[-1], name])
        if isinstance(text, list):
            return [plain(t) for t in text]
        if isinstance(text, dict):
            return {k: plain(v) for k, v in text.items()}
        return text

    return sorted((r.type, r.name, plain(r.urn), repr(plain(r.inputs)), repr(plain(r.options)))
                  for r in resources if r.type != outer)


@pytest.mark.parametrize("stack", ["prod", "lab"])
def test_gpu_serving_declares_what_the_program_declares(stack: str) -> None:
    from package.serving import GpuServing

    values = secret_values(stack)
    program = run_program(stack, secret_values=values)
    hosted = run_program(stack, secret_values=values,
                         program=lambda: GpuServing(stack, {**document(stack), "secrets": values}))
    assert _without_package(hosted.resources) == _without_package(program.resources)
    assert len(hosted.resources) == len(program.resources) + 1


def test_a_wrong_arg_is_refused_in_one_line_naming_it() -> None:
    from package.serving import ArgumentError, GpuServing

    wrong = document("prod")
    wrong["nodes"][0]["gpu"]["count"] = "two"
    with pytest.raises(ArgumentError, match=r"^config error: nodes\[0\]\.gpu\.count: ") as refused:
        run_program("prod", program=lambda: GpuServing("prod", {**wrong, "secrets": secret_values("prod")}))
    assert "\n" not in str(refused.value)


def test_a_secret_the_document_names_and_the_program_does_not_give_is_refused_naming_it() -> None:
    from package.serving import ArgumentError, GpuServing

    values = secret_values("prod")
    values.pop("sshPrivateKey")
    with pytest.raises(ArgumentError, match=r"^secrets\.sshPrivateKey: not given"):
        run_program("prod", program=lambda: GpuServing("prod", {**document("prod"), "secrets": values}))


def test_the_provider_reports_a_refused_arg_as_pulumi_reports_a_bad_input_not_with_a_traceback() -> None:
    """What the engine prints is the error's message alone; any other exception in a component's __init__ reaches it
    with the provider's traceback appended."""
    import importlib

    from pulumi import InputPropertiesError

    from package.serving import VERSION, GpuServing

    entry = importlib.import_module("package.__main__")
    provider = entry.Provider([GpuServing], "gpu-serving", None, VERSION)
    wrong = document("lab")
    wrong["models"][0]["gpusPerReplica"] = 3
    with pytest.raises(InputPropertiesError) as refused:
        run_program("lab", program=lambda: provider.construct("lab", "gpu-serving:index:GpuServing",
                                                              {**wrong, "secrets": secret_values("lab")}))
    assert refused.value.message.startswith("config error: models[0].gpusPerReplica: ")
    assert "\n" not in refused.value.message and refused.value.errors == []


def test_the_yaml_example_declares_the_lab_stack_s_document_and_every_secret_it_names() -> None:
    program = yaml.safe_load((ROOT / "examples" / "yaml" / "Pulumi.yaml").read_text())
    properties = program["resources"]["lab"]["properties"]
    assert {key: value for key, value in properties.items() if key != "secrets"} == document("lab")
    assert set(properties["secrets"]) == set(secret_values("lab"))
    assert all(f"${{{key}}}" == value and program["config"][key]["secret"] for key, value in properties["secrets"].items())


def test_the_e2e_compares_previews_by_type_and_name_leaving_out_the_package_s_own_and_archive_paths() -> None:
    """The helpers of the e2e's `package-preview` (testbed/e2e/package_checks.py), on previews made by hand."""
    from testbed.e2e.package_checks import declared, differences

    def preview(project: str, parents: str, path: str, digest: str = "h", *extra: str) -> dict[str, Any]:
        urns = [f"urn:pulumi:s::{project}::{parents}command:remote:CopyToRemote::n:steps", *extra]
        source = {"hash": digest, "path": path}
        return {"steps": [{"urn": urn, "newState": {"inputs": {"source": source} if "CopyToRemote" in urn else {}}}
                          for urn in urns]}

    program = declared(preview("gpu-serving", "gpu-serving:node:GpuNode$", "components/node/linked", "h",
                               "urn:pulumi:s::gpu-serving::pulumi:pulumi:Stack::gpu-serving-s"))
    package = preview("ex", "gpu-serving:index:GpuServing$gpu-serving:node:GpuNode$", "/clone/components/node/linked", "h",
                      "urn:pulumi:s::ex::pulumi:providers:gpu-serving::default", "urn:pulumi:s::ex::gpu-serving:index:GpuServing::lab")
    assert list(program) == ["command:remote:CopyToRemote::n:steps"]
    assert differences(program, declared(package)) == []
    changed = preview("ex", "", "/clone/components/node/linked", "other")
    assert differences(program, declared(changed)) == ["command:remote:CopyToRemote::n:steps: source"]
    extra = preview("ex", "", "/clone/x", "h", "urn:pulumi:s::ex::kubernetes:core/v1:Namespace::ns")
    assert differences(program, declared(extra)) == ["extra kubernetes:core/v1:Namespace::ns"]
    assert differences(declared(extra), program) == ["missing kubernetes:core/v1:Namespace::ns"]
