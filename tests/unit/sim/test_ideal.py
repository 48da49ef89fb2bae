"""The ideal pool (dds/sim/ideal.py): the bound `dds simulate` prints beside every policy, worked out by hand."""

from __future__ import annotations

import pytest

from dds.sim.engine import simulate
from dds.planner.reservations import ReservationConfig
from dds.sim.ideal import IDEAL_POLICY, IDEAL_RESERVING, asks_for_reservations, ideal
from dds.sim.policies import POLICIES
from dds.sim.results import compare, render_table, summarize
from dds.sim.trace import Job
from dds.sim.workloads import GiB, WorkloadParams, build

from .builders import cluster, job, scenario


def starts(result) -> dict[str, float | None]:
    return {j.name: j.start_s for j in result.jobs}


# A CPU job keeps half of node 0's cores all along; the 4-GPU pool is busy with a job beside it until 100 s. The
# second job needs a whole node's cores, so only node 1 can take it.
MOVE = [job("hog", 0, gpus=0, cores=4, duration=1000), job("first", 0, gpus=4, cores=4),
        job("second", 10, gpus=4, cores=8)]


def test_a_gpu_freed_on_one_node_serves_a_job_on_another_at_once():
    # The second job takes the GPUs the moment they are free: no detach, no attach, no cooldown.
    result = ideal(scenario(cluster((4, 0), 4), MOVE))
    assert starts(result) == {"hog": 0.0, "first": 0.0, "second": 100.0}
    assert {j.name: j.node for j in result.jobs} == {"hog": "workers-0", "first": "workers-0",
                                                      "second": "workers-1"}
    assert result.policy == IDEAL_POLICY


def test_the_bound_is_below_what_dds_gets_with_fabric_latency_and_cooldown():
    tiny = scenario(cluster((4, 0), 4), MOVE)
    dds = summarize(simulate(tiny, POLICIES["best-fit"]))
    bound = summarize(ideal(tiny))
    assert bound.wait_mean_s == 30.0  # (0 + 0 + 90) / 3
    # The GPUs detach from node 0 and attach to node 1 before the second job starts.
    assert dds.wait_mean_s >= bound.wait_mean_s + (10.0 + 30.0) / 3


def test_a_later_job_that_fits_starts_before_an_earlier_one_that_does_not():
    jobs = [job("busy", 0, gpus=3), job("large", 1, gpus=2), job("small", 2, gpus=1)]
    result = ideal(scenario(cluster((4,), 4), jobs))
    assert starts(result) == {"busy": 0.0, "large": 100.0, "small": 2.0}


def test_cores_memory_and_slots_still_bind_and_gpus_held_are_the_gpus_used():
    # Two 6-core jobs cannot share an 8-core node; a node takes at most 2 GPUs (max_gpus) though the pool has 4.
    jobs = [job("a", 0, gpus=1, cores=6), job("b", 0, gpus=1, cores=6), job("c", 0, gpus=3, cores=1)]
    result = ideal(scenario(cluster((2, 2), 4, max_gpus=2), jobs))
    assert starts(result) == {"a": 0.0, "b": 0.0, "c": None}  # 3 GPUs never fit a 2-slot node
    summary = summarize(result)
    assert summary.never_started == 1
    assert summary.gpus_present_avg == pytest.approx(2.0)  # nothing idle is held


def test_nodes_a_group_may_add_are_there_from_the_start():
    jobs = [job("a", 0, gpus=1, cores=8), job("b", 0, gpus=1, cores=8)]
    result = ideal(scenario(cluster((1,), 4, max_nodes=2), jobs))
    assert starts(result) == {"a": 0.0, "b": 0.0}


def test_a_gang_starts_only_when_its_minimum_fits_at_once():
    gang = [Job(name=f"g{i}", arrival_s=0.0, duration_s=100.0, milli_cpu=1000, memory=GiB, gpus=2, group="g")
            for i in range(2)]
    jobs = [job("single", 0, gpus=1)] + gang
    result = ideal(scenario(cluster((4,), 4), jobs))
    assert starts(result) == {"single": 0.0, "g0": 100.0, "g1": 100.0}


def test_a_job_insisting_on_a_model_the_pool_lacks_never_starts():
    result = ideal(scenario(cluster((4,), 4), [job("v100", 0, model="V100"), job("a30", 0, model="A30")]))
    assert starts(result) == {"v100": None, "a30": 0.0}


def test_every_row_shows_its_gap_to_the_ideal_and_none_when_they_ran_different_jobs():
    tiny = scenario(cluster((4, 0), 4), MOVE)
    summaries = compare([simulate(tiny, POLICIES["best-fit"]), ideal(tiny)], tiny.baseline)
    gaps = {s.policy: s.wait_vs_ideal for s in summaries}
    assert gaps["ideal"] == 0.0
    assert gaps["best-fit"] == pytest.approx(summaries[0].wait_mean_s / 30.0 - 1.0) and gaps["best-fit"] > 0
    header, _, first, _ = render_table(summaries).splitlines()
    assert "vs ideal" in header and f"{gaps['best-fit']:+.1%}" in first

    unrun = scenario(cluster((4,), 4), [job("v100", 0, model="V100"), job("a30", 0, model="A30"),
                                        job("b", 0)])
    fewer = scenario(cluster((4,), 4), [job("a30", 0, model="A30"), job("b", 0)])
    mixed = compare([simulate(fewer, POLICIES["best-fit"]), ideal(unrun)])
    assert mixed[0].wait_vs_ideal is None  # 0 never ran against the bound's 1: not the same jobs


# Two 4-slot nodes share a 4-GPU pool; a and b fill it on node 0, the large job asks for all 4.
HOLD = [job("a", 0, gpus=2), job("b", 50, gpus=2), job("large", 60, gpus=4), job("c", 70, gpus=2)]
QUIET = ReservationConfig(min_age_seconds=600.0, quiet_age_seconds=0.0)


def test_without_holds_a_large_job_waits_until_the_small_ones_leave_the_pool_empty():
    result = ideal(scenario(cluster((0, 0), 4, max_gpus=4), HOLD))
    assert starts(result)["large"] == 200.0 and starts(result)["c"] == 100.0  # c overtakes it when a ends


def test_a_held_large_job_gets_the_gpus_its_node_has_slots_for_and_starts_once_its_node_drains():
    # At 60 few jobs wait, so the large job gets node 0 (the most GPUs in use) held. When a ends at 100, node 0 has
    # 2 free slots and the pool 2 free GPUs: they are the large job's, so c waits; at 150 b ends and it starts.
    result = ideal(scenario(cluster((0, 0), 4, max_gpus=4), HOLD), QUIET)
    assert result.policy == IDEAL_RESERVING
    assert starts(result) == {"a": 0.0, "b": 50.0, "large": 150.0, "c": 250.0}


def test_a_hold_comes_with_age_and_disabled_rules_change_nothing():
    # Two 1-GPU jobs queue before the large one; d comes later. Without holds d takes the 2 GPUs q0 and q1 free at
    # 200 and the large job waits for the pool to empty at 300. Held from age 100 (at 160) on node 0, the GPUs its
    # node frees are the large job's: d waits, the large job starts when c ends at 250.
    crowd = HOLD + [job("q0", 55, gpus=1), job("q1", 55, gpus=1), job("d", 180, gpus=2)]
    tiny = scenario(cluster((0, 0), 4, max_gpus=4), crowd)
    assert starts(ideal(tiny))["large"] == 300.0
    late = starts(ideal(tiny, ReservationConfig(min_age_seconds=100.0, quiet_age_seconds=None)))
    assert (late["large"], late["d"]) == (250.0, 350.0)
    off = ideal(tiny, ReservationConfig(enabled=False))
    assert starts(off) == starts(ideal(tiny)) and off.policy == IDEAL_POLICY


def test_dds_with_its_reservations_stays_above_the_reserving_bound_on_kubecomp_w4():
    reservations = ReservationConfig(min_age_seconds=600.0, quiet_age_seconds=0.0)
    for seed in (1, 2):
        w4 = build("kubecomp-w4", WorkloadParams(seed=seed))
        dds = summarize(simulate(w4, POLICIES["best-fit"], reservations=reservations, release_idle=True))
        assert dds.wait_mean_s >= summarize(ideal(w4, reservations)).wait_mean_s


def test_with_reservations_the_policies_that_move_gpus_show_their_gap_to_the_reserving_bound_too():
    tiny = scenario(cluster((2, 2), 4, max_gpus=4), HOLD)
    results = [simulate(tiny, POLICIES["best-fit"], reservations=QUIET), simulate(tiny, POLICIES["static"]),
               ideal(tiny), ideal(tiny, QUIET)]
    summaries = {s.policy: s for s in compare(results, tiny.baseline)}
    best_fit, bound = summaries["best-fit"], summaries[IDEAL_RESERVING]
    assert best_fit.wait_vs_reserving == pytest.approx(best_fit.wait_mean_s / bound.wait_mean_s - 1.0)
    assert summaries["static"].wait_vs_reserving is None  # fixed GPUs reserve nothing
    assert "vs reserving" in render_table(tuple(summaries.values())).splitlines()[0]


def test_the_reserving_bound_is_asked_for_only_when_some_job_is_large():
    assert asks_for_reservations(scenario(cluster((0, 0), 4, max_gpus=4), HOLD), QUIET)  # 4 GPUs of 4 slots
    assert not asks_for_reservations(scenario(cluster((0, 0), 4, max_gpus=4), HOLD[:2]), QUIET)  # 2 of 4: not large
    assert not asks_for_reservations(scenario(cluster((0, 0), 4, max_gpus=4), HOLD), ReservationConfig(enabled=False))
