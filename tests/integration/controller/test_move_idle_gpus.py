"""move_idle_gpus, DDS's own loop on a real apiserver: a GPU idle on one node, long before its cooldown, is detached
at once when a pending pod that only another node can take would get it, and the next passes attach it there; and a
node with room for one more GPU pod gets an idle GPU for it from the pool before any pod asks (room headroom,
`plan_room_headroom` in dds/planner/moves.py)."""

from __future__ import annotations

import pytest

from dds.fabric.base import OperationKind
from tests.integration.controller.harness import ControllerHarness, one_gpu_idle_beside_a_busy_one
from tests.integration.nodes.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.pool_size(2)]


def test_an_idle_gpu_moves_to_the_node_a_pending_pod_needs_before_its_cooldown(dds: ControllerHarness):
    dds.settings = dds.settings.model_copy(update={"move_idle_gpus": True})
    dds.restart_dds()
    first, second = one_gpu_idle_beside_a_busy_one(dds)
    dds.create_pod("waiting", gpus=1, node=second)  # only the second node will do, and the pool is empty
    dds.wait_unschedulable("waiting")
    dds.clock.advance(5)
    dds.run_once()

    [detach] = [op for op in dds.operations() if op.kind == OperationKind.DETACH]
    assert (detach.node, detach.requested) == (first, 1)
    assert "would get GPUs idle on other nodes" in dds.controller.journal.render_text().decode()  # explained
    dds.pass_detach_latency()  # the GPU is back in the pool; this pass attaches it where the pod waits
    [attach] = [op for op in dds.operations() if op.kind == OperationKind.ATTACH and op.node == second]
    assert attach.requested == 1
    dds.pass_attach_latency()
    assert dds.wait_running("waiting") == second
    assert len(dds.devices(first)) == 1  # the GPU in use stayed


def _one_node_with_one_busy_gpu(dds: ControllerHarness) -> str:
    """One node whose one GPU a running 1-GPU pod uses, with cpu, memory and GPU slots for more such pods; the rest
    of the pool free."""
    dds.create_group("workers", replicas=1, gpu_cooldown="600s")
    [node] = dds.node_names()
    dds.attach_gpus(node, 1)
    dds.create_pod("busy", gpus=1, node=node)
    dds.wait_running("busy", node)
    return node


@pytest.mark.pool_size(3)  # two free: one pod's worth is attached, the other stays in the pool
def test_a_node_with_room_for_one_more_gpu_pod_gets_an_idle_gpu_from_the_pool(dds: ControllerHarness):
    dds.settings = dds.settings.model_copy(update={"move_idle_gpus": True})
    dds.restart_dds()
    node = _one_node_with_one_busy_gpu(dds)
    dds.run_once()  # no pod is pending: the pass has nothing to serve, only the headroom to keep

    [attach] = dds.operations()
    assert (attach.kind, attach.node, attach.requested) == (OperationKind.ATTACH, node, 1)
    assert attach.key.startswith("room/")
    [event] = dds.events("Node", node, "AttachingGPU")  # explained where `kubectl describe node` shows it...
    assert f"{node} has room for one more pod of 1 GPU(s)" in event.message
    assert "nodes with room for one more GPU pod" in dds.controller.journal.render_text().decode()  # ...and why
    dds.pass_attach_latency()
    wait_for(f"{node} to show 2 GPUs", lambda: dds.gpus_allocatable(node) == 2)
    dds.run_once()
    assert len(dds.operations()) == 1  # one pod's worth is kept, not more, though the pool has another

    dds.create_pod("next", gpus=1, node=node)  # the next pod starts on the GPU already there, with no attach
    assert dds.wait_running("next") == node
    assert len(dds.operations()) == 1


def test_without_move_idle_gpus_no_idle_gpu_is_attached_ahead_of_demand(dds: ControllerHarness):
    _one_node_with_one_busy_gpu(dds)  # the setting is off by default
    dds.run_once()
    dds.clock.advance(5)
    dds.run_once()
    assert dds.operations() == []
    assert "room for one more GPU pod" not in dds.controller.journal.render_text().decode()
