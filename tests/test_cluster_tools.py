"""The loopback cluster's helpers: simulated nodes follow the stack, ports come free in a block,
and the engine's event log is read by sequence. (`make e2e` runs the cluster itself.)"""

from __future__ import annotations

import socket

import pytest

from testbed.cluster.nodes import node_args
from testbed.e2e.cluster_checks import _free_port_block, _sequence
from testbed.e2e.run import CheckError
from tools.render import RenderError


def test_one_simulated_node_per_node_of_the_stack_with_its_gpus() -> None:
    assert node_args("prod") == ["--node", "k8s-worker-02:2"]
    assert node_args("lab") == ["--node", "lab-node:1"]
    with pytest.raises(RenderError, match=r"no stack file Pulumi\.nope\.yaml"):
        node_args("nope")


def test_the_port_block_is_free_on_loopback() -> None:
    base = _free_port_block(6)
    for port in range(base, base + 6):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_event_sequence_is_found_by_kind_and_urn() -> None:
    events = [
        {"sequence": 3, "resourcePreEvent": {"metadata": {"urn": "urn:pulumi:s::p::kubernetes:batch/v1:Job::m-download"}}},
        {"sequence": 7, "resOutputsEvent": {"metadata": {"urn": "urn:pulumi:s::p::kubernetes:batch/v1:Job::m-download"}}},
        {"sequence": 9, "resourcePreEvent": {"metadata": {"urn": "urn:pulumi:s::p::kubernetes:apps/v1:Deployment::m-deployment"}}},
    ]
    assert _sequence(events, "resOutputsEvent", "::m-download") == 7
    assert _sequence(events, "resourcePreEvent", "::m-deployment") == 9
    with pytest.raises(CheckError, match="no resOutputsEvent"):
        _sequence(events, "resOutputsEvent", "::m-deployment")
