"""What DDS does when a scale-up's GPUs cannot be had (dds/planner/attach_failures.py and the plan check of
dds/planner/equip.py), on plain data."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.fabric.base import ErrorCode, FabricError
from dds.model.fabric_errors import ErrorCode as ModelErrorCode
from dds.planner import plan_scale_up
from dds.planner.attach_failures import (ATTACH_ATTEMPTS, ERROR_CLASS_OTHER, ERROR_CLASS_OUT_OF_RESOURCES, Action,
                                         after_attach_failure, retry_delay)
from dds.planner.equip import equip_new_nodes, nodes_without_gpus, without_unequipped_nodes
from dds.model.plan import NewNodes, PlannerConfig
from dds.model.snapshot import PoolInfo, Snapshot
from tests.unit.planner.builders import make_group, make_node, make_pod


def failure(code: ErrorCode, attempts: int = 1, *, room: bool = True, free: int = 4, need: int = 1):
    return after_attach_failure(FabricError(code, "the fabric said no"), attempts, group_has_room=room,
                                pool_free=free, gpus_for_new_node=need)


def test_retry_waits_grow_exponentially_up_to_a_cap():
    assert [retry_delay(n) for n in range(1, 6)] == [2.0, 4.0, 8.0, 16.0, 30.0]
    assert retry_delay(50) == 30.0
    with pytest.raises(ValueError):
        retry_delay(0)


def test_attempts_count_the_tries_made():
    with pytest.raises(ValueError, match="at least 1"):
        failure(ErrorCode.BACKEND, attempts=0)


def test_the_fabric_and_the_planner_share_one_set_of_codes():
    assert ErrorCode is ModelErrorCode


@pytest.mark.parametrize("code", [ErrorCode.BACKEND, ErrorCode.TIMEOUT])
def test_a_transient_failure_is_retried_with_backoff_then_reported(code):
    first = failure(code, attempts=1)
    assert first.action == Action.RETRY and first.delay == 2.0
    assert "retry 1 of 3" in first.message
    last = failure(code, attempts=ATTACH_ATTEMPTS)
    assert last.action == Action.FAIL and last.error_class == ERROR_CLASS_OTHER
    assert f"after {ATTACH_ATTEMPTS} attempt(s)" in last.message and "the fabric said no" in last.message


def test_an_empty_pool_is_reported_as_out_of_resources_without_a_node():
    # A new node would draw its GPUs from that same empty pool.
    decision = failure(ErrorCode.OUT_OF_RESOURCES, free=0)
    assert decision.action == Action.FAIL and decision.code == ErrorCode.OUT_OF_RESOURCES
    assert decision.error_class == ERROR_CLASS_OUT_OF_RESOURCES
    assert "same pool" in decision.message


def test_a_full_node_falls_back_to_a_new_node_when_the_pool_can_equip_it():
    assert failure(ErrorCode.SLOTS_FULL, free=2, need=1).action == Action.NODE
    at_max = failure(ErrorCode.SLOTS_FULL, room=False)
    assert at_max.action == Action.FAIL and "max size" in at_max.message
    short = failure(ErrorCode.SLOTS_FULL, free=0, need=1)
    assert short.action == Action.FAIL and short.error_class == ERROR_CLASS_OUT_OF_RESOURCES


def test_a_request_the_fabric_can_never_accept_is_not_retried():
    decision = failure(ErrorCode.INVALID)
    assert decision.action == Action.FAIL and decision.code == ErrorCode.INVALID


@pytest.mark.parametrize("needs, per_node, free, unequipped", [
    ([True], [1], 0, 1),  # the talk's pool of two, both at boot: a new node would get no GPU
    ([True], [1], 1, 0),
    ([True, True], [1, 1], 1, 1),  # one of two new nodes can be equipped
    ([True, False], [1], 0, 0),  # a pod needs no GPU: the node serves it, its GPU follows later
    ([], [1], 0, 0),
    ([True], [], 0, 0),
])
def test_new_nodes_the_pool_cannot_equip(needs, per_node, free, unequipped):
    assert nodes_without_gpus(needs, per_node, free) == unequipped


def _two_busy_workers(pool_free: int, *pending) -> Snapshot:
    group = make_group(initial_gpus=1, replicas=2, max_size=4, memory_gib=64)
    nodes = (make_node("w1", gpus=1, memory_gib=64), make_node("w2", gpus=1, memory_gib=64))
    busy = (make_pod("busy-0", gpus=1, memory_gib=48, node="w1"), make_pod("busy-1", gpus=1, memory_gib=48, node="w2"))
    return Snapshot(now=100.0, nodes=nodes, pods=busy + tuple(pending), groups=(group,),
                    pools=(PoolInfo("pool-a", {"A30": pool_free}),))


def test_with_the_pool_empty_the_planner_plans_a_node_and_dds_does_not_add_it():
    train = make_pod("train-0", gpus=1, memory_gib=8)
    snapshot = _two_busy_workers(0, train)
    plan = plan_scale_up(snapshot, PlannerConfig(), [train])
    assert plan.nodes == 1 and not plan.attaches  # the planner: a new node boots with 1 GPU ...
    kept, unequipped = without_unequipped_nodes(snapshot, plan, snapshot.groups[0])
    assert kept.is_empty  # ... but that GPU comes from the same empty pool
    assert unequipped is not None and unequipped.nodes == 1 and unequipped.pods == ("default/train-0",)
    assert "pool pool-a has 0 free A30" in unequipped.message


def test_a_node_is_still_added_when_the_pool_can_equip_it_or_a_pod_needs_no_gpu():
    train = make_pod("train-0", gpus=1, memory_gib=8)
    equipped = _two_busy_workers(1, train)
    plan = plan_scale_up(equipped, PlannerConfig(), [train])
    assert without_unequipped_nodes(equipped, plan, equipped.groups[0]) == (plan, None)

    mem = make_pod("mem-0", memory_gib=24)
    no_gpu = _two_busy_workers(0, mem)
    plan = plan_scale_up(no_gpu, PlannerConfig(), [mem])
    assert plan.nodes == 1
    assert without_unequipped_nodes(no_gpu, plan, no_gpu.groups[0]) == (plan, None)


def test_pods_of_a_node_the_pool_cannot_equip_still_get_the_gpus_live_nodes_can_take():
    # The batch plan packs both pods onto one new node (boot GPU + 1): the pool's one free A30 cannot equip it. The
    # node is dropped, and one pod gets that A30 on a live worker instead.
    pods = (make_pod("train-a", gpus=1, memory_gib=8), make_pod("train-b", gpus=1, memory_gib=8))
    snapshot = _two_busy_workers(1, *pods)
    packed = plan_scale_up(snapshot, PlannerConfig(), list(pods))
    one_node = replace(packed, attaches=(), new_nodes=(NewNodes(group=snapshot.groups[0].id, count=1,
                                                                pods=tuple(p.key for p in pods), reason="batch",
                                                                gpus_per_node=(1,)),))
    plan, unequipped = equip_new_nodes(snapshot, one_node, snapshot.groups[0], PlannerConfig())
    assert plan.nodes == 0 and [(a.count, a.model) for a in plan.attaches] == [(1, "A30")]
    served = [d for d in plan.decisions if d.verdict.value == "fits-after-gpus"]
    assert len(served) == 1 and served[0].node in ("w1", "w2")
    # What is refused is the node, for the pod that got nothing, with what the pool has left.
    assert unequipped is not None and unequipped.nodes == 1
    assert unequipped.pods == tuple(p.key for p in pods if p.key != served[0].pod)
    assert unequipped.message.startswith(f"pool pool-a has 0 free A30 for {unequipped.pods[0]}: 1 new node(s)")
