"""A stand-in for the Hugging Face hub, said to be one: on 127.0.0.1, serving tiny repositories a test makes.

Just the endpoints the real `huggingface_hub` client calls for what the download Job does
(`HfApi().model_info`, `list_repo_files`, `snapshot_download`) with `HF_ENDPOINT` pointing here:

    GET  /api/models/<org>/<name>/revision/<rev>        model info: sha, siblings
    GET  /api/models/<org>/<name>/tree/<rev>[/<path>]   the file tree (one page)
    HEAD /<org>/<name>/resolve/<rev>/<path>             X-Repo-Commit, ETag, Content-Length; LFS files
    GET  /<org>/<name>/resolve/<rev>/<path>             redirect (302) to <cdn>/lfs/<sha256> with X-Linked-Etag
    GET  /lfs/<sha256>                                  and X-Linked-Size, as the hub's CDN redirect (Range too)

Refusals carry the hub's `X-Error-Code`/`X-Error-Message` headers, which the client turns into
its exception classes: an unknown token is 401 "Invalid credentials in Authorization header"; a
gated repository without a token is 401 `GatedRepo`, with a token not granted 403 `GatedRepo`; a
private one is `RepoNotFound`, as are unknown repositories; an unknown revision `RevisionNotFound`.
It cannot show xet storage, pagination, rate limits, or anything about the real hub's availability.

    python -m testbed.standins.hub --repo org/name --files DIR [--commit SHA] [--access gated] [--port N] [--cdn-url URL]

serves DIR's files as that repository (the bearer token for a gated or private one from
GS_HUB_TOKEN: never on the command line).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
"""Stored in git LFS by the hub's default .gitattributes: their resolve redirects to the CDN."""


INVALID_TOKEN = "Invalid credentials in Authorization header"
"""The hub's X-Error-Message for a token it does not know; the client then raises a plain HTTP error."""


COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Repo:
    repo_id: str
    files: Mapping[str, bytes]
    commit: str = "0" * 40
    branches: Mapping[str, str] = field(default_factory=dict)
    """Branch or tag names to commits; `main` points at `commit` unless given."""
    access: Literal["public", "gated", "private"] = "public"
    token: str = ""
    """The bearer token granted this repository (a gated or private one)."""

    def refs(self) -> dict[str, str]:
        return {"main": self.commit, **self.branches}


@dataclass(frozen=True)
class HubError(Exception):
    status: int
    code: str | None
    message: str


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_oid(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


def resolve_revision(repo: Repo, revision: str) -> str:
    """The commit a revision names: a branch or tag, or the repository's commit itself."""
    if revision == repo.commit or (COMMIT.fullmatch(revision) and revision in repo.refs().values()):
        return revision
    if revision in repo.refs():
        return repo.refs()[revision]
    raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")


def check_access(repo: Repo | None, repo_id: str, authorization: str | None, known_tokens: set[str]) -> Repo:
    """What the hub answers before anything else: the token first, then the repository's access."""
    token = authorization.removeprefix("Bearer ") if authorization and authorization.startswith("Bearer ") else None
    if token is not None and token not in known_tokens:
        raise HubError(401, None, INVALID_TOKEN)
    if repo is None:
        raise HubError(404, "RepoNotFound", "Repository not found")
    if repo.access == "public" or (token is not None and token == repo.token):
        return repo
    if repo.access == "gated":
        status = 401 if token is None else 403
        raise HubError(status, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it and be authenticated.")
    raise HubError(401 if token is None else 404, "RepoNotFound", "Repository not found")


def model_info(repo: Repo, commit: str, blobs: bool) -> dict[str, Any]:
    def sibling(path: str) -> dict[str, Any]:
        if not blobs:
            return {"rfilename": path}
        entry = tree_entry(path, repo.files[path])
        return {"rfilename": path, "blobId": entry["oid"], "size": entry["size"], **({"lfs": entry["lfs"]} if "lfs" in entry else {})}

    siblings = [sibling(path) for path in sorted(repo.files)]
    return {
        "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.repo_id.split("/", 1)[0],
        "sha": commit,
        "private": repo.access == "private",
        "gated": "manual" if repo.access == "gated" else False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": ["stand-in"],
        "siblings": siblings,
        "cardData": {"description": "a repository served by gpu-serving's stand-in hub (testbed/standins/hub.py)"},
    }


def tree_entry(path: str, data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
    if is_lfs(path):
        entry["lfs"] = {"oid": lfs_oid(data), "size": len(data), "pointerSize": 134}
    return entry


def tree(repo: Repo, under: str, recursive: bool) -> list[dict[str, Any]]:
    """Files and folders below `under`, as the tree endpoint lists them (folders before their files)."""
    prefix = f"{under.strip('/')}/" if under.strip("/") else ""
    folders: set[str] = set()
    files = []
    for path in sorted(p for p in repo.files if p.startswith(prefix)):
        rest = path[len(prefix):].split("/")
        for depth in range(1, len(rest) if recursive else min(2, len(rest))):
            folders.add(prefix + "/".join(rest[:depth]))
        if recursive or len(rest) == 1:
            files.append(tree_entry(path, repo.files[path]))
    listed = [{"type": "directory", "oid": git_blob_id(f.encode()), "size": 0, "path": f} for f in sorted(folders)]
    return listed + files


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) of a `Range: bytes=N-[M]` request (the client resumes with one); None for the whole file."""
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", header or "")
    if not match:
        return None
    first, last = int(match[1]), int(match[2]) if match[2] else size - 1
    return (first, min(last, size - 1)) if first < size else (size, size - 1)


class Hub:
    """The stand-in hub in a thread of the calling process: `with Hub([repo]) as hub: hub.url`."""

    def __init__(self, repos: list[Repo], port: int = 0, cdn_url: str | None = None) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.tokens = {r.token for r in repos if r.token}
        self.blobs = {lfs_oid(d): d for r in repos for p, d in r.files.items() if is_lfs(p)}
        self.requests: list[tuple[str, str, bool]] = []
        """(method, path, whether a bearer token came): what the clients asked, in order."""
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        # The hub's CDN is another host: a client (huggingface_hub 1.x on) follows a same-host redirect
        # for metadata, where the CDN sends no X-Repo-Commit, and it drops the token for another host.
        # By default this server under another name; a client that reaches it elsewhere gives its own.
        self.cdn_url = cdn_url or self.url.replace("127.0.0.1", "localhost")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Hub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def record(self, method: str, path: str, authorised: bool) -> None:
        with self._lock:
            self.requests.append((method, path, authorised))

    def answer(self, path: str, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request; HubError for a refusal."""
        parts = urlsplit(path)
        query = dict(q.split("=", 1) if "=" in q else (q, "") for q in parts.query.split("&") if q)
        route = parts.path
        if match := re.fullmatch(r"/lfs/([0-9a-f]{64})", route):
            if match[1] not in self.blobs:
                raise HubError(404, "EntryNotFound", "no such object")
            return 200, {}, self.blobs[match[1]]
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(?:/(.*))?", route):
            repo_id, kind, revision, under = match[1], match[2], unquote(match[3]), unquote(match[4] or "")
            repo = check_access(self.repos.get(repo_id), repo_id, headers.get("Authorization"), self.tokens)
            commit = resolve_revision(repo, revision)
            found = model_info(repo, commit, query.get("blobs") == "True") if kind == "revision" else \
                tree(repo, under, query.get("recursive") in ("True", "true", "1"))
            return 200, {"Content-Type": "application/json"}, json.dumps(found).encode()
        if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", route):
            repo_id, revision, file = match[1], unquote(match[2]), unquote(match[3])
            repo = check_access(self.repos.get(repo_id), repo_id, headers.get("Authorization"), self.tokens)
            commit = resolve_revision(repo, revision)
            if file not in repo.files:
                raise HubError(404, "EntryNotFound", f"{file} does not exist on {revision}")
            return self.resolve(repo.files[file], file, commit)
        raise HubError(404, None, f"the stand-in hub does not serve {route}")

    def resolve(self, data: bytes, file: str, commit: str) -> tuple[int, dict[str, str], bytes]:
        headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_id(data)}"', "Accept-Ranges": "bytes"}
        if not is_lfs(file):
            return 200, headers, data
        oid = lfs_oid(data)
        headers.update({"X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(len(data)), "Location": f"{self.cdn_url}/lfs/{oid}"})
        return 302, headers, b""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "gpu-serving-hub-stand-in"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.reply(body_wanted=False)

            def do_GET(self) -> None:
                self.reply(body_wanted=True)

            def reply(self, body_wanted: bool) -> None:
                hub.record(self.command, self.path, "Authorization" in self.headers)
                try:
                    status, headers, body = hub.answer(self.path, self.headers)
                except HubError as error:
                    status, body = error.status, json.dumps({"error": error.message}).encode()
                    headers = {"Content-Type": "application/json", "X-Error-Message": error.message}
                    if error.code:
                        headers["X-Error-Code"] = error.code
                span = byte_range(self.headers.get("Range"), len(body)) if status == 200 else None
                if span:
                    headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{len(body)}"
                    status, body = 206, body[span[0]:span[1] + 1]
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body_wanted:
                    self.wfile.write(body)

        return Handler


def read_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.standins.hub", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--repo", required=True, help="org/name")
    parser.add_argument("--files", type=Path, required=True, help="the folder whose files the repository holds")
    parser.add_argument("--commit", default=hashlib.sha1(b"gpu-serving stand-in").hexdigest())
    parser.add_argument("--access", choices=("public", "gated", "private"), default="public")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cdn-url", help="where LFS files redirect to: this server under another host name, as clients reach it")
    args = parser.parse_args(argv)
    token = os.environ.get("GS_HUB_TOKEN", "")
    if args.access != "public" and not token:
        print(f"ERROR: a {args.access} repository needs its token in GS_HUB_TOKEN", file=sys.stderr)
        return 2
    if not args.files.is_dir():
        print(f"ERROR: {args.files} is not a folder: give --files the folder holding the repository's files", file=sys.stderr)
        return 2
    repo = Repo(args.repo, read_files(args.files), args.commit, access=args.access, token=token)
    with Hub([repo], args.port, args.cdn_url) as hub:
        print(f"hub stand-in on {hub.url}: {repo.repo_id}@{repo.commit} ({len(repo.files)} files, {repo.access})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
