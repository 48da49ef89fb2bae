"""Gangs get capacity for their minimum all at once, or none at all (dds/planner/gangs.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.planner import plan_scale_up
from dds.planner.gangs import GANG_INCOMPLETE, GANG_LARGER_THAN_CLUSTER, find_gangs, gang_of
from dds.model.snapshot import POD_GROUP_LABEL
from dds.model.plan import PlannerConfig, Verdict
from dds.planner.reference import plan_scale_up_reference
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

CONFIG = PlannerConfig(policy="best-fit", batch_solver="greedy", allow_new_nodes=False)


def member(name: str, group: str = "ddp", minimum: int = 0, gpus: int = 2, **kw):
    pod = make_pod(name, gpus=gpus, **kw)
    return replace(pod, pod_group=group, pod_group_min_member=minimum)


def two_workers(pool_free: int):
    """Two empty 4-slot workers, `pool_free` A30s in the pool, no new nodes."""
    nodes = [make_node("w1"), make_node("w2")]
    return nodes, [make_group(replicas=2, max_size=2)], [make_pool(A30=pool_free)]


@pytest.mark.parametrize("planner", [plan_scale_up, plan_scale_up_reference], ids=["fast", "reference"])
def test_a_gang_that_fits_whole_gets_every_attach(planner):
    nodes, groups, pools = two_workers(pool_free=8)
    pods = [member(f"ddp-{i}", minimum=4, created=float(i)) for i in range(4)]
    plan = planner(make_snapshot(nodes, pods, groups=groups, pools=pools), CONFIG)
    assert {d.verdict for d in plan.decisions} == {Verdict.FITS_AFTER_GPUS}
    assert plan.gpus == 8


@pytest.mark.parametrize("planner", [plan_scale_up, plan_scale_up_reference], ids=["fast", "reference"])
def test_a_gang_too_large_for_the_pool_attaches_nothing_and_says_why(planner):
    nodes, groups, pools = two_workers(pool_free=6)  # 3 of the 4 members would fit
    pods = [member(f"ddp-{i}", minimum=4, created=float(i)) for i in range(4)]
    plan = planner(make_snapshot(nodes, pods, groups=groups, pools=pools), CONFIG)
    assert plan.is_empty
    assert [d.verdict for d in plan.decisions] == [Verdict.UNSCHEDULABLE] * 4
    assert "gang default/ddp needs 8 GPU(s) for its 4 pod(s)" in plan.decisions[0].reason
    assert "more than the 6 GPU(s) the cluster has in all" in plan.decisions[0].reason


def test_the_capacity_a_short_gang_cannot_use_goes_to_the_pods_after_it():
    nodes, groups, pools = two_workers(pool_free=6)
    pods = [member(f"ddp-{i}", minimum=4, created=float(i)) for i in range(4)]
    pods.append(make_pod("single", gpus=1, created=10.0))
    plan = plan_scale_up(make_snapshot(nodes, pods, groups=groups, pools=pools), CONFIG)
    single = next(d for d in plan.decisions if d.pod == "default/single")
    assert single.verdict == Verdict.FITS_AFTER_GPUS
    assert plan.gpus == 1


def test_members_already_running_count_towards_the_minimum():
    nodes, groups, pools = two_workers(pool_free=2)
    running = [member(f"ddp-{i}", minimum=4, node="w1") for i in range(3)]
    nodes[0] = make_node("w1", gpus=4)  # 3 x 2 GPUs do not fit a 4-slot node, but the planner only counts them
    late = member("ddp-3", minimum=4, created=5.0)
    plan = plan_scale_up(make_snapshot(nodes, running + [late], groups=groups, pools=pools), CONFIG)
    assert plan.decisions[0].verdict == Verdict.FITS_AFTER_GPUS


def test_without_a_declared_minimum_every_member_shown_is_needed():
    pods = [member("a", created=1.0), member("b", created=2.0), make_pod("other", gpus=1)]
    gangs = find_gangs(make_snapshot(pods=pods), pods)
    assert list(gangs) == ["default/ddp"]
    assert gangs["default/ddp"].min_member == 2
    assert gangs["default/ddp"].pending == ("default/a", "default/b")


def test_the_coscheduling_label_is_read_when_the_edge_gave_no_group():
    pod = make_pod("w", labels={POD_GROUP_LABEL: "job-7"}, namespace="team")
    assert gang_of(pod) == "team/job-7"
    assert gang_of(make_pod("alone")) is None


def test_a_gang_larger_than_the_pool_does_not_block_a_gang_behind_it():
    nodes, groups, pools = two_workers(pool_free=8)
    huge = [member(f"huge-{i}", group="huge", minimum=3, gpus=4, created=float(i)) for i in range(3)]
    ddp = [member(f"ddp-{i}", minimum=4, created=10.0 + i) for i in range(4)]
    plan = plan_scale_up(make_snapshot(nodes, huge + ddp, groups=groups, pools=pools), CONFIG)
    verdicts = {d.pod: d.verdict for d in plan.decisions}
    assert all(verdicts[f"default/huge-{i}"] == Verdict.UNSCHEDULABLE for i in range(3))
    assert all(verdicts[f"default/ddp-{i}"] == Verdict.FITS_AFTER_GPUS for i in range(4))
    assert plan.gpus == 8


def test_a_gang_larger_than_every_gpu_there_is_is_refused_as_such():
    nodes, groups, pools = two_workers(pool_free=8)  # 8 GPUs in all; the gang asks for 10
    pods = [member(f"ddp-{i}", minimum=5, created=float(i)) for i in range(5)]
    plan = plan_scale_up(make_snapshot(nodes, pods, groups=groups, pools=pools), CONFIG)
    assert plan.is_empty
    assert {d.refusal for d in plan.decisions} == {GANG_LARGER_THAN_CLUSTER}
    assert "needs 10 GPU(s)" in plan.decisions[0].reason and "the 8 GPU(s) the cluster has" in plan.decisions[0].reason


def test_a_gang_short_of_gpus_free_now_is_left_out_but_not_called_too_large():
    nodes, groups, pools = two_workers(pool_free=4)
    nodes[0] = make_node("w1", gpus=4)
    busy = make_pod("busy", gpus=4, node="w1")  # 8 GPUs in all, 4 of them in use until busy ends
    pods = [member(f"ddp-{i}", minimum=4, created=float(i)) for i in range(4)]
    plan = plan_scale_up(make_snapshot(nodes, [busy] + pods, groups=groups, pools=pools), CONFIG)
    assert plan.is_empty
    assert {d.refusal for d in plan.decisions} == {GANG_INCOMPLETE}
    assert "gang default/ddp needs 4 pod(s) at once" in plan.decisions[0].reason
    assert "only 2 of the 4" in plan.decisions[0].reason
