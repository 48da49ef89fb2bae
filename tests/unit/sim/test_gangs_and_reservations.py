"""Gangs and reservations in the simulator, on traces small enough to work out by hand."""

from __future__ import annotations

import argparse
from dataclasses import replace

from dds.commands.simulate import reservations_from_args
from dds.planner.reservations import ReservationConfig
from dds.sim.engine import simulate
from dds.sim.policies import POLICIES
from dds.sim.results import summarize
from tests.unit.sim.builders import cluster, job, scenario


def gang(name: str, at: float, pods: int, gpus: int, duration: float = 100.0):
    return [replace(job(f"{name}-{i}", at, gpus=gpus, duration=duration), group=name, group_min=pods)
            for i in range(pods)]


def starts(result):
    return {j.name: j.start_s for j in result.jobs}


def test_a_gang_starts_only_whole_and_a_gang_too_large_strands_nothing_when_planned_as_one():
    # Two 4-slot nodes with no GPUs, a 6-GPU pool: the 4 x 2-GPU gang can never start; the single job must.
    jobs = gang("ddp", 0.0, pods=4, gpus=2) + [job("single", 5.0, gpus=1)]
    spec = scenario(cluster((0, 0), pool_gpus=6, max_gpus=4), jobs)
    aware = simulate(spec, POLICIES["best-fit"])
    unaware = simulate(spec, POLICIES["gang-unaware"])
    assert all(starts(aware)[f"ddp-{i}"] is None for i in range(4))
    assert starts(aware)["single"] == 40.0  # the loop tick after its arrival (10 s), then the attach (30 s)
    assert summarize(aware).gpu_stranded_s == 0
    assert all(starts(unaware)[f"ddp-{i}"] is None for i in range(4))
    assert summarize(unaware).gpu_stranded_s > 0


def test_gang_members_start_together_once_all_fit():
    jobs = gang("ddp", 0.0, pods=2, gpus=2)
    result = simulate(scenario(cluster((0, 0), pool_gpus=4, max_gpus=4), jobs), POLICIES["best-fit"])
    assert starts(result)["ddp-0"] == starts(result)["ddp-1"] == 30.0  # the loop tick at 0, then the attach


def test_a_large_job_gets_a_node_reserved_and_starts_while_small_jobs_keep_arriving():
    # One 8-GPU pool on two 8-slot nodes, 4/4. 1-GPU jobs of 300 s arrive every 100 s and keep both nodes busy; the
    # 8-GPU job arriving at 50 s needs every GPU on one node.
    small = [job(f"s-{i}", 100.0 * i, gpus=1, duration=300.0) for i in range(30)]
    spec = scenario(cluster((4, 4), pool_gpus=8), small + [job("big", 50.0, gpus=8, duration=300.0)])
    with_reservation = simulate(spec, POLICIES["best-fit"], reservations=ReservationConfig(min_age_seconds=100.0))
    big = starts(with_reservation)["big"]
    assert big is not None and big - 50.0 <= 600.0
    without = simulate(spec, POLICIES["best-fit"], reservations=ReservationConfig(enabled=False))
    assert starts(without)["big"] is None or starts(without)["big"] > big


def test_a_large_job_is_reserved_before_its_min_age_while_few_pods_queue_behind_it():
    # As above, but the reservation age is past the whole stream: only the quiet rule can reserve early, and the
    # 1-GPU jobs, each alone in the queue when it arrives, leave it quiet.
    small = [job(f"s-{i}", 100.0 * i, gpus=1, duration=300.0) for i in range(30)]
    spec = scenario(cluster((4, 4), pool_gpus=8), small + [job("big", 50.0, gpus=8, duration=300.0)])
    quiet = simulate(spec, POLICIES["best-fit"],
                     reservations=ReservationConfig(min_age_seconds=10_000.0, quiet_age_seconds=0.0))
    late = simulate(spec, POLICIES["best-fit"], reservations=ReservationConfig(min_age_seconds=10_000.0))
    big = starts(quiet)["big"]
    assert big is not None and big - 50.0 <= 600.0
    assert starts(late)["big"] is None or starts(late)["big"] > big


def test_reserve_early_turns_reservations_on_with_its_quiet_age():
    args = argparse.Namespace(reservations=False, no_reservations=False, reserve_after=None, reserve_early=30.0)
    config = reservations_from_args(args)
    assert (config.enabled, config.quiet_age_seconds, config.min_age_seconds) == (True, 30.0, 300.0)


def test_simulate_reserves_by_default_as_the_controller_does_and_can_be_told_not_to():
    plain = argparse.Namespace(reservations=False, no_reservations=False, reserve_after=None, reserve_early=None)
    config = reservations_from_args(plain)
    assert (config.enabled, config.quiet_age_seconds, config.min_age_seconds) == (True, 0.0, 300.0)
    off = reservations_from_args(argparse.Namespace(**{**vars(plain), "no_reservations": True}))
    assert not off.enabled


def test_simulate_releases_idle_gpus_to_pending_pods_by_default_as_the_controller_does():
    from dds.commands.simulate import release_idle_from_args

    assert release_idle_from_args(argparse.Namespace(no_release_idle_gpus=False)) is True
    assert release_idle_from_args(argparse.Namespace(no_release_idle_gpus=True)) is False


def test_an_idle_gpu_goes_to_a_pod_on_another_node_before_its_cooldown_when_idle_gpus_are_released():
    # The only GPU serves `first` on w0 until 100 s; `hog` then keeps half of w0's cores, so `second` (a whole node's
    # cores) can only go to w1. Released at once (detach 10 s, attach 30 s) or after the 600 s cooldown.
    jobs = [job("first", 0.0, gpus=1, cores=4), job("hog", 1.0, gpus=0, cores=4, duration=2000.0),
            job("second", 150.0, gpus=1, cores=8)]
    spec = scenario(cluster((1, 0), pool_gpus=1, gpu_idle_cooldown=600.0), jobs)
    released = starts(simulate(spec, POLICIES["best-fit"], release_idle=True))["second"]
    kept = starts(simulate(spec, POLICIES["best-fit"]))["second"]
    assert released is not None and released <= 150.0 + 10.0 + 30.0 + 10.0  # within one loop interval of the move
    assert kept is not None and kept >= 100.0 + 600.0
