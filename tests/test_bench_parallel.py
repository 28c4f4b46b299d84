"""testbed/bench_parallel.py: when each of two machines ran a node step, from their sshd journals, and the
two-node stack it runs (the full run is `make bench-engine`: it boots two VMs)."""

from __future__ import annotations

from pathlib import Path

from stacks.config import parse
from testbed import bench_parallel

# `journalctl -t sshd -o short-unix` in the lab VM (Debian bookworm, OpenSSH 9.2, LogLevel VERBOSE), as it
# wrote it: two Commands on connections the provider keeps open; the third session has not closed yet.
JOURNAL = """\
1796456173.103435 vmtest sshd[2237]: Connection from 10.0.2.2 port 50236 on 10.0.2.15 port 22 rdomain ""
1796456173.210494 vmtest sshd[2237]: Accepted publickey for root from 10.0.2.2 port 50236 ssh2: ED25519 SHA256:Gup
1796456173.234573 vmtest sshd[2237]: Starting session: command for root from 10.0.2.2 port 50236 id 0
1796456174.389227 vmtest sshd[2276]: Accepted publickey for root from 10.0.2.2 port 50238 ssh2: ED25519 SHA256:Gup
1796456174.413574 vmtest sshd[2276]: Starting session: command for root from 10.0.2.2 port 50238 id 0
1796456174.587033 vmtest sshd[2276]: Close session: user root from 10.0.2.2 port 50238 id 0
1796456175.164497 vmtest sshd[2237]: Close session: user root from 10.0.2.2 port 50236 id 0
1796456175.200000 vmtest sshd[2237]: Starting session: command for root from 10.0.2.2 port 50236 id 1
1796456176.838977 vmtest sshd[2237]: Connection closed by 10.0.2.2 port 50236
"""


def test_sessions_pair_each_started_session_with_its_close() -> None:
    assert bench_parallel.sessions(JOURNAL) == [(1796456173.234573, 1796456175.164497), (1796456174.413574, 1796456174.587033)]


def test_both_at_once_is_the_overlap_of_the_two_machines_busy_time() -> None:
    assert bench_parallel.both_at_once([(0, 4), (2, 6)], [(5, 8)]) == 1
    assert bench_parallel.both_at_once([(0, 2), (4, 6)], [(1, 5)]) == 2
    assert bench_parallel.both_at_once([(0, 2)], [(2, 4)]) == 0  # one after the other, as --parallel 1 runs them


def test_the_two_node_stack_is_the_lab_stack_on_two_machines(tmp_path: Path) -> None:
    raw = bench_parallel.two_node_stack((2201, 2202), tmp_path, raid="models2", mount="/mnt/models2")
    config = parse(raw)
    assert [n.name for n in config.nodes] == list(bench_parallel.NODES)
    assert [n.ssh.port for n in config.nodes] == [2201, 2202]
    assert {(n.storage.raid_name, n.storage.mountpoint, n.storage.size_gb) for n in config.nodes} == {("models2", "/mnt/models2", 2)}
    assert [n.storage.disks for n in config.nodes] == [["/dev/disk/by-id/virtio-gs-disk-a", "/dev/disk/by-id/virtio-gs-disk-b"],
                                                       ["/dev/disk/by-id/virtio-gs-disk-c", "/dev/disk/by-id/virtio-gs-disk-d"]]
    report = bench_parallel.markdown((bench_parallel.Up("default", 90.0, (7, 7), (80.0, 82.0), 70.0),
                                      bench_parallel.Up("1", 150.0, (7, 7), (60.0, 61.0), 0.0)))
    assert "| the default `--parallel` | 90.0 | 7 / 7 | 80.0 / 82.0 | **70.0** |" in report
    assert "| `--parallel 1` | 150.0 | 7 / 7 | 60.0 / 61.0 | **0.0** |" in report
