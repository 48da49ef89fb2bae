"""Memory demand in `dds simulate` (issue 43): CXL memory attached chunk by chunk by the production planner, against
the same jobs GPU-only, on tiny traces whose outcome is worked out by hand."""

from __future__ import annotations

import csv
from dataclasses import replace

from dds.cli import main
from dds.config import PoolSpec
from dds.model.cxl import cxl_model
from dds.sim.engine import SimResult, simulate
from dds.sim.ideal import ideal
from dds.sim.policies import POLICIES
from dds.sim.results import MemoryEffect, compare, memory_effects, render_memory_table, summarize
from dds.sim.scenario import GPU_ONLY_SUFFIX, ClusterSpec, Scenario, Timing, gpu_only
from dds.sim.trace import Job
from dds.sim.workloads import CXL_NODE_MEMORY, WorkloadParams, build, gpu_group

GiB = 2**30
CHUNK = 16 * GiB


def memory_job(name: str, at: float, memory_gib: int, duration: float = 100.0) -> Job:
    return Job(name=name, arrival_s=at, duration_s=duration, milli_cpu=1000, memory=memory_gib * GiB, gpus=0)


def memory_cluster(max_nodes: int = 2, chunks: int = 4, cooldown: float = 60.0) -> ClusterSpec:
    """One 64 GiB server to start (up to `max_nodes`), taking up to 64 GiB of CXL memory in 16 GiB chunks from a pool
    of 2 A30s and `chunks` chunks."""
    group = gpu_group("workers", nodes=1, max_nodes=max_nodes, cores=8, memory=64 * GiB, max_gpus=2, pool="pool-0",
                      models=("A30",), gpu_idle_cooldown_s=cooldown, node_idle_cooldown_s=600.0,
                      max_cxl_memory=64 * GiB, cxl_memory_chunk=CHUNK)
    devices = {"A30": 2, cxl_model(CHUNK): chunks} if chunks else {"A30": 2}
    return ClusterSpec(groups=(group,), pools=(PoolSpec(name="pool-0", devices=devices),),
                       initial_nodes={"workers": 1}, preconfigured={"workers": (0,)})


def tiny(jobs: list[Job], cluster: ClusterSpec | None = None) -> Scenario:
    return Scenario(name="tiny", description="hand-computed", cluster=cluster or memory_cluster(), jobs=tuple(jobs),
                    timing=Timing(attach_s=30.0, detach_s=10.0, node_provision_s=300.0, loop_interval_s=10.0))


def starts(result: SimResult) -> dict[str, float | None]:
    return {j.name: j.start_s for j in result.jobs}


def test_a_pod_short_of_memory_gets_a_chunk_attached_instead_of_a_node():
    # a takes 48 of the node's 64 GiB; b (32 GiB) is 16 GiB short: the scale step at t=10 attaches one 16 GiB chunk,
    # online 30 s later, and b starts then on the same node. No node is added.
    result = simulate(tiny([memory_job("a", 0, 48), memory_job("b", 1, 32)]), POLICIES["best-fit"])
    assert starts(result) == {"a": 0.0, "b": 40.0}
    assert {j.node for j in result.jobs} == {"workers-0"}
    assert (result.counters.nodes_added, result.counters.cxl_chunks_attached, result.counters.gpus_attached) == (0, 1, 0)
    # The chunk is memory on the node until both jobs are gone and the cooldown has passed, then it is detached.
    held = {s.t_s: s.cxl_memory for s in result.timeline}
    assert held[40.0] == CHUNK
    assert result.counters.cxl_chunks_detached == 1 and result.timeline[-1].cxl_memory == 0


def test_gpu_only_the_same_pod_waits_for_a_new_node():
    # Without CXL memory b fits no live node: the step at t=10 asks for a node, Ready 300 s later (a runs on).
    result = simulate(gpu_only(tiny([memory_job("a", 0, 48, duration=1000.0), memory_job("b", 1, 32)])),
                      POLICIES["best-fit"])
    assert starts(result) == {"a": 0.0, "b": 310.0}
    assert (result.counters.nodes_added, result.counters.cxl_chunks_attached) == (1, 0)


def test_memory_the_pods_request_is_never_detached_however_long_they_run():
    # b runs 1,000 s on the chunk, far past the 60 s cooldown: the chunk stays until b ends, then goes.
    result = simulate(tiny([memory_job("a", 0, 48, duration=2000.0), memory_job("b", 1, 32, duration=1000.0)]),
                      POLICIES["best-fit"])
    assert starts(result)["b"] == 40.0
    assert all(s.cxl_memory == CHUNK for s in result.timeline if 40.0 <= s.t_s < 1040.0)
    detached = next(s.t_s for s in result.timeline if s.t_s > 40.0 and s.cxl_memory == 0)
    assert 1040.0 + 60.0 <= detached <= 1040.0 + 60.0 + 10.0 + 10.0  # cooldown, then a loop tick and the detach


def test_a_pool_without_memory_falls_back_to_a_node():
    result = simulate(tiny([memory_job("a", 0, 48, duration=1000.0), memory_job("b", 1, 32)],
                           memory_cluster(chunks=0)), POLICIES["best-fit"])
    assert starts(result) == {"a": 0.0, "b": 310.0}
    assert result.counters.nodes_added == 1


def test_policies_that_attach_nothing_attach_no_memory_either():
    result = simulate(tiny([memory_job("a", 0, 48, duration=1000.0), memory_job("b", 1, 32)]), POLICIES["node-only"])
    assert result.counters.cxl_chunks_attached == 0
    assert starts(result)["b"] == 310.0  # cluster-autoscaler alone: a new server


def test_gpu_only_twin_keeps_the_jobs_and_takes_the_memory_away():
    scenario = tiny([memory_job("a", 0, 48)])
    twin = gpu_only(scenario)
    assert twin.name == "tiny" + GPU_ONLY_SUFFIX and twin.jobs == scenario.jobs
    assert twin.cluster.pools[0].devices == {"A30": 2}
    assert (twin.cluster.groups[0].max_cxl_memory, twin.cluster.groups[0].cxl_memory_chunk) == (0, 0)
    assert scenario.cluster.takes_cxl_memory() and not twin.cluster.takes_cxl_memory()
    assert scenario.cluster.total_gpus() == 2  # chunks are devices of the pool, not GPUs


def test_the_ideal_pool_lends_memory_too():
    # One node only: with the pool's memory b starts at once; GPU-only it waits for a to end.
    scenario = tiny([memory_job("a", 0, 48), memory_job("b", 1, 32)], memory_cluster(max_nodes=1))
    assert starts(ideal(scenario)) == {"a": 0.0, "b": 1.0}
    assert starts(ideal(gpu_only(scenario))) == {"a": 0.0, "b": 100.0}
    # The pool's memory is finite: four chunks (64 GiB) and a third job short by more than what is left waits.
    crowded = tiny([memory_job("a", 0, 64), memory_job("b", 0, 48), memory_job("c", 0, 32)],
                   memory_cluster(max_nodes=1, chunks=4))
    assert starts(ideal(crowded)) == {"a": 0.0, "b": 0.0, "c": 100.0}


def test_node_hours_and_peak_nodes_come_from_the_timeline():
    summary = summarize(simulate(gpu_only(tiny([memory_job("a", 0, 48, duration=3600.0),
                                                memory_job("b", 1, 32, duration=3600.0)])), POLICIES["best-fit"]))
    # The first node from 0 to the last finish (b's, at 310 + 3,600 s), a second from 310 s: 3,910 + 3,600 seconds.
    assert summary.nodes_peak == 2
    assert abs(summary.node_hours - (3910.0 + 3600.0) / 3600.0) < 1e-9


def test_the_memory_table_sets_each_policy_beside_its_gpu_only_run():
    scenario = tiny([memory_job("a", 0, 48, duration=1000.0), memory_job("b", 1, 32)])
    memory = simulate(scenario, POLICIES["best-fit"])
    twin = simulate(gpu_only(scenario), POLICIES["best-fit"])
    renamed = replace(twin, policy="best-fit" + GPU_ONLY_SUFFIX)
    (effect,) = memory_effects(compare([memory, renamed]), GPU_ONLY_SUFFIX)
    assert effect.policy == "best-fit"
    assert effect.ratio("wait_mean_s") == (39.0 / 2) / (309.0 / 2)
    assert effect.ratio("nodes_added") == 0.0
    lines = render_memory_table([effect]).splitlines()
    assert lines[2].split()[:3] == ["best-fit", "CXL", "memory"]
    assert lines[3].split()[:2] == ["GPU-only", "154s"]  # (0 + 309) / 2
    assert lines[4].split()[:2] == ["memory/GPU-only", "0.13x"]


def test_waits_are_not_compared_when_one_run_left_jobs_unrun():
    memory = summarize(simulate(tiny([memory_job("a", 0, 48)]), POLICIES["best-fit"]))
    unrun = replace(memory, never_started=1)
    assert MemoryEffect("best-fit", memory, unrun).ratio("wait_mean_s") is None


def test_the_cxl_memory_workload_is_memory_bound_and_fits_a_nodes_own_memory():
    scenario = build("cxl-memory", WorkloadParams(seed=1))
    assert scenario.cluster.takes_cxl_memory()
    assert all(j.memory <= CXL_NODE_MEMORY for j in scenario.jobs)  # GPU-only runs every job too
    kinds = {j.name.split("-")[0] for j in scenario.jobs}
    assert kinds == {"train", "infer", "etl"}
    assert build("cxl-memory", WorkloadParams(seed=1)).jobs == scenario.jobs


def test_simulate_compares_memory_with_gpu_only_and_writes_memory_csv(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["simulate", "--workload", "cxl-memory", "--jobs", "30", "--policies", "best-fit,node-only",
                 "--out", str(out), "--progress", "never"]) == 0
    printed = capsys.readouterr().out
    assert "best-fit/gpu-only" in printed and "ideal/gpu-only" in printed
    assert "node-only/gpu-only" not in printed  # it attaches nothing: its GPU-only run would be the same
    assert "CXL memory against GPU-only" in printed and "memory/GPU-only" in printed
    rows = list(csv.DictReader((out / "memory.csv").open()))
    assert [r["policy"] for r in rows] == ["best-fit", "ideal"]
    assert float(rows[0]["cxl_chunks_attached_memory"]) > 0 and rows[0]["cxl_chunks_attached_gpu_only"] == "0"
    assert {"node_hours_ratio", "wait_mean_s_ratio", "wait_p95_s_ratio"} <= set(rows[0])
    assert (out / "nodes_and_memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_shortcuts_change_no_outcome_with_memory():
    # The simulator offers the planner only pods some node has room for, counting the memory attached to it: asking
    # about every pod every time must give the same run.
    scenario = build("cxl-memory", WorkloadParams(seed=2, jobs=40, mean_interval_s=60.0))
    fast = simulate(scenario, POLICIES["best-fit"])
    slow = simulate(scenario, POLICIES["best-fit"], exhaustive=True)
    assert fast.counters.cxl_chunks_attached > 0
    assert fast.jobs == slow.jobs
    assert fast.timeline == slow.timeline
    assert (fast.counters.cxl_chunks_attached, fast.counters.cxl_chunks_detached, fast.counters.nodes_added) == (
        slow.counters.cxl_chunks_attached, slow.counters.cxl_chunks_detached, slow.counters.nodes_added)
