"""The component package from other languages (docs/package.md): the YAML and TypeScript examples, the package
added to each as a user adds it, on the real engine and the loopback cluster."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stacks.config import parse
from testbed.e2e.group_checks import GroupEndToEnd
from testbed.e2e.run import CheckError, require, stack_raw, stack_yaml, tail

# The Python program's stack previewed for the comparison (the e2e's "lab" stack is the lab VM's).
REFERENCE = "package-reference"
PACKAGE_CHECKS = ("package-preview", "package-wrong-arg", "package-up")
EXAMPLES = ("yaml", "typescript")
# What only a program using the package declares: the component itself and its provider.
PACKAGE_ONLY = ("gpu-serving:index:", "pulumi:providers:gpu-serving", "pulumi:pulumi:Stack")
# The YAML example's `up`: a kwok node of its own (the fit nodes are free once per-node-fit has run) and NFS for the
# weights, so that no step runs over SSH and nothing of the cluster stack's is touched.
UP_NODE, UP_PRODUCT, UP_NAMESPACE = "fit-a", "e2e-package", "ai-package"


def declared(preview: dict[str, Any]) -> dict[str, Any]:
    """`type::name` → inputs of every resource a `preview --json` declares, but what only the package adds. An
    archive's path is left out (the package's is absolute, where the package was cloned); its hash stays."""
    resources = {}
    for step in preview.get("steps", []):
        urn = step["urn"]
        kind, name = urn.split("::")[2].split("$")[-1], urn.split("::")[3]
        if kind.startswith(PACKAGE_ONLY):
            continue
        resources[f"{kind}::{name}"] = _without_paths((step.get("newState") or {}).get("inputs") or {})
    return resources


def _without_paths(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items() if not (k == "path" and "hash" in value)}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    return value


def differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = [f"missing {key}" for key in sorted(set(want) - set(got))]
    out += [f"extra {key}" for key in sorted(set(got) - set(want))]
    for key in sorted(set(want) & set(got)):
        if want[key] != got[key]:
            fields = sorted(k for k in set(want[key]) | set(got[key]) if want[key].get(k) != got[key].get(k))
            out.append(f"{key}: {', '.join(fields)}")
    return out


@dataclass
class PackageEndToEnd(GroupEndToEnd):
    """Checks of the component package, on the cluster the cluster checks started."""

    def example(self, language: str) -> Path:
        return self.project / "examples" / language

    def add_package(self, language: str) -> Path:
        """The example as a user has it: its dependencies, `pulumi package add` of the package, its kubeconfig
        (.kube/lab.yaml, the loopback cluster's), its secrets."""
        folder = self.example(language)
        figures = self.report["figures"]
        self.lab_kubeconfig(folder)
        start = time.monotonic()
        if language == "typescript":
            self.logged(["npm", "install", "--no-audit", "--no-fund"], shown="npm install", cwd=folder, timeout=600)
        figures[f"package{language.title()}InstallSeconds"] = round(time.monotonic() - start, 1)
        start = time.monotonic()
        self.pulumi("package", "add", str(self.project / "package"), cwd=folder, timeout=900)
        figures[f"package{language.title()}AddSeconds"] = round(time.monotonic() - start, 1)
        self.example_stack(folder, "lab", stack_raw("lab"))
        return folder

    def lab_kubeconfig(self, folder: Path) -> None:
        """The loopback cluster's kubeconfig where the lab document points: `folder`/.kube/lab.yaml."""
        kube = folder / ".kube" / "lab.yaml"
        kube.parent.mkdir(exist_ok=True)
        shutil.copy(self.cluster_env["KUBECONFIG"], kube)

    def example_stack(self, folder: Path, stack: str, raw: dict[str, Any]) -> None:
        """A stack of the example in `folder` with a canary for each secret the document `raw` names."""
        self.pulumi("stack", "init", stack, "--secrets-provider", "passphrase", cwd=folder)
        values = self.secret_values(raw, self.canaries["sshPrivateKey"])
        for key in parse(raw).secret_keys():
            self.pulumi("config", "set", "--secret", key, stack=stack, stdin=values[key], cwd=folder)

    def package_preview(self) -> str:
        """Each example previews the lab stack's document: the same resources with the same inputs as the Python
        program's preview of Pulumi.lab.yaml, on the same cluster."""
        raw = stack_raw("lab")
        self.lab_kubeconfig(self.project)
        self.new_stack(REFERENCE, raw, self.secret_values(raw, self.canaries["sshPrivateKey"]))
        want = declared(json.loads(self.pulumi("preview", "--json", stack=REFERENCE).stdout))
        require(len(want) > 10, f"the Python program's preview declares {len(want)} resources")
        seen = []
        for language in EXAMPLES:
            folder = self.add_package(language)
            start = time.monotonic()
            got = declared(json.loads(self.pulumi("preview", "--json", stack="lab", cwd=folder).stdout))
            self.report["figures"][f"package{language.title()}PreviewSeconds"] = round(time.monotonic() - start, 1)
            diff = differences(want, got)
            require(not diff, f"{language}: {len(diff)} differences from the Python program: {diff[:4]}")
            seen.append(language)
        return f"{' and '.join(seen)} examples declare the Python program's {len(want)} resources with the same inputs"

    def package_wrong_arg(self) -> str:
        """A wrong arg in the YAML program is refused in one line naming it, as the stack file's would be."""
        folder = self.example("yaml")
        program = folder / "Pulumi.yaml"
        original = program.read_text()
        document = yaml.safe_load(original)
        document["resources"]["lab"]["properties"]["models"][0]["gpusPerReplica"] = 3
        program.write_text(stack_yaml(document))
        try:
            proc = self.pulumi("preview", stack="lab", cwd=folder, check=False)
        finally:
            program.write_text(original)
        text = proc.stdout + proc.stderr
        # The CLI prints the error twice (as it happens, and under Diagnostics): one message, on one line.
        messages = {line[line.index("error: "):].strip() for line in text.splitlines() if "models[0].gpusPerReplica" in line}
        require(proc.returncode != 0, f"the preview of gpusPerReplica 3 on a 1-GPU node passed: {tail(text)}")
        require(len(messages) == 1 and "Traceback" not in text, f"not one line naming models[0].gpusPerReplica: {tail(text)}")
        return messages.pop()[:200]

    def package_up(self) -> str:
        """`pulumi up` of the YAML example against the loopback cluster: every object the Python program declares for
        the same document is created; then destroyed."""
        folder = self.example("yaml")
        raw = stack_raw("lab")
        raw["cluster"] = {**raw["cluster"], "namespace": UP_NAMESPACE, "kubeconfig": {"path": ".kube/lab.yaml"}}
        raw["nodes"] = [{"name": UP_NODE, "ssh": {"host": "127.0.0.1"}, "gpu": {"product": UP_PRODUCT, "count": 2},
                         "containerRuntime": "none"}]
        raw["modelStorage"] = {"type": "nfs", "server": "nas.lan", "path": "/models", "sizeGi": 20}
        raw["models"] = [{**raw["models"][0], "gpuProduct": UP_PRODUCT}]
        program = folder / "Pulumi.yaml"
        document = yaml.safe_load(program.read_text())
        document["resources"]["lab"]["properties"] = {**raw, "secrets": document["resources"]["lab"]["properties"]["secrets"]}
        program.write_text(stack_yaml(document))
        self.example_stack(folder, "up", raw)
        self.timed("packageUpSeconds", "up", "--yes", "--skip-preview", stack="up", cwd=folder, timeout=1200)
        # The Python program's objects for the same document, rendered offline.
        (self.project / "Pulumi.package-up.yaml").write_text(stack_yaml({"config": {f"gpu-serving:{k}": v for k, v in raw.items()}}))
        objects = self.offline_render("package-up").kubernetes_objects()
        missing = self.missing_from_cluster(objects)
        require(not missing, f"declared by the program but not created by the YAML example: {missing}")
        (deployment,) = (o["metadata"]["name"] for o in objects if o["kind"] == "Deployment")
        available = self.get("deployment", deployment, "-n", UP_NAMESPACE)["status"].get("availableReplicas")
        require(available == 1, f"the model's Deployment {deployment} has {available} available replicas")
        self.pulumi("preview", "--expect-no-changes", stack="up", cwd=folder)
        self.pulumi("destroy", "--yes", "--skip-preview", stack="up", cwd=folder, timeout=900)
        if self.kubectl("get", "deployment", deployment, "-n", UP_NAMESPACE, check=False).returncode == 0:
            raise CheckError(f"the model's Deployment {deployment} is still there after destroy")
        return f"{len(objects)} objects created as the Python program declares them, Deployment available; no changes after; destroyed"
