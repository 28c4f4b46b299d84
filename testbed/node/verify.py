"""Runs the built images on this host, each in a chroot of its unpacked layers, as a pod would run
them: the config's Entrypoint/Cmd/Env/User with a pod's `command`/`args` applied the Kubernetes
way. Needs root (chroot, setuid); the host's loopback stands for the pod network.

    sudo venv/bin/python -m testbed.node.verify [--archive images.tar]   # default: build() first

Checks: pause runs as 65535 and exits 0 on SIGTERM; vllm-sim's entrypoint takes the Deployment's
args; the download Job's own script fetches a tiny repository from the hub stand-in with the
image's huggingface_hub; vllm_sim serves it (/health from the host); the smoke Job's own script
passes against it as the smoke image's user with busybox and curl; no symlink in the rootfs
dangles. What it cannot show: containerd, runc, namespaces, cgroups, a read-only root: a chroot
is not a container (the node e2e is).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.serving import DOWNLOAD_SCRIPT, SMOKE_SCRIPT
from testbed.node import images, oci
from testbed.standins.hub import Hub, Repo

PORT = 18123
REPO = Repo("gs-testbed/tiny", {"config.json": b'{"stand_in": true}\n', "model.safetensors": b"\0" * 4096}, "1" * 40)

DANGLING = """\
import os
bad = [os.path.join(d, n) for d, ds, fs in os.walk("/") for n in ds + fs
       if os.path.islink(os.path.join(d, n)) and not os.path.exists(os.path.join(d, n))]
print("\\n".join(bad))
raise SystemExit(1 if bad else 0)
"""


@dataclass(frozen=True)
class Unpacked:
    root: Path
    config: dict[str, Any]

    def argv(self, command: Sequence[str] = (), args: Sequence[str] = ()) -> list[str]:
        """As the kubelet builds it: `command` replaces Entrypoint, `args` replaces Cmd, and a
        `command` alone drops Cmd too."""
        cfg = self.config["config"]
        entrypoint = list(command) or cfg.get("Entrypoint", [])
        cmd = list(args) or ([] if command else cfg.get("Cmd", []))
        return [*entrypoint, *cmd]

    def env(self, **extra: str) -> dict[str, str]:
        return {**dict(var.split("=", 1) for var in self.config["config"].get("Env", [])), **extra}

    def ids(self, user: str | None = None) -> tuple[int, int]:
        """Numeric `uid[:gid]` only (the images here name no user by name); no gid: 0."""
        uid, _, gid = (user if user is not None else self.config["config"].get("User", "0")).partition(":")
        return int(uid or 0), int(gid or 0)

    def popen(self, argv: list[str], env: dict[str, str], user: str | None = None, **kwargs: Any) -> subprocess.Popen[str]:
        uid, gid = self.ids(user)
        return subprocess.Popen(argv, env=env, preexec_fn=entering(self.root, uid, gid), text=True, **kwargs)

    def run(self, argv: list[str], env: dict[str, str], user: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        with self.popen(argv, env, user, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
            out, _ = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def entering(root: Path, uid: int, gid: int) -> Callable[[], None]:
    def enter() -> None:
        os.chroot(root)
        os.chdir("/")
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return enter


# ---- the archive, read as a consumer reads it --------------------------------------------------


def unpack(archive: Path, name: str, into: Path) -> Unpacked:
    """`name`'s layers in order under `into`, and its config: index.json → manifest → blobs."""
    with tarfile.open(archive) as tar:
        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return member.read()

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = [m for m in index["manifests"] if m["annotations"][oci.NAME_ANNOTATION] == oci.normalized(name)]
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        into.mkdir(parents=True)
        for layer in manifest["layers"]:
            subprocess.run(["tar", "-xpf", "-", "-C", str(into)], input=blob(layer["digest"]), check=True)
    pod_files(into)
    return Unpacked(into, config)


def pod_files(root: Path) -> None:
    """What the runtime and kubelet add to every container: /dev/null (the smoke script writes
    there) and /etc/hosts (the hub stand-in redirects to `localhost`)."""
    (root / "dev").mkdir(exist_ok=True)
    os.mknod(root / "dev/null", 0o666 | 0o020000, os.makedev(1, 3))
    os.chmod(root / "dev/null", 0o666)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n")


# ---- the checks --------------------------------------------------------------------------------


def check(what: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok ' if ok else 'FAIL'} {what}{': ' + detail.strip() if detail and not ok else ''}", flush=True)
    if not ok:
        raise SystemExit(1)


def check_pause(pause: Unpacked) -> None:
    proc = pause.popen(pause.argv(), pause.env())
    time.sleep(0.5)
    check("pause is still running after 0.5 s", proc.poll() is None)
    proc.send_signal(signal.SIGTERM)
    check("pause exits 0 on SIGTERM", proc.wait(timeout=5) == 0)


def check_python(sim: Unpacked) -> None:
    result = sim.run(sim.argv(args=["--help"]), sim.env())
    check("vllm-sim's entrypoint takes args (--help)", result.returncode == 0 and "vllm_sim" in result.stdout, result.stdout)
    result = sim.run(sim.argv(command=["python3", "-c", "import huggingface_hub; print(huggingface_hub.__version__)"]), sim.env())
    check("huggingface_hub imports", result.stdout.strip() == "0.35.3", result.stdout)
    result = sim.run(sim.argv(command=["python3", "-c", DANGLING]), sim.env())
    check("no dangling symlinks", result.returncode == 0, result.stdout)


def check_download(sim: Unpacked, hub: Hub) -> None:
    """The download Job's command and env, as root (the root profile)."""
    env = sim.env(HF_ENDPOINT=hub.url, HF_HUB_CACHE="/models/hub", HF_HOME="/models/.gpu-serving/hf-home",
                  GS_REPO=REPO.repo_id, GS_REVISION="main", GS_MARKER_DIR="/models/.gpu-serving/downloads")
    result = sim.run(sim.argv(command=["python3", "-c", DOWNLOAD_SCRIPT]), env)
    check("the download Job's script fetches from the hub stand-in", result.returncode == 0 and "ready in" in result.stdout, result.stdout)


@contextlib.contextmanager
def serving(sim: Unpacked) -> Iterator[subprocess.Popen[str]]:
    args = [REPO.repo_id, "--revision=main", "--served-model-name=tiny", "--host=127.0.0.1", f"--port={PORT}",
            "--download-dir=/models/hub", "--tensor-parallel-size=1", "--max-model-len=4096", "--shutdown-timeout=5"]
    proc = sim.popen(sim.argv(args=args), sim.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def wait_healthy(proc: subprocess.Popen[str], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as answer:
            return answer.status == 200
        time.sleep(0.2)
    return False


def check_server_and_smoke(sim: Unpacked, smoke: Unpacked) -> None:
    with serving(sim) as proc:
        healthy = wait_healthy(proc)
        check(f"vllm_sim answers /health on 127.0.0.1:{PORT} from the host", healthy, "" if healthy else proc.communicate()[0])
        env = smoke.env(BASE=f"http://127.0.0.1:{PORT}", MODEL="tiny", HEALTH_WAIT_S="30", REQUEST_TIMEOUT_S="30")
        result = smoke.run(smoke.argv(command=["/bin/sh", "-c", SMOKE_SCRIPT]), env)
        check(f"the smoke Job's script passes as {smoke.config['config'].get('User')}", result.returncode == 0, result.stdout)
        proc.send_signal(signal.SIGTERM)
        check("vllm_sim exits 0 on SIGTERM", proc.wait(timeout=15) == 0)


def verify(archive: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="gs-node-verify-") as tmp, Hub([REPO]) as hub:
        pause = unpack(archive, images.PAUSE, Path(tmp, "pause"))
        sim = unpack(archive, images.VLLM_SIM, Path(tmp, "vllm-sim"))
        smoke = unpack(archive, images.SMOKE, Path(tmp, "smoke"))
        check_pause(pause)
        check_python(sim)
        check_download(sim, hub)
        # The smoke Job runs in its own pod: its own rootfs, the server reached over the network.
        check_server_and_smoke(sim, smoke)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.node.verify", description=__doc__.split("\n")[0])
    parser.add_argument("--archive", type=Path, help="an archive testbed.node.images built (default: build it)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("node verify: needs root (chroot)", file=sys.stderr)
        return 1
    verify(args.archive or images.build().archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
