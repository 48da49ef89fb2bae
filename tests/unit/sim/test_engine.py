"""The simulator against outcomes worked out by hand on tiny traces (the real planner decides; the cases are built so
that any correct placement gives the same waits and counts)."""

from __future__ import annotations

import pytest

from dds.config import PoolSpec
from dds.sim.engine import SimResult, simulate
from dds.sim.policies import POLICIES
from dds.sim.scenario import ClusterSpec
from dds.sim.workloads import GiB, gpu_group

from tests.unit.sim.builders import cluster, job, scenario


def waits(result: SimResult) -> dict[str, float | None]:
    return {j.name: j.wait_s for j in result.jobs}


def test_static_cluster_queues_the_third_job_until_a_gpu_frees():
    # Two nodes with one fixed GPU each; three 1-GPU jobs at t=0 running 100 s.
    result = simulate(scenario(cluster((1, 1), 2), [job("a", 0), job("b", 0), job("c", 0)]), POLICIES["static"])
    assert sorted(waits(result).values()) == [0.0, 0.0, 100.0]
    assert result.counters.gpus_attached == 0
    assert max(j.finish_s for j in result.jobs) == 200.0


@pytest.mark.parametrize("policy", ["best-fit", "least-demand", "spread", "concentrated"])
def test_attach_first_attaches_exactly_what_pending_jobs_need(policy):
    # Two GPU-less nodes, a pool of 4. a (1 GPU, t=0): the step at t=0 attaches 1, online at 30.
    # b (2 GPUs, t=5): the step at t=10 attaches 2, online at 40. c (no GPU) binds at once.
    jobs = [job("a", 0, gpus=1), job("b", 5, gpus=2), job("c", 0, gpus=0)]
    result = simulate(scenario(cluster((0, 0), 4), jobs), POLICIES[policy])
    assert waits(result) == {"a": 30.0, "b": 35.0, "c": 0.0}
    assert result.counters.gpus_attached == 3
    assert result.counters.nodes_added == 0


def test_idle_gpus_of_an_empty_node_at_min_size_go_back_to_the_pool():
    # a holds 1 GPU until 130. The node cannot go (group at min size 1), but its GPU idles from 130: detached at 190
    # (60 s cooldown), back in the pool at 200.
    result = simulate(scenario(cluster((0,), 4), [job("a", 0, gpus=1)]), POLICIES["best-fit"])
    assert result.counters.gpus_detached == 1
    assert result.timeline[-1].gpus_present == 0
    assert result.end_s == 200.0


def test_attach_first_moves_an_idle_gpu_to_the_node_that_has_room():
    # "big" (4 cores) starts with the only GPU; "small" (2 cores) has none. x (4 cores, no GPU) fills big's CPU, so
    # y (2 cores, 1 GPU, t=1) can only run on small: big's idle GPU (cooldown 0) is detached at t=0 (back at 10),
    # attached to small at the t=10 step, online at 40.
    big = gpu_group("big", nodes=1, cores=4, memory=64 * GiB, pool="pool-0", models=("A30",), gpu_idle_cooldown_s=0)
    small = gpu_group("small", nodes=1, cores=2, memory=64 * GiB, pool="pool-0", models=("A30",),
                      gpu_idle_cooldown_s=0)
    spec = ClusterSpec(groups=(big, small), pools=(PoolSpec(name="pool-0", devices={"A30": 1}),),
                       initial_nodes={"big": 1, "small": 1}, preconfigured={"big": (1,), "small": (0,)})
    jobs = [job("x", 0, gpus=0, cores=4, duration=500), job("y", 1, gpus=1, cores=2)]
    result = simulate(scenario(spec, jobs), POLICIES["best-fit"])
    assert waits(result) == {"x": 0.0, "y": 39.0}
    assert result.counters.gpus_reallocated == 1
    assert {j.name: j.node for j in result.jobs}["y"].startswith("small")


def test_node_only_adds_a_server_and_removes_an_empty_one_later():
    # One server with 1 fixed GPU, room for one more (template: 1 GPU). a holds the GPU for 1000 s, so b waits for the
    # new server: the step at t=0 asks for it, Ready at 300. The new server is empty from 400; at 1000 (400 + 600 s
    # cooldown) it goes, the group being above its minimum of 1. The last server stays (the minimum).
    spec = cluster((1,), 1, max_gpus=1, max_nodes=2, node_idle_cooldown=600)
    jobs = [job("a", 0, duration=1000), job("b", 0)]
    result = simulate(scenario(spec, jobs, provision=300), POLICIES["node-only"])
    assert sorted(waits(result).values()) == [0.0, 300.0]
    assert result.counters.nodes_added == 1
    assert result.counters.nodes_removed == 1
    assert result.counters.gpus_attached == 0
    assert result.timeline[-1].nodes == 1


def test_attach_first_adds_a_node_only_when_every_node_is_at_its_maximum():
    # One node at its 2-GPU maximum, busy; a 2-GPU job can only go to a new node, which then gets GPUs attached.
    spec = cluster((2,), 4, max_gpus=2, max_nodes=2)
    jobs = [job("a", 0, gpus=2, duration=1000), job("b", 0, gpus=2)]
    result = simulate(scenario(spec, jobs, provision=300), POLICIES["best-fit"])
    assert result.counters.nodes_added == 1
    assert result.counters.gpus_attached == 2
    # Ready at 300, attached at the next step (300), online 30 s later.
    assert waits(result) == {"a": 0.0, "b": 330.0}


def test_a_job_no_node_can_ever_hold_is_reported_and_the_run_ends():
    result = simulate(scenario(cluster((1, 1), 2), [job("huge", 0, gpus=9), job("ok", 10)]), POLICIES["spread"])
    assert waits(result) == {"huge": None, "ok": 0.0}


def test_static_concentrated_runs_the_8_gpu_job_that_even_cannot():
    jobs = [job("e", 0, gpus=8, cores=4)]
    spec = cluster((4, 4), 8)
    assert waits(simulate(scenario(spec, jobs), POLICIES["static"])) == {"e": None}
    assert waits(simulate(scenario(spec, jobs), POLICIES["static-concentrated"])) == {"e": 0.0}


def test_same_scenario_same_result():
    jobs = [job(f"j{i}", i * 7.0, gpus=i % 3, duration=50 + i) for i in range(12)]
    spec = cluster((1, 0, 2), 6)
    first = simulate(scenario(spec, jobs), POLICIES["least-demand"])
    second = simulate(scenario(spec, jobs), POLICIES["least-demand"])
    assert first == second


@pytest.mark.parametrize("workload, policy", [
    pytest.param("elastic", "least-demand", id="elastic-least-demand"),
    pytest.param("elastic", "node-only", id="elastic-node-only"),
    pytest.param("kubecomp-realloc-30", "best-fit", id="realloc-best-fit"),
])
def test_shortcuts_change_no_outcome(workload, policy):
    # The simulator skips planner calls whose answer cannot change; asking every time must give the same run.
    from dds.sim.workloads import WorkloadParams, build

    scenario_ = build(workload, WorkloadParams(seed=3, jobs=30))
    fast = simulate(scenario_, POLICIES[policy])
    slow = simulate(scenario_, POLICIES[policy], exhaustive=True)
    assert fast.jobs == slow.jobs
    assert fast.timeline == slow.timeline
    assert (fast.counters.gpus_attached, fast.counters.gpus_detached, fast.counters.nodes_added) == (
        slow.counters.gpus_attached, slow.counters.gpus_detached, slow.counters.nodes_added)


def test_warm_headroom_starts_the_next_job_without_an_attach_and_holds_one_gpu():
    # One GPU-less node, a pool of 4. With one warm GPU the refill attaches it at t=0 (online at 30), so b, arriving
    # at t=1000, long after a's GPU idled out, starts at once; without headroom b waits for an attach (30 s).
    jobs = [job("a", 0, gpus=1), job("b", 1000, gpus=1)]
    cold = simulate(scenario(cluster((0,), 4), jobs), POLICIES["best-fit"])
    warm = simulate(scenario(cluster((0,), 4), jobs), POLICIES["best-fit"], warm_gpus=1)
    assert waits(cold)["b"] == 30.0
    assert waits(warm)["b"] == 0.0
    assert warm.timeline[-1].gpus_present >= 1  # the headroom stays once both jobs are done


def test_moves_keep_an_idle_gpu_on_a_node_with_room_for_one_more_pod():
    # One 8-core node holding one GPU, a pool of 4, production's 600 s cooldown. a takes the GPU at t=0 and leaves
    # room for one more 4-core pod: with moves, the node gets an idle GPU for it at once (dds/planner/moves.py,
    # plan_room_headroom), so b starts on arrival; without, b waits for an attach. Once b runs the node is full and
    # nothing more is attached.
    jobs = [job("a", 0, gpus=1, cores=4, duration=1000), job("b", 100, gpus=1, cores=4)]
    spec = cluster((1,), 4, gpu_idle_cooldown=600.0)
    plain = simulate(scenario(spec, jobs), POLICIES["best-fit"])
    moved = simulate(scenario(spec, jobs), POLICIES["best-fit"], moves=True)
    assert waits(plain)["b"] == 30.0
    assert waits(moved)["b"] == 0.0
    assert moved.counters.gpus_attached == plain.counters.gpus_attached + 1  # the one b took, no more
