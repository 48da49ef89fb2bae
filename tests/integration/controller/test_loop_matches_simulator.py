"""The control loop and `dds simulate` make the same choice on the same snapshot: the loop's pass, on a real apiserver
with default settings, is recorded (the snapshot it observed), and the simulator's pass (dds/sim/engine.py, its
defaults: `dds simulate` takes them from the same Settings) is planned on that recording. The cases are choices the
defaults changed (issue 41): a GPU idle on one node, long before its cooldown, while a pod only another node can take
waits and the pool is empty; and a large pod's reservation moving from the node that drained first to the one whose
pods hold the GPUs it lacks."""

from __future__ import annotations

import argparse

import pytest

from dds.commands.simulate import release_idle_from_args, reservations_from_args
from dds.fabric.base import OperationKind
from dds.planner.passes import PassInputs, plan_pass
from dds.planner.reservations import RESERVATION_TAINT_KEY
from dds.sim.engine import Simulation
from dds.sim.policies import POLICIES
from dds.sim.workloads import WorkloadParams, build
from tests.integration.controller.harness import (DEBOUNCE_SECONDS, ControllerHarness, one_gpu_idle_beside_a_busy_one,
                                                   two_nodes_with_busy_gpus)
from tests.integration.nodes.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.pool_size(2)]

SIMULATE_DEFAULTS = argparse.Namespace(reservations=False, no_reservations=False, reserve_after=None,
                                       reserve_early=None, no_release_idle_gpus=False)


def simulator() -> Simulation:
    """`dds simulate --policies best-fit` with no flags: its pass settings are what is compared."""
    return Simulation(build("kubecomp-w1", WorkloadParams(jobs=1)), POLICIES["best-fit"],
                      reservations=reservations_from_args(SIMULATE_DEFAULTS),
                      release_idle=release_idle_from_args(SIMULATE_DEFAULTS))


def test_the_loop_releases_an_idle_gpu_for_a_waiting_pod_as_the_simulator_decides(dds: ControllerHarness):
    first, second = one_gpu_idle_beside_a_busy_one(dds)
    dds.create_pod("waiting", gpus=1, node=second)  # only the second node will do
    dds.wait_unschedulable("waiting")
    dds.clock.advance(DEBOUNCE_SECONDS + 1)

    recorded = dds.controller.run_once()  # the loop's pass, with the settings' defaults (nothing set here)

    loop_detaches = sorted((op.node, op.requested) for op in dds.operations() if op.kind == OperationKind.DETACH)
    assert loop_detaches == [(first, 1)]  # released at once, 600 s before its cooldown
    snapshot = recorded.snapshot
    pending = tuple(p for p in snapshot.pending_pods() if p.key in recorded.unschedulable_since)
    plan = plan_pass(snapshot, PassInputs(pending=pending, waiting=pending), simulator().pass_settings)
    assert sorted((d.node, len(d.device_ids)) for d in plan.moves) == loop_detaches
    assert plan.fast_path is not None and plan.fast_path.attaches == ()  # the pool is empty: nothing else to do
    assert plan.scale_down.detaches == ()  # the idle GPU's cooldown is far off: not released by scale-down


@pytest.mark.pool_size(4)
def test_the_loop_moves_a_reservation_to_the_node_still_draining_as_the_simulator_decides(dds: ControllerHarness):
    """Every GPU is attached and busy when a 4-GPU pod arrives alone: it is reserved at once (the quiet rule). Its
    node drains first, so the loop hands the reservation to the other node, whose pods hold the GPUs it lacks, and
    the simulator's pass on the recorded snapshot makes the same move."""
    w1, w2 = two_nodes_with_busy_gpus(dds, gpu_cooldown="600s")
    dds.create_pod("big", gpus=4)
    dds.wait_unschedulable("big")
    dds.clock.advance(DEBOUNCE_SECONDS + 1)
    dds.run_once()
    assert RESERVATION_TAINT_KEY in dds.taint_keys(w1), "both hold 2 GPUs, 2 in use: the first by name"

    for name in ("a-0", "a-1"):
        dds.core.delete_namespaced_pod(name, dds.namespace, grace_period_seconds=0)
    wait_for(f"{w1} to drain", lambda: not dds.core.list_namespaced_pod(
        dds.namespace, field_selector=f"spec.nodeName={w1}").items)
    observed = []  # the pass's snapshot as observed, before its reservations are carried out (and it observes again)
    dds.controller.listeners.append(observed.append)
    dds.controller.run_once()
    assert RESERVATION_TAINT_KEY in dds.taint_keys(w2) and RESERVATION_TAINT_KEY not in dds.taint_keys(w1)
    recorded = observed[0]

    snapshot = recorded.snapshot
    pending = tuple(p for p in snapshot.pending_pods() if p.key in recorded.unschedulable_since)
    plan = plan_pass(snapshot, PassInputs(pending=pending, waiting=pending), simulator().pass_settings)
    assert [(r.node, r.moved_from) for r in plan.reservations.new] == [(w2, w1)]
    assert [(d.node, len(d.device_ids)) for d in plan.reservations.detaches] == [(w1, 2)]
