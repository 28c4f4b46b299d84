"""A stand-in for a fleet of SSH hosts, said to be one: on 127.0.0.1, one port per node, running nothing.

    python3 -m testbed.standins.ssh --nodes gpu-00,gpu-01 --log sessions.jsonl --files DIR [--seconds S]

For the real-engine benchmark's `pulumi up` of a generated stack: the node steps are
`remote.Command`s that must reach a host, and the machine has neither 32 nodes nor disks to
partition. Every exec request is answered with exit 0 and no output, after `--seconds` (default 0);
the script sent is read only for the step's name (its `# gpu-serving: components/node_scripts/NN-step.sh`
line) and never run. Any user is let in without authentication. One JSON line per session goes to
`--log` (node, step, start and end times), so a benchmark can tell how many Commands ran and how
many nodes had their steps running side by side. Once listening it prints `{"node": port, ...}` on one line.
Files copied to a node (its copy of the step files, over SFTP) land under `--files`/<node>/, that node's SFTP root,
and each SFTP session is logged as the step `copy`.

It runs under Debian's python3 with Debian's python3-asyncssh (testbed/vm/install-host-deps.sh):
the project's venv stays free of an SSH server library. It cannot show a real login's cost, a
node's scripts or their output (the health step reports nothing, so the node's outputs stay unknown).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
import warnings
from pathlib import Path
from typing import IO, Any

STEP = re.compile(r"^# gpu-serving: components/node_scripts/(\S+)\.sh", re.MULTILINE)


def step_of(command: str) -> str:
    """The node step a script is (`10-preflight`), or `-` for anything else (the bare program's `true`)."""
    match = STEP.search(command)
    return match.group(1) if match else "-"


def overlapping_nodes(sessions: list[dict[str, Any]]) -> int:
    """The most nodes that had a session open at the same instant (sessions of one node count once)."""
    events = sorted([(s["start"], 1, s["node"]) for s in sessions] + [(s["end"], -1, s["node"]) for s in sessions],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant: touching is not overlapping
    open_by_node: dict[str, int] = {}
    most = 0
    for _, change, node in events:
        open_by_node[node] = open_by_node.get(node, 0) + change
        most = max(most, sum(1 for n in open_by_node.values() if n > 0))
    return most


def chains(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node's sessions as one span, from its first start to its last end: a session lasts
    milliseconds here, so nodes whose steps ran side by side show as overlapping spans, not sessions."""
    spans: dict[str, dict[str, Any]] = {}
    for session in sessions:
        span = spans.setdefault(session["node"], {"node": session["node"], "start": session["start"], "end": session["end"]})
        span["start"], span["end"] = min(span["start"], session["start"]), max(span["end"], session["end"])
    return list(spans.values())


def read_log(path: Any) -> list[dict[str, Any]]:
    try:
        text = open(path).read()  # noqa: SIM115 - a short read of a file another process appends to
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def serve(nodes: list[str], log: IO[str], seconds: float, files: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # asyncssh's import warns about ciphers it will not be asked for
        import asyncssh

    class Server(asyncssh.SSHServer):  # type: ignore[misc]
        def begin_auth(self, username: str) -> bool:
            return False  # nothing runs here, so there is nothing to protect

    def session(node: str) -> Any:
        async def run(process: Any) -> None:
            start = time.time()
            if seconds:
                await asyncio.sleep(seconds)
            # Logged before the exit status goes out: a client that saw its command end finds it in the log.
            log.write(json.dumps({"node": node, "step": step_of(process.command or ""), "start": start, "end": time.time()}) + "\n")
            log.flush()
            process.exit(0)

        return run

    def sftp(node: str) -> Any:
        root = files / node
        root.mkdir(parents=True, exist_ok=True)

        def factory(channel: Any) -> Any:
            log.write(json.dumps({"node": node, "step": "copy", "start": time.time(), "end": time.time()}) + "\n")
            log.flush()
            return asyncssh.SFTPServer(channel, chroot=str(root))

        return factory

    key = asyncssh.generate_private_key("ssh-ed25519")
    ports = {}
    for node in nodes:
        server = await asyncssh.create_server(Server, "127.0.0.1", 0, server_host_keys=[key], process_factory=session(node),
                                              sftp_factory=sftp(node))
        ports[node] = server.sockets[0].getsockname()[1]
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m testbed.standins.ssh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", required=True, type=lambda text: [n for n in text.split(",") if n])
    parser.add_argument("--log", required=True)
    parser.add_argument("--seconds", type=float, default=0.0, help="how long each exec takes before it exits 0")
    parser.add_argument("--files", required=True, type=Path, help="the nodes' SFTP roots, a folder each")
    args = parser.parse_args(argv)
    with open(args.log, "a") as log, contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.nodes, log, args.seconds, args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
