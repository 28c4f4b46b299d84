"""The lab node's image builder (testbed/node): the OCI writer on tiny rootfs trees, the recipe's
pure parts, the cache, and the pause program. No network, no apt: the real build and a chroot run
of its result are `python -m testbed.node.images` and `python -m testbed.node.verify`."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from testbed.node import images, oci
from testbed.node.oci import Entry
from testbed.standins import vllm_sim
from tools.render import ROOT, Render

# ---- helpers ------------------------------------------------------------------------------------


def tiny_rootfs(root: Path) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_bytes(b"#!/bin/sh\necho tool\n")
    (root / "usr/bin/tool").chmod(0o755)
    (root / "usr/bin/sh").symlink_to("tool")
    (root / "etc").mkdir()
    (root / "etc/secret").write_text("only root\n")
    (root / "etc/secret").chmod(0o600)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    return root


def archive_of(images_by_name: dict[str, oci.Image]) -> tuple[bytes, dict[str, str]]:
    out = io.BytesIO()
    digests = oci.write_archive(out, images_by_name)
    return out.getvalue(), digests


def read_layout(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def blob(files: dict[str, bytes], digest: str) -> bytes:
    return files[f"blobs/sha256/{digest.removeprefix('sha256:')}"]


def layer_members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name.rstrip("/"): m for m in tar}


def header_typeflags(data: bytes) -> set[bytes]:
    """Every header block's type flag, read from the raw bytes (tarfile hides pax headers)."""
    flags, offset = set(), 0
    while offset + 512 <= len(data) and data[offset:offset + 512] != b"\0" * 512:
        header = data[offset:offset + 512]
        flags.add(header[156:157])
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        offset += 512 + (size + 511) // 512 * 512
    return flags


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    return tiny_rootfs(tmp_path / "rootfs")


@pytest.fixture
def image(rootfs: Path) -> oci.Image:
    return oci.Image([oci.entries_from_dir(rootfs)], entrypoint=["/usr/bin/tool"], cmd=["--flag"],
                     env=["PATH=/usr/bin"], user="100:101", working_dir="/tmp")


# ---- the OCI writer -----------------------------------------------------------------------------


def test_every_blob_is_named_by_its_digest_and_every_descriptor_matches(image: oci.Image) -> None:
    data, digests = archive_of({"gs-testbed/tool:v1": image})
    files = read_layout(data)
    for name, content in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(content).hexdigest() == name.rpartition("/")[2]
    index = json.loads(files["index.json"])
    descriptors = [*index["manifests"]]
    for entry in index["manifests"]:
        manifest = json.loads(blob(files, entry["digest"]))
        descriptors += [manifest["config"], *manifest["layers"]]
    for d in descriptors:
        assert len(blob(files, d["digest"])) == d["size"]
    assert digests == {"gs-testbed/tool:v1": index["manifests"][0]["digest"]}


def test_index_manifest_and_config_carry_what_containerd_needs(image: oci.Image) -> None:
    files = read_layout(archive_of({"gs-testbed/tool:v1": image})[0])
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    assert index["schemaVersion"] == 2 and index["mediaType"] == oci.INDEX_MEDIA_TYPE
    by_tag, by_digest = index["manifests"]
    assert by_tag["mediaType"] == by_digest["mediaType"] == oci.MANIFEST_MEDIA_TYPE
    assert by_tag["platform"] == {"architecture": "amd64", "os": "linux"}
    # The CRI looks an image up by its normalized name, and a digest-pinned one by repo@digest.
    assert by_tag["annotations"] == {oci.NAME_ANNOTATION: "docker.io/gs-testbed/tool:v1", oci.REF_NAME_ANNOTATION: "v1"}
    assert by_digest["annotations"][oci.NAME_ANNOTATION] == f"docker.io/gs-testbed/tool@{by_tag['digest']}"
    assert by_digest["digest"] == by_tag["digest"]
    manifest = json.loads(blob(files, by_tag["digest"]))
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == oci.MANIFEST_MEDIA_TYPE
    assert manifest["config"]["mediaType"] == oci.CONFIG_MEDIA_TYPE
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar"]
    config = json.loads(blob(files, manifest["config"]["digest"]))
    assert (config["architecture"], config["os"]) == ("amd64", "linux")
    assert config["config"] == {"Entrypoint": ["/usr/bin/tool"], "Cmd": ["--flag"], "Env": ["PATH=/usr/bin"],
                                "User": "100:101", "WorkingDir": "/tmp"}
    # Uncompressed: the diff_id is the layer's own digest.
    assert config["rootfs"] == {"type": "layers", "diff_ids": [manifest["layers"][0]["digest"]]}
    assert "created" not in config and "history" not in config


def test_names_sharing_an_image_share_its_manifest_and_images_sharing_a_rootfs_its_layer(rootfs: Path) -> None:
    entries = oci.entries_from_dir(rootfs)
    server, client = oci.Image([entries], entrypoint=["/usr/bin/tool"]), oci.Image([entries], cmd=["/usr/bin/sh"])
    data, digests = archive_of({"gs-testbed/a:v1": server, "gs-testbed/b:v2": server, "gs-testbed/c:v3": client})
    files = read_layout(data)
    assert digests["gs-testbed/a:v1"] == digests["gs-testbed/b:v2"] != digests["gs-testbed/c:v3"]
    index = json.loads(files["index.json"])
    names = [m["annotations"][oci.NAME_ANNOTATION] for m in index["manifests"]]
    assert names[::2] == ["docker.io/gs-testbed/a:v1", "docker.io/gs-testbed/b:v2", "docker.io/gs-testbed/c:v3"]
    layers = {json.loads(blob(files, d))["layers"][0]["digest"] for d in digests.values()}
    assert len(layers) == 1
    # One layer, two configs, two manifests.
    assert len([f for f in files if f.startswith("blobs/")]) == 5


def test_the_same_inputs_give_the_same_bytes_whatever_the_files_mtimes(rootfs: Path, image: oci.Image) -> None:
    first = archive_of({"gs-testbed/tool:v1": image})[0]
    assert archive_of({"gs-testbed/tool:v1": image})[0] == first
    for path in [rootfs, *rootfs.rglob("*")]:
        os.utime(path, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
    again = oci.Image([oci.entries_from_dir(rootfs)], entrypoint=["/usr/bin/tool"], cmd=["--flag"],
                      env=["PATH=/usr/bin"], user="100:101", working_dir="/tmp")
    assert archive_of({"gs-testbed/tool:v1": again})[0] == first
    (rootfs / "usr/bin/tool").write_bytes(b"changed\n")
    changed = oci.Image([oci.entries_from_dir(rootfs)], entrypoint=["/usr/bin/tool"])
    assert archive_of({"gs-testbed/tool:v1": changed})[0] != first


def test_the_layer_keeps_symlinks_and_modes_and_drops_times_and_names(rootfs: Path) -> None:
    data = oci.layer_tar([*oci.entries_from_dir(rootfs), Entry("home/vllm", "dir", 0o700, uid=65534, gid=65534)])
    members = layer_members(data)
    assert list(members) == sorted(members)
    assert members["usr/bin/sh"].issym() and members["usr/bin/sh"].linkname == "tool"
    assert members["usr/bin/tool"].mode == 0o755 and members["etc/secret"].mode == 0o600
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    assert all(m.mtime == 0 and m.uname == "" and m.gname == "" for m in members.values())
    # Root's, whoever unpacked the tree, unless an entry says otherwise.
    assert {(m.uid, m.gid) for name, m in members.items() if name != "home/vllm"} == {(0, 0)}
    assert (members["home/vllm"].uid, members["home/vllm"].gid) == (65534, 65534)
    assert header_typeflags(data) <= {tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE}


def test_long_paths_need_no_pax_headers() -> None:
    deep = "usr/lib/python3/dist-packages/" + "/".join(["a_rather_long_folder_name"] * 8) + "/module.py"
    data = oci.layer_tar([Entry(deep, "file", 0o644, b"x = 1\n")])
    assert deep in layer_members(data)
    assert tarfile.XHDTYPE not in header_typeflags(data) and tarfile.XGLTYPE not in header_typeflags(data)


def test_parents_are_written_before_children_with_0755() -> None:
    members = layer_members(oci.layer_tar([Entry("opt/gs/vllm_sim.py", "file", 0o644, b""), Entry("root", "dir", 0o700)]))
    assert list(members) == ["opt", "opt/gs", "opt/gs/vllm_sim.py", "root"]
    assert members["opt"].mode == members["opt/gs"].mode == 0o755 and members["root"].mode == 0o700


def test_what_a_layer_must_not_hold_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="no device nodes"):
        oci.entries_from_dir(tmp_path)
    with pytest.raises(ValueError, match="parent bin is a symlink"):
        oci.layer_tar([Entry("bin", "symlink", 0o777, target="usr/bin"), Entry("bin/sh", "file", 0o755)])
    with pytest.raises(ValueError, match="not a path inside"):
        oci.layer_tar([Entry("../escape", "file", 0o644)])
    with pytest.raises(ValueError, match="tag"):
        archive_of({"gs-testbed/untagged": oci.Image([[]])})


@pytest.mark.parametrize(("name", "full"), [
    ("gs-testbed/pause:3.10.2", "docker.io/gs-testbed/pause:3.10.2"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
    ("localhost:5000/x:y", "localhost:5000/x:y"),
])
def test_names_are_normalized_as_the_cri_looks_them_up(name: str, full: str) -> None:
    assert oci.normalized(name) == full
    assert oci.repository("localhost:5000/x:y@sha256:00") == "localhost:5000/x"


# ---- the recipe ---------------------------------------------------------------------------------


def test_debs_move_into_usr_and_docs_are_pruned() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, extra in [("./", tarfile.DIRTYPE, ""), ("./bin/", tarfile.DIRTYPE, ""), ("./bin/busybox", tarfile.REGTYPE, ""),
                                  ("./lib64/ld-linux-x86-64.so.2", tarfile.SYMTYPE, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
                                  ("./usr/share/doc/busybox/copyright", tarfile.REGTYPE, "")]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, extra, 0o755
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
        hard = tarfile.TarInfo("./usr/bin/other")
        hard.type, hard.linkname = tarfile.LNKTYPE, "./bin/busybox"
        tar.addfile(hard)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        members = tar.getmembers()
        entries = [images.tar_entry(tar, m) for m in members[:-1]]
        with pytest.raises(images.BuildError, match="only files, directories and symlinks"):
            images.tar_entry(tar, members[-1])
    assert [(e.path, e.kind) for e in entries if e] == [("usr/bin/busybox", "file"), ("usr/lib64/ld-linux-x86-64.so.2", "symlink")]


def test_apt_stanzas_become_dependency_groups() -> None:
    text = ("Package: python3-minimal\nVersion: 3.11.2-1+b1\nArchitecture: amd64\nPre-Depends: python3.11-minimal (>= 3.11.2-1~)\n"
            "Depends: dpkg (>= 1.13.20), media-types | mime-support, libfoo:any\nSHA256: ab\nDescription: x\n continued: line\n\n"
            "Package: other\nVersion: 1\n")
    first, second = images.parse_stanzas(text)
    assert first["SHA256"] == "ab" and second == {"Package": "other", "Version": "1"}
    assert images.dependency_groups(first) == (("python3.11-minimal",), ("dpkg",), ("media-types", "mime-support"), ("libfoo",))


def test_a_dependency_in_neither_list_stops_the_build() -> None:
    debs = [images.Deb("curl", "1", "00", (("libcurl4",), ("dpkg",))), images.Deb("libcurl4", "1", "01", (("libnew1",),))]
    with pytest.raises(images.BuildError, match="libcurl4 needs libnew1"):
        images.check_dependencies(debs)
    images.check_dependencies([debs[0], images.Deb("libcurl4", "1", "01", ())])


def test_wheels_install_into_debians_dist_packages(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
        tool = zipfile.ZipInfo("pkg/tool.sh")
        tool.external_attr = 0o100775 << 16
        archive.writestr(tool, "#!/bin/sh\n")
        archive.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\n")
    entries = {e.path: e.mode for e in images.wheel_entries(wheel)}
    assert entries == {f"{images.SITE_PACKAGES}/pkg/__init__.py": 0o644, f"{images.SITE_PACKAGES}/pkg/tool.sh": 0o755,
                       f"{images.SITE_PACKAGES}/pkg-1.0.dist-info/METADATA": 0o644}
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("pkg-1.0.data/scripts/x", "")
    with pytest.raises(images.BuildError, match=r"has a \.data folder"):
        list(images.wheel_entries(wheel))


@pytest.mark.skipif(sys.version_info[:2] != images.IMAGE_PYTHON, reason="only a 3.11 host writes the image's bytecode")
def test_modules_carry_bytecode_that_python_loads_instead_of_compiling(tmp_path: Path) -> None:
    site = images.SITE_PACKAGES
    entries = [Entry(f"{site}/pkg/__init__.py", "file", 0o644, b"VALUE = 42\n"),
               Entry(f"{site}/pkg/bad.py", "file", 0o644, b"def (:\n"),  # skipped, as py3compile skips it
               Entry(f"{site}/pkg/unused.py", "file", 0o644, b"x = 1\n")]  # no program imports it: left alone
    compiled = images.bytecode(entries, {f"{site}/pkg/__init__.py", f"{site}/pkg/bad.py"})
    assert [e.path for e in compiled] == [f"{site}/pkg/__pycache__/__init__.{sys.implementation.cache_tag}.pyc"]
    for entry in (entries[0], *compiled):
        (tmp_path / entry.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / entry.path).write_bytes(entry.data)
    # The source changed after the build: an unchecked-hash pyc is used as it is, so 42 proves the bytecode
    # was loaded and nothing compiled (-B: nothing written either, as in the pod).
    (tmp_path / site / "pkg/__init__.py").write_bytes(b"VALUE = 1\n")
    out = subprocess.run([sys.executable, "-B", "-c", "import pkg; print(pkg.VALUE)"],
                         env={**os.environ, "PYTHONPATH": str(tmp_path / site)}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["42"]


@pytest.mark.skipif(sys.version_info[:2] != images.IMAGE_PYTHON, reason="only a 3.11 host writes the image's bytecode")
def test_what_is_compiled_is_what_the_pods_programs_import() -> None:
    modules = images.imported_modules()
    stdlib, site = "usr/lib/python3.11", images.SITE_PACKAGES
    # The download Job's client, the stand-in's HTTP server, the init container's json, and what every start loads.
    for path in (f"{site}/huggingface_hub/__init__.py", f"{site}/huggingface_hub/_snapshot_download.py",
                 f"{site}/requests/__init__.py", f"{stdlib}/http/server.py", f"{stdlib}/json/__init__.py",
                 f"{stdlib}/encodings/__init__.py"):
        assert path in modules, path
    assert not any("/pip/" in m or "/pulumi/" in m or "/pytest/" in m for m in modules)  # the venv's own are not
    assert not any(m.startswith(f"{stdlib}/tkinter/") or m.startswith(f"{stdlib}/unittest/") for m in modules)


def test_the_pinned_client_is_the_one_the_stand_in_tests_run() -> None:
    pinned = re.search(r"^huggingface_hub==(\S+)$", (ROOT / "requirements-dev.txt").read_text(), re.MULTILINE)
    assert pinned and any(name.startswith(f"huggingface_hub-{pinned[1]}-") for name in images.WHEELS)
    assert not any(name.startswith("hf_xet") for name in images.WHEELS)


def built(hf_endpoint: str) -> tuple[dict[str, str], dict[str, bytes]]:
    rootfs = [Entry("usr/bin/busybox", "file", 0o755, b"busybox"), Entry("bin", "symlink", 0o777, target="usr/bin")]
    data, digests = archive_of(images.image_set(b"pause", rootfs, hf_endpoint))
    return digests, read_layout(data)


def config_of(files: dict[str, bytes], digest: str) -> dict[str, Any]:
    return json.loads(blob(files, json.loads(blob(files, digest))["config"]["digest"]))["config"]


def test_the_smoke_digest_does_not_move_with_the_hub_endpoint() -> None:
    first, files = built("http://10.244.0.1:18080")
    second, _ = built("http://192.0.2.1:1")
    assert first[images.SMOKE] == second[images.SMOKE]
    assert first[images.VLLM_SIM] != second[images.VLLM_SIM]
    assert "HF_ENDPOINT=http://10.244.0.1:18080" in config_of(files, first[images.VLLM_SIM])["Env"]
    assert config_of(files, first[images.PAUSE]) == {"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"}


def test_the_pods_command_and_args_reach_vllm_sim(prod: Render) -> None:
    """The Deployment runs `vllm serve` by name: the image's `vllm` on PATH hands its arguments to the stand-in,
    which must read them as `vllm serve` would. The image's own Entrypoint does the same. The Jobs set their own."""
    digests, files = built(images.DEFAULT_HF_ENDPOINT)
    entrypoint = config_of(files, digests[images.VLLM_SIM])["Entrypoint"]
    assert entrypoint == ["python3", "/opt/gs/vllm_sim.py", "serve"]
    (deployment,) = prod.of_type("kubernetes:apps/v1:Deployment")
    (server,) = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert server["command"] == ["vllm", "serve"]
    assert images.VLLM_SHIM.path == "usr/local/bin/vllm" and images.VLLM_SHIM.mode == 0o755
    assert images.VLLM_SHIM.data.splitlines()[-1] == b'exec python3 /opt/gs/vllm_sim.py "$@"'
    args, unknown = vllm_sim.parse_args([*server["command"][1:], *server["args"]])
    assert args.model == server["args"][0] and not unknown
    commands = {tuple(job.inputs["spec"]["template"]["spec"]["containers"][0]["command"][:2])
                for job in prod.of_type("kubernetes:batch/v1:Job")}
    assert commands == {("python3", "-c"), ("/bin/sh", "-c")}


def test_the_etc_files_name_the_users_the_pods_run_as() -> None:
    passwd = images.ETC_FILES["etc/passwd"]
    assert re.search(r"^root:x:0:0:[^:]*:/root:", passwd, re.MULTILINE)
    # The nonRoot profile's 65534 answers getpwuid() (components/serving/profile.py); no invented UID does.
    assert re.search(r"^nobody:x:65534:65534:", passwd, re.MULTILINE)
    assert len(passwd.splitlines()) == 2


# ---- the cache ----------------------------------------------------------------------------------


@pytest.fixture
def no_host_inputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """build() with apt and Go answered here and the write recorded, not done."""
    monkeypatch.setenv("GS_CACHE", str(tmp_path / "gs"))
    monkeypatch.setattr(images, "resolve_debs", lambda downloads: [images.Deb("libc6", "1", "ab" * 32, ())])
    monkeypatch.setattr(images, "go_version", lambda: "go version go1.26.8 linux/amd64")
    writes: list[str] = []

    def write_images(work: Path, downloads: Path, debs: list[images.Deb], hf_endpoint: str, key: str) -> None:
        writes.append(hf_endpoint)
        (work / "images.tar").write_bytes(b"archive")
        (work / "images.json").write_text(json.dumps({"digests": {images.SMOKE: "sha256:" + "0" * 64}}))

    monkeypatch.setattr(images, "write_images", write_images)
    return writes


def test_a_warm_cache_answers_without_building(no_host_inputs: list[str], tmp_path: Path) -> None:
    first = images.build(tmp_path / "out")
    start = time.monotonic()
    again = images.build(tmp_path / "out")
    assert time.monotonic() - start < 0.5
    assert again == first and no_host_inputs == [images.DEFAULT_HF_ENDPOINT]
    assert first.archive.read_bytes() == b"archive" and first.archive.parent.name.startswith("images-")
    assert first.pinned(images.SMOKE) == f"{images.SMOKE}@sha256:{'0' * 64}"
    assert not list((tmp_path / "out").glob(".build-*"))


def test_any_input_makes_a_new_key(no_host_inputs: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = images.build(tmp_path / "out")
    other_endpoint = images.build(tmp_path / "out", hf_endpoint="http://192.0.2.1:1")
    monkeypatch.setattr(images, "resolve_debs", lambda downloads: [images.Deb("libc6", "2", "cd" * 32, ())])
    other_debs = images.build(tmp_path / "out")
    assert len({first.archive, other_endpoint.archive, other_debs.archive}) == 3
    assert len(no_host_inputs) == 3


def test_a_failed_build_leaves_nothing_behind(no_host_inputs: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise images.BuildError("apt-get download … failed")

    monkeypatch.setattr(images, "write_images", fail)
    with pytest.raises(images.BuildError):
        images.build(tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == [".build.lock"]


# ---- the pause program --------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("go") is None, reason="Go >= 1.26 builds the pause binary")
def test_pause_builds_static_and_reproducibly_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    first = images.build_pause(tmp_path / "pause")
    assert first[:4] == b"\x7fELF" and b"ld-linux" not in first, "not a static binary"
    assert images.build_pause(tmp_path / "again") == first
    process = subprocess.Popen([tmp_path / "pause"])
    time.sleep(0.3)
    assert process.poll() is None, "pause did not keep running"
    process.send_signal(signal.SIGTERM)
    assert process.wait(5) == 0
