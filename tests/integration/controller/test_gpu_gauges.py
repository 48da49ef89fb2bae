"""The gauges the control loop sets each pass, through real passes on the real apiserver: GPUs per node
(`dds_node_gpus`, gone with the node) and idle GPUs past the cooldown that DDS decided to release
(`dds_gpus_idle_past_cooldown`: back to 0 once the detach is under way, held up while the fabric refuses it)."""

from __future__ import annotations

from typing import Optional

import pytest
from prometheus_client import REGISTRY

from dds.fabric.base import DetachRequest, ErrorCode, FabricError, Operation
from tests.integration.controller.harness import ControllerHarness

pytestmark = pytest.mark.integration

COOLDOWN = 60.0  # the harness's gpu-idle-cooldown and node-idle-cooldown ("60s")


def node_gpus(node: str) -> dict[str, float]:
    """The node's dds_node_gpus series as /metrics serves them: model -> GPUs."""
    return {s.labels["model"]: s.value for family in REGISTRY.collect() if family.name == "dds_node_gpus"
            for s in family.samples if s.labels["node"] == node}


def idle_past_cooldown(group: str) -> Optional[float]:
    return REGISTRY.get_sample_value("dds_gpus_idle_past_cooldown", {"group": group})


def test_gpus_per_node_follow_attaches_detaches_and_removed_nodes(dds: ControllerHarness):
    group = dds.create_group("gauges", replicas=2, min_size=1).id
    first, second = dds.node_names()
    dds.attach_gpus(second, 2)
    dds.create_pod("train-0", gpus=1)
    dds.wait_running("train-0", second)

    dds.run_once()
    assert node_gpus(first) == {"A30": 0} and node_gpus(second) == {"A30": 2}
    assert idle_past_cooldown(group) == 0

    dds.clock.advance(COOLDOWN + 1)
    dds.run_once()  # second's idle GPU is released; first, empty past its cooldown, is removed
    assert idle_past_cooldown(group) == 1
    assert dds.machine_removed(first)
    dds.pass_detach_latency()
    assert idle_past_cooldown(group) == 0, "the detach is under way: nothing left to release"
    assert node_gpus(second) == {"A30": 1}

    dds.nodes.wait_ready_nodes(1)
    dds.run_once()
    assert dds.node_names() == [second]
    assert node_gpus(first) == {}, "a node that is gone has no series"


def test_idle_gpus_the_fabric_refuses_to_detach_stay_counted(dds: ControllerHarness,
                                                            monkeypatch: pytest.MonkeyPatch):
    group = dds.create_group("refused", replicas=1, min_size=1).id
    [node] = dds.node_names()
    dds.attach_gpus(node, 2)
    dds.create_pod("train-0", gpus=1)
    dds.wait_running("train-0", node)

    def refuse(request: DetachRequest) -> Operation:
        raise FabricError(ErrorCode.BACKEND, "fabric manager unreachable")

    monkeypatch.setattr(dds.app.fabric, "detach", refuse)
    dds.run_once()
    for _ in range(3):  # pass after pass, DDS decides to release the idle GPU and cannot
        dds.clock.advance(COOLDOWN + 1)
        dds.run_once()
        assert idle_past_cooldown(group) == 1
        assert dds.events("Node", node, "DetachFailed")
    assert node_gpus(node) == {"A30": 2}
