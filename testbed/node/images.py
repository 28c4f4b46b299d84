"""The images a pod on the lab node runs, built without a registry into one OCI archive for
`ctr -n k8s.io images import --platform linux/amd64 --digests <archive>` (docs/real-node-plan.md).

    venv/bin/python -m testbed.node.images [--out DIR] [--hf-endpoint URL] [--picker]   # prints the archive and refs as JSON

Two root filesystems, three names:
- gs-testbed/pause:3.10.2: the sandbox image, our static Go pause (testbed/node/pause) as
  USER 65535:65535, ENTRYPOINT ["/pause"], as Kubernetes' own.
- gs-testbed/vllm-sim:v0.18.0 (what models[].image names; the download Job runs it too) and
  gs-testbed/smoke:v1 (cluster.smokeImage, pinned by digest) share one layer: Debian bookworm's
  python3.11 and curl from .debs, busybox as /bin/sh and its applets, huggingface_hub 0.35.3 and
  its pure-Python dependencies (no hf_xet), the bytecode of the modules the pods' programs import
  (`bytecode`: what Debian's postinst and pip would have compiled) and testbed/standins/vllm_sim.py. Each name has its own
  config, so a new HF_ENDPOINT changes the vllm-sim digest, never the smoke one.

The vllm-sim ENTRYPOINT is `python3 /opt/gs/vllm_sim.py serve`, as vLLM's is `vllm serve`, and
`/usr/local/bin/vllm` runs the stand-in: the Deployment's `command` is `vllm serve` (the model first in
`args`), the download Job its own `command` (python3 -c),
the smoke Job `/bin/sh -c`. The image runs as root, as vLLM's does; its /etc/passwd has root and
nobody/nogroup (the nonRoot profile's 65534), and no invented UID: a UID outside passwd fails as
it does in vLLM (profile.py), which the profile's USER/LOGNAME avoid.

The .debs come from this host's apt (a Debian bookworm host; cached under $GS_CACHE/node/debs by
their sha256), the wheels from PyPI by the pins below (under $GS_CACHE/node/wheels). The archive is
cached under $GS_CACHE/node/images-<key>/, the key being the sha256 of every input; a warm call
reads only apt's list files' sizes and times, the sources and `go version`.

`--picker` builds the endpoint picker proof's archive instead (`build_picker`): gs-testbed/epp and
gs-testbed/llm-d-inference-sim, each its static Go binary alone from testbed/endpoint/build.sh, as pause.

What it cannot show: that the node's containerd imports and runs the archive (the node e2e does);
the .debs are whatever apt's lists name today, not a pinned snapshot.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import marshal
import os
import platform
import posixpath
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed import cluster_pins
from testbed.node import oci
from testbed.node.oci import Entry

HERE = Path(__file__).resolve().parent
VLLM_SIM_SOURCE = HERE.parent / "standins" / "vllm_sim.py"
PAUSE_SOURCE = HERE / "pause"

PAUSE = "gs-testbed/pause:3.10.2"
VLLM_SIM = "gs-testbed/vllm-sim:v0.18.0"
SMOKE = "gs-testbed/smoke:v1"

DEFAULT_HF_ENDPOINT = "http://10.244.0.1:18080"
"""Where pods reach the hub stand-in: the bridge's gateway, forwarded to the host (plan, "Stand-ins")."""

PYTHON_DEBS = (
    "libc6", "libgcc-s1", "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib",
    "python3-minimal", "libexpat1", "zlib1g", "libssl3", "libffi8", "libuuid1", "libbz2-1.0", "liblzma5",
)
SHELL_DEBS = ("busybox-static",)
CURL_DEBS = (
    "curl", "libcurl4", "libbrotli1", "libcom-err2", "libdb5.3", "libgmp10", "libgnutls30", "libgssapi-krb5-2",
    "libhogweed6", "libidn2-0", "libk5crypto3", "libkeyutils1", "libkrb5-3", "libkrb5support0", "libldap-2.5-0",
    "libnettle8", "libnghttp2-14", "libp11-kit0", "libpsl5", "librtmp1", "libsasl2-2", "libsasl2-modules-db",
    "libssh2-1", "libtasn1-6", "libunistring2", "libzstd1",
)
"""libcurl4 links Kerberos, LDAP (and through it SASL and Berkeley DB), GnuTLS for RTMP, libssh2,
libpsl and nghttp2: the whole Depends closure, though the smoke script speaks plain HTTP."""

DEBS = (*PYTHON_DEBS, *SHELL_DEBS, *CURL_DEBS)

LEFT_OUT = {
    "dpkg": "python3-minimal's maintainer scripts only; nothing is configured in the image",
    "gcc-12-base": "documentation only",
    "libcrypt1": "the deprecated crypt module",
    "libncursesw6": "curses",
    "libtinfo6": "curses and readline",
    "libreadline8": "the interactive prompt",
    "libnsl2": "the nis module",
    "libtirpc3": "the nis module",
    "libsqlite3-0": "sqlite3: neither huggingface_hub's download path nor vllm_sim imports it",
    "media-types": "mimetypes falls back to its built-in table",
}
"""Dependencies of the packages above that the image leaves out, and why. A dependency in neither
list stops the build: a Debian update that adds one is then seen, not shipped broken."""

WHEELS = {
    "certifi-2026.10.19.post1-py3-none-any.whl": "1324c476b4811eff41a8bc2122cd0bbd4d9c7234c725446d99ab1612b3a7fdd2",
    "charset_normalizer-3.5.3-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl":
        "2a6f937e0b70133d1f826d0a253331b6fe1a4c874808cc12e16f2fb8177042f4",
    "filelock-4.3.2-py3-none-any.whl": "02a8801bc6b2a80921bf3d7895c63084d53bae2a3c86783adce5ae2b89a1825b",
    "fsspec-2026.9.0-py3-none-any.whl": "8dd6e646e99ea382bd85f97a45e6b526a442d79423a7dc673f1e2756d05fcb5f",
    "huggingface_hub-0.35.3-py3-none-any.whl": "0e3a01829c19d86d03793e4577816fe3bdfc1602ac62c7fb220d593d351224ba",
    "idna-3.20-py3-none-any.whl": "ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c",
    "packaging-26.4-py3-none-any.whl": "81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2",
    "pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl":
        "622aa875fa6533f25fedcffe23079357d65a690d462200afed5d8e9d0e01ebee",
    "requests-2.34.2-py3-none-any.whl": "2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0",
    "tqdm-4.70.1-py3-none-any.whl": "c293e525e6fef9c20e8728fd4612df02a0aa31bb5fe91ecd93e123b1b7bffa73",
    "typing_extensions-4.16.0-py3-none-any.whl": "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8",
    "urllib3-2.8.0-py3-none-any.whl": "0cf3cae568d36aa9576b28dfb35f11328f1cb974ca7647d9475ebb86c75ac6e3",
}
"""huggingface_hub==0.35.3 and its dependencies at the versions requirements-dev.txt resolves to
(the client tests/test_standins.py runs against the hub stand-in), for CPython 3.11 on x86_64. hf_xet
is left out: without it the client downloads over plain HTTP, which is what the hub stand-in serves."""

SITE_PACKAGES = "usr/lib/python3/dist-packages"
"""Where Debian's python3.11 looks for packages that are not its own (it has no site-packages)."""

BUSYBOX_APPLETS = (
    "sh", "ash", "awk", "basename", "cat", "chmod", "cp", "cut", "date", "df", "dirname", "du", "echo", "env",
    "expr", "false", "find", "grep", "head", "hostname", "id", "ip", "kill", "ln", "ls", "mkdir", "mktemp", "mv",
    "nc", "nslookup", "printf", "ps", "pwd", "readlink", "rm", "rmdir", "sed", "sha256sum", "sleep", "sort", "stat",
    "tail", "tee", "test", "timeout", "touch", "tr", "true", "uname", "wc", "wget", "which", "xargs",
)
"""The smoke script needs sh, date and sleep; the rest are for a shell in a pod while debugging."""

PRUNED = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/", "usr/share/locale/",
          "usr/share/zsh/", "usr/lib/x86_64-linux-gnu/gconv/")
"""Nothing here reads them: Python's codecs are its own, not iconv's (gconv is 8 MB of the layer)."""

USR_MERGED = ("bin", "sbin", "lib", "lib64")
"""Bookworm's .debs still ship these at /; a bookworm system has them as links into /usr."""

ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    sha256: str
    depends: tuple[tuple[str, ...], ...]
    """Depends and Pre-Depends: each group is alternatives (`a | b`)."""


@dataclass(frozen=True)
class Images:
    archive: Path
    digests: dict[str, str]
    """Image name (`gs-testbed/smoke:v1`) → its manifest digest (`sha256:…`)."""

    def pinned(self, name: str) -> str:
        """`name@sha256:…`, as cluster.smokeImage takes it."""
        return f"{name}@{self.digests[name]}"


class BuildError(Exception):
    """Why the images cannot be built: one line."""


# ---- the cache ---------------------------------------------------------------------------------


def gs_cache() -> Path:
    return Path(os.environ.get("GS_CACHE") or Path.home() / ".cache/gpu-serving")


def build(cache: Path | None = None, *, hf_endpoint: str = DEFAULT_HF_ENDPOINT) -> Images:
    """The archive for these inputs: from the cache when it is there, else built and cached.
    `cache` holds images-<key>/ (default $GS_CACHE/node); downloads stay under $GS_CACHE/node."""
    downloads = gs_cache() / "node"
    debs = resolve_debs(downloads)
    key = cache_key(debs, hf_endpoint)
    return cached(cache or downloads, f"images-{key[:16]}",
                  lambda work: write_images(work, downloads, debs, hf_endpoint, key))


def cached(out_root: Path, name: str, write: Callable[[Path], None]) -> Images:
    """out_root/name when a build finished there, else `write` into a fresh folder renamed to it."""
    out = out_root / name
    if (done := load(out)) is not None:
        return done
    out_root.mkdir(parents=True, exist_ok=True)
    with locked(out_root / ".build.lock"):
        if (done := load(out)) is not None:
            return done
        for stale in out_root.glob(".build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=out_root))
        try:
            write(work)
            work.chmod(0o755)  # mkdtemp makes it private; the result is for every user of the cache
            work.rename(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    loaded = load(out)
    assert loaded is not None
    return loaded


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One build per cache folder at a time: a parallel caller waits, then finds the result."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def load(out: Path) -> Images | None:
    try:
        meta = json.loads((out / "images.json").read_text())
    except (OSError, ValueError):
        return None
    return Images(out / "images.tar", meta["digests"])


def cache_key(debs: list[Deb], hf_endpoint: str) -> str:
    """sha256 of every input: the .debs (by apt's sha256, which the download is checked against),
    the wheels, the sources, the builders, the Go and Python that ran them, the endpoint."""
    digest = hashlib.sha256()
    for part in inputs(debs, hf_endpoint):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def inputs(debs: list[Deb], hf_endpoint: str) -> Iterator[bytes]:
    yield "\n".join(f"{deb.package} {deb.sha256}" for deb in debs).encode()
    yield "\n".join(f"{name} {sha}" for name, sha in sorted(WHEELS.items())).encode()
    yield VLLM_SIM_SOURCE.read_bytes()
    for path in sorted(PROGRAMS.glob("*.py")):  # what they import is compiled
        yield path.name.encode() + b"\0" + path.read_bytes()
    for path in sorted(PAUSE_SOURCE.iterdir()):
        yield path.name.encode() + b"\0" + path.read_bytes()
    yield Path(__file__).read_bytes()
    yield Path(oci.__file__).read_bytes()
    yield go_version().encode()
    # tarfile's and json's output is part of the archive's bytes.
    yield platform.python_version().encode()
    yield hf_endpoint.encode()


def go_version() -> str:
    if shutil.which("go") is None:
        raise BuildError("go is not installed (Go >= 1.26 builds the pause binary)")
    return run(["go", "version"]).strip()


def run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True, cwd=cwd, env=env).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        detail = (error.stderr or error.stdout or "").strip() if isinstance(error, subprocess.CalledProcessError) else str(error)
        raise BuildError(f"{' '.join(argv[:3])} … failed: {detail[-2000:]}") from error


# ---- .debs -------------------------------------------------------------------------------------


APT_LISTS = Path("/var/lib/apt/lists")


def resolve_debs(downloads: Path) -> list[Deb]:
    """DEBS at the versions apt's lists name. apt-cache takes 0.6 s a call (no package cache on
    disk), so its answer is kept, keyed by the list files' names, sizes and times: an
    `apt-get update` that changes them asks again."""
    lists = sorted(APT_LISTS.glob("*_Packages*"))
    if not lists or not is_bookworm():
        raise BuildError("needs a Debian bookworm host with apt's package lists (the image's .debs are bookworm's)")
    state = "\n".join([*DEBS, *(f"{p.name} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in lists)])
    saved = downloads / "debs" / f"resolved-{hashlib.sha256(state.encode()).hexdigest()[:16]}.json"
    with contextlib.suppress(OSError, ValueError, TypeError):
        return [Deb(d["package"], d["version"], d["sha256"], tuple(tuple(g) for g in d["depends"]))
                for d in json.loads(saved.read_text())]
    debs = apt_candidates(DEBS)
    check_dependencies(debs)
    saved.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(saved, json.dumps([deb.__dict__ for deb in debs], indent=1).encode())
    return debs


def is_bookworm() -> bool:
    with contextlib.suppress(OSError):
        return "VERSION_CODENAME=bookworm" in Path("/etc/os-release").read_text().splitlines()
    return False


def apt_candidates(packages: Iterable[str]) -> list[Deb]:
    packages = list(packages)
    stanzas = parse_stanzas(run(["apt-cache", "show", "--no-all-versions", *packages]))
    found = {s["Package"]: s for s in stanzas if s.get("Architecture") in ("amd64", "all")}
    missing = [p for p in packages if p not in found]
    if missing:
        raise BuildError(f"apt knows no amd64 candidate for {', '.join(missing)} (run apt-get update?)")
    return [Deb(p, found[p]["Version"], found[p]["SHA256"], dependency_groups(found[p])) for p in packages]


def parse_stanzas(text: str) -> list[dict[str, str]]:
    stanzas = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line[:1] not in ("", " ") and ": " in line)
        if fields:
            stanzas.append(fields)
    return stanzas


def dependency_groups(stanza: dict[str, str]) -> tuple[tuple[str, ...], ...]:
    """`a (>= 1) | b:any, c` → (("a", "b"), ("c",))."""
    text = ", ".join(stanza[key] for key in ("Pre-Depends", "Depends") if key in stanza)
    return tuple(
        tuple(re.sub(r"\(.*?\)|:\w+", "", alt).strip() for alt in group.split("|"))
        for group in text.split(",") if group.strip()
    )


def check_dependencies(debs: list[Deb]) -> None:
    chosen = {deb.package for deb in debs}
    unmet = sorted({
        f"{deb.package} needs {' | '.join(group)}"
        for deb in debs for group in deb.depends
        if not any(alt in chosen or alt in LEFT_OUT for alt in group)
    })
    if unmet:
        raise BuildError(f"add to DEBS or LEFT_OUT in testbed/node/images.py: {'; '.join(unmet)}")


def fetch_debs(debs: list[Deb], downloads: Path) -> dict[str, Path]:
    """package → its .deb, stored by sha256; apt-get downloads only what is missing and checks
    each file against the hash its lists hold."""
    store = downloads / "debs"
    store.mkdir(parents=True, exist_ok=True)
    missing = [deb for deb in debs if not (store / f"{deb.sha256}.deb").is_file()]
    if missing:
        with tempfile.TemporaryDirectory(dir=store) as tmp:
            # As root apt drops to _apt for the download, which may not write a private temp dir.
            sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
            run(["apt-get", "download", *sandbox, *(f"{deb.package}={deb.version}" for deb in missing)], cwd=tmp)
            for path in Path(tmp).glob("*.deb"):
                path.rename(store / f"{sha256_file(path)}.deb")
    files = {deb.package: store / f"{deb.sha256}.deb" for deb in debs}
    absent = [package for package, path in files.items() if not path.is_file()]
    if absent:
        raise BuildError(f"apt-get download gave no file with the listed sha256 for {', '.join(absent)}")
    return files


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def deb_entries(deb: Path) -> Iterator[Entry]:
    """The .deb's files as layer entries, moved into /usr as on a usr-merged system, docs pruned."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with proc.stdout, tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        for member in tar:
            entry = tar_entry(tar, member)
            if entry is not None:
                yield entry
    if proc.wait() != 0:
        raise BuildError(f"dpkg-deb --fsys-tarfile {deb.name} failed")


def tar_entry(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Entry | None:
    path = usr_merged(posixpath.normpath(member.name).lstrip("/"))
    if path in (".", *USR_MERGED) or path.startswith(PRUNED):
        return None
    mode, owner = member.mode & 0o7777, {"uid": member.uid, "gid": member.gid}
    if member.isdir():
        return Entry(path, "dir", mode, **owner)
    if member.issym():
        return Entry(path, "symlink", 0o777, target=member.linkname, **owner)
    if member.isfile():
        data = tar.extractfile(member)
        assert data is not None
        return Entry(path, "file", mode, data.read(), **owner)
    # None of the packages above has hard links or device nodes; a new one is looked at, not guessed.
    raise BuildError(f"{member.name}: a {member.type!r} entry (only files, directories and symlinks are handled)")


def usr_merged(path: str) -> str:
    top, _, rest = path.partition("/")
    return f"usr/{top}/{rest}".rstrip("/") if top in USR_MERGED and rest else path


# ---- wheels ------------------------------------------------------------------------------------


def fetch_wheels(downloads: Path) -> list[Path]:
    store = downloads / "wheels"
    store.mkdir(parents=True, exist_ok=True)
    missing = {name: sha for name, sha in WHEELS.items() if not verified(store / name, sha)}
    if missing:
        with tempfile.TemporaryDirectory(dir=store) as tmp:
            pip_download(missing, Path(tmp))
            for name, sha in missing.items():
                if not verified(Path(tmp, name), sha):
                    raise BuildError(f"pip download gave no {name} with sha256 {sha}")
                Path(tmp, name).rename(store / name)
    return [store / name for name in sorted(WHEELS)]


def verified(path: Path, sha256: str) -> bool:
    return path.is_file() and sha256_file(path) == sha256


def pip_download(wheels: dict[str, str], dest: Path) -> None:
    """By exact version and hash, for CPython 3.11 on manylinux x86_64 whatever this host runs."""
    requirements = dest / "requirements.txt"
    requirements.write_text("".join(f"{wheel_requirement(name)} --hash=sha256:{sha}\n" for name, sha in wheels.items()))
    run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--only-binary", ":all:", "--require-hashes", "--implementation", "cp", "--python-version", "3.11",
         "--abi", "cp311", "--abi", "none", "--platform", "manylinux_2_28_x86_64", "--platform", "any",
         "--dest", str(dest), "-r", str(requirements)])


def wheel_requirement(filename: str) -> str:
    name, version = filename.split("-")[:2]
    return f"{name}=={version}"


def wheel_entries(wheel: Path) -> Iterator[Entry]:
    """A wheel installed as an installer would for pure and platlib packages (they have no .data),
    without the console scripts nobody here runs."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            if ".data/" in info.filename:
                raise BuildError(f"{wheel.name} has a .data folder, which this installer does not place")
            executable = (info.external_attr >> 16) & 0o111
            yield Entry(f"{SITE_PACKAGES}/{info.filename}", "file", 0o755 if executable else 0o644, archive.read(info))


# ---- the pause binary --------------------------------------------------------------------------


def build_pause(out: Path) -> bytes:
    return build_go(PAUSE_SOURCE, out)


def build_go(source: Path, out: Path) -> bytes:
    """A standard-library-only Go main package built static, without build IDs or paths, so its bytes
    depend on the source and Go version only."""
    cache = gs_cache() / "go"
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false", "GOOS": "linux",
           "GOARCH": "amd64", "GOCACHE": str(cache / "build"), "GOMODCACHE": str(cache / "mod")}
    run(["go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", str(out), "."], cwd=source, env=env)
    return out.read_bytes()


# ---- the images --------------------------------------------------------------------------------


VLLM_SHIM = Entry("usr/local/bin/vllm", "file", 0o755, b'#!/bin/sh\nexec python3 /opt/gs/vllm_sim.py "$@"\n')
"""vLLM's image has `vllm` on PATH, and the Deployment runs `vllm serve` by name."""


def python_rootfs(debs: dict[str, Path], wheels: list[Path]) -> list[Entry]:
    entries = [entry for package in DEBS for entry in deb_entries(debs[package])]
    entries += [entry for wheel in wheels for entry in wheel_entries(wheel)]
    entries += [Entry(top, "symlink", 0o777, target=f"usr/{top}") for top in USR_MERGED]
    entries += [Entry(f"usr/bin/{applet}", "symlink", 0o777, target="busybox") for applet in BUSYBOX_APPLETS]
    entries += [Entry(path, "file", 0o644, text.encode()) for path, text in ETC_FILES.items()]
    entries += [
        Entry("usr/sbin", "dir", 0o755),
        Entry("tmp", "dir", 0o1777),
        Entry("root", "dir", 0o700),
        Entry("home", "dir", 0o755),
        Entry("opt/gs/vllm_sim.py", "file", 0o644, VLLM_SIM_SOURCE.read_bytes()),
        VLLM_SHIM,
    ]
    shadowed = {entry.path for entry in entries if entry.kind == "file"} & {f"usr/bin/{a}" for a in BUSYBOX_APPLETS}
    if shadowed:
        raise BuildError(f"busybox applets would replace packaged files: {', '.join(sorted(shadowed))}")
    return entries + bytecode(entries, imported_modules())


IMAGE_PYTHON = (3, 11)
"""The minor version of Debian's python3.11 in DEBS: bytecode is only valid for it."""
PROGRAMS = HERE.parent.parent / "components" / "serving" / "programs"
"""components/serving/jobs.py's PROGRAMS (not imported: that would load the Pulumi SDK here): the *.py among them
are the download Job's and the init container's, run by the image's python3."""
LIST_MODULES = """import importlib, json, sys
for name in sys.argv[1:]:
    module, _, attribute = name.partition(":")
    try:
        imported = importlib.import_module(module)
    except ImportError:
        continue
    if attribute:  # `from m import a`: a submodule, or an attribute a lazy package imports on first use
        try:
            importlib.import_module(f"{module}.{attribute}")
        except ImportError:
            getattr(imported, attribute, None)
print(json.dumps(sorted(getattr(m, "__file__", None) or "" for m in list(sys.modules.values()))))
"""


def imported_modules() -> set[str]:
    """The image paths of the modules the pods' Python programs import (vllm_sim and PROGRAMS), with what the
    interpreter itself loads from files at start (encodings): resolved by this host's 3.11, whose standard
    library and venv hold the same modules at the same relative paths. Compiling only these keeps the layer
    small: every byte of it is unpacked by each node's emulated CPU, and all the bytecode would add 17 MiB."""
    if sys.version_info[:2] != IMAGE_PYTHON:
        return set()
    names = set()
    for source in (VLLM_SIM_SOURCE, *sorted(PROGRAMS.glob("*.py"))):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module != "__future__":
                names.update(f"{node.module}:{alias.name}" for alias in node.names)
    files = json.loads(run([sys.executable, "-I", "-c", LIST_MODULES, *sorted(names)]))
    roots = {Path(sysconfig.get_path("stdlib")): "usr/lib/python3.11", Path(sysconfig.get_path("purelib")): SITE_PACKAGES,
             Path(sysconfig.get_path("platlib")): SITE_PACKAGES}
    paths = set()
    for file in map(Path, filter(None, files)):
        root = next((r for r in roots if file.suffix == ".py" and file.is_relative_to(r)), None)
        if root is not None:
            paths.add(f"{roots[root]}/{file.relative_to(root).as_posix()}")
    return paths


def bytecode(entries: list[Entry], modules: set[str]) -> list[Entry]:
    """The bytecode of each of `modules` (image paths) beside it, as Debian's postinst (py3compile) and pip would
    have written it. Without it every Python process in a pod compiles all it imports at each start, since
    nothing may write the cache (PYTHONDONTWRITEBYTECODE; the nonRoot profile's read-only root): about 1 s of a
    host core per start of the download Job's client, and tens of seconds on the test bed's emulated CPU, more
    under the init container's CPU limit. Unchecked-hash pycs (PEP 552), so the layer's normalized mtimes do
    not matter. Only a 3.11 host can write them (another version's would be ignored): elsewhere there are none."""
    if sys.version_info[:2] != IMAGE_PYTHON:
        return []
    out = []
    for entry in entries:
        if entry.kind != "file" or entry.path not in modules:
            continue
        try:
            code = compile(entry.data, "/" + entry.path, "exec", dont_inherit=True, optimize=0)
        except (SyntaxError, ValueError):  # not Python 3.11: Debian's py3compile skips such files too
            continue
        folder, name = posixpath.split(entry.path)
        flags = (1).to_bytes(4, "little")  # hash-based, source not checked
        pyc = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(entry.data) + marshal.dumps(code)
        out.append(Entry(f"{folder}/__pycache__/{name[:-3]}.{sys.implementation.cache_tag}.pyc", "file", 0o644, pyc))
    return out


def image_set(pause: bytes, rootfs: list[Entry], hf_endpoint: str) -> dict[str, oci.Image]:
    path = "PATH=/usr/local/bin:/usr/bin:/bin"
    return {
        PAUSE: oci.Image([[Entry("pause", "file", 0o755, pause)]], entrypoint=["/pause"], user="65535:65535"),
        # HOME is left to the runtime, which takes it from /etc/passwd (root: /root), as in vLLM's image.
        VLLM_SIM: oci.Image([rootfs], entrypoint=["python3", "/opt/gs/vllm_sim.py", "serve"],
                            env=[path, "PYTHONDONTWRITEBYTECODE=1", f"HF_ENDPOINT={hf_endpoint}"]),
        # curlimages/curl's user (curl_user:curl_group): a Job that stopped setting runAsUser would
        # still not run as root.
        SMOKE: oci.Image([rootfs], cmd=["/bin/sh"], env=[path], user="100:101"),
    }


def write_images(work: Path, downloads: Path, debs: list[Deb], hf_endpoint: str, key: str) -> None:
    pause = build_pause(work / "pause")
    rootfs = python_rootfs(fetch_debs(debs, downloads), fetch_wheels(downloads))
    images = image_set(pause, rootfs, hf_endpoint)
    with (work / "images.tar").open("wb") as out:
        digests = oci.write_archive(out, images)
    (work / "pause").unlink()
    meta = {"key": key, "hf_endpoint": hf_endpoint, "digests": digests, "debs": {d.package: d.version for d in debs}}
    (work / "images.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.rename(path)


# ---- the picker proof's images -----------------------------------------------------------------


ENDPOINT_BUILD = HERE.parent / "endpoint" / "build.sh"
PICKER_USER = "65532:65532"
"""distroless's nonroot, the user of the upstream EPP image: both binaries are static and need no passwd entry."""


def picker_names() -> dict[str, str]:
    """Binary in testbed/endpoint/build.sh's folder → its image name, tagged with the module version it was built at."""
    pins = cluster_pins()
    return {"epp": f"gs-testbed/epp:{pins['INFERENCE_EXTENSION_VERSION']}",
            "llm-d-inference-sim": f"gs-testbed/llm-d-inference-sim:{pins['INFERENCE_SIM_VERSION']}"}


def build_picker(cache: Path | None = None) -> Images:
    """The endpoint picker and llm-d's simulator as images, each its static binary alone (as pause), in an archive
    of their own beside the node's: it is imported into a node already running (testbed/e2e/real_picker.py), so the
    node's images and their cache key do not depend on this much longer build. The binaries come from
    testbed/endpoint/build.sh (cached; a cold build takes many minutes)."""
    bins = Path(run(["bash", str(ENDPOINT_BUILD)]).strip())
    names = picker_names()
    digest = hashlib.sha256()
    for part in (*(name.encode() + (bins / binary).read_bytes() for binary, name in sorted(names.items())),
                 Path(__file__).read_bytes(), Path(oci.__file__).read_bytes(), platform.python_version().encode()):
        digest.update(hashlib.sha256(part).digest())
    key = digest.hexdigest()

    def write(work: Path) -> None:
        images = {name: oci.Image([[Entry(binary, "file", 0o755, (bins / binary).read_bytes())]], entrypoint=[f"/{binary}"],
                                  user=PICKER_USER) for binary, name in names.items()}
        with (work / "images.tar").open("wb") as out:
            digests = oci.write_archive(out, images)
        (work / "images.json").write_text(json.dumps({"key": key, "digests": digests}, indent=1, sort_keys=True) + "\n")

    return cached(cache or gs_cache() / "node", f"picker-images-{key[:16]}", write)


# ---- the command -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.node.images", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="the folder for images-<key>/ (default $GS_CACHE/node)")
    parser.add_argument("--hf-endpoint", default=DEFAULT_HF_ENDPOINT,
                        help=f"HF_ENDPOINT in the vllm-sim image (default {DEFAULT_HF_ENDPOINT})")
    parser.add_argument("--picker", action="store_true", help="the endpoint picker and llm-d simulator images instead")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        images = build_picker(args.out) if args.picker else build(args.out, hf_endpoint=args.hf_endpoint)
    except BuildError as error:
        print(f"node images: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"archive": str(images.archive), "images": {name: images.pinned(name) for name in sorted(images.digests)}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
