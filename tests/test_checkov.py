"""checkov (Kubernetes framework) on the rendered prod manifests, with the repo's `.checkov.yaml`.

checkov's dependencies conflict with pulumi's, so it lives in its own venv, `.venv-checkov/`,
created here on first use (pinned version; needs the package registry once).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools.render import ROOT, Render

CHECKOV_VERSION = "3.3.30"
VENV = ROOT / ".venv-checkov"
CHECKOV = VENV / "bin" / "checkov"
CONFIG = ROOT / ".checkov.yaml"


def ensure_checkov() -> Path:
    if CHECKOV.exists():
        return CHECKOV
    python = os.environ.get("PYTHON", "python3")
    subprocess.run([python, "-m", "venv", str(VENV)], check=True, timeout=300)
    subprocess.run(
        [str(VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", f"checkov=={CHECKOV_VERSION}"],
        check=True,
        timeout=1800,
    )
    return CHECKOV


def checkov(folder: Path) -> dict[str, Any]:
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    result = subprocess.run(
        [str(ensure_checkov()), "--config-file", str(CONFIG), "-d", str(folder), "-o", "json"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # Exit 1 means failed checks; anything else is checkov itself failing.
    assert result.returncode in (0, 1), result.stderr[-2000:]
    report = json.loads(result.stdout)
    return report[0] if isinstance(report, list) else report


def write_manifests(objects: list[dict[str, Any]], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifests.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=True))
    return folder


@pytest.fixture(scope="module")
def prod_report(prod: Render, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return checkov(write_manifests(prod.kubernetes_objects(), tmp_path_factory.mktemp("prod")))


def test_prod_manifests_pass_checkov(prod_report: dict[str, Any]) -> None:
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in prod_report["results"]["failed_checks"]]
    assert failed == []
    assert prod_report["summary"]["parsing_errors"] == 0
    # The manifests were really scanned: the Deployment, Job, Service, Ingress, HPA, ... all count.
    assert prod_report["summary"]["resource_count"] >= 10
    assert prod_report["summary"]["passed"] >= 100


def test_checkov_is_not_toothless(prod: Render, tmp_path: Path) -> None:
    """The same scan flags a Deployment with the seed's mistakes that the skips do not cover."""
    deployment = next(o for o in prod.kubernetes_objects() if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    del container["securityContext"], container["livenessProbe"], pod["automountServiceAccountToken"]
    report = checkov(write_manifests([deployment], tmp_path))
    failed = {c["check_id"] for c in report["results"]["failed_checks"]}
    assert {"CKV_K8S_8", "CKV_K8S_20", "CKV_K8S_28", "CKV_K8S_38"} <= failed


def test_every_skip_is_one_id_with_a_reason() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    skips = config["skip-check"]
    assert skips and all(re.fullmatch(r"CKV2?_K8S_\d+", s) for s in skips), skips
    assert len(skips) == len(set(skips))
    assert set(config) <= {"framework", "compact", "quiet", "skip-check"}
    lines = CONFIG.read_text().splitlines()
    for skip in skips:
        index = lines.index(f"  - {skip}")
        reason = lines[index - 1].strip()
        assert reason.startswith("# ") and len(reason) > 30, f"{skip} needs a one-line reason above it"
