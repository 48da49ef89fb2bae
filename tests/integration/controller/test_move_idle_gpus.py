"""move_idle_gpus, DDS's own loop on a real apiserver: a GPU idle on one node, long before its cooldown, is detached
at once when a pending pod that only another node can take would get it, and the next passes attach it there."""

from __future__ import annotations

import pytest

from dds.fabric.base import OperationKind
from tests.integration.controller.harness import ControllerHarness

pytestmark = [pytest.mark.integration, pytest.mark.pool_size(2)]


def test_an_idle_gpu_moves_to_the_node_a_pending_pod_needs_before_its_cooldown(dds: ControllerHarness):
    dds.settings = dds.settings.model_copy(update={"move_idle_gpus": True})
    dds.restart_dds()
    dds.create_group("workers", replicas=2, gpu_cooldown="600s")
    first, second = dds.node_names()
    dds.attach_gpus(first, 2)  # the whole pool: one GPU will be used, one idle
    dds.create_pod("busy", gpus=1, node=first)
    dds.wait_running("busy", first)
    dds.run_once()  # the idle GPU's cooldown starts

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
