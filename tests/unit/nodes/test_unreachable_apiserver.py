"""With the apiserver down, every node-backend call fails with a typed error naming the group, the request and the
step — never a raw urllib3 exception, never a half-applied change (nothing could be written)."""

from __future__ import annotations

import socket

import pytest
from kubernetes import client

from dds.kube.nodes import NodeUpdateFailed, set_gpu_capacity
from dds.nodes.errors import NodeBackendUnavailable
from dds.nodes.machineset import MachineSetProvisioner
from tests.unit.nodes.builders import make_group


@pytest.fixture
def dead_api() -> client.ApiClient:
    with socket.socket() as sock:  # a port nothing listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.retries = False
    return client.ApiClient(configuration)


def test_add_nodes_names_the_group_and_the_cause(dead_api: client.ApiClient) -> None:
    provisioner = MachineSetProvisioner(dead_api, clock=lambda: 0.0, request_timeout_seconds=2.0)
    with pytest.raises(NodeBackendUnavailable,
                       match=r"MachineSet/default/gpu-workers: adding 1 node\(s\) \(request k1\): reading MachineSet "
                             r"default/gpu-workers: apiserver unreachable") as caught:
        provisioner.add_nodes(make_group(), 1, key="k1")
    assert caught.value.retryable


def test_remove_node_and_machines_fail_the_same_way(dead_api: client.ApiClient) -> None:
    provisioner = MachineSetProvisioner(dead_api, clock=lambda: 0.0, request_timeout_seconds=2.0)
    with pytest.raises(NodeBackendUnavailable, match="removing node worker-1"):
        provisioner.remove_node(make_group(), "worker-1", key="k2")
    with pytest.raises(NodeBackendUnavailable, match="listing machines"):
        provisioner.machines(make_group())


def test_set_gpu_capacity_says_which_node_and_count(dead_api: client.ApiClient) -> None:
    with pytest.raises(NodeUpdateFailed, match="node worker-1: setting nvidia.com/gpu capacity and allocatable to 2: "
                                               "apiserver unreachable"):
        set_gpu_capacity(dead_api, "worker-1", "nvidia.com/gpu", 2, request_timeout_seconds=2.0)
