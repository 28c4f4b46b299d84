"""GPU sharing per node (issue #26 item 1): time-slicing and MIG are configured per node, refused at load
when they cannot work, counted by the capacity checks per resource, and rendered as the device plugin's and
the MIG manager's configs plus the node labels that select them."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from components.cluster import device_plugin
from components.sharing import device_plugin_configs, mig_parted_config, sharing_labels
from stacks.config import ConfigError, parse
from stacks.config.sharing import MIG_CARDS, REPLICAS, Mig
from testbed.cluster.nodes import node_args
from tests.test_render import KUBERNETES_VERSION, NO_SCHEMA
from tools.render import ROOT, run_program

EXAMPLE = ROOT / "docs" / "examples" / "Pulumi.sharing.yaml"
SLICED, MIG_NODE = 0, 1  # the example's nodes
SHARED_A, SHARED_B, ON_MIG, SMALL_MIG = 0, 1, 2, 3  # the example's models


def example_raw() -> dict[str, Any]:
    document = yaml.safe_load(EXAMPLE.read_text())["config"]
    return {key.split(":", 1)[1]: copy.deepcopy(value) for key, value in document.items()}


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def example():  # type: ignore[no-untyped-def]
    return run_program("sharing", stack_file=EXAMPLE)


def objects(render: Any, kind: str) -> list[dict[str, Any]]:
    return [o for o in render.kubernetes_objects() if o.get("kind") == kind]


def named(render: Any, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects(render, kind) if o["metadata"]["name"] == name)


# ---------------------------------------------------------------------------- what a node advertises


def test_the_example_loads_and_counts_what_each_node_advertises() -> None:
    stack = parse(example_raw())
    assert stack.nodes[SLICED].gpu.count == 1  # physical cards, also when shared
    assert stack.nodes[SLICED].gpu.advertised == {"gpu.shared": 2}
    assert stack.nodes[MIG_NODE].gpu.advertised == {"mig-3g.40gb": 2, "mig-2g.20gb": 2, "mig-1g.10gb": 4}
    assert [m.gpu_resource for m in stack.models] == ["gpu.shared", "gpu.shared", "mig-3g.40gb", "mig-2g.20gb"]


def test_every_cards_largest_profiles_fill_it_exactly() -> None:
    """The table's slices reproduce NVIDIA's per-card maxima: 7 × 1g, 3 × 2g, 2 × 3g, 1 × 7g (A30: 4 × 1g, 2 × 2g)."""
    for name, card in MIG_CARDS.items():
        for profile, (compute, memory) in card.profiles.items():
            most = min(card.compute_slices // compute, card.memory_slices // memory)
            Mig(card=name, profiles={profile: most})
            with pytest.raises(ValueError, match="compute and" if most < 7 else "less than or equal to 7"):
                Mig(card=name, profiles={profile: most + 1})


def test_one_mig_layout_has_one_name_whatever_the_order() -> None:
    a = Mig(card="A100-80GB", profiles={"1g.10gb": 2, "3g.40gb": 1, "2g.20gb": 1})
    b = Mig(card="A100-80GB", profiles={"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})
    assert a.config_name == b.config_name == "gpu-serving-1x3g.40gb-1x2g.20gb-2x1g.10gb"
    longest = Mig(card="B200-180GB", profiles={"3g.90gb": 1, "2g.45gb": 1, "1g.23gb": 2})
    assert len(longest.config_name) <= 63  # a label value


# ---------------------------------------------------------------------------- refused at load, one per reason


def test_time_slicing_needs_two_replicas() -> None:
    raw = example_raw()
    raw["nodes"][SLICED]["gpu"]["sharing"]["timeSlicing"]["replicas"] = 1
    assert error_of(raw).startswith("nodes[0].gpu.sharing.timeSlicing.replicas: Input should be greater than or equal to 2")


@pytest.mark.parametrize("sharing", [{}, {"timeSlicing": {"replicas": 2}, "mig": {"card": "A100-80GB", "profiles": {"7g.80gb": 1}}}])
def test_sharing_is_exactly_one_kind(sharing: dict[str, Any]) -> None:
    raw = example_raw()
    raw["nodes"][SLICED]["gpu"]["sharing"] = sharing
    assert error_of(raw).startswith("nodes[0].gpu.sharing: set exactly one of `timeSlicing` or `mig`")


def test_a_mig_profile_of_another_card_is_refused() -> None:
    raw = example_raw()
    raw["nodes"][MIG_NODE]["gpu"]["sharing"]["mig"]["profiles"] = {"3g.20gb": 2}  # an A100-40GB profile
    message = error_of(raw)
    assert message.startswith("nodes[1].gpu.sharing.mig.profiles: 3g.20gb is not a MIG profile of A100-80GB"), message
    assert "3g.40gb" in message


def test_a_mig_layout_larger_than_the_card_is_refused() -> None:
    raw = example_raw()
    raw["nodes"][MIG_NODE]["gpu"]["sharing"]["mig"]["profiles"] = {"3g.40gb": 2, "1g.10gb": 1}
    assert error_of(raw).startswith("nodes[1].gpu.sharing.mig.profiles: 2 × 3g.40gb + 1 × 1g.10gb takes 7 compute and 9 "
                                    "memory slices, but one A100-80GB has 7 and 8")


def test_a_mig_profile_in_the_wrong_form_is_refused() -> None:
    raw = example_raw()
    raw["nodes"][MIG_NODE]["gpu"]["sharing"]["mig"]["profiles"] = {"3g-40gb": 1}
    message = error_of(raw)
    assert message.startswith("nodes[1].gpu.sharing.mig.profiles.3g-40gb: must be a MIG profile"), message
    assert "e.g. 3g.40gb" in message


def test_an_unknown_mig_card_is_refused() -> None:
    raw = example_raw()
    raw["nodes"][MIG_NODE]["gpu"]["sharing"]["mig"]["card"] = "A100"
    message = error_of(raw)
    assert message.startswith("nodes[1].gpu.sharing.mig.card: "), message
    assert "'A100-80GB'" in message


def test_a_gpu_resource_in_the_wrong_form_is_refused() -> None:
    raw = example_raw()
    raw["models"][SHARED_A]["gpuResource"] = "nvidia.com/gpu.shared"
    assert error_of(raw).startswith("models[0].gpuResource: must be a GPU resource after nvidia.com/")


@pytest.mark.parametrize(("model", "why"), [(SHARED_A, "time-slices, not cards"), (ON_MIG, "one MIG instance")])
def test_tensor_parallelism_on_a_shared_card_is_refused(model: int, why: str) -> None:
    raw = example_raw()
    raw["models"][model]["gpusPerReplica"] = 2
    message = error_of(raw)
    assert message.startswith(f"models[{model}].gpusPerReplica: 2 with gpuResource "), message
    assert why in message


def test_a_model_on_shared_cards_must_ask_for_a_share() -> None:
    raw = example_raw()
    del raw["models"][SHARED_A]["gpuResource"]  # the default: whole cards
    message = error_of(raw)
    assert message.startswith("models[0].gpuResource: gpu, but no nvidia-l40s node advertises nvidia.com/gpu "
                              "(they advertise nvidia.com/gpu.shared)"), message
    assert "never given to a model that did not ask" in message


@pytest.mark.parametrize(("resource", "fix"), [("gpu.shared", "gpu.sharing.timeSlicing"), ("mig-4g.40gb", "add 4g.40gb to")])
def test_a_share_no_node_of_the_product_offers_is_refused(resource: str, fix: str) -> None:
    raw = example_raw()
    raw["models"][ON_MIG]["gpuResource"] = resource
    message = error_of(raw)
    assert message.startswith(f"models[2].gpuResource: {resource}, but no nvidia-a100-80gb node advertises nvidia.com/{resource}"), message
    assert fix in message


def test_time_slices_are_counted_against_cards_times_replicas() -> None:
    raw = example_raw()
    raw["models"][SHARED_B]["replicas"] = {"min": 2, "max": 2}  # 3 slices wanted, 1 card × 2 replicas
    raw["models"][SHARED_B]["gpuMemoryUtilization"] = raw["models"][SHARED_A]["gpuMemoryUtilization"] = 0.3
    assert error_of(raw) == ("models: at max replicas the models need 3 nvidia.com/gpu.shared on nvidia-l40s nodes but the "
                             "nodes declare 2; the extra pods would stay Pending with 'Insufficient nvidia.com/gpu.shared' — "
                             "lower replicas.max or add nodes")
    raw["nodes"][SLICED]["gpu"]["sharing"]["timeSlicing"]["replicas"] = 3
    assert parse(raw).nodes[SLICED].gpu.advertised == {"gpu.shared": 3}


def test_each_mig_profile_is_counted_on_its_own() -> None:
    raw = example_raw()
    raw["models"][ON_MIG]["replicas"] = {"min": 3, "max": 3}  # 2 cards × 1 × 3g.40gb
    assert "need 3 nvidia.com/mig-3g.40gb on nvidia-a100-80gb nodes but the nodes declare 2" in error_of(raw)
    raw["models"][ON_MIG]["replicas"] = {"min": 2, "max": 2}
    raw["models"][SMALL_MIG]["gpuResource"] = "mig-1g.10gb"  # 4 of those: the 3g.40gb pods do not use them
    raw["models"][SMALL_MIG]["replicas"] = {"min": 4, "max": 4}
    assert parse(raw).models[SMALL_MIG].replicas.max == 4


def test_pods_that_may_meet_on_one_card_must_fit_its_memory() -> None:
    raw = example_raw()
    raw["models"][SHARED_B]["gpuMemoryUtilization"] = 0.6
    message = error_of(raw)
    assert message.startswith("models[1].gpuMemoryUtilization: 0.6, but on gpu-l40s-1 up to 2 of the shared pods can run on "
                              "one card"), message
    assert "0.6 (models[1]) + 0.45 (models[0]) = 1.05" in message


def test_the_worst_card_is_counted_not_the_average() -> None:
    """Three pods at 0.45 on two cards of 2 slices: spread they fit, but any 2 may meet on one card (0.9, fine);
    with 3 slices per card all three may meet (1.35): refused, although the node has room to spread them."""
    raw = example_raw()
    raw["nodes"][SLICED]["gpu"]["count"] = 2
    raw["models"][SHARED_B]["replicas"] = {"min": 2, "max": 2}
    assert parse(raw).nodes[SLICED].gpu.advertised == {"gpu.shared": 4}
    raw["nodes"][SLICED]["gpu"]["sharing"]["timeSlicing"]["replicas"] = 3
    assert "= 1.35 of its memory" in error_of(raw)


def test_the_stacks_own_device_plugin_runs_no_mig() -> None:
    raw = example_raw()
    raw["cluster"]["devicePlugin"]["enabled"] = True
    assert error_of(raw).startswith("nodes[1].gpu.sharing.mig: not with cluster.devicePlugin.enabled")


def test_node_local_storage_counts_the_home_nodes_shares() -> None:
    raw = example_raw()
    raw["nodes"][SLICED]["storage"] = {"disks": ["/dev/sda", "/dev/sdb"]}
    raw["modelStorage"] = {"type": "local", "node": "gpu-l40s-1"}
    raw["models"] = raw["models"][:2]
    assert parse(raw).capacity_gib > 0  # two slices on the home node: both pods fit there
    raw["nodes"].append({**copy.deepcopy(raw["nodes"][SLICED]), "name": "gpu-l40s-2", "ssh": {"host": "10.0.0.13"}})
    del raw["nodes"][2]["storage"]
    raw["models"][SHARED_A]["replicas"] = {"min": 2, "max": 2}
    raw["models"][SHARED_A]["gpuMemoryUtilization"] = raw["models"][SHARED_B]["gpuMemoryUtilization"] = 0.3
    assert error_of(raw).startswith("models: at max replicas the models need 3 nvidia.com/gpu.shared, but node-local storage "
                                    "keeps every pod on gpu-l40s-1 (2 nvidia.com/gpu.shared)")


# ---------------------------------------------------------------------------- rendered


def test_the_device_plugin_gets_every_config_a_node_can_name(example) -> None:  # type: ignore[no-untyped-def]
    config_map = named(example, "ConfigMap", "gpu-serving-device-plugin-config")
    assert config_map["metadata"]["namespace"] == "gpu-operator"
    configs = {key: yaml.safe_load(text) for key, text in config_map["data"].items()}
    assert set(configs) == {"default", "gpu-serving-mig-mixed"} | {f"gpu-serving-time-slicing-{r}" for r in REPLICAS}
    assert configs["default"] == {"version": "v1", "flags": {"migStrategy": "none"}}
    assert configs["gpu-serving-mig-mixed"] == {"version": "v1", "flags": {"migStrategy": "mixed"}}
    for replicas in REPLICAS:
        assert configs[f"gpu-serving-time-slicing-{replicas}"] == {
            "version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
                "renameByDefault": True, "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}


def test_the_mig_manager_gets_every_layout_and_all_disabled(example) -> None:  # type: ignore[no-untyped-def]
    config_map = named(example, "ConfigMap", "gpu-serving-mig-parted-config")
    assert config_map["metadata"]["namespace"] == "gpu-operator"
    layouts = yaml.safe_load(config_map["data"]["config.yaml"])
    assert layouts["version"] == "v1"
    configs = layouts["mig-configs"]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert configs["gpu-serving-1x3g.40gb-1x2g.20gb-2x1g.10gb"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}]
    # Each entry is its name: the layout `Mig` names so, on some card it knows.
    for name, entry in configs.items():
        if name == "all-disabled":
            continue
        assert name in {mig.config_name for mig in _accepting(entry[0]["mig-devices"])}, name


def _accepting(profiles: dict[str, int]) -> list[Mig]:
    """The layout on every card that accepts it."""
    accepted = []
    for card in MIG_CARDS:
        try:
            accepted.append(Mig(card=card, profiles=profiles))  # type: ignore[arg-type]
        except ValidationError:
            continue
    return accepted


def _brute_force_layouts(card: str, most: int) -> dict[str, dict[str, int]]:
    """Every layout `Mig` accepts on `card` with at most `most` of each profile, tried one by one."""
    profiles = list(MIG_CARDS[card].profiles)
    accepted = {}
    for counts in itertools.product(range(most + 1), repeat=len(profiles)):
        chosen = {p: n for p, n in zip(profiles, counts, strict=True) if n}
        if not chosen:
            continue
        try:
            mig = Mig(card=card, profiles=chosen)  # type: ignore[arg-type]
        except ValidationError:
            continue
        accepted[mig.config_name] = dict(chosen)
    return accepted


@pytest.mark.parametrize("card", sorted(MIG_CARDS))
def test_every_layout_a_stack_can_name_is_in_the_mig_managers_file(card: str) -> None:
    """A layout change moves the label to an entry the file (as the manager's pod sees it) has held all along."""
    configs = yaml.safe_load(mig_parted_config(parse(example_raw()).nodes) or "")["mig-configs"]
    accepted = _brute_force_layouts(card, most=4)
    assert accepted
    for name, profiles in accepted.items():
        assert configs[name][0]["mig-devices"] == profiles, name
    # Seven of the smallest fill a card: the file goes beyond what the brute force above tries.
    smallest = next(iter(MIG_CARDS[card].profiles))
    assert Mig(card=card, profiles={smallest: MIG_CARDS[card].compute_slices}).config_name in configs  # type: ignore[arg-type]


def test_a_layout_or_replicas_change_leaves_both_files_as_they_were() -> None:
    """What each program reads does not depend on what the nodes pick: no write of it to wait for."""
    before = parse(example_raw())
    raw = example_raw()
    raw["nodes"][SLICED]["gpu"]["sharing"] = {"timeSlicing": {"replicas": 7}}
    raw["nodes"][MIG_NODE]["gpu"]["sharing"]["mig"]["profiles"] = {"7g.80gb": 1}
    raw["models"] = []
    after = parse(raw)
    assert sharing_labels(after.nodes[SLICED]) != sharing_labels(before.nodes[SLICED])
    assert sharing_labels(after.nodes[MIG_NODE]) != sharing_labels(before.nodes[MIG_NODE])
    assert device_plugin_configs(after.nodes) == device_plugin_configs(before.nodes)
    assert mig_parted_config(after.nodes) == mig_parted_config(before.nodes)
    plugin, layouts = device_plugin_configs(after.nodes), yaml.safe_load(mig_parted_config(after.nodes) or "")["mig-configs"]
    assert sharing_labels(after.nodes[SLICED])["nvidia.com/device-plugin.config"] == "gpu-serving-time-slicing-7" in plugin
    assert sharing_labels(after.nodes[MIG_NODE])["nvidia.com/mig.config"] == "gpu-serving-1x7g.80gb" in layouts


def test_the_mig_managers_file_fits_a_configmap(example) -> None:  # type: ignore[no-untyped-def]
    # The API server refuses a ConfigMap over 1 MiB; keep well clear of it as cards are added.
    text = named(example, "ConfigMap", "gpu-serving-mig-parted-config")["data"]["config.yaml"]
    assert len(text.encode()) < 256 * 1024


def test_a_sharing_nodes_labels_come_after_the_configmaps_they_name(example) -> None:  # type: ignore[no-untyped-def]
    """For the `up` that first writes them (and one that adds entries): the label never reaches the API server first."""
    maps = {r.inputs["metadata"]["name"]: r.urn for r in example.of_type("kubernetes:core/v1:ConfigMap")}
    wanted = {maps["gpu-serving-device-plugin-config"], maps["gpu-serving-mig-parted-config"]}
    patches = {r.inputs["metadata"]["name"]: r for r in example.of_type("kubernetes:core/v1:NodePatch")}
    assert set(patches) == {"gpu-l40s-1", "gpu-a100-1"}
    for patch in patches.values():
        assert wanted <= set(patch.options.get("dependsOn", [])), patch.name


def test_a_node_without_sharing_does_not_wait_for_them() -> None:
    raw = example_raw()
    plain = {**copy.deepcopy(raw["nodes"][SLICED]), "name": "gpu-plain-1"}
    plain["gpu"] = {k: v for k, v in plain["gpu"].items() if k != "sharing"}
    raw["nodes"].append(plain)
    result = run_program("sharing", stack_file=EXAMPLE, overrides={f"gpu-serving:{k}": json.dumps(v) for k, v in raw.items()})
    patch = next(r for r in result.of_type("kubernetes:core/v1:NodePatch") if r.inputs["metadata"]["name"] == "gpu-plain-1")
    assert not [urn for urn in patch.options.get("dependsOn", []) if "ConfigMap" in urn]


def test_the_node_labels_select_the_configs_they_name(example) -> None:  # type: ignore[no-untyped-def]
    labels = {o["metadata"]["name"]: o["metadata"]["labels"] for o in objects(example, "Node")}
    plugin = named(example, "ConfigMap", "gpu-serving-device-plugin-config")["data"]
    layouts = yaml.safe_load(named(example, "ConfigMap", "gpu-serving-mig-parted-config")["data"]["config.yaml"])["mig-configs"]
    assert labels["gpu-l40s-1"]["nvidia.com/device-plugin.config"] in plugin
    assert labels["gpu-a100-1"]["nvidia.com/device-plugin.config"] in plugin
    assert labels["gpu-a100-1"]["nvidia.com/mig.config"] in layouts
    assert "nvidia.com/mig.config" not in labels["gpu-l40s-1"]
    # What they advertise, for the policy pack: physical cards, replicas, MIG instances (cards × layout).
    assert labels["gpu-l40s-1"]["gpu-serving/gpu.count"] == "1" and labels["gpu-l40s-1"]["gpu-serving/gpu.replicas"] == "2"
    assert {k: v for k, v in labels["gpu-a100-1"].items() if k.startswith("gpu-serving/mig-")} == {
        "gpu-serving/mig-3g.40gb.count": "2", "gpu-serving/mig-2g.20gb.count": "2", "gpu-serving/mig-1g.10gb.count": "4"}


def test_a_stack_without_sharing_writes_none_of_it() -> None:
    stack = parse(_prod())
    assert device_plugin_configs(stack.nodes) == {} and mig_parted_config(stack.nodes) is None
    assert sharing_labels(stack.nodes[0]) == {}


def _prod() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in document.items()}


def test_each_model_asks_for_its_share(example) -> None:  # type: ignore[no-untyped-def]
    limits = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
              for d in objects(example, "Deployment")}
    assert {name: {k: v for k, v in lim.items() if k.startswith("nvidia.com/")} for name, lim in limits.items()} == {
        "vllm-qwen3-a": {"nvidia.com/gpu.shared": "1"}, "vllm-qwen3-b": {"nvidia.com/gpu.shared": "1"},
        "vllm-qwen3-mig": {"nvidia.com/mig-3g.40gb": "1"}, "vllm-qwen3-small": {"nvidia.com/mig-2g.20gb": "1"},
    }


def gfd_product(card: str, plugin_config: dict[str, Any]) -> str:
    """The `nvidia.com/gpu.product` GPU Feature Discovery writes for a card under a device plugin config
    (k8s-device-plugin internal/lm/resource.go getProductName and mig-strategy.go): `-SHARED` appended when
    nvidia.com/gpu is time-sliced and not renamed; `-MIG-<profile>` only under the single strategy; under
    mixed, MIG-enabled cards keep the card's name."""
    if plugin_config["flags"]["migStrategy"] == "single":
        raise AssertionError("single would name the product after the profile; the stack writes mixed")
    sliced = (plugin_config.get("sharing") or {}).get("timeSlicing")
    if sliced and not sliced.get("renameByDefault") and any(r["replicas"] > 1 for r in sliced["resources"]):
        return f"{card}-SHARED"
    return card


def test_gfd_product_selection_still_matches_under_sharing(example) -> None:  # type: ignore[no-untyped-def]
    """A model selecting on GFD's product label (gfdProduct) keeps finding its nodes: the label GFD writes under the
    configs the stack renders is the card's own name."""
    configs = {k: yaml.safe_load(v) for k, v in named(example, "ConfigMap", "gpu-serving-device-plugin-config")["data"].items()}
    selector = named(example, "Deployment", "vllm-qwen3-mig")["spec"]["template"]["spec"]["nodeSelector"]
    card = "NVIDIA-A100-SXM4-80GB"
    assert selector == {"nvidia.com/gpu.product": gfd_product(card, configs["gpu-serving-mig-mixed"])}
    assert gfd_product(card, configs["gpu-serving-time-slicing-2"]) == card
    # What the stack avoids: a time-sliced config left unrenamed would move the label from under the selector.
    unrenamed = copy.deepcopy(configs["gpu-serving-time-slicing-2"])
    unrenamed["sharing"]["timeSlicing"]["renameByDefault"] = False
    assert gfd_product(card, unrenamed) == f"{card}-SHARED"


def test_the_stacks_own_device_plugin_runs_each_time_slicing_config_on_its_nodes() -> None:
    raw = example_raw()
    raw["nodes"] = raw["nodes"][:1]
    raw["models"] = raw["models"][:2]
    raw["cluster"]["devicePlugin"] = {"enabled": True}
    result = run_program("sharing", stack_file=EXAMPLE, overrides={f"gpu-serving:{k}": json.dumps(v) for k, v in raw.items()})
    daemonsets = {d["metadata"]["name"]: d for d in objects(result, "DaemonSet")}
    assert sorted(daemonsets) == ["nvidia-device-plugin", "nvidia-device-plugin-time-slicing-2"]
    plain, sliced = daemonsets["nvidia-device-plugin"], daemonsets["nvidia-device-plugin-time-slicing-2"]
    assert plain["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/device-plugin.config", "operator": "NotIn", "values": ["gpu-serving-time-slicing-2"]}]}]}
    pod = sliced["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "nvidia.com/device-plugin.config": "gpu-serving-time-slicing-2"}
    assert {"name": "CONFIG_FILE", "value": "/etc/nvidia-device-plugin/config.yaml"} in pod["containers"][0]["env"]
    assert pod["volumes"][1]["configMap"] == {"name": "gpu-serving-device-plugin-config",
                                              "items": [{"key": "gpu-serving-time-slicing-2", "path": "config.yaml"}]}
    # The two DaemonSets' selectors do not overlap: neither adopts the other's pods.
    assert plain["spec"]["selector"]["matchLabels"] != sliced["spec"]["selector"]["matchLabels"]
    assert not plain["spec"]["selector"]["matchLabels"].items() <= sliced["spec"]["template"]["metadata"]["labels"].items()
    # The plugin reads its config from its own namespace.
    config_map = named(result, "ConfigMap", "gpu-serving-device-plugin-config")
    assert config_map["metadata"]["namespace"] == sliced["metadata"]["namespace"] == "kube-system"
    # Its pods mount their key of the ConfigMap: the DaemonSet comes after it.
    variant = next(r for r in result.of_type("kubernetes:apps/v1:DaemonSet") if r.inputs["metadata"]["name"].endswith("slicing-2"))
    assert any(urn.endswith("ConfigMap::cluster-device-plugin-config") for urn in variant.options.get("dependsOn", []))
    for obj in result.kubernetes_objects():
        if (obj["apiVersion"], obj["kind"]) not in NO_SCHEMA:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_plain_device_plugin_is_unchanged_without_sharing() -> None:
    stack = parse(_prod() | {"cluster": {**_prod()["cluster"], "devicePlugin": {"enabled": True}}})
    assert device_plugin(stack.cluster) == device_plugin(stack.cluster, shared=())
    spec = device_plugin(stack.cluster)["spec"].template.spec  # type: ignore[index]
    assert spec.affinity is None and spec.node_selector == {"nvidia.com/gpu.present": "true"}


def test_the_example_manifests_are_valid_kubernetes(example) -> None:  # type: ignore[no-untyped-def]
    checked = [obj["kind"] for obj in example.kubernetes_objects() if (obj["apiVersion"], obj["kind"]) not in NO_SCHEMA]
    for obj in example.kubernetes_objects():
        if (obj["apiVersion"], obj["kind"]) not in NO_SCHEMA:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    assert {"ConfigMap", "Node", "Deployment"} <= set(checked)


# ---------------------------------------------------------------------------- the loopback cluster


def test_simulated_nodes_advertise_what_the_device_plugin_would() -> None:
    assert node_args("sharing", EXAMPLE) == [
        "--node", "gpu-l40s-1:gpu.shared=2",
        "--node", "gpu-a100-1:mig-3g.40gb=2,mig-2g.20gb=2,mig-1g.10gb=4",
    ]


def test_cluster_sh_turns_the_specs_into_node_capacity(tmp_path: Path) -> None:
    args = [*node_args("sharing", EXAMPLE), "--node", "plain:2:8:16Gi"]
    result = subprocess.run(["bash", str(ROOT / "testbed/cluster/cluster.sh"), "nodes", *args],
                            capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    capacity = {n["metadata"]["name"]: n["status"]["capacity"] for n in yaml.safe_load_all(result.stdout) if n}
    assert capacity["gpu-l40s-1"]["nvidia.com/gpu.shared"] == "2" and "nvidia.com/gpu" not in capacity["gpu-l40s-1"]
    assert {k: v for k, v in capacity["gpu-a100-1"].items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-2g.20gb": "2", "nvidia.com/mig-1g.10gb": "4"}
    assert capacity["plain"] == {"cpu": "8", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "2"}
    refused = subprocess.run(["bash", str(ROOT / "testbed/cluster/cluster.sh"), "nodes", "--node", "x:gpu.shard=2"],
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert refused.returncode == 1 and "bad --node x:gpu.shard=2" in refused.stderr


# ---------------------------------------------------------------------------- what the cluster must have


def test_preview_warns_when_nothing_would_read_the_sharing_configs() -> None:
    from components.prerequisites import missing, needs

    warnings = [w for w in missing(lambda path: 404, needs(parse(example_raw()))) if "Prometheus Operator" not in w]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("the GPU Operator is not installed (no ClusterPolicy CRD): nothing creates the MIG instances")
    assert warnings[1].startswith("namespace gpu-operator does not exist: `pulumi up` fails creating the device plugin's sharing "
                                  "ConfigMap gpu-serving-device-plugin-config (cluster.devicePlugin.namespace) and the MIG "
                                  "layouts ConfigMap gpu-serving-mig-parted-config")
    assert missing(lambda path: 200, needs(parse(example_raw()))) == []
    assert not [n for n in needs(parse(_prod())) if "nvidia" in n.path or "gpu-operator" in n.path]


def test_the_example_renders_from_the_command_line(tmp_path: Path) -> None:
    """As docs/few-gpus.md "GPU sharing" prints it (into a temporary folder instead of rendered/sharing/)."""
    command = [sys.executable, "-m", "tools.render", "sharing", "--stack-file", "docs/examples/Pulumi.sharing.yaml"]
    result = subprocess.run([*command, "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "policy.txt").read_text() == ""
    manifests = [d for d in yaml.safe_load_all((tmp_path / "out" / "manifests.yaml").read_text()) if d]
    assert {"gpu-serving-device-plugin-config", "gpu-serving-mig-parted-config"} <= {
        d["metadata"]["name"] for d in manifests if d["kind"] == "ConfigMap"}
