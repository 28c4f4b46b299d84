"""The VM image: a Debian bookworm disk built once by build-image.sh (beside this file) and cached
outside the repository, keyed by the script's content, so editing the script makes a new image."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from testbed.vm.errors import VmError

BUILD_SCRIPT = Path(__file__).resolve().parent / "build-image.sh"


def image_dir(cache_root: Path | None = None) -> Path:
    """Where build-image.sh puts (or has put) the image for its current content."""
    root = cache_root or Path(os.environ.get("GS_VM_CACHE") or Path.home() / ".cache" / "gpu-serving")
    digest = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:16]
    return root / f"image-{digest}"


def ensure_image(timeout: float = 1800) -> Path:
    """Build the VM image if it is not cached yet; return its folder.

    The folder holds ``disk.raw``, ``id_ed25519`` and ``id_ed25519.pub``.
    Building needs root and the tools from install-host-deps.sh (~3 min).
    """
    target = image_dir()
    if (target / "disk.raw").is_file():
        return target
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise VmError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")
    if not (target / "disk.raw").is_file():
        raise VmError(f"{BUILD_SCRIPT} succeeded but {target}/disk.raw is missing")
    return target
