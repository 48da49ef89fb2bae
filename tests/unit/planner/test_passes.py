"""One decision pass (dds/planner/passes.py): the order the control loop and `dds simulate` both take decisions in."""

from __future__ import annotations

from dataclasses import replace

from dds.model.plan import PlannerConfig
from dds.planner.passes import PassInputs, PassSettings, plan_pass, with_attaches
from dds.planner.reservations import Reservation, ReservationPlan, reservation_taint
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

NOW = 1000.0
IDLE_LONG_AGO = NOW - 3600
WARM = PlannerConfig(warm_gpus_by_pool={"pool-a": 1})


def _inputs(*pods, **fields) -> PassInputs:
    return PassInputs(pending=tuple(pods), waiting=tuple(pods), **fields)


def test_a_waiting_pod_that_fits_a_live_node_gets_gpus_and_no_headroom_is_planned_beside():
    pod = make_pod("p", gpus=2)
    snapshot = make_snapshot([make_node("w1")], [pod], groups=[make_group(replicas=1)])
    plan = plan_pass(snapshot, _inputs(pod), PassSettings(planner=WARM))
    assert [(a.node, a.count) for a in plan.fast_path.attaches] == [("w1", 2)]
    assert plan.warm_refill == () and plan.room_headroom == ()
    assert "headroom counts on the pool as observed" in plan.notes[0]


def test_without_waiting_pods_a_group_is_brought_back_to_its_warm_gpus():
    snapshot = make_snapshot([make_node("w1")], groups=[make_group(replicas=1)])
    plan = plan_pass(snapshot, _inputs(), PassSettings(planner=WARM))
    assert plan.fast_path is None
    assert [(a.node, a.count) for a in plan.warm_refill] == [("w1", 1)]


def test_warm_refill_counts_on_what_room_headroom_takes_from_the_pool_first():
    # One free GPU: room headroom (one more 1-GPU pod fits w1) takes it, so warm headroom finds none left.
    running = make_pod("r", gpus=1, cores=1, node="w1")
    snapshot = make_snapshot([make_node("w1", gpus=1)], [running], groups=[make_group(replicas=1)],
                             pools=[make_pool(A30=1)])
    plan = plan_pass(snapshot, _inputs(), PassSettings(planner=WARM, move_idle_gpus=True))
    assert [(a.node, a.count) for a in plan.room_headroom] == [("w1", 1)]
    assert plan.warm_refill == ()
    assert with_attaches(snapshot, plan.room_headroom).pools[0].free == {"A30": 0}


def test_pods_a_reservation_serves_are_left_to_it_and_its_node_keeps_its_idle_gpus():
    large = make_pod("large", gpus=4)
    nodes = [make_node("w1", gpus=2, gpus_idle_since=IDLE_LONG_AGO, empty_since=IDLE_LONG_AGO)]
    snapshot = make_snapshot(nodes, [large], groups=[make_group(replicas=1, min_size=1)])
    reserved = ReservationPlan(reservations=(Reservation(pod=large.key, token="t", node="w1", pool="pool-a", gpus=4,
                                                         reason="waited too long"),))
    plan = plan_pass(snapshot, _inputs(large, reservations=reserved), PassSettings())
    assert plan.waiting == () and plan.fast_path is None
    assert plan.scale_down.detaches == ()
    assert any(k.node == "w1" and "reserved" in k.reason for k in plan.scale_down.kept)
    without = plan_pass(snapshot, _inputs(), PassSettings())
    assert [d.node for d in without.scale_down.detaches] == ["w1"]


def test_scale_down_is_not_planned_when_the_caller_knows_no_cooldown_is_over():
    nodes = [make_node("w1", gpus=2, gpus_idle_since=IDLE_LONG_AGO)]
    snapshot = make_snapshot(nodes, groups=[make_group(replicas=1, min_size=1)])
    assert plan_pass(snapshot, _inputs(), PassSettings()).scale_down.detaches
    assert plan_pass(snapshot, _inputs(scale_down_due=False), PassSettings()).scale_down.is_empty


def test_new_nodes_are_the_fast_paths_only_when_it_stands_in_for_cluster_autoscaler():
    pod = make_pod("big", cores=6)  # fits no live node: the only one is busy
    busy = make_pod("busy", cores=6, node="w1")
    snapshot = make_snapshot([make_node("w1")], [busy, pod], groups=[make_group(replicas=1)])
    production = plan_pass(snapshot, _inputs(pod), PassSettings())
    assert production.fast_path.new_nodes == () and production.claim_nodes is None  # CA adds it (case 1)
    simulated = plan_pass(snapshot, _inputs(pod), PassSettings(fast_path_adds_nodes=True))
    assert [(n.group, n.count) for n in simulated.fast_path.new_nodes] == [("gpu", 1)]


def test_room_headroom_never_goes_to_a_node_being_removed():
    running = make_pod("r", gpus=1, cores=1, node="w1")
    snapshot = make_snapshot([make_node("w1", gpus=1)], [running], groups=[make_group(replicas=1)])
    settings = PassSettings(move_idle_gpus=True)
    assert plan_pass(snapshot, _inputs(), settings).room_headroom
    assert plan_pass(snapshot, _inputs(removing=frozenset({"w1"})), settings).room_headroom == ()


def test_the_stages_are_timed_by_the_callers_timer():
    stages = []

    class Timer:
        def __init__(self, stage: str) -> None:
            stages.append(stage)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

    pod = make_pod("p", gpus=1)
    snapshot = make_snapshot([make_node("w1")], [pod], groups=[make_group(replicas=1)])
    plan_pass(snapshot, _inputs(pod), PassSettings(), timer=Timer)
    assert stages == ["scale-up", "scale-down"]


def test_release_idle_gpus_moves_an_idle_gpu_to_a_waiting_pod_without_keeping_room_headroom():
    # w1 holds one idle A30 beside a CPU pod that leaves no room for the waiting 1-GPU pod; w2 has room but no GPU;
    # the pool is empty. A second GPU idle in the pool would be room headroom for w2 under move_idle_gpus.
    nodes = [make_node("w1", gpus=1), make_node("w2")]
    waiting = make_pod("train", gpus=1, cores=2)
    pods = [make_pod("hog", cores=8, node="w1"), waiting]
    snapshot = make_snapshot(nodes, pods, groups=[make_group(replicas=2, max_size=2)], pools=[make_pool(A30=0)])
    released = plan_pass(snapshot, _inputs(waiting), PassSettings(release_idle_gpus=True))
    assert [(d.node, d.device_ids) for d in released.moves] == [("w1", ("w1-gpu-0",))]
    assert plan_pass(snapshot, _inputs(waiting), PassSettings()).moves == ()

    running = make_pod("r", gpus=1, cores=1, node="w1")
    roomy = make_snapshot([make_node("w1", gpus=1)], [running], groups=[make_group(replicas=1)])
    assert plan_pass(roomy, _inputs(), PassSettings(release_idle_gpus=True)).room_headroom == ()
    assert plan_pass(roomy, _inputs(), PassSettings(move_idle_gpus=True)).room_headroom


def test_gpus_that_reach_the_pool_after_the_reservations_were_planned_stay_for_the_reserved_node():
    """The pass is planned again once its reservations are carried out. GPUs that reached the pool in between (a
    detach for the reservation that completed at once) are the reserved node's to gather next pass: a small pod on
    the other node does not get them, or the large pod's slots would fill again and it could wait for ever."""
    group = make_group(replicas=2, max_size=2, max_gpus=8)
    large, small = make_pod("large", gpus=8, created=0.0), make_pod("small", gpus=2, created=500.0)
    fenced = replace(make_node("w1", gpus=6), taints=(reservation_taint("t"),))
    snapshot = make_snapshot([fenced, make_node("w2", gpus=0)], [large, small], groups=[group],
                             pools=[make_pool(A30=2)])
    reserved = ReservationPlan(reservations=(Reservation(pod=large.key, token="t", node="w1", pool="pool-a", gpus=8,
                                                         reason="waited too long"),))
    plan = plan_pass(snapshot, _inputs(large, small, reservations=reserved), PassSettings())
    assert plan.fast_path is None or not plan.fast_path.attaches
    # With the reservation served (w1 holds its 8), the small pod gets the pool's GPUs as before.
    served = make_snapshot([replace(fenced, devices=make_node("w1", gpus=8).devices), make_node("w2", gpus=0)],
                           [large, small], groups=[group], pools=[make_pool(A30=2)])
    plan = plan_pass(served, _inputs(large, small, reservations=reserved), PassSettings())
    assert [(a.node, a.count) for a in plan.fast_path.attaches] == [("w2", 2)]
