"""Issue 39 item 5: the Grafana dashboards (components/dashboards) as ConfigMaps for kube-prometheus-stack's
sidecar, and every PromQL query of theirs, of the alerts and of the autoscaler checked against the series
names the pinned exporters export (tests/data/metrics, extracted by tools/metric_names.py from each
exporter's source) and parsed by promtool."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import dashboards
from components.serving import monitoring
from components.serving.autoscaling import QUEUE_GAUGE, adapter_rules, queue_query
from components.serving.names import object_name
from stacks.config import Model
from tests import checkers
from tests.test_serving import prod_model, prod_raw
from tests.test_stack_files import stack_files
from tools import metric_names
from tools.render import ROOT, Render, redact

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
METRICS = ROOT / "tests" / "data" / "metrics"
SIDECAR_LABEL = {"grafana_dashboard": "1"}  # kube-prometheus-stack 88.5.3: grafana.sidecar.dashboards.label/labelValue


# ---------------------------------------------------------------------------- the fixtures


def fixture(name: str) -> set[str]:
    lines = (METRICS / f"{name}.txt").read_text().splitlines()
    assert lines[0].startswith("# ") and "tools/metric_names.py" in lines[0], f"{name}: no provenance header"
    return {line for line in lines if line and not line.startswith("#")}


def vllm_versions() -> set[str]:
    """The vLLM versions the stacks run: every committed stack file's images and the config's default."""
    images = {Model.model_fields["image"].default}
    for path in stack_files():
        config = yaml.safe_load(path.read_text())["config"]
        images |= {model.get("image", Model.model_fields["image"].default) for model in config.get("gpu-serving:models", [])}
    versions = set()
    for image in images:
        tag = re.fullmatch(r"vllm/vllm-openai:(v[0-9.]+)", image)
        assert tag, f"{image}: not a vllm/vllm-openai release tag; extract its metric names into tests/data/metrics"
        versions.add(tag.group(1))
    return versions


def test_every_pinned_vllm_has_a_fixture() -> None:
    assert vllm_versions() == {"v0.11.0", "v0.18.0", "v0.34.0"}
    for version in vllm_versions():
        assert (METRICS / f"vllm-{version}.txt").is_file(), f"run tools/metric_names.py on the vllm {version} wheel"


def test_the_fixtures_hold_what_the_sources_say() -> None:
    """Spot checks against the sources the fixtures were extracted from (see their headers)."""
    old, new = fixture("vllm-v0.11.0"), fixture("vllm-v0.18.0")
    # v0.11 hides the deprecated gpu_cache_usage_perc (--show-hidden-metrics-for-version); v0.18 has removed it.
    assert "vllm:kv_cache_usage_perc" in old & new and "vllm:gpu_cache_usage_perc" not in old | new
    # time_per_output_token_seconds was renamed inter_token_latency_seconds: v0.11 has both, v0.18 the new one.
    assert "vllm:time_per_output_token_seconds_bucket" in old - new
    assert "vllm:inter_token_latency_seconds_bucket" in old & new
    assert {"vllm:num_preemptions_total", "vllm:request_success_total", "vllm:time_to_first_token_seconds_count"} <= old & new
    # v0.34 (the default image): the queue the autoscalers read and the alerts' series are still there; it adds
    # per-reason waiting counts and admission rejections, and drops prompt_tokens_recomputed.
    newest = fixture("vllm-v0.34.0")
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= new & newest
    assert {"vllm:admission_rejections_total", "vllm:num_requests_waiting_by_reason"} <= newest - new
    assert "vllm:prompt_tokens_recomputed_total" in new - newest
    assert {"node_md_state", "node_md_blocks_synced", "node_filesystem_avail_bytes"} <= fixture("node-exporter-v1.12.1")
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"} <= fixture("dcgm-exporter-4.5.3-4.8.2")
    assert "DCGM_FI_DRIVER_VERSION" not in fixture("dcgm-exporter-4.5.3-4.8.2")  # a label, not a series
    assert "kube_deployment_status_replicas_available" in fixture("kube-state-metrics-v2.20.0")


def test_the_extractor_reads_prometheus_client_definitions(tmp_path: Path) -> None:
    source = tmp_path / metric_names.VLLM_FILE
    source.parent.mkdir(parents=True)
    source.write_text(
        "class L:\n"
        "    def __init__(self):\n"
        "        self._gauge_cls(name='vllm:g', documentation='')\n"
        "        self._counter_cls(name='vllm:c', documentation='')\n"
        "        self._counter_cls(name='vllm:already_total', documentation='')\n"
        "        self._histogram_cls(name='vllm:h_total', documentation='')\n"
        "        if self.show_hidden_metrics:\n"
        "            self._gauge_cls(name='vllm:old', documentation='')\n"
    )
    shown, hidden = metric_names.vllm(tmp_path)
    assert shown == ["vllm:already_total", "vllm:c_total", "vllm:g", "vllm:h_total_bucket", "vllm:h_total_count", "vllm:h_total_sum"]
    assert hidden == ["vllm:old"]


# ---------------------------------------------------------------------------- PromQL metric names

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: strings, label matchers, ranges and label lists
    removed, then every identifier that is neither a function (followed by `(`) nor a keyword; and the
    names of `__name__` matchers."""
    names = set(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", text):
        if text[match.end():].lstrip().startswith("(") or match.group(0).lower() in KEYWORDS:
            continue
        names.add(match.group(0))
    return names


@pytest.mark.parametrize(("expr", "names"), [
    ('histogram_quantile(0.95, sum by (le) (rate(vllm:ttft_bucket{a="b",c=~"x|y"}[$__rate_interval])))', {"vllm:ttft_bucket"}),
    ("max by (namespace, pod) (a{x=\"1\"}) > 0 and on (namespace, pod) sum by (namespace, pod) (rate(b[5m])) == 0", {"a", "b"}),
    ("(x{d=\"vllm-$m\"} > bool 0) * (y == bool 0)", {"x", "y"}),
    ("a / b offset 5m or absent(c{k=\"by(\"})", {"a", "b", "c"}),
    ('{__name__="vllm:num_requests_waiting",pod!=""}', {"vllm:num_requests_waiting"}),
    ("count(up) * 1e3 + 0x1f", {"up"}),
])
def test_metric_names_are_parsed_out_of_promql(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def exporter_names(name: str) -> set[str]:
    """Where a series must come from, by its prefix: a vLLM series from every pinned vLLM version."""
    if name.startswith("vllm:"):
        return set.intersection(*(fixture(f"vllm-{v}") for v in vllm_versions()))
    for prefix, source in (("kube_", "kube-state-metrics-v2.20.0"), ("node_", "node-exporter-v1.12.1"),
                           ("DCGM_", "dcgm-exporter-4.5.3-4.8.2")):
        if name.startswith(prefix):
            return fixture(source)
    return set()


def unknown(exprs: list[str]) -> list[tuple[str, str]]:
    return [(name, expr) for expr in exprs for name in sorted(promql_metric_names(expr)) if name not in exporter_names(name)]


# ---------------------------------------------------------------------------- the dashboards


def dashboard_maps(render: Render) -> dict[str, dict[str, Any]]:
    return {redact(r.inputs)["metadata"]["name"]: redact(r.inputs) for r in render.of_type(CONFIG_MAP)
            if r.inputs["metadata"].get("labels", {}).get("grafana_dashboard")}


def rendered(render: Render) -> dict[str, dict[str, Any]]:
    """kind (models, nodes) → the dashboard JSON as the ConfigMap holds it."""
    out = {}
    for config_map in dashboard_maps(render).values():
        ((file, text),) = config_map["data"].items()
        out[file.rsplit("-", 1)[1].removesuffix(".json")] = json.loads(text)
    return out


def panel_queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def variable_queries(dashboard: dict[str, Any]) -> list[str]:
    """The metric selectors of the `label_values(<selector>, <label>)` query variables."""
    out = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["definition"])
            assert match, variable["definition"]
            out.append(match.group(1))
    return out


def test_prod_has_both_dashboards_for_the_sidecar(prod: Render) -> None:
    maps = dashboard_maps(prod)
    assert set(maps) == {"gpu-serving-ai-models", "gpu-serving-ai-nodes"}
    for config_map in maps.values():
        assert config_map["metadata"]["namespace"] == "ai"
        assert SIDECAR_LABEL.items() <= config_map["metadata"]["labels"].items()
        ((file, _),) = config_map["data"].items()
        assert file.startswith("gpu-serving-ai-") and file.endswith(".json")  # one folder for every dashboard: unique names
    boards = rendered(prod)
    assert {b["uid"] for b in boards.values()} == {dashboards._uid("models", "ai"), dashboards._uid("nodes", "ai")}
    assert all(len(b["uid"]) <= 40 for b in boards.values())


def test_the_dashboards_use_a_datasource_variable(prod: Render) -> None:
    for board in rendered(prod).values():
        (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
        assert variable["name"] == "datasource" and variable["query"] == "prometheus"
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))


def test_the_models_dashboard_offers_the_stacks_models(render) -> None:  # type: ignore[no-untyped-def]
    one_each = {"min": 1, "max": 1}
    two = [prod_model(replicas=one_each), prod_model(name="llama", ingress=None, replicas=one_each)]
    result = render(models=two)
    board = rendered(result)["models"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    # Listed from the models' Deployments (one at zero replicas too), the model's name cut out of vllm-<model>.
    query = variables["model_name"]["query"]["query"]
    assert query == 'label_values(kube_deployment_spec_replicas{namespace="$namespace",deployment=~"vllm-.+"}, deployment)'
    cut = re.compile(variables["model_name"]["regex"].strip("/"))
    assert [cut.fullmatch(object_name(m)).group(1) for m in result.config.models] == ["qwen3", "llama"]  # type: ignore[union-attr]
    assert variables["namespace"]["query"] == "ai" and variables["namespace"]["hide"] == 2
    # The Deployment selector of the replicas panels names the model's Deployment.
    model = result.config.models[1]
    deployments = {m for e in panel_queries(board) for m in re.findall(r'deployment="([^"]+)"', e)}
    assert {d.replace("$model_name", model.name) for d in deployments} == {object_name(model)}


def test_adding_a_model_or_a_node_leaves_the_dashboards_as_they_are(render) -> None:  # type: ignore[no-untyped-def]
    """The runbook's promise (adding a model or a node changes only its own objects) holds for the dashboards:
    nothing of a model or a node is in them."""
    import copy

    one_each = {"min": 1, "max": 1}
    base = rendered(render(models=[prod_model(replicas=one_each)]))
    raw = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    nodes = raw["gpu-serving:nodes"]
    extra = copy.deepcopy(nodes[0])
    extra.update(name="k8s-worker-03", storage={**extra["storage"], "disks": ["/dev/disk/by-id/wwn-0x1", "/dev/disk/by-id/wwn-0x2"],
                                                 "mountpoint": "/data/models"})
    extra["ssh"] = {**extra["ssh"], "host": "k8s-worker-03", "hostKeySecret": "sshHostKeyWorker03"}
    more = rendered(render(nodes=[*nodes, extra], models=[prod_model(replicas=one_each),
                                                           prod_model(name="llama", ingress=None, replicas=one_each)]))
    assert more == base


def test_the_models_dashboard_has_the_panels_an_operator_needs(prod: Render) -> None:
    board = rendered(prod)["models"]
    titles = {p["title"] for p in board["panels"]}
    assert {"Requests running and waiting", "Errors and aborts", "Time to first token", "Inter-token latency", "Queue time",
            "End-to-end latency", "KV-cache use", "Preemptions", "Tokens per second", "Replicas", "Cold starts"} <= titles
    used = {n for e in panel_queries(board) for n in promql_metric_names(e)}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "kube_deployment_spec_replicas"} <= used


def test_the_nodes_dashboard_shows_the_arrays_by_their_md_devices(prod: Render) -> None:
    board = rendered(prod)["nodes"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "node", "instance"}
    filesystems = [e for e in panel_queries(board) if "node_filesystem" in e]
    assert filesystems and all('device=~"/dev/md.+"' in e for e in filesystems)
    used = {n for e in panel_queries(board) for n in promql_metric_names(e)}
    assert {"node_md_state", "node_md_disks", "node_md_blocks_synced", "node_filesystem_avail_bytes", "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED"} <= used


@pytest.mark.parametrize("path", stack_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_query_names_series_the_pinned_exporters_export(path: Path) -> None:
    from tools.render import run_program

    result = run_program(path.stem.removeprefix("Pulumi."), stack_file=path)
    boards = rendered(result)
    assert set(boards) == {"models", "nodes"}
    for board in boards.values():
        exprs = panel_queries(board) + variable_queries(board)
        assert exprs and unknown(exprs) == []


def test_the_alerts_and_the_autoscaler_name_series_the_pinned_exporters_export() -> None:
    model = Model.model_validate(prod_model())
    exprs = [rule["expr"] for rule in monitoring.alert_rules(model, "ai")] + [queue_query(model, "ai")]
    exprs.append(yaml.safe_load(adapter_rules())["rules"][0]["seriesQuery"])
    assert unknown(exprs) == []
    assert QUEUE_GAUGE in exporter_names(QUEUE_GAUGE)


def test_a_misspelt_metric_is_caught() -> None:
    assert unknown(["rate(vllm:time_per_output_token_seconds_bucket[5m])", "vllm:gpu_cache_usage_perc", "node_md_sync"]) == [
        ("vllm:time_per_output_token_seconds_bucket", "rate(vllm:time_per_output_token_seconds_bucket[5m])"),
        ("vllm:gpu_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        ("node_md_sync", "node_md_sync"),
    ]


# ---------------------------------------------------------------------------- promtool parses every query


def concrete(expr: str, board: dict[str, Any]) -> str:
    """The query as Grafana sends it: the rendered constants, a sample value of the other variables."""
    values = {"__rate_interval": "1m", "__range": "1h", "__interval": "1m", "model_name": "qwen3", "node": "k8s-worker-02",
              "instance": "10.0.0.2:9100"}
    for variable in board["templating"]["list"]:
        if variable["type"] == "constant":
            values[variable["name"]] = variable["query"]
    return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)


def test_promtool_parses_every_query(tmp_path: Path, prod: Render) -> None:
    rules = []
    for kind, board in sorted(rendered(prod).items()):
        for i, expr in enumerate(panel_queries(board) + variable_queries(board)):
            rules.append({"record": f"gpu_serving:{kind}:{i}", "expr": concrete(expr, board)})
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([str(checkers.promtool()), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout


# ---------------------------------------------------------------------------- configuration


def test_dashboards_can_be_turned_off(render) -> None:  # type: ignore[no-untyped-def]
    cluster = prod_raw()["cluster"] | {"monitoring": {**prod_raw()["cluster"]["monitoring"], "dashboards": False}}
    assert dashboard_maps(render(cluster=cluster)) == {}


def test_the_sidecar_label_and_namespace_are_configurable(render) -> None:  # type: ignore[no-untyped-def]
    monitoring_config = {**prod_raw()["cluster"]["monitoring"], "dashboardLabels": {"grafana_dashboard": "gpu"},
                         "dashboardNamespace": "monitoring"}
    result = render(cluster=prod_raw()["cluster"] | {"monitoring": monitoring_config})
    maps = dashboard_maps(result)
    assert set(maps) == {"gpu-serving-ai-models", "gpu-serving-ai-nodes"}
    for config_map in maps.values():
        assert config_map["metadata"]["namespace"] == "monitoring"
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "gpu"
    (resource,) = [r for r in result.of_type(CONFIG_MAP) if r.inputs["metadata"]["name"] == "gpu-serving-ai-models"]
    assert not [urn for urn in resource.options.get("dependsOn", []) if "Namespace" in urn]  # another namespace: no wait


def test_in_the_stacks_namespace_a_dashboard_waits_for_it(prod: Render) -> None:
    (resource,) = [r for r in prod.of_type(CONFIG_MAP) if r.inputs["metadata"]["name"] == "gpu-serving-ai-models"]
    assert [urn for urn in resource.options.get("dependsOn", []) if "Namespace" in urn]


def test_the_docs_name_every_panel(prod: Render) -> None:
    text = (ROOT / "docs" / "models.md").read_text()
    section = text[text.index("### Dashboards"):]
    missing = [p["title"] for board in rendered(prod).values() for p in board["panels"] if p["type"] != "row" and p["title"] not in section]
    assert missing == []
    assert 'grafana_dashboard: "1"' in section and "dashboards: false" in section and "dashboardNamespace" in section
