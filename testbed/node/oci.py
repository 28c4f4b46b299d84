"""A small OCI image-layout writer: one uncompressed layer per image, written deterministically
into ONE tar archive that `ctr -n k8s.io images import --platform linux/amd64 --digests` takes.

Standard library only. Same entries and configs in, byte-identical archive out: entries are
sorted, every timestamp is 0, owner names are empty, the tar has no pax headers, and the JSON is
written with sorted keys. What it cannot show: that containerd accepts it; only an import on a
node with a real containerd does (docs/real-node-plan.md, "Images without a registry").
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
NAME_ANNOTATION = "io.containerd.image.name"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
PLATFORM = {"architecture": "amd64", "os": "linux"}
"""In every config, as containerd skips a manifest whose config names no platform (it cannot match
`--platform linux/amd64`); in every index entry too, so a matcher need not read the config."""


Kind = Literal["file", "dir", "symlink"]


@dataclass(frozen=True)
class Entry:
    """One path of a layer: `path` is relative (`usr/bin/curl`), `mode` the permission bits with
    setuid/setgid/sticky. Hard links are not a kind: a writer stores a copy, which costs bytes only."""

    path: str
    kind: Kind
    mode: int
    data: bytes = b""
    target: str = ""
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class Image:
    """What one manifest holds. Several names may share one Image: they then share its manifest."""

    layers: Sequence[Sequence[Entry]]
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ()
    user: str = ""
    working_dir: str = "/"
    labels: Mapping[str, str] = field(default_factory=dict)


# ---- references ------------------------------------------------------------------------------


def normalized(name: str) -> str:
    """The reference as containerd's CRI looks it up (`ParseDockerRef`): `gs-testbed/pause:3.10.2`
    becomes `docker.io/gs-testbed/pause:3.10.2`. An image imported under the short name is never
    found by the kubelet, which asks for the normalized one."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if rest else f"docker.io/library/{name}"


def repository(name: str) -> str:
    """`gs-testbed/smoke:v1` → `gs-testbed/smoke`; a `:` before the last `/` is a registry port."""
    name = name.split("@", 1)[0]
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.split(':', 1)[0]}"


def tag(name: str) -> str:
    last = name.split("@", 1)[0].rpartition("/")[2]
    if ":" not in last:
        raise ValueError(f"{name}: give every image name a tag")
    return last.split(":", 1)[1]


# ---- layers ----------------------------------------------------------------------------------


def entries_from_dir(root: Path) -> list[Entry]:
    """A directory tree as layer entries: modes and symlinks kept, times dropped, every owner root
    (the tree's owner is whoever unpacked it, which means nothing in the image; an Entry of its own
    gives a file another owner). Device nodes, FIFOs and sockets are refused: no layer here needs one."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in [*dirnames, *sorted(filenames)]:
            path = Path(dirpath, name)
            entries.append(_entry(path, path.relative_to(root).as_posix()))
    return entries


def _entry(path: Path, rel: str) -> Entry:
    st = path.lstat()
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return Entry(rel, "symlink", 0o777, target=os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return Entry(rel, "dir", mode)
    if stat.S_ISREG(st.st_mode):
        return Entry(rel, "file", mode, data=path.read_bytes())
    raise ValueError(f"{path}: not a file, directory or symlink (a layer here holds no device nodes)")


def with_parents(entries: Iterable[Entry]) -> list[Entry]:
    """The entries by path, the last of a path winning, and a 0755 directory for every parent no
    entry names: an extractor then never invents a parent with a mode of its own choosing."""
    by_path: dict[str, Entry] = {}
    for entry in entries:
        path = entry.path.strip("/")
        if not path or path == "." or ".." in path.split("/"):
            raise ValueError(f"{entry.path!r}: not a path inside the layer")
        by_path[path] = replace(entry, path=path)
    for path in list(by_path):
        parent = path.rpartition("/")[0]
        while parent and parent not in by_path:
            by_path[parent] = Entry(parent, "dir", 0o755)
            parent = parent.rpartition("/")[0]
        # An extractor would follow a symlink parent out of the rootfs, or fail on a file one.
        if parent and by_path[parent].kind != "dir":
            raise ValueError(f"{path}: its parent {parent} is a {by_path[parent].kind}, not a directory")
    return [by_path[path] for path in sorted(by_path)]


def _tarinfo(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.path)
    info.mode, info.uid, info.gid, info.mtime, info.uname, info.gname = entry.mode, entry.uid, entry.gid, 0, "", ""
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, entry.target
    else:
        info.type, info.size = tarfile.REGTYPE, len(entry.data)
    return info


def write_tar(entries: Iterable[Entry], out: IO[bytes]) -> None:
    """GNU format: long names without pax headers (which would carry times and owner names)."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8") as tar:
        for entry in with_parents(entries):
            tar.addfile(_tarinfo(entry), io.BytesIO(entry.data) if entry.kind == "file" else None)


def layer_tar(entries: Iterable[Entry]) -> bytes:
    buffer = io.BytesIO()
    write_tar(entries, buffer)
    return buffer.getvalue()


# ---- blobs -----------------------------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest(data), "size": len(data), **extra}


def image_config(image: Image, diff_ids: Sequence[str]) -> dict[str, Any]:
    """No `created` and no history: both would carry the build's time into the digest."""
    fields: dict[str, Any] = {
        "Entrypoint": list(image.entrypoint),
        "Cmd": list(image.cmd),
        "Env": list(image.env),
        "User": image.user,
        "WorkingDir": image.working_dir,
        "Labels": dict(image.labels),
    }
    # An empty Cmd left out, not written as []: a runtime then takes the pod's args alone.
    config = {key: value for key, value in fields.items() if value}
    return {**PLATFORM, "config": config, "rootfs": {"type": "layers", "diff_ids": list(diff_ids)}}


def image_blobs(image: Image, blobs: dict[str, bytes], written: dict[int, dict[str, Any]]) -> bytes:
    """Adds the image's layers and config to `blobs` (by digest); returns its manifest. `written`
    holds each layer's descriptor by the id of its entries: images sharing a rootfs tar it once."""
    layers = []
    for entries in image.layers:
        if id(entries) not in written:
            data = layer_tar(entries)
            blobs[digest(data)] = data
            written[id(entries)] = descriptor(LAYER_MEDIA_TYPE, data)
        layers.append(written[id(entries)])
    config = canonical_json(image_config(image, [layer["digest"] for layer in layers]))
    blobs[digest(config)] = config
    manifest = canonical_json({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": descriptor(CONFIG_MEDIA_TYPE, config),
        "layers": layers,
    })
    blobs[digest(manifest)] = manifest
    return manifest


def index_entries(name: str, manifest: bytes) -> list[dict[str, Any]]:
    """Two names per image, as the CRI itself records a pulled image (repo tag and repo digest):
    a pod naming `repo:tag@sha256:…` is looked up by `docker.io/repo@sha256:…` alone, which the
    import's own `import-<date>@sha256:…` name is not."""
    full = normalized(name)
    by_digest = f"{repository(full)}@{digest(manifest)}"
    return [
        descriptor(MANIFEST_MEDIA_TYPE, manifest, platform=PLATFORM,
                   annotations={NAME_ANNOTATION: full, REF_NAME_ANNOTATION: tag(name)}),
        descriptor(MANIFEST_MEDIA_TYPE, manifest, platform=PLATFORM,
                   annotations={NAME_ANNOTATION: by_digest, REF_NAME_ANNOTATION: by_digest}),
    ]


def write_archive(out: IO[bytes], images: Mapping[str, Image]) -> dict[str, str]:
    """Writes the OCI layout for `images` (name → Image) as one tar to `out`; returns each name's
    manifest digest. Names sharing an Image object share its layer, config and manifest blobs."""
    blobs: dict[str, bytes] = {}
    layers: dict[int, dict[str, Any]] = {}
    manifests: dict[int, bytes] = {}
    manifest_of: dict[str, str] = {}
    index: list[dict[str, Any]] = []
    for name in sorted(images):
        image = images[name]
        if id(image) not in manifests:
            manifests[id(image)] = image_blobs(image, blobs, layers)
        manifest = manifests[id(image)]
        manifest_of[name] = digest(manifest)
        index.extend(index_entries(name, manifest))
    layout = [
        Entry("oci-layout", "file", 0o644, canonical_json({"imageLayoutVersion": "1.0.0"})),
        Entry("index.json", "file", 0o644, canonical_json({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": index})),
        *(Entry(f"blobs/sha256/{key.removeprefix('sha256:')}", "file", 0o644, data) for key, data in blobs.items()),
    ]
    write_tar(layout, out)
    return manifest_of
