"""Issue 15 item 3: a rollout or scale-down lets streams finish (preStop, grace, vLLM's drain, PDB)."""

from __future__ import annotations

import pytest

from components.serving import drain
from components.serving.edge import PROXY_TIMEOUT_S
from components.serving.names import selector_labels
from components.serving.server import container_args
from policy.rules import check_resources
from stacks.config.models import image_version
from tests.test_serving import DEPLOYMENT, container, model_of, one, prod_model
from tools.render import Render

PDB = "kubernetes:policy/v1:PodDisruptionBudget"


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.11.0", (0, 11, 0)),
        ("vllm/vllm-openai:v0.18.0", (0, 18, 0)),
        ("registry.lan:5000/vllm/vllm-openai:0.19.1-cu128", (0, 19, 1)),
        ("vllm/vllm-openai:v0.20", (0, 20, 0)),
        ("vllm/vllm-openai:v0.33.0@sha256:" + "a" * 64, (0, 33, 0)),
        ("vllm/vllm-openai@sha256:" + "a" * 64, None),
        ("registry.lan:5000/vllm/vllm-openai:nightly", None),
    ],
)
def test_vllm_version_from_the_tag(image: str, version: tuple[int, ...] | None) -> None:
    assert image_version(image) == version


@pytest.mark.parametrize(
    ("image", "flag"),
    [("vllm/vllm-openai:v0.17.1", False), ("vllm/vllm-openai:v0.18.0", True), ("vllm/vllm-openai:v1.0.0", True),
     ("vllm/vllm-openai@sha256:" + "b" * 64, False)],
)
def test_shutdown_timeout_only_where_the_image_has_it(image: str, flag: bool) -> None:
    args = container_args(model_of(image=image))
    assert ("--shutdown-timeout=600" in args) is flag


def test_grace_covers_prestop_and_the_longest_stream() -> None:
    assert drain.grace_period_seconds() >= drain.PRESTOP_S + PROXY_TIMEOUT_S
    assert drain.DRAIN_S == PROXY_TIMEOUT_S


def test_prod_pods_drain_before_they_stop(prod: Render) -> None:
    deployment = one(prod, DEPLOYMENT)
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": drain.PRESTOP_S}}}
    assert "--shutdown-timeout=600" in c["args"]  # prod pins a vLLM >= 0.18
    assert pod["terminationGracePeriodSeconds"] == drain.PRESTOP_S + 600 + drain.EXIT_S


def test_prod_has_a_disruption_budget_per_model(prod: Render) -> None:
    pdb = one(prod, PDB)
    assert pdb["metadata"]["name"] == "vllm-qwen3"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == selector_labels(prod.config.models[0])
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_older_image_still_gets_prestop_and_grace(render) -> None:  # type: ignore[no-untyped-def]
    result = render(models=[prod_model(image="vllm/vllm-openai:v0.11.0")])
    deployment = one(result, DEPLOYMENT)
    assert not any(a.startswith("--shutdown-timeout") for a in container(deployment)["args"])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == drain.grace_period_seconds()
    entries = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in result.resources if r.custom]
    assert not [v for v in check_resources(entries) if v.policy == "vllm-graceful-drain"]


def test_docs_say_which_edge_bounds_a_stream() -> None:
    # Issue 24 item 6: proxy-read-timeout is an idle timeout; only the Gateway's timeouts.request
    # bounds a stream. The docs must not claim a bound ingress-nginx does not give, and the gap
    # is listed with what bounds it instead (the drain).
    from testbed.e2e.runbook import documents
    from tools.render import ROOT

    text = "\n".join(path.read_text() for path in documents())
    page = (ROOT / "docs/models.md").read_text()
    assert "the edge's stream timeout" not in text
    assert "`proxy-read-timeout` is an *idle* timeout" in page and "`timeouts.request` (600 s) ends" in page
    (gap,) = [line for line in (ROOT / "docs/failure-modes.md").read_text().splitlines()
              if line.startswith("| a stream runs longer than 600 s behind ingress-nginx")]
    assert "idle timeout" in gap and "--shutdown-timeout=600" in gap and "timeouts.request" in gap
    assert f"--shutdown-timeout={drain.DRAIN_S}" in gap and drain.DRAIN_S == PROXY_TIMEOUT_S
