"""The simulator acts through the controller's applier (dds/controller/apply.py): node adds and removals through the
executor's node provisioner (the simulated cloud), reservation and claim taints through `SimulatedNodes`."""

from __future__ import annotations

import pytest

from dds.planner.reservations import CLAIM_TAINT_KEY, RESERVATION_EFFECT, RESERVATION_TAINT_KEY
from dds.sim.engine import SimulatedNodes, Simulation
from dds.sim.policies import POLICIES
from tests.unit.sim.builders import cluster, job, scenario


def _simulation() -> Simulation:
    sim = Simulation(scenario(cluster([2, 2], pool_gpus=8), [job("a", at=0.0)]), POLICIES["best-fit"])
    sim._start_cluster()
    return sim


def test_reservation_and_claim_taints_are_the_nodes_own_fields():
    sim = _simulation()
    nodes = SimulatedNodes(sim)
    first, second = (n.name for n in sim.nodes())
    nodes.taint(first, RESERVATION_TAINT_KEY, "uid-big", RESERVATION_EFFECT)
    nodes.taint(second, CLAIM_TAINT_KEY, "uid-big", RESERVATION_EFFECT)
    assert [(n.reserved_for, n.claimed_by) for n in sim.nodes()] == [("uid-big", None), (None, "uid-big")]
    nodes.untaint(first, RESERVATION_TAINT_KEY)
    nodes.untaint(second, CLAIM_TAINT_KEY)
    assert [(n.reserved_for, n.claimed_by) for n in sim.nodes()] == [(None, None), (None, None)]


def test_what_the_simulated_world_does_not_model_is_refused_not_dropped():
    sim = _simulation()
    nodes = SimulatedNodes(sim)
    name = sim.nodes()[0].name
    with pytest.raises(ValueError, match="models only"):
        nodes.taint(name, "dds.cdi.dev/removing", "true", "NoSchedule")
    with pytest.raises(ValueError, match="does not model node labels"):
        nodes.label(name, {"a": "b"})
    with pytest.raises(ValueError, match="no node gone"):
        nodes.taint("gone", RESERVATION_TAINT_KEY, "t", RESERVATION_EFFECT)
