"""Warm headroom: a group keeps `warm_gpus` idle GPUs attached past the cooldown and gets them back after pods take
them, within its nodes' slots, and never while a pending pod waits on the pool."""

from __future__ import annotations

from dataclasses import replace

from dds.planner import plan_scale_down
from dds.planner.headroom import hungry_pools, plan_warm_refill, warm_target
from dds.model.plan import PlannerConfig
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

NOW = 1000.0
IDLE_LONG_AGO = NOW - 3600


def idle_nodes(*gpus: int):
    return [make_node(f"w{i}", gpus=n, gpus_idle_since=IDLE_LONG_AGO) for i, n in enumerate(gpus, 1)]


def detached(plan) -> int:
    return sum(len(d.device_ids) for d in plan.detaches)


def test_the_group_annotation_wins_over_the_pool_default():
    config = PlannerConfig(warm_gpus_by_pool={"pool-a": 2})
    assert warm_target(make_group(), config) == 2
    assert warm_target(make_group().model_copy(update={"warm_gpus": 0}), config) == 0


def test_idle_gpus_past_the_cooldown_go_back_except_the_warm_ones():
    snapshot = make_snapshot(idle_nodes(2, 1), groups=[make_group(replicas=2, min_size=2)])
    assert detached(plan_scale_down(snapshot, PlannerConfig())) == 3
    plan = plan_scale_down(snapshot, PlannerConfig(warm_gpus_by_pool={"pool-a": 2}))
    assert detached(plan) == 1
    assert any("kept warm" in d.reason for d in plan.detaches) or any("warm headroom" in k.reason for k in plan.kept)


def test_no_headroom_is_held_while_a_pod_waits_on_the_pool():
    waiting = make_pod("train", gpus=1, memory_gib=64)  # no node has the memory: it needs the pool for a new node
    snapshot = make_snapshot(idle_nodes(2), [waiting], groups=[make_group(replicas=1, min_size=1)],
                             pools=[make_pool(A30=0)])
    hungry = hungry_pools(snapshot, [waiting])
    assert hungry == {"pool-a"}
    plan = plan_scale_down(snapshot, PlannerConfig(warm_gpus_by_pool={"pool-a": 2}), hungry_pools=hungry)
    assert detached(plan) == 2


def test_refill_tops_up_the_group_on_its_roomiest_nodes():
    busy = [make_pod("b1", gpus=1, node="w1"), make_pod("b2", gpus=1, node="w2")]
    snapshot = make_snapshot([make_node("w1", gpus=1), make_node("w2", gpus=4)], busy,
                             groups=[make_group(replicas=2)], pools=[make_pool(A30=5)])
    attaches = plan_warm_refill(snapshot, PlannerConfig(warm_gpus_by_pool={"pool-a": 2}), frozenset())
    # w2 already holds 3 idle GPUs (4 attached, 1 used): the headroom is there, nothing to attach.
    assert attaches == ()
    snapshot = replace(snapshot, nodes=(make_node("w1", gpus=1), make_node("w2", gpus=1)))
    attaches = plan_warm_refill(snapshot, PlannerConfig(warm_gpus_by_pool={"pool-a": 2}), frozenset())
    assert sorted((a.node, a.count) for a in attaches) == [("w1", 1), ("w2", 1)]
    assert all(a.model == "A30" and a.pods == () and "warm headroom" in a.reason for a in attaches)


def test_refill_counts_gpus_on_their_way_and_stays_within_slots_and_the_pool():
    snapshot = make_snapshot([make_node("w1", gpus=3, attaching=1)], [make_pod("b", gpus=3, node="w1")],
                             groups=[make_group(replicas=1)], pools=[make_pool(A30=5)])
    assert plan_warm_refill(snapshot, PlannerConfig(warm_gpus_by_pool={"pool-a": 3}), frozenset()) == ()
    one_slot = make_snapshot([make_node("w1", gpus=3)], [make_pod("b", gpus=3, node="w1")],
                             groups=[make_group(replicas=1)], pools=[make_pool(A30=1)])
    [attach] = plan_warm_refill(one_slot, PlannerConfig(warm_gpus_by_pool={"pool-a": 3}), frozenset())
    assert (attach.node, attach.count) == ("w1", 1)


def test_no_refill_from_a_hungry_pool():
    snapshot = make_snapshot([make_node("w1", gpus=1)], [make_pod("b", gpus=1, node="w1")],
                             groups=[make_group(replicas=1)], pools=[make_pool(A30=3)])
    assert plan_warm_refill(snapshot, PlannerConfig(warm_gpus_by_pool={"pool-a": 1}), frozenset({"pool-a"})) == ()
