"""Where the server may write, and as whom: compile caches on the model volume, and the
non-root profile (read-only root filesystem, writable emptyDirs for HOME and /tmp).

vLLM compiles on every cold start (torch.compile/Inductor, Triton kernels, CUDA graphs' shapes):
minutes on a big model. Its caches default to the container's home, which dies with the pod; on
the volume, keyed by image and model, a restart or a second replica reuses them, and a new image
or revision starts a fresh cache instead of loading kernels another version built.
"""

from __future__ import annotations

import hashlib

import pulumi_kubernetes as k8s

from components.serving.names import STATE_DIR
from stacks.config import Model

NON_ROOT_UID = 65534
"""`nobody`/`nogroup`, which every Debian/Ubuntu base (so every `vllm-openai` image) has in
/etc/passwd: `getpwuid()` answers, where an invented UID (2000 in images of v0.18's age) makes
torch's compile-cache set-up and Triton fail with `KeyError: getpwuid(): uid not found`."""


NON_ROOT_USER = "nobody"
"""USER and LOGNAME: `getpass.getuser()` (torch, Triton) returns these before asking passwd at all."""


NON_ROOT_HOME = "/home/vllm"
"""An emptyDir (nobody's passwd home, /nonexistent, is not writable)."""


def compile_cache_dir(model: Model) -> str:
    key = hashlib.sha256(f"{model.image}\n{model.hugging_face_id}@{model.revision}".encode()).hexdigest()[:12]
    return f"{STATE_DIR}/compile-cache/{model.name}-{key}"


def cache_env(model: Model) -> dict[str, str]:
    root = compile_cache_dir(model)
    return {
        "VLLM_CACHE_ROOT": f"{root}/vllm",  # torch.compile artefacts, vLLM's own caches
        "TRITON_CACHE_DIR": f"{root}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
        # Everything else that caches under ~/.cache (FlashInfer's JIT, …) lands on the volume too.
        "XDG_CACHE_HOME": f"{root}/xdg",
    }


def non_root(model: Model) -> bool:
    return model.security_profile == "nonRoot"


def profile_env(model: Model) -> dict[str, str]:
    env = cache_env(model)
    if non_root(model):
        env.update(identity_env())
    return env


def identity_env(home: str = NON_ROOT_HOME) -> dict[str, str]:
    """Who the process is without a passwd lookup, and a writable HOME (the root filesystem is read-only)."""
    return {"HOME": home, "USER": NON_ROOT_USER, "LOGNAME": NON_ROOT_USER}


def pod_security_context(model: Model | None = None) -> k8s.core.v1.PodSecurityContextArgs:
    seccomp = k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")
    if model is None or not non_root(model):
        return k8s.core.v1.PodSecurityContextArgs(seccomp_profile=seccomp)
    return k8s.core.v1.PodSecurityContextArgs(
        seccomp_profile=seccomp,
        run_as_non_root=True,
        run_as_user=NON_ROOT_UID,
        run_as_group=NON_ROOT_UID,
        # The volume's files become group nogroup (local PVs; an NFS export must grant it itself).
        fs_group=NON_ROOT_UID,
        fs_group_change_policy="OnRootMismatch",
    )


def container_security_context(model: Model) -> k8s.core.v1.SecurityContextArgs:
    # The root profile: the stock image runs as root and writes under its home, so no
    # read-only root filesystem, but nothing beyond plain root either.
    return k8s.core.v1.SecurityContextArgs(
        allow_privilege_escalation=False,
        privileged=False,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        read_only_root_filesystem=True if non_root(model) else None,
    )


def scratch_volumes(model: Model) -> tuple[list[k8s.core.v1.VolumeArgs], list[k8s.core.v1.VolumeMountArgs]]:
    """The non-root profile's writable places besides the model volume and /dev/shm: HOME
    (Python, torch and vLLM write small state there) and /tmp (tokenizer and compile scratch)."""
    if not non_root(model):
        return [], []
    volumes = [
        k8s.core.v1.VolumeArgs(name="home", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="1Gi")),
        k8s.core.v1.VolumeArgs(name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="4Gi")),
    ]
    mounts = [
        k8s.core.v1.VolumeMountArgs(name="home", mount_path=NON_ROOT_HOME),
        k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
    ]
    return volumes, mounts
