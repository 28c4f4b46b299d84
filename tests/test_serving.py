"""VllmService: every pitfall of the seed is a default, asserted on the rendered objects."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from components.serving.autoscaling import adapter_rules, queue_query
from components.serving.edge import ingress_route
from components.serving.names import MARKER_DIR, download_job_name, labels
from components.serving.server import container_args, startup_probe
from components.serving.sizing import memory_limit, shm_size_gi
from stacks.config import ConfigError, Model, flag_name, parse
from stacks.config.budgets import (
    DOWNLOAD_MB_PER_S,
    IMAGE_PULL_S,
    MIN_DOWNLOAD_S,
    MIN_STARTUP_S,
    PROBE_PERIOD_S,
    deployment_timeout_seconds,
    download_deadline_seconds,
    startup_budget_seconds,
)
from tools.render import ROOT, Render, redact

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
JOB = "kubernetes:batch/v1:Job"
SECRET = "kubernetes:core/v1:Secret"
SERVICE = "kubernetes:core/v1:Service"
INGRESS = "kubernetes:networking.k8s.io/v1:Ingress"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
KUBERNETES_VERSION = "1.37.0"


def prod_raw() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in document.items()}


def prod_model(**changes: Any) -> dict[str, Any]:
    model = copy.deepcopy(prod_raw()["models"][0])
    model.update(changes)
    return model


def model_of(**changes: Any) -> Model:
    return Model.model_validate(prod_model(**changes))


def of_type(render: Render, type_token: str) -> list[Any]:
    """Resources of a type; for Jobs only the download Job (the smoke-test Job has tests of its own)."""
    found = render.of_type(type_token)
    return [r for r in found if "-dl-" in r.inputs["metadata"]["name"]] if type_token == JOB else found


def one(render: Render, type_token: str) -> dict[str, Any]:
    (resource,) = of_type(render, type_token)
    return redact(resource.inputs)


def adapter_config_maps(render: Render) -> list[dict[str, Any]]:
    """The ConfigMaps but the Grafana dashboards' (tests/test_dashboards.py)."""
    return [redact(r.inputs) for r in render.of_type(CONFIG_MAP) if "grafana_dashboard" not in r.inputs["metadata"].get("labels", {})]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def two_models() -> list[dict[str, Any]]:
    first = prod_model(replicas={"min": 1, "max": 1}, ingress={"host": "ai.primer.rs", "path": "/qwen3", "tlsSecret": "ai-tls"})
    second = prod_model(
        name="small",
        huggingFaceId="Qwen/Qwen3-0.6B",
        weightsGb=1.5,
        replicas={"min": 1, "max": 1},
        ingress={"host": "ai.primer.rs", "path": "/small", "tlsSecret": "ai-tls"},
    )
    return [first, second]


def assert_valid(render: Render) -> int:
    from tests import checkers

    checked = 0
    for obj in render.kubernetes_objects():
        if obj["apiVersion"].split("/")[0] in checkers.CRD_GROUPS:
            checkers.validate(obj)  # a custom resource: against its CRD's schema
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        checked += 1
    return checked


# ---------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize(("weights_gb", "budget", "threshold"), [(1, 600, 60), (6, 600, 60), (140, 1700, 170), (400, 4300, 430)])
def test_startup_budget_grows_with_the_weights_and_never_undercuts_the_seed(weights_gb: float, budget: int, threshold: int) -> None:
    assert startup_budget_seconds(weights_gb) == budget
    probe = startup_probe(weights_gb)
    assert probe.failure_threshold == threshold
    assert probe.failure_threshold * probe.period_seconds >= MIN_STARTUP_S


def test_startup_budget_is_monotonic_and_whole_periods() -> None:
    budgets = [startup_budget_seconds(w / 2) for w in range(1, 2000)]
    assert budgets == sorted(budgets)
    assert all(b % PROBE_PERIOD_S == 0 and b >= 600 for b in budgets)


def test_timeouts_cover_image_pull_and_load() -> None:
    assert deployment_timeout_seconds(140) > IMAGE_PULL_S + startup_budget_seconds(140)
    assert download_deadline_seconds(6) == MIN_DOWNLOAD_S
    assert download_deadline_seconds(140) == 600 + 2 * 140 * 1000 // DOWNLOAD_MB_PER_S


@pytest.mark.parametrize(("gpus", "gi"), [(1, 8), (2, 12), (4, 20), (8, 36)])
def test_shm_grows_with_tensor_parallelism(gpus: int, gi: int) -> None:
    assert shm_size_gi(gpus) == gi


@pytest.mark.parametrize(
    ("memory", "shm", "limit"), [("16Gi", 8, "24Gi"), ("512Mi", 8, "8704Mi"), ("1Ti", 4, "1028Gi"), ("100Ki", 1, "1048676Ki")]
)
def test_memory_limit_leaves_room_for_shm(memory: str, shm: int, limit: str) -> None:
    assert memory_limit(memory, shm) == limit


def test_container_args_are_the_seed_flags_from_config() -> None:
    args = container_args(model_of(gpusPerReplica=2, extraArgs=["--enable-prefix-caching"]))
    assert args == [
        "Qwen/Qwen3-8B-AWQ",  # positional: `vllm serve --model` is deprecated
        "--revision=4da05a8edb55c6046cce958586c33b61da07bb79",
        "--served-model-name=qwen3",
        "--host=0.0.0.0",
        "--port=8000",
        "--download-dir=/models/hub",
        "--tensor-parallel-size=2",
        "--gpu-memory-utilization=0.9",
        "--max-model-len=16384",
        "--shutdown-timeout=600",  # prod pins vLLM >= 0.18
        "--enable-prefix-caching",
    ]


def test_download_job_name_changes_with_the_revision_only() -> None:
    a, b = model_of(), model_of(revision="0123abcd")
    assert download_job_name(a) != download_job_name(b)
    assert download_job_name(a) == download_job_name(model_of(image="vllm/vllm-openai:v0.10.2"))
    longest = model_of(name="m" * 40)
    assert len(download_job_name(longest)) <= 63


def test_version_label_from_tag_or_digest() -> None:
    assert labels(model_of(), "x")["app.kubernetes.io/version"] == "v0.18.0"
    digest = "registry.lan:5000/vllm/vllm-openai@sha256:" + "a" * 64
    assert labels(model_of(image=digest), "x")["app.kubernetes.io/version"] == "digest"


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/", ("/v1", "Prefix", None)),
        ("/qwen3", ("/qwen3/v1(/|$)(.*)", "ImplementationSpecific", "/v1/$2")),
        ("/team/qwen3/", ("/team/qwen3/v1(/|$)(.*)", "ImplementationSpecific", "/v1/$2")),
    ],
)
def test_ingress_sub_paths_are_stripped_before_vllm(path: str, route: tuple[str, str, str | None]) -> None:
    assert ingress_route(path) == route


def test_queue_query_filters_model_name_not_model() -> None:
    # What it sums over two pods seen by two scrape jobs: tests/test_serving_monitoring.py (promtool).
    query = queue_query(model_of(), "ai")
    assert '{namespace="ai",model_name="qwen3"}' in query and "model=" not in query


def test_adapter_rule_turns_the_gauge_into_the_hpa_metric() -> None:
    (rule,) = yaml.safe_load(adapter_rules())["rules"]
    assert rule["name"] == {"matches": "^vllm:num_requests_waiting$", "as": "vllm_num_requests_waiting"}
    assert 'vllm:num_requests_waiting"' in rule["seriesQuery"] and 'pod!=""' in rule["seriesQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("--tensor_parallel_size=2", "--tensor-parallel-size"),
        ("-tp", "-tp"),
        ("2", None),
        ("-1", None),
        ("--x", "--x"),
    ],
)
def test_flag_names_are_normalised(arg: str, flag: str | None) -> None:
    assert flag_name(arg) == flag


# ---------------------------------------------------------------------------- the prod render


def test_gpu_is_a_limit_only_and_cpu_memory_are_guaranteed(prod: Render) -> None:
    resources = container(one(prod, DEPLOYMENT))["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in resources["requests"]
    # Issue 24: Guaranteed QoS, requests = limits; the memory is 16Gi + the 8Gi /dev/shm.
    assert resources["requests"] == {"cpu": "4", "memory": "24Gi"}
    assert {k: v for k, v in resources["limits"].items() if k != "nvidia.com/gpu"} == {"cpu": "4", "memory": "24Gi"}


def test_probes_use_health_and_the_startup_budget(prod: Render) -> None:
    c = container(one(prod, DEPLOYMENT))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    startup = c["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] == 600  # 6 GB: the seed's floor
    assert c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"] >= 60


def test_big_model_gets_a_longer_startup_budget(render) -> None:  # type: ignore[no-untyped-def]
    big = prod_model(name="big", huggingFaceId="Qwen/Qwen2.5-72B-Instruct", weightsGb=140, gpusPerReplica=2, replicas={"min": 1, "max": 1})
    result = render(models=[big])
    deployment = one(result, DEPLOYMENT)
    startup = container(deployment)["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] == 1700
    assert deployment["spec"]["progressDeadlineSeconds"] >= 1700 + IMAGE_PULL_S
    (resource,) = result.of_type(DEPLOYMENT)
    assert resource.options["customTimeouts"]["create"] == f"{deployment_timeout_seconds(140)}s"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "12Gi"}
    assert "--tensor-parallel-size=2" in container(deployment)["args"]
    assert container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert deployment["spec"]["replicas"] == 1


def test_shm_and_model_volume_match_download_dir(prod: Render) -> None:
    deployment = one(prod, DEPLOYMENT)
    c = container(deployment)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert mounts["dshm"] == "/dev/shm"
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models"}
    download_dir = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--download-dir="))
    assert download_dir.startswith(mounts["models"] + "/")
    assert env_of(c)["HF_HUB_CACHE"] == download_dir
    assert env_of(c)["HF_HUB_OFFLINE"] == "1"


def test_tokens_come_from_the_secret(prod: Render) -> None:
    secret = one(prod, SECRET)
    assert secret["stringData"] == {"hf-token": "[secret]", "api-key": "[secret]"}
    (resource,) = prod.of_type(SECRET)
    from tools.render import is_secret

    data = resource.inputs["stringData"]
    assert is_secret(data) or is_secret(data["hf-token"])
    # Only the download Job holds the Hugging Face token; the server holds the API key.
    env = env_of(one(prod, JOB)["spec"]["template"]["spec"]["containers"][0])
    ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "hf-token"}}
    assert env["HF_TOKEN"] == env["HUGGING_FACE_HUB_TOKEN"] == ref
    server = env_of(container(one(prod, DEPLOYMENT)))
    assert server["VLLM_API_KEY"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "api-key"}}
    assert "HF_TOKEN" not in server and "HUGGING_FACE_HUB_TOKEN" not in server


def test_api_key_is_a_secret_env_and_never_leaks(render) -> None:  # type: ignore[no-untyped-def]
    canary = "CANARY-api-key-91b2"
    result = render(models=[prod_model(apiKeySecret="vllmApiKey")], secrets={"vllmApiKey": canary, "hfToken": "CANARY-hf-3c4d"})
    env = env_of(container(one(result, DEPLOYMENT)))
    assert env["VLLM_API_KEY"] == {"secretKeyRef": {"name": "vllm-qwen3-secrets", "key": "api-key"}}
    assert not any("api-key" in a for a in container(one(result, DEPLOYMENT))["args"])
    assert one(result, SECRET)["stringData"] == {"hf-token": "[secret]", "api-key": "[secret]"}
    dumped = json.dumps(result.kubernetes_objects()) + json.dumps(redact(result.outputs))
    assert canary not in dumped and "CANARY-hf-3c4d" not in dumped


def test_pods_land_on_the_gpu_product_and_tolerate_the_taint(prod: Render) -> None:
    spec = one(prod, DEPLOYMENT)["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu-serving/gpu.product": "nvidia-a100"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    assert "runtimeClassName" not in spec
    assert spec["enableServiceLinks"] is False
    assert spec["automountServiceAccountToken"] is False


def test_runtime_class_comes_from_cluster_config(render) -> None:  # type: ignore[no-untyped-def]
    cluster = prod_raw()["cluster"] | {"runtimeClassName": "nvidia"}
    spec = one(render(cluster=cluster), DEPLOYMENT)["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"


def test_rollout_never_needs_a_spare_gpu(prod: Render) -> None:
    spec = one(prod, DEPLOYMENT)["spec"]
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert spec["progressDeadlineSeconds"] == deployment_timeout_seconds(6)


def test_scrape_annotations_only_without_the_pod_monitor(prod: Render, render) -> None:  # type: ignore[no-untyped-def]
    # Issue 24: annotations beside a PodMonitor double every series where an annotation job exists.
    template = one(prod, DEPLOYMENT)["spec"]["template"]
    assert prod.config.cluster.monitoring.pod_monitor
    annotations = dict(template["metadata"]["annotations"])
    assert annotations.pop("gpu-serving/api-key-hmac").startswith("hmac-sha256:")  # tests/test_api_key_rotation.py
    assert not any(k.startswith("prometheus.io/") for k in annotations)
    plain = render(cluster=prod_raw()["cluster"] | {"monitoring": {"podMonitor": False}})
    plain_annotations = dict(one(plain, DEPLOYMENT)["spec"]["template"]["metadata"]["annotations"])
    plain_annotations.pop("gpu-serving/api-key-hmac")
    assert plain_annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "qwen3"
    assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpu-serving"


def test_security_context_is_as_tight_as_the_image_allows(prod: Render) -> None:
    deployment = one(prod, DEPLOYMENT)
    assert deployment["spec"]["template"]["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container(deployment)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_deployment_waits_for_the_download_job(prod: Render) -> None:
    (job,), (deployment,) = of_type(prod, JOB), prod.of_type(DEPLOYMENT)
    assert job.urn in deployment.options["dependsOn"]
    assert job.options["deleteBeforeReplace"] is True
    assert job.options["customTimeouts"]["create"] == f"{IMAGE_PULL_S + MIN_DOWNLOAD_S}s"
    assert deployment.options["customTimeouts"]["create"] == f"{deployment_timeout_seconds(6)}s"


def test_download_job_fills_the_same_cache_without_a_gpu(prod: Render) -> None:
    job = one(prod, JOB)
    assert job["metadata"]["name"].startswith("vllm-qwen3-dl-")
    spec = job["spec"]
    assert spec["backoffLimit"] == 3
    assert spec["activeDeadlineSeconds"] == MIN_DOWNLOAD_S
    assert spec["ttlSecondsAfterFinished"] > 0
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == container(one(prod, DEPLOYMENT))["image"]
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])
    assert "nodeSelector" not in pod  # the local PV's node affinity picks the storage node
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"  # ... which is a tainted GPU node
    env = env_of(c)
    assert env["HF_HUB_CACHE"] == "/models/hub"
    assert env["GS_REPO"] == "Qwen/Qwen3-8B-AWQ" and env["GS_REVISION"] == prod.config.models[0].revision
    assert env["GS_MARKER_DIR"] == MARKER_DIR
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "vllm-qwen3-secrets", "key": "hf-token"}}
    assert "HF_HUB_OFFLINE" not in env
    assert c["command"][:2] == ["python3", "-c"] and "snapshot_download" in c["command"][2]
    assert "cache_dir=cache" in c["command"][2] and "marker.exists()" in c["command"][2]
    compile(c["command"][2], "download", "exec")


def test_download_job_on_shared_storage_stays_off_gpu_nodes(render) -> None:  # type: ignore[no-untyped-def]
    result = render(modelStorage={"type": "nfs", "server": "nas.lan", "path": "/export/models", "sizeGi": 500})
    pod = one(result, JOB)["spec"]["template"]["spec"]
    assert "tolerations" not in pod and "nodeSelector" not in pod


def test_service_and_ingress_stream(prod: Render) -> None:
    service = one(prod, SERVICE)
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "inference-server"  # not the Job's pods
    ingress = one(prod, INGRESS)
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert annotations["nginx.ingress.kubernetes.io/proxy-http-version"] == "1.1"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"]) >= 600
    assert annotations["cert-manager.io/cluster-issuer"] == "letsencrypt"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["ai.primer.rs"], "secretName": "ai-tls"}]
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": "http"}}


def hpa_render(render, **overrides: Any) -> Render:  # type: ignore[no-untyped-def]
    return render(cluster=prod_raw()["cluster"] | {"autoscaling": "hpa"}, **overrides)


def test_hpa_scales_on_the_queue_and_leaves_replicas_alone(render) -> None:  # type: ignore[no-untyped-def]
    prod = hpa_render(render)
    assert "replicas" not in one(prod, DEPLOYMENT)["spec"]
    hpa = one(prod, HPA)["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-qwen3"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 2)
    (metric,) = hpa["metrics"]
    assert metric == {
        "type": "Pods",
        "pods": {"metric": {"name": "vllm_num_requests_waiting"}, "target": {"type": "AverageValue", "averageValue": "3"}},
    }
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 600
    assert prod.of_type(SCALED_OBJECT) == []
    (rules,) = adapter_config_maps(prod)
    assert rules["metadata"] == {"name": "gpu-serving-adapter-rules", "namespace": "monitoring", "labels": rules["metadata"]["labels"],
                                 "annotations": {"pulumi.com/patchForce": "true"}}
    assert rules["data"]["config.yaml"] == adapter_rules()
    assert prod.outputs["prometheusAdapterRules"] == "monitoring/gpu-serving-adapter-rules"


def test_hpa_target_is_configurable(render) -> None:  # type: ignore[no-untyped-def]
    result = hpa_render(render, models=[prod_model(replicas={"min": 1, "max": 2, "targetRequestsWaiting": 8})])
    assert one(result, HPA)["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "8"


def test_keda_replaces_the_hpa(render) -> None:  # type: ignore[no-untyped-def]
    cluster = prod_raw()["cluster"] | {"autoscaling": "keda"}
    result = render(cluster=cluster)
    assert result.of_type(HPA) == [] and adapter_config_maps(result) == []
    scaled = one(result, SCALED_OBJECT)
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "vllm-qwen3"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 2)
    (trigger,) = spec["triggers"]
    assert trigger["metadata"]["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    assert 'model_name="qwen3"' in trigger["metadata"]["query"]
    assert trigger["metadata"]["threshold"] == "3"
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 600
    assert "replicas" not in one(result, DEPLOYMENT)["spec"]
    assert assert_valid(result) >= 10


def test_fixed_replicas_need_no_autoscaler(render) -> None:  # type: ignore[no-untyped-def]
    result = render(models=[prod_model(replicas={"min": 2, "max": 2})])
    assert result.of_type(HPA) == [] and result.of_type(SCALED_OBJECT) == [] and adapter_config_maps(result) == []
    assert one(result, DEPLOYMENT)["spec"]["replicas"] == 2
    assert result.outputs["models"]["qwen3"]["replicas"]["autoscaler"] == "none"


def test_outputs_per_model(prod: Render) -> None:
    assert prod.outputs["models"] == {
        "qwen3": {
            "url": "http://vllm-qwen3.ai.svc:8000/v1",
            "ingressUrl": "https://ai.primer.rs/v1",
            "servedModelName": "qwen3",
            "gpusPerReplica": 1,
            "replicas": {"min": 1, "max": 2, "autoscaler": "keda"},
        }
    }


def test_component_type_and_parents(prod: Render) -> None:
    (component,) = prod.of_type("gpu-serving:serving:VllmService")
    children = [r for r in prod.resources if r.parent == component.urn]
    assert {r.type for r in children} >= {SECRET, JOB, DEPLOYMENT, SERVICE, INGRESS, SCALED_OBJECT}
    for child in children:
        assert child.inputs["metadata"]["namespace"] == "ai"


def test_prod_render_is_valid_kubernetes(prod: Render) -> None:
    assert assert_valid(prod) >= 11


# ---------------------------------------------------------------------------- two models


def test_two_models_share_a_host_namespace_and_volume(render) -> None:  # type: ignore[no-untyped-def]
    result = render(models=two_models())
    objects = result.kubernetes_objects()
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), keys
    assert len(result.of_type("kubernetes:core/v1:PersistentVolumeClaim")) == 1
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for d in result.of_type(DEPLOYMENT)
        for v in d.inputs["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {"models"}
    services = {s.inputs["metadata"]["name"] for s in result.of_type(SERVICE)}
    assert services == {"vllm-qwen3", "vllm-small"}
    routes = {}
    for ingress in result.of_type(INGRESS):
        (rule,) = ingress.inputs["spec"]["rules"]
        (path,) = rule["http"]["paths"]
        routes[(rule["host"], path["path"])] = path["backend"]["service"]["name"]
        assert ingress.inputs["metadata"]["annotations"]["nginx.ingress.kubernetes.io/rewrite-target"] == "/v1/$2"
        assert path["pathType"] == "ImplementationSpecific"
    assert routes == {("ai.primer.rs", "/qwen3/v1(/|$)(.*)"): "vllm-qwen3", ("ai.primer.rs", "/small/v1(/|$)(.*)"): "vllm-small"}
    outputs = result.outputs["models"]
    assert outputs["small"]["ingressUrl"] == "https://ai.primer.rs/small/v1"
    assert outputs["small"]["url"] == "http://vllm-small.ai.svc:8000/v1"
    assert len({j.inputs["metadata"]["name"] for j in of_type(result, JOB)}) == 2
    assert assert_valid(result) >= 15


# ---------------------------------------------------------------------------- load-time validation


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    return str(caught.value)


def with_models(*models: dict[str, Any], **top: Any) -> dict[str, Any]:
    raw = prod_raw()
    raw["models"] = list(models)
    raw.update(top)
    return raw


NFS = {"type": "nfs", "server": "nas.lan", "path": "/export/models", "sizeGi": 500}


@pytest.mark.parametrize(
    ("raw", "starts"),
    [
        (with_models(prod_model(gpusPerReplica=3)), "models[0].gpusPerReplica: 3 GPUs, but the largest nvidia-a100 node has 2"),
        (
            with_models(prod_model(replicas={"min": 1, "max": 3}), modelStorage=NFS),
            "models: at max replicas the models need 3 nvidia-a100 GPUs but the nodes declare 2",
        ),
        (
            with_models(
                prod_model(replicas={"min": 1, "max": 1}),
                prod_model(name="b", replicas={"min": 1, "max": 2}, ingress=None),
                modelStorage=NFS,
            ),
            "models: at max replicas the models need 3 nvidia-a100 GPUs",
        ),
        (with_models(prod_model(weightsGb=990)), "models: the weights add up to 990 GB but the model volume holds 979 GB"),
        (
            with_models(prod_model(extraArgs=["--tensor-parallel-size=2"])),
            "models[0].extraArgs[0]: '--tensor-parallel-size=2': --tensor-parallel-size is set by the bundle from gpusPerReplica",
        ),
        (
            with_models(prod_model(extraArgs=["--download_dir", "/tmp"])),
            "models[0].extraArgs[0]: '--download_dir': --download-dir is set by the bundle",
        ),
        (with_models(prod_model(extraArgs=["-tp", "2"])), "models[0].extraArgs[0]: '-tp': -tp is set by the bundle from gpusPerReplica"),
        (with_models(prod_model(extraArgs=["--port=9000"])), "models[0].extraArgs[0]: '--port=9000'"),
        (with_models(prod_model(extraArgs=["--model", "x/y"])), "models[0].extraArgs[0]: '--model'"),
        (
            with_models(prod_model(extraArgs=["--api-key=abc"])),
            "models[0].extraArgs[0]: --api-key: --api-key is set by the bundle from apiKeySecret",  # the value is never repeated
        ),
        (with_models(prod_model(env={"HF_HUB_OFFLINE": "0"})), "models[0].env: HF_HUB_OFFLINE is set by the bundle"),
        (
            with_models(prod_model(env={"CUDA_VISIBLE_DEVICES": "0,1"})),
            "models[0].env: CUDA_VISIBLE_DEVICES is set by the bundle from the device plugin",
        ),
        (with_models(prod_model(env={"HUGGING_FACE_HUB_TOKEN": "hf_x"})), "models[0].env: HUGGING_FACE_HUB_TOKEN looks like a secret"),
        (with_models(prod_model(replicas={"min": 0, "max": 2})), "models[0].replicas.min: 0, but cluster.requestHold is unset"),
        (with_models(prod_model(name="m" * 41)), "models[0].name: at most 40 characters"),
        (with_models(prod_model(image="vllm/vllm-openai:latest")), "models[0].image: not pinned: uses :latest"),
        (
            with_models(prod_model(replicas={"min": 1, "max": 1}), prod_model(name="b", replicas={"min": 1, "max": 1})),
            "models[1].ingress.path: ai.primer.rs/ is already routed to models[0]",
        ),
        (
            with_models(
                prod_model(replicas={"min": 1, "max": 1}, ingress={"host": "ai.primer.rs", "path": "/a/", "tlsSecret": "ai-tls"}),
                prod_model(name="b", replicas={"min": 1, "max": 1}, ingress={"host": "ai.primer.rs", "path": "/a", "tlsSecret": "ai-tls"}),
            ),
            "models[1].ingress.path: ai.primer.rs/a is already routed to models[0]",
        ),
        (
            with_models(
                prod_model(replicas={"min": 1, "max": 1}, ingress={"host": "ai.primer.rs", "path": "/a", "tlsSecret": "ai-tls"}),
                prod_model(name="b", replicas={"min": 1, "max": 1}, ingress={"host": "ai.primer.rs", "path": "/b", "tlsSecret": "other"}),
            ),
            "models[1].ingress.tlsSecret: ai.primer.rs already uses tlsSecret 'ai-tls' in models[0]",
        ),
        (
            with_models(prod_model(), cluster=prod_raw()["cluster"] | {"autoscaling": "none"}),
            "models[0].replicas: min 1 ≠ max 2 but cluster.autoscaling is none",
        ),
        (
            with_models(prod_model(), cluster=prod_raw()["cluster"] | {"runtimeClassName": "Nvidia"}),
            "cluster.runtimeClassName: must be a Kubernetes name",
        ),
        (with_models(prod_model(), cluster=prod_raw()["cluster"] | {"prometheusUrl": "prometheus:9090"}), "cluster.prometheusUrl:"),
    ],
)
def test_model_config_errors_name_the_key(raw: dict[str, Any], starts: str) -> None:
    message = error_of(raw)
    assert message.startswith(starts), message


def test_prod_model_is_the_seed() -> None:
    (model,) = parse(prod_raw()).models
    assert (model.name, model.hugging_face_id, model.gpus_per_replica, model.gpu_product) == (
        "qwen3",
        "Qwen/Qwen3-8B-AWQ",
        1,
        "nvidia-a100",
    )
    assert (model.replicas.min, model.replicas.max, model.replicas.target_requests_waiting) == (1, 2, 3)
    assert not model.image.endswith(":latest")


def test_allowed_extra_args_and_env_pass() -> None:
    raw = with_models(
        prod_model(extraArgs=["--enable-prefix-caching", "--load-format", "runai_streamer"], env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    )
    (model,) = parse(raw).models
    assert model.extra_args[-1] == "runai_streamer"
