"""Moving an idle GPU straight to where a pending pod fits (dds/planner/moves.py)."""

from __future__ import annotations

from dds.planner import plan_scale_up
from dds.planner.moves import plan_moves
from dds.model.plan import PlannerConfig
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

CONFIG = PlannerConfig(policy="best-fit", batch_solver="greedy", allow_new_nodes=False)


def snapshot(hog_cores: float):
    """w1 holds one idle A30 and a CPU-only pod of `hog_cores`; w2 has no GPU; the pool is empty; a 1-GPU pod waits."""
    nodes = [make_node("w1", gpus=1), make_node("w2")]
    pods = [make_pod("hog", cores=hog_cores, node="w1"), make_pod("train", gpus=1, cores=2)]
    return make_snapshot(nodes, pods, groups=[make_group(replicas=2, max_size=2)], pools=[make_pool(A30=0)])


def test_an_idle_gpu_on_a_full_node_moves_to_where_the_pod_fits():
    snap = snapshot(hog_cores=8)
    plan = plan_scale_up(snap, CONFIG)
    (detach,) = plan_moves(snap, CONFIG, plan, plan_scale_up)
    assert (detach.node, detach.device_ids) == ("w1", ("w1-gpu-0",))


def test_nothing_moves_when_the_pod_fits_where_the_gpu_is():
    snap = snapshot(hog_cores=1)
    plan = plan_scale_up(snap, CONFIG)
    assert plan_moves(snap, CONFIG, plan, plan_scale_up) == ()
