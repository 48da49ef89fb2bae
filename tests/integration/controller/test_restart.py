"""A controller that died between cordoning a node (taint dds.cdi.dev/removing) and removing it leaves the taint on the
node, while the list of removals under way lived in its memory only. The next controller finds the taint: it resumes
the removal when the node is still removable, else it lifts the taint — never a node cordoned for good."""

from __future__ import annotations

from typing import Any

import pytest

from dds.controller.removals import REMOVAL_TAINT
from tests.integration.controller.harness import CA_TAINT, ControllerHarness

pytestmark = pytest.mark.integration

COOLDOWN = 60.0


class ProcessDied(BaseException):
    """Stands for SIGKILL: nothing after this point of the dying controller runs."""


class DiesBeforeRemoving:
    """The node backend of a controller that dies right before it asks for the removal (after the cordon)."""

    def __init__(self, provisioner: Any) -> None:
        self._provisioner = provisioner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provisioner, name)

    def remove_node(self, *args: Any, **kwargs: Any) -> None:
        raise ProcessDied()


def cordon_then_die(dds: ControllerHarness) -> None:
    node_actions = dds.app.controller.executor.nodes  # the applier's node port (dds/scaling/node_actions.py)
    node_actions.provisioner = DiesBeforeRemoving(node_actions.provisioner)
    dds.run_once()
    dds.clock.advance(COOLDOWN + 1)
    with pytest.raises(ProcessDied):
        dds.run_once()


def test_the_next_controller_resumes_the_removal_of_a_node_still_removable(dds: ControllerHarness):
    dds.create_group("workers", replicas=2, min_size=1)
    first, second = dds.node_names()
    cordon_then_die(dds)
    assert REMOVAL_TAINT in dds.taint_keys(first) and dds.replicas("workers") == 2

    dds.restart_dds()
    dds.run_once()

    assert dds.machine_removed(first) and dds.replicas("workers") == 1
    dds.nodes.wait_ready_nodes(1)
    assert dds.node_names() == [second]


def test_the_next_controller_lifts_the_taint_of_a_node_that_holds_work_again(dds: ControllerHarness):
    dds.create_group("workers", replicas=2, min_size=1)
    first, _ = dds.node_names()
    cordon_then_die(dds)
    dds.create_pod("arrived", bind_to=first)  # bound while no controller ran
    dds.wait_running("arrived", first)

    dds.restart_dds()
    dds.run_once()

    assert REMOVAL_TAINT not in dds.taint_keys(first), "the node takes pods again"
    assert not dds.machine_removed(first) and dds.replicas("workers") == 2


def test_the_next_controller_keeps_a_cordoned_node_the_group_now_needs_for_its_min_size(dds: ControllerHarness):
    group = dds.create_group("workers", replicas=2, min_size=1)
    first, second = dds.node_names()
    cordon_then_die(dds)
    dds.nodes.provisioner.remove_node(group, second, key="operator-scale-down")  # while no controller ran
    dds.nodes.wait_ready_nodes(1)

    dds.restart_dds()
    dds.run_once()

    assert not dds.machine_removed(first) and dds.replicas("workers") == 1
    assert REMOVAL_TAINT not in dds.taint_keys(first), "the group's last node takes pods again"


def test_a_removal_ca_asked_for_is_finished_by_the_next_controller(dds: ControllerHarness):
    # DDS accepted CA's DeleteNodes and was releasing the node's GPUs when it died: CA counts the node as deleted and
    # will not ask again (nor lift its taint), so the next controller must finish the removal.
    group = dds.create_group("workers", replicas=2, min_size=1, mode="observed")
    node, other = dds.node_names()
    dds.attach_gpus(node, 1)
    dds.add_taint(node, CA_TAINT)
    dds.app.scale_down.delete_nodes(group, [dds.live_node(node, group)], "ca-delete-1")
    assert dds.operations() and not dds.machine_removed(node)

    dds.restart_dds()
    dds.pass_detach_latency()
    dds.run_once()

    assert dds.devices(node) == ()
    assert dds.machine_removed(node) and dds.replicas("workers") == 1
    dds.nodes.wait_ready_nodes(1)
    assert dds.node_names() == [other]
