"""The simulator drives the production simulated fabric (dds.fabric.simulated) on its virtual clock: what the run
reports is what that fabric did, and its books balance at the end."""

from __future__ import annotations

import pytest

from dds.fabric.base import OperationKind, OperationState
from dds.sim.engine import Simulation
from dds.sim.policies import POLICIES
from dds.sim.workloads import WorkloadParams, build

from tests.unit.sim.builders import cluster, job, scenario


@pytest.mark.parametrize("policy", ["best-fit", "spread"])
def test_a_run_leaves_the_fabric_consistent_with_what_the_run_reports(policy: str) -> None:
    simulation = Simulation(build("kubecomp-realloc-30", WorkloadParams(seed=2, jobs=25)), POLICIES[policy])
    result = simulation.run()
    fabric = simulation.fabric
    fabric.check_invariants()
    assert fabric.name == "sim"
    held = len(fabric.devices())
    assert result.timeline[-1].gpus_present == held  # no fixed GPUs under attach-first: all of them are devices
    free = sum(sum(p.free.values()) for p in fabric.pools())
    assert held + free == result.total_pool_gpus
    assert result.counters.gpus_attached > 0 and result.counters.attach_failures == 0


def test_attach_and_detach_take_the_scenarios_latencies_on_the_virtual_clock() -> None:
    # a (1 GPU) arrives at 0 on a GPU-less node: attached at the t=0 step, online at 30 (attach 30 s); it runs 100 s,
    # its GPU idles from 130, is detached at 190 (cooldown 60 s) and back in the pool at 200 (detach 10 s).
    simulation = Simulation(scenario(cluster((0,), 2), [job("a", 0)]), POLICIES["best-fit"])
    result = simulation.run()
    operations = sorted(simulation.fabric.operations(), key=lambda op: op.started_at)
    assert [(op.kind, op.state, op.started_at, op.finished_at) for op in operations] == [
        (OperationKind.ATTACH, OperationState.SUCCEEDED, 0.0, 30.0),
        (OperationKind.DETACH, OperationState.SUCCEEDED, 190.0, 200.0)]
    assert result.jobs[0].start_s == 30.0 and result.end_s == 200.0
