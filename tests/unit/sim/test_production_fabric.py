"""The simulator drives the production simulated fabric (dds.fabric.simulated) on its virtual clock, through the
controller's apply path (dds/controller/apply.py): what the run reports is what that fabric did, and its books balance
at the end."""

from __future__ import annotations

import pytest

from dds import metrics
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


def _count(counter, *labels: str) -> float:
    return counter.labels(*labels)._value.get()


def test_plans_are_carried_out_through_the_controllers_apply_path() -> None:
    # The executor and the operation watcher count what they start and see end; the simulation's own tally agrees.
    before = (_count(metrics.GPUS_ATTACHED, "pool-0", "A30"), _count(metrics.GPUS_DETACHED, "pool-0", "A30"))
    result = Simulation(scenario(cluster((0,), 2), [job("a", 0)]), POLICIES["best-fit"]).run()
    after = (_count(metrics.GPUS_ATTACHED, "pool-0", "A30"), _count(metrics.GPUS_DETACHED, "pool-0", "A30"))
    assert (after[0] - before[0], after[1] - before[1]) == (result.counters.gpus_attached,
                                                           result.counters.gpus_detached) == (1, 1)


def test_nodes_are_added_and_removed_through_the_executor() -> None:
    # node-only: the job needs a server with GPUs, which comes after the provisioning time and goes once idle.
    spec = scenario(cluster((0,), 2, max_nodes=2, node_idle_cooldown=60.0), [job("a", 0)], provision=300.0)
    group = spec.cluster.groups[0].id
    before = (_count(metrics.NODES_ADDED, group), _count(metrics.NODES_REMOVED, group))
    result = Simulation(spec, POLICIES["node-only"]).run()
    after = (_count(metrics.NODES_ADDED, group), _count(metrics.NODES_REMOVED, group))
    assert (result.counters.nodes_added, result.counters.nodes_removed) == (1, 1) and result.jobs[0].start_s == 300.0
    assert (after[0] - before[0], after[1] - before[1]) == (result.counters.nodes_added, result.counters.nodes_removed)
