"""The control-plane half of the gateway stand-in: what Envoy Gateway and Envoy AI Gateway would make Envoy do for the
stack's endpoint objects, as the JSON file the data-plane half serves (`extproc-client -serve`, gateway.go there).

Neither control plane runs here (docs/endpoint.md: no Envoy can be had), so this reads the objects as the API server
holds them and applies the vendors' documented semantics, nothing of our own:
- an `AIGatewayRoute`'s `hostnames` and its rules: the `x-ai-eg-model` value each rule matches and the InferencePool it
  sends to, whose `endpointPickerRef` names the picker's Service and port (Envoy reaches the Service's ClusterIP);
  the rule's `timeouts.request`;
- the `SecurityPolicy` targeting the HTTPRoute AI Gateway generates (the route's name): `apiKeyAuth.credentialRefs`,
  every value of those Secrets a key (each data key a client id);
- the `BackendTrafficPolicy` targeting the same: its `responseOverride` entries that apply to Envoy's own answers.
What it cannot show: Envoy's filter order, xDS translation, TLS, route re-selection after the body is read, or any
Envoy Gateway / AI Gateway bug; it shows that the stack's objects, as applied, say what docs/endpoint.md says they do.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from typing import Any

MODEL_HEADER = "x-ai-eg-model"
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


class TranslationError(ValueError):
    """An object the gateway would reject or could not resolve: the message names it."""


def seconds(duration: str) -> float:
    """A Gateway API duration (`600s`, `1h30m`, `500ms`) in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise TranslationError(f"not a Gateway API duration: {duration!r}")
    return sum(int(n) * UNITS[u] for n, u in parts)


def _targets(policy: Mapping[str, Any], route: str) -> bool:
    return any(ref.get("kind") == "HTTPRoute" and ref.get("name") == route for ref in policy["spec"].get("targetRefs", []))


def data_plane_config(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The data plane's file from the namespace's objects (AIGatewayRoute, SecurityPolicy, BackendTrafficPolicy,
    InferencePool, Service, Secret, as `kubectl get -o json` gives them: Secret values base64)."""
    by_kind: dict[str, dict[str, Mapping[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    hosts: dict[str, dict[str, Any]] = {}
    for name, route in sorted(by_kind.get("AIGatewayRoute", {}).items()):
        policies = [p for p in by_kind.get("SecurityPolicy", {}).values() if _targets(p, name)]
        if len(policies) > 1:
            raise TranslationError(f"AIGatewayRoute {name}: {len(policies)} SecurityPolicies target its HTTPRoute")
        keys: list[str] | None = None
        if policies:
            keys = []
            for ref in policies[0]["spec"]["apiKeyAuth"]["credentialRefs"]:
                secret = by_kind.get("Secret", {}).get(ref["name"])
                if secret is None:
                    # Envoy Gateway marks the policy invalid and the route answers 500 to every request.
                    raise TranslationError(f"SecurityPolicy {policies[0]['metadata']['name']}: no Secret {ref['name']}")
                keys += [base64.b64decode(v).decode() for _, v in sorted((secret.get("data") or {}).items())]
        overrides: dict[str, dict[str, str]] = {}
        for policy in by_kind.get("BackendTrafficPolicy", {}).values():
            if not _targets(policy, name):
                continue
            for entry in policy["spec"].get("responseOverride", []):
                if entry.get("source", "All") not in ("Local", "All") or "response" not in entry:
                    continue
                for match in entry["match"].get("statusCodes", []):
                    # The first entry to match wins.
                    overrides.setdefault(str(match["value"]), {"contentType": entry["response"].get("contentType", "text/plain"),
                                                               "body": entry["response"]["body"]["inline"]})
        models = []
        for rule in route["spec"]["rules"]:
            names = [h["value"] for m in rule.get("matches", []) for h in m.get("headers", [])
                     if h["name"].lower() == MODEL_HEADER and h.get("type", "Exact") == "Exact"]
            (ref,) = rule["backendRefs"]
            if ref.get("kind") != "InferencePool":
                raise TranslationError(f"AIGatewayRoute {name}: a rule sends to {ref.get('kind')} {ref['name']}, not a pool")
            pool = by_kind.get("InferencePool", {}).get(ref["name"])
            if pool is None:
                raise TranslationError(f"AIGatewayRoute {name}: no InferencePool {ref['name']}")
            picker = pool["spec"]["endpointPickerRef"]
            service = by_kind.get("Service", {}).get(picker["name"])
            if service is None or not service["spec"].get("clusterIP"):
                raise TranslationError(f"InferencePool {ref['name']}: no Service {picker['name']} for its picker")
            timeout = seconds(rule["timeouts"]["request"]) if rule.get("timeouts", {}).get("request") else 0
            models += [{"name": n, "pool": ref["name"], "picker": f"{service['spec']['clusterIP']}:{picker['port']['number']}",
                        "timeoutSeconds": timeout} for n in names]
        for host in route["spec"]["hostnames"]:
            entry = hosts.setdefault(host, {"keys": keys, "models": [], "overrides": overrides})
            entry["models"] += models
    return {"hosts": hosts}
