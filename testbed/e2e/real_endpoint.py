"""The one-URL checks of the real-node run (issue #43): the example endpoint stack's three models and two teams, each
team's requests through its one base URL, answered by the right model's pods, on the same joined VM as the picker
checks (testbed/e2e/real_picker.py), after them.

Real: the stack's objects as `tools.render` renders the example (docs/examples/Pulumi.endpoint.yaml) into this
namespace: for each of qwen3 (two LoRA adapters), mistral and embed its InferencePool and picker (ServiceAccount, Role,
RoleBinding, ConfigMap, Deployment, Service, NetworkPolicy; the one change of `on_the_lab_node`), and per team its
AIGatewayRoute, SecurityPolicy and BackendTrafficPolicy, all applied to the API server; each team's Secret shaped as
the stack writes it (components/endpoint.py `client_ids`), with keys made here; the pickers (GAIE v1.5.0) choosing
each request's pod; llm-d-inference-sim pods as the models' servers (qwen3's serving its adapters, embed answering
/v1/embeddings).
Standing in: Envoy with Envoy Gateway and AI Gateway, by testbed/endpoint/standin_gateway.py (the objects read from
the API server, as those control planes would read them) and `extproc-client -serve` in the guest (key check, route
by host and body `model`, ext_proc to the pool's picker, the request streamed to the pod it names). What that cannot
show is in docs/endpoint.md; the stand-in is named in every check's line.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import time
from typing import Any

import yaml

from components.endpoint import client_ids, tenant_secret_name
from stacks.config.endpoint import Tenant
from testbed.e2e.real_picker import EXAMPLE, model_picker_objects, model_simulators, on_the_lab_node, render_example
from testbed.e2e.run import require
from testbed.endpoint.standin_gateway import data_plane_config

ONE_URL_CHECKS = ("endpoint-one-url", "endpoint-one-url-rotate-key")
NEW_POOLS = ("qwen3", "embed")
"""The example's models that the picker checks did not bring up (mistral's pool is theirs)."""
TEAM_KINDS = ("AIGatewayRoute", "SecurityPolicy", "BackendTrafficPolicy")
GATEWAY_PORT = 8088
GATEWAY_CONFIG = "/var/tmp/standin-gateway.json"
STREAM_LATENCY_MS = 40
"""The new simulators' time per token: a stream long enough to see whether it arrives token by token."""


class OneUrlChecks:
    """Mixed into the real-node run after PickerChecks (uses its kubectl, VM, tunnels and picker set-up)."""

    one_url: dict[str, Any] | None = None

    def one_url_checks(self, needs: tuple[str, ...]) -> None:
        self.check("endpoint-one-url", self.endpoint_one_url, needs=needs)
        self.check("endpoint-one-url-rotate-key", self.endpoint_one_url_rotate_key, needs=("endpoint-one-url",))
        if self.one_url is not None:
            self.vm.ssh("pkill -f -- '-serve /var/tmp/' || true", check=False)
            self.kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found", stdin=self.one_url["manifest"], check=False)

    # ---- set-up -----------------------------------------------------------------------------

    def one_url_up(self) -> dict[str, Any]:
        if self.one_url is not None:
            return self.one_url
        from testbed.node import images as node_images

        picker = self.picker_up()
        start = time.monotonic()
        ns = self.picker_namespace
        names = node_images.picker_names()
        documents = render_example(ns, self.picker_images.pinned(names["epp"]), self.tmp / "picker")
        stack = yaml.safe_load(EXAMPLE.read_text())["config"]
        tenants = [Tenant.model_validate(t) for t in stack["gpu-serving:tenants"]]
        adapters = {m["name"]: [a["name"] for a in (m.get("lora") or {}).get("adapters", [])] for m in stack["gpu-serving:models"]}
        objects: list[dict[str, Any]] = []
        servers: list[dict[str, Any]] = []
        pickers: dict[str, str] = {}
        for model in NEW_POOLS:
            pool_objects = on_the_lab_node(model_picker_objects(documents, model))
            objects += pool_objects
            servers.append(self.simulator(model, adapters[model], pool_objects[0]["spec"]["selector"]["matchLabels"]))
            (deployment,) = [o for o in pool_objects if o["kind"] == "Deployment"]
            pickers[model] = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        team = [d for d in documents if d["kind"] in TEAM_KINDS]
        require(sorted(d["kind"] for d in team) == sorted(TEAM_KINDS * len(tenants)),
                f"the render's team objects: {sorted(d['kind'] for d in team)}")
        keys = {t.name: [f"sk-{t.name}-{secrets.token_hex(12)}"] for t in tenants}
        manifest = yaml.safe_dump_all([*objects, *servers, *team, *(self.team_secret(t, keys[t.name]) for t in tenants)],
                                      sort_keys=False)
        self.kubectl("apply", "-f", "-", stdin=manifest)
        pools = {model: ",".join(f"{k}={v}" for k, v in d["spec"]["selector"]["matchLabels"].items())
                 for d in documents if d["kind"] == "InferencePool" for model in [d["metadata"]["name"].removeprefix("vllm-")]}
        # Four pods start at once on the one emulated node (two simulators, two pickers): 3 to 4 minutes there on a
        # loaded host (2026-12-07),
        # 484 s once with other work beside it: so a wait of its own per pod, over that.
        for model in NEW_POOLS:
            self.wait_for(f"{model}'s simulator Ready", lambda m=model: self.pool_pods(pools[m], ready=1), 600)
            self.wait_for(f"{model}'s picker Ready", lambda s=pickers[model]: self.ready_one(s), 600)
        self.vm.put_file(picker["client"].read_bytes(), "/var/tmp/extproc-client", "0755")
        self.one_url = {"manifest": manifest, "tenants": {t.name: t for t in tenants}, "keys": keys, "pools": pools,
                        "served_by": {name: model for model, names in adapters.items() for name in (model, *names)},
                        "hosts": {t.name: f"{t.name}.{stack['gpu-serving:cluster']['endpoint']['domain']}" for t in tenants}}
        self.push_gateway_config()
        self.vm.ssh(f"setsid nohup /var/tmp/extproc-client -serve {GATEWAY_CONFIG} -listen 127.0.0.1:{GATEWAY_PORT} "
                    ">/var/tmp/standin-gateway.log 2>&1 < /dev/null & sleep 1", timeout=60)
        self.one_url["port"] = self.tunnel(f"127.0.0.1:{GATEWAY_PORT}")
        # Each picker answers once its caches synced (real_picker.py): the first request per model that is answered.
        for model in ("qwen3", "mistral", "embed"):
            team = next(t for t in tenants if model in t.models or any(a in t.models for a in adapters[model]))
            served = model if model in team.models else next(a for a in adapters[model] if a in team.models)
            self.wait_for(f"a first answer from {served} through team {team.name}'s URL",
                          lambda t=team.name, s=served: self.call(t, s)[0] == 200, 180)
        self.report["figures"]["oneUrlSetupSeconds"] = round(time.monotonic() - start, 1)
        return self.one_url

    def simulator(self, model: str, adapters: list[str], selector: dict[str, str]) -> dict[str, Any]:
        from testbed.node import images as node_images

        names = node_images.picker_names()
        sim = model_simulators(self.picker_namespace, model, selector, self.picker_images.pinned(names["llm-d-inference-sim"]),
                               self.raw["cluster"]["smokeImage"], replicas=1)
        args = sim["spec"]["template"]["spec"]["containers"][0]["args"]
        args.append(f"--inter-token-latency={STREAM_LATENCY_MS}ms")
        if adapters:
            # vLLM's --lora-modules as the simulator reads it: one JSON object per adapter.
            args += [f"--max-loras={len(adapters)}", "--lora-modules",
                     *(json.dumps({"name": a, "path": f"/adapters/{a}", "base_model_name": model}) for a in adapters)]
        return sim

    def team_secret(self, tenant: Tenant, keys: list[str]) -> dict[str, Any]:
        """The team's Secret as the stack writes it: one data key per client id."""
        data = {cid: base64.b64encode(k.encode()).decode() for cid, k in zip(client_ids(tenant.model_copy(
            update={"api_key_secrets": [f"k{i}" for i in range(len(keys))]})), keys, strict=True)}
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                "metadata": {"name": tenant_secret_name(tenant), "namespace": self.picker_namespace}}

    def push_gateway_config(self) -> dict[str, Any]:
        """What Envoy Gateway and AI Gateway would push to Envoy, from the objects as the API server holds them now."""
        ns = self.picker_namespace
        kinds = "aigatewayroutes,securitypolicies,backendtrafficpolicies,inferencepools,services,secrets"
        config = data_plane_config(self.get(kinds, "-n", ns)["items"])
        body = json.dumps(config, indent=1).encode()
        self.vm.put_file(body, GATEWAY_CONFIG + ".new", "0600")
        self.vm.ssh(f"mv {GATEWAY_CONFIG}.new {GATEWAY_CONFIG}")
        return config

    # ---- tools ------------------------------------------------------------------------------

    def call(self, team: str, model: str | None, *, key: str | None = "team", path: str = "/v1/chat/completions",
             stream: bool = False, host: str | None = None) -> tuple[int, dict[str, str], bytes, list[float]]:
        """One request to `team`'s URL (its host) with its first key (or `key`): status, headers, body, and the times
        (s from the response's headers, so that the pick's time is not counted) at which each part of the body arrived."""
        state = self.one_url
        assert state is not None
        headers = {"Host": host or state["hosts"][team], "Content-Type": "application/json"}
        key = state["keys"][team][0] if key == "team" else key
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        if model is None:
            method, body = "GET", None
        elif path == "/v1/embeddings":
            method, body = "POST", json.dumps({"model": model, "input": "which pod answers?"})
        else:
            method = "POST"
            body = json.dumps({"model": model, "messages": [{"role": "user", "content": "which pod answers?"}],
                               "max_tokens": 8, "stream": stream, **({"ignore_eos": True} if stream else {})})
        connection = http.client.HTTPConnection("127.0.0.1", state["port"], timeout=120)
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        start = time.monotonic()
        parts, times = [], []
        while chunk := response.read1(65536):
            parts.append(chunk)
            times.append(time.monotonic() - start)
        connection.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, b"".join(parts), times

    def models_listed(self, team: str, key: str | None = "team") -> list[str]:
        status, _, body, _ = self.call(team, None, key=key, path="/v1/models")
        require(status == 200, f"GET /v1/models as {team}: {status} {body[:200]!r}")
        return [m["id"] for m in json.loads(body)["data"]]

    def answered_by(self, team: str, model: str, path: str = "/v1/chat/completions") -> str:
        """Sends `model` through `team`'s URL; requires a 200 whose body names `model` from a pod of the pool its route
        names; returns that pod's address."""
        status, headers, body, _ = self.call(team, model, path=path)
        require(status == 200, f"{model} through {team}'s URL: {status} {body[:300]!r}")
        answer = json.loads(body)
        require(answer.get("model") == model, f"{model} through {team}'s URL was answered as {answer.get('model')!r}")
        endpoint = headers.get("x-gs-standin-endpoint", "")
        pool = self.pool_of(model)
        ips = {p["status"]["podIP"] for p in self.pool_pods(self.one_url["pools"][pool]) or []}
        require(endpoint.split(":")[0] in ips, f"{model} was answered by {endpoint}, not a pod of pool vllm-{pool} ({sorted(ips)})")
        return endpoint

    def pool_of(self, served: str) -> str:
        """The model (and pool) a served name belongs to: itself, or the base model of an adapter."""
        assert self.one_url is not None
        return str(self.one_url["served_by"][served])

    def refused(self, team: str, model: str | None, status: int, code: str, **kw: Any) -> bytes:
        got, headers, body, _ = self.call(team, model, **kw)
        require(got == status, f"{model} as {team} ({kw}): {got}, not {status}: {body[:200]!r}")
        require(headers.get("content-type") == "application/json", f"{model} as {team}: {headers.get('content-type')}")
        require(json.loads(body)["error"]["code"] == code, f"{model} as {team}: {body[:200]!r}")
        return body

    # ---- checks -----------------------------------------------------------------------------

    def endpoint_one_url(self) -> str:
        state = self.one_url_up()
        require(self.models_listed("apps") == ["qwen3", "qwen3-sql", "qwen3-support", "mistral"],
                f"apps lists {self.models_listed('apps')}")
        require(self.models_listed("data") == ["qwen3-sql", "embed"], f"data lists {self.models_listed('data')}")
        answered = {f"apps:{m}": self.answered_by("apps", m) for m in ("qwen3", "qwen3-support", "mistral")}
        answered["data:qwen3-sql"] = self.answered_by("data", "qwen3-sql")
        answered["data:embed"] = self.answered_by("data", "embed", path="/v1/embeddings")
        # Another team's model and a model that does not exist: the same answer, so a key cannot probe names.
        forbidden = self.refused("data", "mistral", 404, "model_not_found")
        unknown = self.refused("data", "gpt-4o", 404, "model_not_found")
        require(forbidden == unknown, f"another team's model answered {forbidden!r}, an unknown one {unknown!r}")
        self.refused("apps", "embed", 404, "model_not_found")
        # A team's key on the other team's URL, no key, a wrong key.
        self.refused("apps", "qwen3-sql", 401, "invalid_api_key", host=state["hosts"]["data"])
        self.refused("apps", "qwen3", 401, "invalid_api_key", key=None)
        self.refused("apps", "qwen3", 401, "invalid_api_key", key="sk-not-a-key")
        require(self.call("data", None, path="/v1/models", host=state["hosts"]["apps"])[0] == 401,
                "data's key listed apps' models")
        # Streamed through: the first token reaches the client while the rest are still being generated.
        status, _, body, times = self.call("apps", "qwen3", stream=True)
        events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
        require(status == 200 and events[-1] == "data: [DONE]" and len(events) >= 9, f"the stream: {status} {body[-200:]!r}")
        require(len(times) > 1 and times[0] < 0.8 * times[-1],
                f"the stream arrived in {len(times)} parts at {[round(t, 2) for t in times[:3]]}…{round(times[-1], 2)} s")
        log = self.vm.ssh("cat /var/tmp/standin-gateway.log", check=False).stdout
        leaked = [k for ks in state["keys"].values() for k in ks if k in log]
        require(not leaked, "a key is in the stand-in gateway's log")
        return (f"Envoy standing in (standin_gateway.py + extproc-client -serve); 3 pools, 3 real pickers, 4 simulator pods: "
                f"apps lists qwen3, qwen3-sql, qwen3-support, mistral and data qwen3-sql, embed; each served name answered "
                f"by a pod of its pool, the picker choosing ({', '.join(f'{k} -> {v}' for k, v in answered.items())}); "
                f"data -> mistral and -> an unknown model: the same 404 model_not_found (the stack's BackendTrafficPolicy "
                f"body); apps' key on data's URL, no key, a wrong key: 401 invalid_api_key; a streamed completion of "
                f"{len(events) - 1} events in {len(times)} parts, the first {times[0]:.2f} s after the headers, the last "
                f"{times[-1]:.2f} s")

    def endpoint_one_url_rotate_key(self) -> str:
        state = self.one_url_up()
        apps = state["tenants"]["apps"]
        old, new = state["keys"]["apps"][0], f"sk-apps-{secrets.token_hex(12)}"
        before = self.pod_starts(self.picker_namespace)
        # Step 1 of a rotation (docs/endpoint.md): both keys in the team's Secret, as `apiKeySecrets: [old, next]` renders it.
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(self.team_secret(apps, [old, new])))
        self.push_gateway_config()
        both = [self.models_listed("apps", key=k) for k in (old, new)]
        require(both[0] == both[1] == ["qwen3", "qwen3-sql", "qwen3-support", "mistral"], f"during the rotation: {both}")
        require(self.call("apps", "mistral", key=new)[0] == 200, "the new key cannot call mistral")
        # Step 2: the old key dropped.
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(self.team_secret(apps, [new])))
        self.push_gateway_config()
        self.refused("apps", "qwen3", 401, "invalid_api_key", key=old)
        require(self.call("apps", "qwen3", key=new)[0] == 200, "the new key alone cannot call qwen3")
        require(self.models_listed("data") == ["qwen3-sql", "embed"], "data's key stopped working")
        self.answered_by("data", "qwen3-sql")
        after = self.pod_starts(self.picker_namespace)
        changed = sorted(p for p in before if after.get(p) != before[p])
        require(not changed, f"pods restarted or replaced during the rotation: {changed}")
        state["keys"]["apps"] = [new]
        ids = client_ids(apps.model_copy(update={"api_key_secrets": ["a", "b"]}))
        return (f"Envoy standing in: apps' Secret given a second key (client ids {ids}), "
                f"both keys list and call apps' models; the old key dropped: 401, the new one answers; data's key lists and "
                f"calls throughout; all {len(before)} pods of the namespace (3 pickers, simulators, the node's own) kept their UIDs "
                "and start times")
