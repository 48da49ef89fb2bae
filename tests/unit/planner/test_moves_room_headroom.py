"""Idle GPUs for one more pod on every node with room (dds/planner/moves.py, `plan_room_headroom`).

The nodes are the builders' 8-core, 32 GiB nodes of group "gpu" (up to 4 A30 from pool "pool-a").
"""

from __future__ import annotations

from typing import Sequence

from dds.planner.moves import plan_room_headroom
from dds.model.plan import Attach
from dds.model.snapshot import NodeInfo, PodInfo, Snapshot
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot


def snapshot(nodes: Sequence[NodeInfo], pods: Sequence[PodInfo], free: int = 4) -> Snapshot:
    return make_snapshot(nodes, pods, groups=[make_group(replicas=len(nodes), max_size=len(nodes))],
                         pools=[make_pool(A30=free)])


def attached(plan: Sequence[Attach]) -> dict[str, int]:
    return {a.node: a.count for a in plan}


def test_a_node_with_room_but_no_idle_gpu_gets_one_and_a_node_holding_one_does_not():
    # The KubeComp w1 case: the big pod (5 cores) leaves room for a small one (2 cores) on w1, which has no idle GPU;
    # w2 has room and an idle GPU already. Only w1 needs one, so the next small pod may land on either.
    nodes = [make_node("w1", gpus=1), make_node("w2", gpus=2)]
    pods = [make_pod("big", gpus=1, cores=5, node="w1"), make_pod("small", gpus=1, cores=2, node="w2")]
    (attach,) = plan_room_headroom(snapshot(nodes, pods))
    assert (attach.node, attach.count, attach.pool, attach.model, attach.pods) == ("w1", 1, "pool-a", "A30", ())


def test_the_largest_pod_that_fits_sets_how_many():
    nodes = [make_node("w1", gpus=1)]
    pods = [make_pod("small", gpus=1, cores=2, node="w1"), make_pod("pair", gpus=2, cores=2),
            make_pod("wide", gpus=4, cores=7)]  # "wide" does not fit the 6 cores left: the 2-GPU pod counts
    assert attached(plan_room_headroom(snapshot(nodes, pods))) == {"w1": 2}


def test_a_node_without_room_for_any_known_pod_gets_nothing():
    nodes = [make_node("w1", gpus=1)]
    pods = [make_pod("big", gpus=1, cores=5, node="w1"), make_pod("other", gpus=1, cores=4)]
    assert plan_room_headroom(snapshot(nodes, pods)) == ()


def test_no_gpu_pod_known_means_no_headroom():
    nodes = [make_node("w1")]
    assert plan_room_headroom(snapshot(nodes, [make_pod("web", cores=1, node="w1")])) == ()


def test_a_pool_pending_pods_wait_on_is_left_to_them():
    nodes = [make_node("w1", gpus=1)]
    pods = [make_pod("small", gpus=1, cores=2, node="w1")]
    assert plan_room_headroom(snapshot(nodes, pods), hungry=frozenset({"pool-a"})) == ()


def test_never_more_than_the_pool_holds_nor_past_the_slots():
    nodes = [make_node("w1", gpus=1), make_node("w2", gpus=4)]
    pods = [make_pod("small", gpus=1, cores=1, node="w1")] + [
        make_pod(f"s{i}", gpus=1, cores=1, node="w2") for i in range(4)] + [make_pod("pair", gpus=2, cores=1)]
    assert attached(plan_room_headroom(snapshot(nodes, pods, free=1))) == {"w1": 1}  # w2: its 4 slots are full


def test_skipped_tainted_and_busy_nodes_are_left_alone():
    nodes = [make_node("w1", gpus=1), make_node("w2", gpus=1, attaching=1), make_node("w3", gpus=1)]
    pods = [make_pod(f"p{n}", gpus=1, cores=2, node=f"w{n}") for n in (1, 2, 3)]
    assert attached(plan_room_headroom(snapshot(nodes, pods), skip=frozenset({"w3"}))) == {"w1": 1}


def test_pods_asking_for_another_model_do_not_count():
    nodes = [make_node("w1", gpus=1)]
    pods = [make_pod("small", gpus=1, cores=2, node="w1"), make_pod("h100", gpus=3, cores=1, model="H100")]
    assert attached(plan_room_headroom(snapshot(nodes, pods))) == {"w1": 1}
