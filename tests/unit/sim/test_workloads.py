"""Generated workloads: KubeComp's shapes, seeded and reproducible."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from dds.sim.scenario import concentrated_layout, even_layout
from dds.sim.workloads import (BUILTIN, WORKLOAD_MIXES, WorkloadParams, build, exact_counts, helios_like_jobs,
                               mix_jobs, multi_pool_cluster, poisson_arrivals, single_pool_cluster)


@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_builtin_workload_is_reproducible_from_its_seed(name):
    params = WorkloadParams(seed=7, jobs=40)
    first, second = build(name, params), build(name, params)
    assert first.jobs == second.jobs and len(first.jobs) == 40
    assert build(name, WorkloadParams(seed=8, jobs=40)).jobs != first.jobs
    assert [j.arrival_s for j in first.jobs] == sorted(j.arrival_s for j in first.jobs)


def test_workload_4_has_the_papers_exact_shares():
    jobs = mix_jobs(WORKLOAD_MIXES[4], 50, 60.0, seed=1)
    kinds = Counter(j.name.rsplit("-", 1)[1] for j in jobs)
    assert kinds == {"a": 12, "b": 12, "c": 12, "d": 12, "e": 2}
    by_kind = {j.name.rsplit("-", 1)[1]: (j.milli_cpu, j.gpus) for j in jobs}
    assert by_kind == {"a": (80_000, 1), "b": (40_000, 1), "c": (40_000, 2), "d": (40_000, 4), "e": (40_000, 8)}
    assert all(j.duration_s == 300.0 for j in jobs)


@pytest.mark.parametrize("mix, count, expected", [
    pytest.param({"A": 0.5, "B": 0.5}, 5, {"A": 3, "B": 2}, id="tie-by-name"),
    pytest.param({"A": 0.24, "E": 0.04, "B": 0.72}, 25, {"A": 6, "B": 18, "E": 1}, id="largest-remainder"),
])
def test_exact_counts(mix, count, expected):
    assert exact_counts(mix, count) == expected


def test_poisson_arrivals_start_at_zero_and_have_the_asked_mean_gap():
    times = poisson_arrivals(20_000, 60.0, random.Random(3))
    assert times[0] == 0.0
    mean_gap = times[-1] / (len(times) - 1)
    assert 57.0 < mean_gap < 63.0


def test_helios_like_trace_offers_the_asked_load():
    jobs = helios_like_jobs(4000, total_gpus=96, target_load=0.85, seed=2)
    offered = sum(j.gpus * j.duration_s for j in jobs) / (jobs[-1].arrival_s * 96)
    assert 0.75 < offered < 0.95
    assert {j.gpus for j in jobs} == {1, 2, 4, 8}


def test_layouts_even_and_concentrated():
    spec = single_pool_cluster(nodes=4, pool_gpus=24)
    assert even_layout(spec, "workers") == (6, 6, 6, 6)
    assert concentrated_layout(spec, "workers") == (8, 8, 8, 0)
    assert spec.layout("workers") == (6, 6, 6, 6)  # no preconfigured entry: even
    multi = multi_pool_cluster(3)
    assert [multi.layout(g.id) for g in multi.groups] == [(4, 4, 8, 8)] * 3
    assert {g.fabric_pool for g in multi.groups} == {"pool-0", "pool-1", "pool-2"}


def test_unknown_workload_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown workload 'w5'; built in: kubecomp-w1"):
        build("w5")


def test_a_layout_that_does_not_fit_the_pool_is_refused():
    with pytest.raises(ValueError, match="9 GPU\\(s\\) placed on nodes of pool pool-0, which holds 8"):
        single_pool_cluster(nodes=2, pool_gpus=8, layout=(8, 1))
