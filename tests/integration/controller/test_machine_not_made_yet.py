"""A node DDS asked the MachineSet for is on its way from the moment spec.replicas goes up, not only once Cluster API has
made its Machine. Found by the apiserver-restart e2e (tests/e2e/test_outages.py): the restart landed between DDS's
MachineSet patch and the Machine's creation, DDS ended the node instance because no Machine was coming, and
cluster-autoscaler, seeing its scale-up gone while the pods still waited, asked again: a second node."""

from __future__ import annotations

import pytest

from dds.controller.ca_requests import ScaleUpRefused
from tests.integration.controller.harness import ControllerHarness

pytestmark = pytest.mark.integration


def test_a_replica_without_its_machine_yet_is_capacity_on_its_way(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=1)
    [first] = dds.node_names()
    dds.create_pod("resident", memory="40Gi")
    dds.wait_running("resident", first)
    dds.create_pod("big", memory="40Gi")  # 64Gi nodes: only a new node holds it
    dds.wait_unschedulable("big")
    with dds.nodes.machines_paused("workers"):  # Cluster API has not made the Machine yet
        [instance] = dds.app.scale_up.increase(group, 1, "ca-request-1")
        assert dds.replicas("workers") == 2
        dds.run_once()
        assert not dds.nodes.machines()[1:], "Cluster API made no Machine for the new replica meanwhile"
        assert dds.app.tracker.get(instance.id) is not None, "CA must keep seeing the node it asked for as upcoming"

        try:  # CA asks again for the same pod: it fits on the node already on its way
            dds.app.scale_up.increase(group, 1, "ca-request-2")
        except ScaleUpRefused:
            pass
        assert dds.replicas("workers") == 2, "a second node for one pod"

    dds.nodes.wait_ready_nodes(2)
    dds.run_once()
    assert dds.app.tracker.get(instance.id) is None, "the instance ends when its node is up"
