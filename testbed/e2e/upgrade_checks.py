"""Day two after a release moved a pin (issue #44 item 6): an existing stack upgraded by `pulumi up`.

- `pin-upgrade`: a stack deployed with the device plugin and one model at the old defaults (device plugin `v0.17.0`,
  vLLM `v0.11.0`, set explicitly here) loses both explicit images, as a stack that leaves them unset does when the
  project is upgraded: that `up` updates the plugin's DaemonSets, whose pods roll, and rolls that model (its download
  Job first); the model that names its own image keeps its pods.
- `hold-upgrade`: a stack with a model held at zero, deployed by this project's release before the move from KEDA's
  HTTP add-on v0.12 (HTTPScaledObject) to v0.15 (InterceptorRoute), then upgraded by the current program: the route
  is created before the HTTPScaledObject is deleted, the ScaledObject's trigger is updated in place, and a model
  whose Deployment the upgrade did not change keeps its pods. The add-on's real v0.15.0 interceptor
  (testbed/e2e/held_request.py) holds a request for the model, idle at zero, from before the upgrade to after it, and
  forwards it once the model is woken.

Standing in: kwok for the kubelets, and no KEDA operator or device plugin runs (their CRDs and objects only): the
test scales the held model as KEDA would. A real kubelet keeping a running pod's devices across a plugin restart (its
checkpoint) is not shown.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from stacks.config import DevicePlugin, Model
from testbed import cluster_pins
from testbed.e2e.cluster_checks import SHARED_NODE, SHARED_PRODUCT, _sequence
from testbed.e2e.day_two import _changed, _events, _name
from testbed.e2e.held_request import COLD_START_HEADER, HeldRequest, hold_one, running_interceptor
from testbed.e2e.run import CheckError, require, stack_raw
from testbed.e2e.sharing_checks import MAPS, OPERATOR_NAMESPACE, SharingEndToEnd
from tools.render import ROOT

PLUGIN_STACK = "plugin-upgrade"
OLD_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
"""The default before the pin moved (docs/nodes.md)."""
OLD_VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
"""The models' default image before the pin moved."""
DEFAULT_IMAGE_MODEL = "qwen3-default"
HOLD_STACK = "hold-upgrade"
HELD_MODEL, ALWAYS_ON = "qwen3-rare", "qwen3-chat"
HOLD_RENDERED = 'kind="HTTPScaledObject"'
"""The text whose removal from components/serving/component.py moved the holds to InterceptorRoutes: the base of
`hold-upgrade` is the commit before that change, found in the history rather than named by hash."""


def release_before(text: str, path: str) -> str:
    """The commit before the newest one that added or removed `text` in `path` (`git log -S`)."""
    found = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%H", f"-S{text}", "--", path],
                           capture_output=True, text=True)
    require(found.returncode == 0 and found.stdout.strip(),
            f"no commit in this clone's history changes {text!r} in {path}: `hold-upgrade` needs the full history (git fetch --unshallow)")
    parent = subprocess.run(["git", "-C", str(ROOT), "rev-parse", f"{found.stdout.strip()}^"], capture_output=True, text=True)
    require(parent.returncode == 0, f"{found.stdout.strip()} has no parent in this clone's history")
    return parent.stdout.strip()


class UpgradeEndToEnd(SharingEndToEnd):
    """Stacks upgraded from an old pin."""

    def shared_node_raw(self, namespace: str) -> dict[str, Any]:
        """The time-sliced kwok node of the sharing stack with the few-GPUs stack's always-up model on it; no GPU Feature
        Discovery on kwok: the models select the product label the stack sets."""
        raw = self.sharing_raw()
        raw["nodes"] = [node for node in raw["nodes"] if node["name"] == SHARED_NODE]  # MIG needs the operator's plugin
        raw["cluster"] = {**raw["cluster"], "namespace": namespace, "gpuFeatureDiscovery": False}
        raw["models"] = [{**m, "gpuProduct": SHARED_PRODUCT} for m in stack_raw("fewgpus")["models"] if m["name"] == ALWAYS_ON]
        return raw

    def ready_model_pods(self, namespace: str, model: str | None = None) -> dict[str, str]:
        """uid → start time of the serving pods that are Ready."""
        selector = "app.kubernetes.io/component=inference-server" + (f",app.kubernetes.io/instance={model}" if model else "")
        pods = self.get("pods", "-n", namespace, "-l", selector)["items"]
        return {p["metadata"]["uid"]: p["status"].get("startTime", "") for p in pods
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))}

    # ---- the device plugin's pin ------------------------------------------------------------------

    def plugin_daemon_sets(self) -> dict[str, dict[str, Any]]:
        return {d["metadata"]["name"]: d for d in self.get("daemonsets", "-n", OPERATOR_NAMESPACE)["items"]
                if d["metadata"]["name"].startswith("nvidia-device-plugin")}

    def rolled_to(self, image: str) -> dict[str, dict[str, Any]] | None:
        """The plugin DaemonSets once each runs only `image`, all its pods updated and available (None before)."""
        plugins = self.plugin_daemon_sets()
        for daemon_set in plugins.values():
            status = daemon_set.get("status") or {}
            spec_image = daemon_set["spec"]["template"]["spec"]["containers"][0]["image"]
            desired = status.get("desiredNumberScheduled", -1)
            if (spec_image != image or status.get("observedGeneration") != daemon_set["metadata"]["generation"]
                    or status.get("updatedNumberScheduled", 0) != desired or status.get("numberAvailable", 0) != desired):
                return None
        return plugins or None

    def pin_upgrade(self) -> str:
        self.operator_namespace()
        raw = self.shared_node_raw(PLUGIN_STACK)
        raw["cluster"]["devicePlugin"] = {**raw["cluster"]["devicePlugin"], "enabled": True, "image": OLD_PLUGIN_IMAGE}
        raw["models"].append({**raw["models"][0], "name": DEFAULT_IMAGE_MODEL, "image": OLD_VLLM_IMAGE})
        self.new_stack(PLUGIN_STACK, raw, self.secret_values(raw, "unused"))
        try:
            return self._upgrade_pins()
        finally:
            self.pulumi("destroy", "--yes", "--skip-preview", stack=PLUGIN_STACK, check=False)

    def _upgrade_pins(self) -> str:
        new_plugin, new_vllm = DevicePlugin().image, Model.model_fields["image"].default
        require(new_plugin != OLD_PLUGIN_IMAGE and new_vllm != OLD_VLLM_IMAGE, "the defaults are still the old pins")
        self.sharing_up(self.tmp / "pin-upgrade-events-1.jsonl", stack=PLUGIN_STACK)
        before = self.wait_for(f"the device plugin DaemonSets rolled out at {OLD_PLUGIN_IMAGE}", lambda: self.rolled_to(OLD_PLUGIN_IMAGE))
        old_pods = {p["metadata"]["uid"] for p in self.get("pods", "-n", OPERATOR_NAMESPACE)["items"]}
        require(old_pods, f"no device plugin pod runs on the shared node ({sorted(before)})")
        serving = {m: self.wait_for(f"{m}'s pods Ready", lambda m=m: self.ready_model_pods(PLUGIN_STACK, m))
                   for m in (ALWAYS_ON, DEFAULT_IMAGE_MODEL)}
        # The time-sliced node's config (no MIG node here: the MIG manager is the GPU Operator's, not this plugin's).
        plugin_map = self.get("configmap", MAPS["plugin"][1], "-n", OPERATOR_NAMESPACE)["metadata"]["resourceVersion"]

        def upgrade(config: dict[str, Any]) -> None:
            # What an upgrade of the project does to this stack file: nothing names the images, so the new defaults apply.
            config["gpu-serving:cluster"]["devicePlugin"].pop("image")
            next(m for m in config["gpu-serving:models"] if m["name"] == DEFAULT_IMAGE_MODEL).pop("image")

        self.edit_stack(PLUGIN_STACK, upgrade)
        events_path = self.tmp / "pin-upgrade-events-2.jsonl"
        self.sharing_up(events_path, stack=PLUGIN_STACK)
        log = _events(events_path)
        changed = {_name(urn): op for urn, op in _changed(events_path).items()}
        plugins = {name: op for name, op in changed.items() if "device-plugin" in name}
        require(plugins == {name: "update" for name in plugins} and len(plugins) == len(before),
                f"the upgrade did {plugins} to the device plugin; expected its {len(before)} DaemonSets updated")
        others = {name: op for name, op in changed.items() if name not in plugins and not name.startswith(f"{DEFAULT_IMAGE_MODEL}-")}
        require(not others, f"the upgrade changed {others}, which neither pin is part of")
        require(changed.get(f"{DEFAULT_IMAGE_MODEL}-deployment") == "update", f"{DEFAULT_IMAGE_MODEL} was not rolled: {changed}")
        # The new Job's outputs (its await saw it complete), not those of deleting the old one (as day_two.change_model).
        downloaded = next((int(e["sequence"]) for e in log if (meta := (e.get("resOutputsEvent") or {}).get("metadata") or {})
                           and meta.get("urn", "").endswith(f"::{DEFAULT_IMAGE_MODEL}-download")
                           and not str(meta.get("op")).startswith(("delete", "discard"))), None)
        require(downloaded is not None, f"no outputs of {DEFAULT_IMAGE_MODEL}'s new download Job in the event log")
        rolled = _sequence(log, "resourcePreEvent", f"Deployment::{DEFAULT_IMAGE_MODEL}-deployment")
        require(downloaded < rolled,
                f"{DEFAULT_IMAGE_MODEL}'s rollout began (#{rolled}) before its download Job in the new image (#{downloaded})")
        after = self.wait_for(f"the device plugin DaemonSets rolled out at {new_plugin}", lambda: self.rolled_to(new_plugin))
        require(set(after) == set(before), f"DaemonSets {sorted(before)} became {sorted(after)}")
        new_pods = {p["metadata"]["uid"] for p in self.get("pods", "-n", OPERATOR_NAMESPACE)["items"]}
        require(not old_pods & new_pods, "a device plugin pod of the old pin still runs")
        kept = self.ready_model_pods(PLUGIN_STACK, ALWAYS_ON)
        require(kept == serving[ALWAYS_ON], f"{ALWAYS_ON}, which names its image, was restarted: {serving[ALWAYS_ON]} -> {kept}")
        old_default = serving[DEFAULT_IMAGE_MODEL]
        rolled_pods = self.wait_for(f"{DEFAULT_IMAGE_MODEL}'s new pods Ready", lambda: {
            uid: t for uid, t in self.ready_model_pods(PLUGIN_STACK, DEFAULT_IMAGE_MODEL).items() if uid not in old_default})
        template = self.get("deployment", f"vllm-{DEFAULT_IMAGE_MODEL}", "-n", PLUGIN_STACK)["spec"]["template"]
        image = template["spec"]["containers"][0]["image"]
        require(image == new_vllm, f"{DEFAULT_IMAGE_MODEL} runs {image}, not the new default {new_vllm}")
        now_map = self.get("configmap", MAPS["plugin"][1], "-n", OPERATOR_NAMESPACE)["metadata"]["resourceVersion"]
        require(now_map == plugin_map, "the device plugin's ConfigMap was written by the upgrade")
        self.pulumi("preview", "--expect-no-changes", stack=PLUGIN_STACK)
        pods = sum(d["status"]["desiredNumberScheduled"] for d in after.values())
        return (f"{OLD_PLUGIN_IMAGE} -> {new_plugin}: the {len(after)} plugin DaemonSets updated, their {pods} pod(s) replaced "
                f"and available; {OLD_VLLM_IMAGE} -> {new_vllm}: {DEFAULT_IMAGE_MODEL} rolled after its download Job "
                f"(#{downloaded} < #{rolled}), {len(rolled_pods)} new pod(s) Ready; {ALWAYS_ON} (its own image) kept its "
                f"{len(kept)} pod(s); nothing else changed ({len(changed)} resources), the plugin's ConfigMap unwritten")

    # ---- the HTTP add-on's pin ----------------------------------------------------------------------

    def old_project(self, ref: str) -> Path:
        """The project as `ref` had it, with the venvs the CLI runs in (as copy_project)."""
        folder = self.tmp / "project-before"
        if not folder.exists():
            folder.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref], capture_output=True, check=False)
            if archive.returncode != 0:
                raise CheckError(f"git archive {ref}: {archive.stderr.decode()[-300:]}")
            subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
            (folder / "venv").symlink_to(ROOT / "venv")
            (folder / "policy" / "venv").symlink_to(ROOT / "venv")
        return folder

    def hold_upgrade(self) -> str:
        self.operator_namespace()
        base = release_before(HOLD_RENDERED, "components/serving/component.py")
        raw = self.shared_node_raw(HOLD_STACK)
        raw["cluster"] = {**raw["cluster"], "autoscaling": "keda", "requestHold": {}}
        held = next(m for m in stack_raw("fewgpus")["models"] if m["name"] == HELD_MODEL)
        raw["models"].append({**held, "gpuProduct": SHARED_PRODUCT})
        self.new_stack(HOLD_STACK, raw, self.secret_values(raw, "unused"))
        old = self.old_project(base)
        shutil.copy2(self.project / f"Pulumi.{HOLD_STACK}.yaml", old / f"Pulumi.{HOLD_STACK}.yaml")
        try:
            return self._upgrade_hold(base, old)
        finally:
            self.pulumi("destroy", "--yes", "--skip-preview", stack=HOLD_STACK, check=False)

    def _upgrade_hold(self, base: str, old: Path) -> str:
        # The release before: its program, the same stack (state and config).
        self.pulumi("up", "--yes", "--skip-preview", stack=HOLD_STACK, cwd=old, env={"PULUMI_DEBUG_COMMANDS": "true"})
        hold_name = f"vllm-{HELD_MODEL}-hold"
        require(self.kubectl("get", "httpscaledobject", hold_name, "-n", HOLD_STACK, check=False).returncode == 0,
                f"the release before ({base}) made no HTTPScaledObject {hold_name}")
        old_route = self.get("httpscaledobject", hold_name, "-n", HOLD_STACK)["spec"]
        scaled_object = self.get("scaledobject", f"vllm-{HELD_MODEL}", "-n", HOLD_STACK)
        for model in (ALWAYS_ON, HELD_MODEL):
            self.wait_for(f"{model}'s pods Ready", lambda model=model: self.ready_model_pods(HOLD_STACK, model))
        kept_pods = self.ready_model_pods(HOLD_STACK, ALWAYS_ON)
        kept_deployment = self.get("deployment", f"vllm-{ALWAYS_ON}", "-n", HOLD_STACK)

        # A request held by the real v0.15 interceptor across the switch: the model idle at zero (as KEDA leaves it),
        # a request arrives under the HTTPScaledObject's route, the upgrade runs, and only then the model wakes.
        binary = Path(self.cluster_env["GS_CLUSTER_BIN"]) / f"interceptor-{cluster_pins()['HTTP_ADD_ON_VERSION']}"
        target = old_route["scaleTargetRef"]
        with running_interceptor(binary, self.cluster_env["KUBECONFIG"], int(self.cluster_env["GS_CLUSTER_PORT"]), HOLD_STACK,
                                 target["service"], int(target["port"]), self.tmp) as (interceptor, model):
            self.scale_held(target["service"], 0)
            host, body = old_route["hosts"][0], {"model": HELD_MODEL, "prompt": "held across the upgrade", "max_tokens": 4}
            held = hold_one(interceptor, host, f"{old_route['pathPrefixes'][0]}/completions", body)

            events_path = self.tmp / "hold-upgrade-events.jsonl"
            self.sharing_up(events_path, stack=HOLD_STACK)
            require(not held.done, f"the request held under the HTTPScaledObject ended during the upgrade: {held.describe()}")
            route = self.get("interceptorroute", hold_name, "-n", HOLD_STACK)
            require(route["spec"]["target"] == {"service": target["service"], "port": target["port"]},
                    f"the route's target {route['spec']['target']} is not the HTTPScaledObject's {target}")
            self.scale_held(target["service"], 1)
            require(held.wait(120), f"the held request was not answered within 120 s of the model waking: {interceptor.log_tail()}")
            upstream = f"{target['service']}.{HOLD_STACK}:{target['port']}"
            require(held.status == 200 and held.answer().get("upstream") == upstream,
                    f"the held request's answer is {held.describe()}, not the model's ({upstream})")
            require(held.headers.get(COLD_START_HEADER) == "true", f"the interceptor did not hold it for a cold start: {held.headers}")
            after = HeldRequest(interceptor, host, f"{old_route['pathPrefixes'][0]}/completions", body)
            require(after.wait(30) and after.status == 200 and after.headers.get(COLD_START_HEADER) == "false",
                    f"a request after the upgrade (the route alone) was answered {after.describe()}")
            require(len(model.requests) == 2, f"the model was sent {len(model.requests)} requests for 2: {model.requests}")
            held_seconds = (held.answered or 0) - held.sent

        log = _events(events_path)
        changed = {_name(urn): op for urn, op in _changed(events_path).items()}
        hold_changes = {name: op for name, op in changed.items() if HELD_MODEL in name and ("hold" in name or "route" in name
                                                                                            or "scaled-object" in name or "keda" in name)}
        routed = _sequence(log, "resOutputsEvent", f"InterceptorRoute::{HELD_MODEL}-interceptor-route")
        deleted = _sequence(log, "resourcePreEvent", f"HTTPScaledObject::{HELD_MODEL}-http-scaled-object")
        require(routed < deleted, f"the HTTPScaledObject's deletion began (event {deleted}) before the route existed ({routed})")
        require(self.kubectl("get", "httpscaledobject", hold_name, "-n", HOLD_STACK, check=False).returncode != 0,
                "the HTTPScaledObject is still there after the up")
        require(route["spec"]["rules"][0]["hosts"] == old_route["hosts"], f"the route's hosts {route['spec']['rules']} are not "
                                                                          f"the HTTPScaledObject's {old_route['hosts']}")
        after_object = self.get("scaledobject", f"vllm-{HELD_MODEL}", "-n", HOLD_STACK)
        require(after_object["metadata"]["uid"] == scaled_object["metadata"]["uid"], "the ScaledObject was replaced, not updated")
        wake = [t["metadata"] for t in after_object["spec"]["triggers"] if t["type"] == "external-push"]
        require(wake and wake[0].get("interceptorRoute") == hold_name and "httpScaledObject" not in wake[0],
                f"the ScaledObject's wake trigger is {wake}")
        hold_service = f"{HELD_MODEL}-hold-service"
        require(hold_service not in changed, f"the hold Service changed: {changed.get(hold_service)}")
        # The model the upgrade did not change keeps its pods (the held one was scaled to zero and woken above).
        now = self.get("deployment", f"vllm-{ALWAYS_ON}", "-n", HOLD_STACK)
        require(now["metadata"]["generation"] == kept_deployment["metadata"]["generation"],
                f"the upgrade changed {ALWAYS_ON}'s Deployment: {changed.get(f'{ALWAYS_ON}-deployment')}")
        require(self.ready_model_pods(HOLD_STACK, ALWAYS_ON) == kept_pods, f"{ALWAYS_ON}'s pods changed though its Deployment did not")
        # The same release before scraped each model with a PodMonitor of its own: the namespace's one is there
        # before either goes, so no scrape cycle finds no PodMonitor (the queries count a pod seen twice once).
        monitored = _sequence(log, "resOutputsEvent", "::cluster-servers-monitor")
        unmonitored = min(_sequence(log, "resourcePreEvent", f"::{model}-pod-monitor") for model in (ALWAYS_ON, HELD_MODEL))
        require(monitored < unmonitored, f"a model's PodMonitor began to go (event {unmonitored}) before the namespace's one "
                                         f"existed ({monitored})")
        scraped = self.servers_scraped(HOLD_STACK)
        self.pulumi("preview", "--expect-no-changes", stack=HOLD_STACK)
        self.report["figures"]["holdUpgradeChanges"] = len(changed)
        self.report["figures"]["holdUpgradeHeldSeconds"] = round(held_seconds, 1)
        return (f"from {base[:12]} (HTTPScaledObject): the route {hold_name} created (#{routed}) before the HTTPScaledObject's "
                f"deletion began (#{deleted}); ScaledObject updated in place, its trigger now interceptorRoute; hold changes "
                f"{hold_changes}; {len(changed)} resource(s) changed in all; {ALWAYS_ON}'s pods kept (Deployment unchanged); "
                f"route timeouts {route['spec'].get('timeouts')}; a request held by the real interceptor under the "
                f"HTTPScaledObject for {held_seconds:.0f} s across the upgrade, answered 200 from {upstream} (cold start) "
                f"once the model woke; the next request through the route alone 200 at once; the namespace's PodMonitor "
                f"(#{monitored}) before the models' went (#{unmonitored}): {scraped}")

    def scale_held(self, service: str, replicas: int) -> None:
        """The held model's Deployment to `replicas`, as KEDA would, and its Service's EndpointSlices to match (the
        interceptor holds requests on them): none ready at 0, one at 1."""
        self.kubectl("scale", "deployment", f"vllm-{HELD_MODEL}", f"--replicas={replicas}", "-n", HOLD_STACK)

        def ready_endpoints() -> int:
            slices = self.get("endpointslices", "-n", HOLD_STACK, "-l", f"kubernetes.io/service-name={service}")["items"]
            return sum(1 for s in slices for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready"))
        self.wait_for(f"{replicas} ready endpoint(s) of {service}", lambda: ready_endpoints() == replicas or None)
