"""Rotating a model's API key rolls its servers; rotating the HF token changes only the Secret.

The servers read VLLM_API_KEY through a secretKeyRef at start: without a pod-template change a
rotated key reaches no running server, which keeps accepting the old one."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from components.serving.credentials import ANNOTATION as API_KEY_ANNOTATION
from components.serving.credentials import api_key_digest
from stacks.config import ROLLOUT_SALT_SECRET, parse
from tests.test_config import prod_raw
from tools.render import Render

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
JOB = "kubernetes:batch/v1:Job"
SECRET = "kubernetes:core/v1:Secret"
BASE = {"hfToken": "hf-token-one", "vllmApiKey": "api-key-one", ROLLOUT_SALT_SECRET: "salt-one"}


@pytest.fixture(scope="module")
def renders() -> Callable[..., Render]:
    from tools.render import run_program

    cache: dict[tuple[tuple[str, str], ...], Render] = {}

    def _render(**changed: str) -> Render:
        values = {**BASE, **changed}
        key = tuple(sorted(values.items()))
        if key not in cache:
            cache[key] = run_program("prod", secret_values=values)
        return cache[key]

    return _render


def template_annotations(resource: Any) -> dict[str, str]:
    return resource.inputs["spec"]["template"]["metadata"].get("annotations") or {}


def jobs(render: Render, kind: str) -> list[Any]:
    return [j for j in render.of_type(JOB) if f"-{kind}-" in j.inputs["metadata"]["name"]]


def test_a_new_api_key_rolls_the_servers_and_reruns_the_smoke_test(renders: Callable[..., Render]) -> None:
    before, after = renders(), renders(vllmApiKey="api-key-two")
    (old,), (new,) = before.of_type(DEPLOYMENT), after.of_type(DEPLOYMENT)
    assert template_annotations(old)[API_KEY_ANNOTATION] != template_annotations(new)[API_KEY_ANNOTATION]
    # Only the annotation differs: the rollout is the Deployment's own (maxSurge 0, no spare GPU).
    assert {k: v for k, v in template_annotations(old).items() if k != API_KEY_ANNOTATION} == \
        {k: v for k, v in template_annotations(new).items() if k != API_KEY_ANNOTATION}
    assert new.inputs["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    (smoke_old,), (smoke_new,) = jobs(before, "smoke"), jobs(after, "smoke")
    assert template_annotations(smoke_old) != template_annotations(smoke_new)
    # The download Job never reads the API key: it is not replaced.
    assert [j.inputs for j in jobs(before, "dl")] == [j.inputs for j in jobs(after, "dl")]


def test_the_same_key_and_salt_give_the_same_template(renders: Callable[..., Render]) -> None:
    from tools.render import run_program

    again = run_program("prod", secret_values=BASE)
    assert [d.inputs for d in renders().of_type(DEPLOYMENT)] == [d.inputs for d in again.of_type(DEPLOYMENT)]


def test_the_annotation_is_not_computable_from_the_key_alone(renders: Callable[..., Render]) -> None:
    """Salted with a secret: the same key under another salt shows another value, and neither the
    key nor an unsalted hash of it is anywhere in the Deployment."""
    (first,), (other_salt,) = renders().of_type(DEPLOYMENT), renders(**{ROLLOUT_SALT_SECRET: "salt-two"}).of_type(DEPLOYMENT)
    value = template_annotations(first)[API_KEY_ANNOTATION]
    assert value != template_annotations(other_salt)[API_KEY_ANNOTATION]
    key = BASE["vllmApiKey"].encode()
    text = repr(first.inputs)
    for leak in (BASE["vllmApiKey"], hashlib.sha256(key).hexdigest()[:32], hashlib.sha1(key).hexdigest()[:32],
                 hashlib.md5(key).hexdigest(), BASE[ROLLOUT_SALT_SECRET]):
        assert leak not in text


def test_models_sharing_a_key_show_different_values() -> None:
    assert api_key_digest("salt", "key", "ai", "a") != api_key_digest("salt", "key", "ai", "b")


def test_a_new_hf_token_changes_only_the_secret(renders: Callable[..., Render]) -> None:
    before, after = renders(), renders(hfToken="hf-token-two")
    changed = sorted(r.urn.rsplit("::", 1)[1] for r, s in zip(before.resources, after.resources, strict=True) if r.inputs != s.inputs)
    assert changed == ["qwen3-secrets"]
    assert [r.type for r in after.resources if r.urn.endswith("::qwen3-secrets")] == [SECRET]


def test_the_salt_is_read_only_where_servers_have_a_key() -> None:
    raw = prod_raw()
    assert ROLLOUT_SALT_SECRET in parse(raw).secret_keys()
    raw["models"][0].pop("apiKeySecret")
    raw["models"][0]["ingress"]["authUrl"] = "http://oauth2-proxy.auth.svc/oauth2/auth"
    assert ROLLOUT_SALT_SECRET not in parse(raw).secret_keys()
    # A stack that renders YAML writes no Secret and knows no key: the annotation cannot be made.
    raw = prod_raw()
    raw["cluster"] = {**raw["cluster"], "renderYamlTo": "out"}
    raw["cluster"].pop("kubeconfig")
    assert ROLLOUT_SALT_SECRET not in parse(raw).secret_keys()


def test_a_yaml_rendering_stack_has_no_annotation(render: Callable[..., Render]) -> None:
    cluster = {**prod_raw()["cluster"], "renderYamlTo": "out"}
    cluster.pop("kubeconfig")
    (deployment,) = render(cluster=cluster).of_type(DEPLOYMENT)
    assert API_KEY_ANNOTATION not in template_annotations(deployment)
