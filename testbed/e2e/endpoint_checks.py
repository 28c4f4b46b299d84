"""The teams' endpoint (issue #43) on the loopback cluster: the node-cache stack of cache_checks.py put behind
`cluster.endpoint` with two teams, then one team's key rotated.

Real: the API server with the pinned CRDs (InferencePool, AIGatewayRoute, SecurityPolicy, BackendTrafficPolicy), the
engine's ordering and diff (a rotation is an update of one Secret), the scheduler and the Deployment controller for
the pickers. Standing in: kwok for the kubelets (the picker pods are Ready without running the picker; its real proof
is on the lab VM's kubelet); no gateway runs, so no request goes through the routes (docs/endpoint.md says what needs
Envoy)."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

from testbed.e2e.cache_checks import CACHE_MODEL, CACHE_NAMESPACE, CacheEndToEnd
from testbed.e2e.run import require

ENDPOINT_CHECKS = ("endpoint-up", "endpoint-rotate-key")
TEAMS = ("team-a", "team-b")
CPU_NODE = "cpu-a"
"""The pickers need no GPU and do not tolerate the GPU taint: a node without it, as every cluster has for its controllers."""


def team_key(team: str) -> str:
    return f"{team.replace('-', '')}ApiKey"


@dataclass
class EndpointEndToEnd(CacheEndToEnd):
    """The endpoint checks, after the node-cache checks, on their stack."""

    def team_secret(self, team: str) -> dict[str, Any]:
        return self.get("secret", "-n", CACHE_NAMESPACE, f"gs-tenant-{team}")

    def endpoint_up(self) -> str:
        nodes = self.cluster_sh("nodes", "--node", f"{CPU_NODE}:0:8:16Gi").stdout
        self.kubectl("apply", "-f", "-", stdin=nodes)
        before = self.pod_starts(CACHE_NAMESPACE)

        def edit(config: dict[str, Any]) -> None:
            cluster = config["gpu-serving:cluster"]
            cluster["gateway"] = {"name": "ai-gateway", "namespace": "envoy-gateway-system"}
            cluster["endpoint"] = {"domain": "ai.example.com", "pickerImage": "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"}
            cluster["network"] = {**cluster.get("network", {}), "apiServerCidrs": ["127.0.0.1/32"]}
            config["gpu-serving:tenants"] = [{"name": team, "apiKeySecrets": [team_key(team)], "models": [CACHE_MODEL]}
                                             for team in TEAMS]

        self.edit_stack("cache", edit)
        for team in TEAMS:
            self.canaries[team_key(team)] = f"gs-canary-{team_key(team)}-{secrets.token_hex(8)}"
            self.pulumi("config", "set", "--secret", team_key(team), stack="cache", stdin=self.canaries[team_key(team)])
        self.timed("upEndpointSeconds", "up", "--yes", "--skip-preview", stack="cache", timeout=900)
        pool = self.get("inferencepool", "-n", CACHE_NAMESPACE, f"vllm-{CACHE_MODEL}")
        picker = pool["spec"]["endpointPickerRef"]["name"]
        deployment = self.get("deployment", "-n", CACHE_NAMESPACE, picker)
        require(deployment["status"].get("readyReplicas") == 1, f"picker {picker} not ready: {deployment['status']}")
        picker_pods = self.get("pods", "-n", CACHE_NAMESPACE, "-l", "app.kubernetes.io/component=endpoint-picker")["items"]
        (on,) = [p["spec"]["nodeName"] for p in picker_pods]
        taints = [t["key"] for t in self.get("node", on)["spec"].get("taints", [])]
        require("nvidia.com/gpu" not in taints, f"the picker runs on {on}, a GPU node ({taints})")
        for team in TEAMS:
            route = self.get("aigatewayroute", "-n", CACHE_NAMESPACE, f"gs-{team}")
            require(route["spec"]["hostnames"] == [f"{team}.ai.example.com"], f"gs-{team} hosts {route['spec']['hostnames']}")
            policy = self.get("securitypolicy", "-n", CACHE_NAMESPACE, f"gs-{team}")
            refs = [r["name"] for r in policy["spec"]["apiKeyAuth"]["credentialRefs"]]
            require(refs == [f"gs-tenant-{team}"], f"gs-{team}'s key check reads {refs}")
            held = base64.b64decode(self.team_secret(team)["data"][team]).decode()
            require(held == self.canaries[team_key(team)], f"gs-tenant-{team} does not hold the team's key")
        after = self.pod_starts(CACHE_NAMESPACE)
        moved = [name for name, start in before.items() if after.get(name) != start]
        require(not moved, f"serving pods restarted by putting the model on the endpoint: {moved}")
        self.pulumi("preview", "--expect-no-changes", stack="cache")
        scraped = self.servers_scraped(CACHE_NAMESPACE)  # with a picker beside the servers now
        return (f"InferencePool vllm-{CACHE_MODEL} with picker {picker} Ready on {on} (no GPU taint); per team an AIGatewayRoute on "
                f"its own host, a SecurityPolicy reading only its Secret, the Secret holding its key; the {len(before)} serving "
                f"pods kept (same UIDs and start times); then no changes; {scraped}")

    def endpoint_rotate_key(self) -> str:
        """A team's key rotated: one Secret updated, every pod kept, the other team's Secret untouched."""
        team, other = TEAMS
        before, other_version = self.pod_starts(CACHE_NAMESPACE), self.team_secret(other)["metadata"]["resourceVersion"]
        new = f"gs-canary-{team_key(team)}-rotated-{secrets.token_hex(8)}"
        self.canaries[f"{team_key(team)}Rotated"] = new
        self.pulumi("config", "set", "--secret", team_key(team), stack="cache", stdin=new)
        self.pulumi("up", "--yes", "--skip-preview", stack="cache", timeout=600)
        changes = self.last_update_changes("cache")
        # An update in place (the provider's enableSecretMutable): a replacement would delete the Secret first.
        require(changes.get("update") == 1 and not {"create", "delete", "replace"} & set(changes),
                f"the rotation changed {changes}, expected one update (the team's Secret, in place)")
        held = base64.b64decode(self.team_secret(team)["data"][team]).decode()
        require(held == new, f"gs-tenant-{team} does not hold the new key")
        require(self.team_secret(other)["metadata"]["resourceVersion"] == other_version, f"gs-tenant-{other} was written")
        after = self.pod_starts(CACHE_NAMESPACE)
        require(after == before, f"pods changed by a key rotation: {sorted(set(before.items()) ^ set(after.items()))}")
        return (f"{team}'s key rotated: the up updated its Secret only ({changes}); {other}'s Secret untouched; all "
                f"{len(after)} pods (serving and picker) kept their UIDs and start times")
