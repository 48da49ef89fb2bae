"""A large GPU pod that waited too long gets a node reserved on the real apiserver and kube-scheduler: it tolerates the
node's reservation taint, GPUs are gathered there, and it starts while 1-GPU pods keep arriving and the freed GPUs
would otherwise go to them.

Two 4-slot workers with 2 GPUs each, both busy with two 1-GPU pods, 2 A30s left in the pool; a 4-GPU pod waits.
The controller's reservations are configured here as `dds serve` configures them from its settings (`reservations`,
`reservation_min_age_seconds`), with an age of their own and no quiet rule, so that each test says when a pod is
old enough.
"""

from __future__ import annotations


import pytest

from dds.controller.reservations import Reservations
from dds.kube.pods import ReservationWrites
from dds.planner.reservations import CLAIM_TAINT_KEY, RESERVATION_TAINT_KEY, ReservationConfig
from tests.integration.controller.harness import ControllerHarness, two_nodes_with_busy_gpus
from tests.integration.nodes.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.pool_size(6)]

MIN_AGE = 120.0


def with_reservations(dds: ControllerHarness) -> None:
    controller = dds.controller
    controller.reservations = Reservations(ReservationWrites(dds.dds_api), controller.actions, controller.events,
                                           controller.journal, ReservationConfig(min_age_seconds=MIN_AGE))


def pending(dds: ControllerHarness, name: str) -> bool:
    return dds.pod_node(name) is None


def test_a_large_pod_gets_its_gpus_gathered_and_starts_while_small_pods_keep_coming(dds: ControllerHarness):
    w1, w2 = two_nodes_with_busy_gpus(dds)
    with_reservations(dds)

    dds.create_pod("big", gpus=4)
    dds.wait_unschedulable("big")
    dds.run_once()
    assert dds.taint_keys(w1) == [] and dds.taint_keys(w2) == [], "younger than the reservation age: nothing"

    dds.clock.advance(MIN_AGE + 1)
    dds.run_once()
    assert RESERVATION_TAINT_KEY in dds.taint_keys(w1)  # both hold 2 GPUs, 2 in use: the first by name
    big = dds.core.read_namespaced_pod("big", dds.namespace)
    assert any(t.key == RESERVATION_TAINT_KEY and t.value == big.metadata.uid for t in big.spec.tolerations or ())
    assert dds.events("Pod", "big", "GPUsReserved")
    [gather] = [op for op in dds.operations() if op.key.startswith("reservation/")]
    assert (gather.node, gather.requested) == (w1, 2)
    dds.pass_attach_latency()
    wait_for(f"{w1} to show 4 GPUs", lambda: dds.gpus_allocatable(w1) == 4)

    # a-0 ends: its GPU is free on w1, and a new 1-GPU pod arrives at once. Only the reserved pod may land on w1.
    dds.core.delete_namespaced_pod("a-0", dds.namespace, grace_period_seconds=0)
    dds.create_pod("c-0", gpus=1)
    dds.wait_unschedulable("c-0")
    dds.run_once()
    assert pending(dds, "c-0") and pending(dds, "big")

    dds.core.delete_namespaced_pod("a-1", dds.namespace, grace_period_seconds=0)
    dds.wait_running("big", w1)
    dds.run_once()
    assert RESERVATION_TAINT_KEY not in dds.taint_keys(w1), "the reservation ends when its pod is bound"
    assert dds.events("Node", w1, "ReservationReleased")
    assert pending(dds, "c-0")  # w1's four GPUs are big's; c-0 waits for the next GPU like any pod


@pytest.mark.pool_size(4)
def test_a_drained_reserved_node_hands_its_reservation_to_the_node_whose_pods_still_run(dds: ControllerHarness):
    """Every GPU is attached and busy: w1 is reserved, w2 claimed. w1's pods end first, so the GPUs it still lacks
    are w2's, which would move only after w2's pods end. DDS reserves w2 instead and moves w1's idle GPUs there while
    w2 drains: the large pod starts on w2 as soon as w2's pods end, with no detach or attach on its path. w1 is
    never open to another pod while it still holds GPUs."""
    w1, w2 = two_nodes_with_busy_gpus(dds)
    with_reservations(dds)
    dds.create_pod("big", gpus=4)
    dds.wait_unschedulable("big")
    dds.clock.advance(MIN_AGE + 1)
    dds.run_once()
    assert RESERVATION_TAINT_KEY in dds.taint_keys(w1) and CLAIM_TAINT_KEY in dds.taint_keys(w2)

    for name in ("a-0", "a-1"):
        dds.core.delete_namespaced_pod(name, dds.namespace, grace_period_seconds=0)
    wait_for(f"{w1} to drain", lambda: not dds.core.list_namespaced_pod(
        dds.namespace, field_selector=f"spec.nodeName={w1}").items)
    dds.run_once()
    assert RESERVATION_TAINT_KEY in dds.taint_keys(w2) and CLAIM_TAINT_KEY not in dds.taint_keys(w2)
    assert RESERVATION_TAINT_KEY not in dds.taint_keys(w1) and CLAIM_TAINT_KEY in dds.taint_keys(w1)
    released = dds.events("Node", w1, "ReservationReleased")
    assert released and f"moved to {w2}" in released[-1].message
    [detach] = [op for op in dds.operations() if op.key.startswith("reservation/") and op.node == w1]
    assert detach.requested == 2

    dds.create_pod("c-0", gpus=1)  # a small pod arriving now lands neither on w1's idle GPUs nor on w2
    dds.wait_unschedulable("c-0")
    dds.pass_detach_latency()
    dds.pass_attach_latency()
    wait_for(f"{w2} to show 4 GPUs", lambda: dds.gpus_allocatable(w2) == 4)
    assert pending(dds, "c-0") and pending(dds, "big")

    for name in ("b-0", "b-1"):
        dds.core.delete_namespaced_pod(name, dds.namespace, grace_period_seconds=0)
    dds.wait_running("big", w2)
    dds.run_once()
    assert RESERVATION_TAINT_KEY not in dds.taint_keys(w2) and CLAIM_TAINT_KEY not in dds.taint_keys(w1)
