"""Reservations for large pods that waited too long (dds/planner/reservations.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.model.plan import Detach, PlannerConfig, ScaleDownPlan
from dds.model.snapshot import NodeInfo
from dds.planner.reservations import (CLAIM_TAINT_KEY, ReservationConfig, claim_taint, keep_reserved,
                                      plan_reservations, reservation_taint)
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

GROUP = make_group(replicas=2, max_size=2, max_gpus=8)


def test_a_young_or_small_pod_gets_no_reservation():
    nodes = [make_node("w1", gpus=2), make_node("w2", gpus=2)]
    pods = [make_pod("big", gpus=8, created=900.0), make_pod("small", gpus=4, created=0.0)]  # now = 1000
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    assert plan.reservations == ()


def test_the_node_holding_most_gpus_is_reserved_and_gathers_the_pool_first():
    nodes = [make_node("w1", gpus=2), make_node("w2", gpus=5)]
    pods = [make_pod("busy", gpus=2, node="w2"), make_pod("big", gpus=8, created=0.0)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=1)]))
    (reservation,) = plan.new
    assert (reservation.pod, reservation.node, reservation.gpus) == ("default/big", "w2", 8)
    assert reservation.taint == reservation_taint("uid-big")
    assert reservation.toleration.value == "uid-big"
    # 3 missing: 1 from the pool, then w1's 2 idle GPUs, released at once.
    assert [(a.node, a.count) for a in plan.attaches] == [("w2", 1)]
    assert [(d.node, len(d.device_ids)) for d in plan.detaches] == [("w1", 2)]
    assert plan.claimed == ()


def test_gpus_other_pods_still_use_are_claimed_by_fencing_their_node():
    nodes = [make_node("w1", gpus=4), make_node("w2", gpus=4)]
    pods = [make_pod("a", gpus=4, node="w1"), make_pod("b", gpus=3, node="w2"), make_pod("big", gpus=8)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    # Either node must wait for the other's busy GPUs: the one with more in use (w1) is expected to drain last, so
    # w2's GPUs move to it while it drains rather than after.
    assert [r.node for r in plan.new] == ["w1"]
    assert plan.claimed == (("w2", "uid-big"),)  # its 3 busy GPUs are the rest
    assert [(d.node, len(d.device_ids)) for d in plan.detaches] == [("w2", 1)]  # its idle one goes at once


def test_a_node_that_can_gather_without_claims_is_preferred_to_one_holding_as_many_gpus_with_fewer_in_use():
    # w1 lacks 4, which w2's idle GPUs cover: only w1's own 2 busy GPUs are waited for. Reserving w2 instead (as
    # many GPUs, none in use) would wait for w1's busy pair and move them after: a detach and an attach on the path.
    nodes = [make_node("w1", gpus=4), make_node("w2", gpus=4)]
    pods = [make_pod("a", gpus=2, node="w1"), make_pod("big", gpus=8)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    assert [r.node for r in plan.new] == ["w1"]
    assert [(d.node, len(d.device_ids)) for d in plan.detaches] == [("w2", 4)]
    assert plan.claimed == ()


@pytest.mark.parametrize("operator", [False, True])
def test_a_busy_device_plugin_node_is_claimed_whole_instead_of_giving_its_idle_gpus(operator: bool):
    """The CDI operator in DEVICE_PLUGIN mode detaches from a node only once none of its GPUs is busy: w1's idle GPUs
    cannot be gathered while its small pod runs, so w1 is fenced and gives all three once the pod ends. Any other
    fabric takes the two idle ones at once and claims only the busy one."""
    nodes = [make_node("w1", gpus=3), make_node("w2", gpus=5)]
    pods = [make_pod("small", gpus=1, node="w1"), make_pod("busy", gpus=2, node="w2"), make_pod("big", gpus=8)]
    snapshot = make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)])
    plan = plan_reservations(snapshot, planner=PlannerConfig(cdi_operator=operator))
    assert [r.node for r in plan.new] == ["w2"]
    assert plan.claimed == (("w1", "uid-big"),)
    assert [(d.node, len(d.device_ids)) for d in plan.detaches] == ([] if operator else [("w1", 2)])
    assert plan.notes == ()


def test_a_reservation_ends_when_its_pod_is_bound():
    tainted = replace(make_node("w1", gpus=8), taints=(reservation_taint("uid-big"),))
    pods = [make_pod("big", gpus=8, node="w1")]
    plan = plan_reservations(make_snapshot([tainted], pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    assert plan.released == ("w1",)
    assert plan.reservations == ()


def test_one_reservation_per_pool_and_none_when_disabled():
    nodes = [make_node("w1"), make_node("w2")]
    pods = [make_pod("big-1", gpus=8, created=0.0), make_pod("big-2", gpus=8, created=1.0)]
    snapshot = make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=8)])
    assert [r.pod for r in plan_reservations(snapshot).new] == ["default/big-1"]
    assert plan_reservations(snapshot, ReservationConfig(enabled=False)).reservations == ()


def test_scale_down_keeps_the_reserved_nodes_gpus():
    plan = ScaleDownPlan(detaches=(Detach("w1", ("g1",), "idle"), Detach("w2", ("g2",), "idle")))
    kept = keep_reserved(plan, {"w1"})
    assert [d.node for d in kept.detaches] == ["w2"]
    assert [k.node for k in kept.kept] == ["w1"]


def test_claim_taint_key_is_distinct_from_the_reservation():
    assert CLAIM_TAINT_KEY != reservation_taint("x").key


QUIET = ReservationConfig(min_age_seconds=600.0, quiet_age_seconds=60.0, quiet_pending=1)


@pytest.mark.parametrize(("config", "others", "reserved"), [
    pytest.param(QUIET, 0, True, id="quiet-pool-reserves-early"),
    pytest.param(QUIET, 1, True, id="one-other-pending-is-still-quiet"),
    pytest.param(QUIET, 2, False, id="a-queue-waits-for-the-min-age"),
    pytest.param(replace(QUIET, quiet_age_seconds=200.0), 0, False, id="younger-than-the-quiet-age"),
    pytest.param(replace(QUIET, quiet_age_seconds=None), 0, False, id="quiet-reservations-off"),
])
def test_a_large_pod_is_reserved_early_only_while_few_pods_queue(config: ReservationConfig, others: int,
                                                                 reserved: bool):
    nodes = [make_node("w1", gpus=2), make_node("w2", gpus=2)]
    pods = [make_pod("big", gpus=8, created=900.0)]  # now = 1000: 100 s old, short of the 600 s min age
    pods += [make_pod(f"small-{i}", gpus=1, created=950.0) for i in range(others)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]), config)
    assert [r.pod for r in plan.new] == (["default/big"] if reserved else [])
    if reserved:
        assert f"while {others} other pending pod(s) could use" in plan.new[0].reason


def test_past_the_min_age_a_large_pod_is_reserved_however_long_the_queue():
    nodes = [make_node("w1", gpus=2), make_node("w2", gpus=2)]
    pods = [make_pod("big", gpus=8, created=0.0)] + [make_pod(f"small-{i}", gpus=1, created=950.0) for i in range(5)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]), QUIET)
    assert [r.pod for r in plan.new] == ["default/big"]
    assert "has waited 1000s:" in plan.new[0].reason


def test_a_node_the_pod_can_start_on_now_is_reserved_before_one_whose_pods_hold_all_its_gpus():
    # w1 holds the most GPUs, but its pod uses all eight; w2 is empty and the pool has eight free.
    nodes = [make_node("w1", gpus=8), make_node("w2")]
    pods = [make_pod("long", gpus=8, node="w1"), make_pod("big", gpus=8, created=0.0)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=8)]))
    assert [r.node for r in plan.new] == ["w2"]
    assert [(a.node, a.count) for a in plan.attaches] == [("w2", 8)]


def reserved_on(name: str, gpus: int) -> NodeInfo:
    return replace(make_node(name, gpus=gpus), taints=(reservation_taint("uid-big"),))


def claimed_on(name: str, gpus: int) -> NodeInfo:
    return replace(make_node(name, gpus=gpus), taints=(claim_taint("uid-big"),))


def test_a_drained_reserved_node_hands_its_reservation_to_the_claimed_node_still_busy():
    # w1 has drained with 5 GPUs; the 3 it lacks are busy on w2. Waiting on w1 means w2's GPUs move after its pods
    # end; reserving w2 moves w1's 5 now, while w2 drains, so the pod starts when w2's pods end.
    nodes = [reserved_on("w1", 5), claimed_on("w2", 3)]
    pods = [make_pod("a", gpus=3, node="w2"), make_pod("big", gpus=8, created=0.0)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    (moved,) = plan.new
    assert (moved.node, moved.moved_from, moved.token) == ("w2", "w1", "uid-big")
    assert "moved from w1 to w2" in moved.reason and "drained" in moved.reason
    assert plan.released == ("w1",)
    assert plan.claimed == (("w1", "uid-big"),), "w1 stays fenced until its GPUs are on their way"
    assert [(d.node, len(d.device_ids)) for d in plan.detaches] == [("w1", 5)]
    assert plan.nodes == {"w2"}


def test_a_reserved_node_still_draining_keeps_its_reservation():
    nodes = [reserved_on("w1", 5), claimed_on("w2", 3)]
    pods = [make_pod("mine", gpus=1, node="w1"), make_pod("a", gpus=3, node="w2"), make_pod("big", gpus=8)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    assert plan.new == () and plan.released == ()
    assert plan.nodes == {"w1"} and plan.claimed == (("w2", "uid-big"),)


def test_a_reservation_moves_to_a_node_the_pod_can_start_on_now():
    # w1's one pod holds all of its GPUs for as long as it runs; w2 has emptied and the pool has the GPUs.
    nodes = [reserved_on("w1", 8), make_node("w2", gpus=2)]
    pods = [make_pod("long", gpus=8, node="w1"), make_pod("big", gpus=8)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=6)]))
    (moved,) = plan.new
    assert (moved.node, moved.moved_from) == ("w2", "w1")
    assert "can take default/big" in moved.reason
    assert [(a.node, a.count) for a in plan.attaches] == [("w2", 6)]
    assert plan.released == ("w1",)


def test_a_reservation_does_not_move_to_a_node_fenced_for_another_pod():
    other = replace(make_node("w2"), taints=(claim_taint("uid-other"),))
    nodes = [reserved_on("w1", 8), other]
    pods = [make_pod("long", gpus=8, node="w1"), make_pod("big", gpus=8)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=8)]))
    assert plan.new == () and plan.nodes == {"w1"}


def test_a_pod_reserved_on_two_nodes_keeps_one_and_gathers_for_one():
    """The edge stopped between the two writes of a move: both nodes carry the pod's reservation taint."""
    nodes = [reserved_on("w1", 5), reserved_on("w2", 3)]
    pods = [make_pod("a", gpus=3, node="w2"), make_pod("big", gpus=8)]
    plan = plan_reservations(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    assert plan.nodes == {"w2"} and plan.released == ("w1",)
    assert plan.claimed == (("w1", "uid-big"),), "fenced while its idle GPUs leave"
    assert [(d.node, len(d.device_ids)) for d in plan.detaches] == [("w1", 5)]  # w1's idle GPUs go to w2 alone
    assert plan.attaches == ()
