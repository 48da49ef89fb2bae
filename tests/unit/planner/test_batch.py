"""The batch solver (MILP): used only when at least as good as greedy, and says so."""

from __future__ import annotations

import pytest

from dds.planner import plan_scale_up
from dds.planner.batch import at_least_as_good, fragmentation
from dds.model.plan import PlannerConfig, Verdict
from tests.unit.planner.builders import make_node, make_pod, make_snapshot, same_host


def _order_trap():
    """Greedy (spread) puts the small pod on the GPU node, so the GPU pod then needs a new node; placed together,
    the small pod goes to the non-DDS node and nothing is added."""
    nodes = [make_node("gpu-node", gpus=1, cores=8), make_node("plain", group=None, cores=8)]
    pods = [make_pod("filler", cores=3, node="plain"), make_pod("small", cores=4, created=1),
            make_pod("trainer", cores=6, gpus=1, created=2)]
    return make_snapshot(nodes, pods)


def test_milp_beats_greedy_when_order_hurts() -> None:
    greedy = plan_scale_up(_order_trap(), PlannerConfig(policy="spread", batch_solver="greedy"))
    assert (greedy.solver, greedy.nodes) == ("greedy", 1)
    batch = plan_scale_up(_order_trap(), PlannerConfig(policy="spread", batch_solver="milp"))
    assert (batch.solver, batch.nodes, batch.gpus) == ("milp", 0, 0)
    verdicts = {d.pod: (d.verdict, d.node) for d in batch.decisions}
    assert verdicts == {"default/small": (Verdict.FITS_NOW, "plain"), "default/trainer": (Verdict.FITS_NOW, "gpu-node")}
    assert any("batch plan (MILP)" in n for n in batch.notes)


def test_auto_uses_the_batch_solver_for_small_batches() -> None:
    plan = plan_scale_up(_order_trap(), PlannerConfig(policy="spread", batch_solver="auto"))
    assert plan.solver == "milp"


def test_milp_result_is_deterministic() -> None:
    config = PlannerConfig(policy="spread", batch_solver="milp")
    assert plan_scale_up(_order_trap(), config) == plan_scale_up(_order_trap(), config)


def test_greedy_kept_when_the_batch_cannot_do_better() -> None:
    nodes = [make_node("w1", gpus=1)]
    plan = plan_scale_up(make_snapshot(nodes, [make_pod("b", gpus=1, node="w1"), make_pod("p", gpus=1)]),
                         PlannerConfig(batch_solver="milp"))
    assert plan.solver == "greedy" and plan.gpus == 1


def test_pods_with_placement_rules_are_planned_greedily() -> None:
    pods = [make_pod("p", gpus=1, anti_affinity=[same_host(app="p")]), make_pod("q", gpus=1, created=1)]
    plan = plan_scale_up(make_snapshot([make_node("w1", gpus=1)], pods), PlannerConfig(batch_solver="milp"))
    assert plan.solver == "greedy"
    assert any("planned greedily" in n for n in plan.notes)


def test_unknown_solver_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="PlannerConfig.batch_solver 'cplex'"):
        plan_scale_up(_order_trap(), PlannerConfig(batch_solver="cplex"))


def test_acceptance_rule() -> None:
    greedy = plan_scale_up(_order_trap(), PlannerConfig(policy="spread", batch_solver="greedy"))
    batch = plan_scale_up(_order_trap(), PlannerConfig(policy="spread", batch_solver="milp"))
    assert at_least_as_good(batch, greedy) and not at_least_as_good(greedy, batch)
    assert not at_least_as_good(greedy, greedy)  # equal is not better: greedy stays
    assert fragmentation(batch) == 0
