"""Kueue jobs in `dds simulate` (dds/sim/kueue.py): admitted through ProvisioningRequests, served by DDS's class under
the attach-first policies and by cluster-autoscaler's best-effort-atomic class under node-only. Behaviour, not timings:
the latencies are the scenario's, the figures are docs/kueue.md's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.model.provisioning import FAILED, PROVISIONED
from dds.sim.engine import Simulation
from dds.sim.kueue import KueueQueue
from dds.sim.policies import POLICIES
from dds.sim.results import admission, render_admission_table
from dds.sim.trace import Job
from dds.sim.workloads import GiB, WorkloadParams, build

from tests.unit.sim.builders import cluster, scenario
from tests.unit.sim.test_results_and_command import run_cli


def gang(name: str, at: float, pods: int, gpus: int, duration: float = 600.0) -> list[Job]:
    return [Job(name=f"{name}-{i}", arrival_s=at, duration_s=duration, milli_cpu=1000, memory=GiB, gpus=gpus,
                gpu_model="A30", group=name) for i in range(pods)]


def kueue_scenario(jobs: list[Job], *, layout=(2, 2), pool: int = 16, max_nodes: int = 4, quota: int = 32):
    return replace(scenario(cluster(layout, pool, max_nodes=max_nodes), jobs), kueue=KueueQueue(gpu_quota=quota))


def run(spec, policy: str) -> tuple[Simulation, object]:
    simulation = Simulation(spec, POLICIES[policy])
    return simulation, simulation.run()


@pytest.mark.parametrize("policy", ["best-fit", "node-only"])
def test_a_jobs_pods_exist_only_once_admitted_and_start_together(policy):
    spec = kueue_scenario(gang("train", 0.0, pods=4, gpus=2) + gang("later", 50.0, pods=2, gpus=2))
    _, result = run(spec, policy)
    for workload in result.workloads:
        starts = {j.start_s for j in result.jobs if j.name.startswith(workload.name + "-")}
        assert workload.admitted_s is not None and workload.running_s is not None
        assert len(starts) == 1, f"{workload.name}'s pods started apart: {starts}"
        assert starts.pop() >= workload.admitted_s  # no pod before Provisioned=True
        assert workload.attempts == 1


def test_dds_serves_the_request_by_attaches_where_node_only_adds_a_whole_server():
    spec = kueue_scenario(gang("train", 0.0, pods=4, gpus=2))
    simulation, dds = run(spec, "best-fit")
    _, nodes_only = run(spec, "node-only")
    assert dds.counters.nodes_added == 0 and dds.counters.gpus_attached >= 4
    assert {j.node for j in dds.jobs} <= {"workers-0", "workers-1"}
    request = simulation._kueue.workloads["train"].request
    # Provisioned by attaches, then consumed: every pod bound on the capacity booked for it.
    assert (request.conditions[PROVISIONED].status, request.conditions[PROVISIONED].reason) == ("True", "CapacityConsumed")
    # CA: two pods fit the two servers' own 2 GPUs; the other two get one new 8-GPU server, where the pods start.
    assert nodes_only.counters.nodes_added == 1 and nodes_only.counters.gpus_attached == 0
    assert "workers-2" in {j.node for j in nodes_only.jobs}


def test_a_request_the_pool_cannot_serve_is_retried_by_kueue_then_the_job_never_runs():
    spec = kueue_scenario(gang("huge", 0.0, pods=3, gpus=8), max_nodes=2, quota=64)
    simulation, result = run(spec, "best-fit")
    workload = simulation._kueue.workloads["huge"]
    assert workload.request.conditions[FAILED].status == "True"
    assert workload.attempts == 4 and workload.deactivated  # the first request and Kueue's three retries
    assert result.workloads[0].admitted_s is None and result.counters.gpus_attached == 0
    assert all(j.start_s is None for j in result.jobs)
    # CA's class never fails it: Provisioned=False, tried again with its backoff, never admitted.
    ca, ca_result = run(spec, "node-only")
    assert ca._kueue.workloads["huge"].request.conditions[PROVISIONED].status == "False"
    assert ca_result.workloads[0].admitted_s is None and ca_result.counters.nodes_added == 0


def test_the_quota_holds_a_job_back_until_an_earlier_one_ends():
    spec = kueue_scenario(gang("first", 0.0, pods=2, gpus=2, duration=300.0) + gang("second", 10.0, pods=2, gpus=2),
                          quota=4)
    simulation, result = run(spec, "best-fit")
    first_end = max(j.finish_s for j in result.jobs if j.name.startswith("first-"))
    assert simulation._kueue.workloads["second"].request.created_at == first_end
    assert all(w.running_s is not None for w in result.workloads)


def test_static_policies_are_refused_for_kueue_jobs():
    with pytest.raises(ValueError, match="ProvisioningRequests"):
        Simulation(kueue_scenario(gang("train", 0.0, pods=1, gpus=1)), POLICIES["static"])


def test_the_kueue_workload_reports_both_policies_and_their_ratio():
    spec = build("kueue", WorkloadParams(seed=1, jobs=12))
    results = [Simulation(spec, POLICIES[p]).run() for p in ("node-only", "best-fit")]
    rows = [admission(r) for r in results]
    assert all(r is not None and r.jobs == len({j.group for j in spec.jobs}) for r in rows)
    table = render_admission_table(results)
    assert "p50/node-only" in table and "best-fit" in table
    assert table.splitlines()[2].split()[-2:] == ["1.00", "1.00"]  # node-only against itself


def test_dds_simulate_prints_the_admission_table_and_leaves_out_the_static_policies(capsys):
    assert run_cli("--workload", "kueue", "--jobs", "20", "--policies", "all", "--no-files", "--progress", "never") == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("Kueue admission"):]
    for policy in ("node-only", "best-fit", "spread"):
        assert f"\n{policy} " in table
    rows = [line.split()[0] for line in printed.splitlines() if line.strip()]
    assert "static" not in rows and "static-concentrated" not in rows
    assert "ideal" not in rows  # the ideal pool has no queue: no bound for Kueue's jobs
