"""Scale-up (cases 1 and 2) on hand-built clusters whose answer can be worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.model.groups import Taint
from dds.planner import plan_scale_up, render_scale_up
from dds.model.plan import PlannerConfig, ScaleUpPlan, Verdict
from dds.model.snapshot import Toleration
from tests.unit.planner.builders import (demo_snapshot, make_group, make_node, make_pod, make_pool, make_snapshot,
                                         same_host)

GREEDY = PlannerConfig(batch_solver="greedy")


def decision(plan: ScaleUpPlan, pod: str):
    return next(d for d in plan.decisions if d.pod == f"default/{pod}")


def busy(node: str, gpus: int, name: str = "") -> object:
    return make_pod(name or f"busy-{node}", gpus=gpus, node=node)


def test_demo_attaches_one_gpu_instead_of_a_node() -> None:
    plan = plan_scale_up(demo_snapshot(), GREEDY)
    train = decision(plan, "train")
    assert (train.verdict, train.node, train.gpus_added) == (Verdict.FITS_AFTER_GPUS, "worker-1", 1)
    assert train.reason.startswith("fits on worker-1 after 1 A30 GPU (best-fit ")
    assert [(a.node, a.pool, a.model, a.count, a.pods) for a in plan.attaches] == [
        ("worker-1", "pool-a", "A30", 1, ("default/train",))]
    assert plan.new_nodes == ()
    assert [r.target for r in train.rejected] == ["worker-2"]  # the runner-up, with why it lost


def test_fits_now_when_a_gpu_is_free() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=2), make_node("w2", gpus=1)],
                             [busy("w1", 1), busy("w2", 1), make_pod("p", gpus=1)])
    plan = plan_scale_up(snapshot, GREEDY)
    assert (decision(plan, "p").verdict, decision(plan, "p").node) == (Verdict.FITS_NOW, "w1")
    assert plan.is_empty


def test_gpus_already_attaching_count_as_capacity() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=1, attaching=1)], [busy("w1", 1), make_pod("p", gpus=1)])
    plan = plan_scale_up(snapshot, GREEDY)
    assert decision(plan, "p").verdict == Verdict.FITS_NOW
    assert plan.is_empty


def test_all_nodes_at_max_adds_a_node() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=4), make_node("w2", gpus=4)],
                             [busy("w1", 4), busy("w2", 4), make_pod("p", gpus=1)],
                             groups=[make_group(replicas=2)])
    plan = plan_scale_up(snapshot, GREEDY)
    p = decision(plan, "p")
    assert (p.verdict, p.group, p.gpus_added) == (Verdict.NEEDS_NODE, "gpu", 1)
    assert "gpu-slots-full" in p.reason
    assert [(n.group, n.count, n.gpus_per_node, n.pods) for n in plan.new_nodes] == [
        ("gpu", 1, (1,), ("default/p",))]
    assert plan.attaches == ()


def test_empty_pool_adds_a_node() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=1)], [busy("w1", 1), make_pod("p", gpus=1)],
                             pools=[make_pool(A30=0)])
    plan = plan_scale_up(snapshot, GREEDY)
    assert decision(plan, "p").verdict == Verdict.NEEDS_NODE
    assert "pool-exhausted" in decision(plan, "p").reason
    assert plan.nodes == 1 and plan.gpus == 0
    assert any("more than pool pool-a has free" in note for note in plan.notes)


def test_mixed_plan_attaches_what_the_pool_has_and_adds_nodes_for_the_rest() -> None:
    pods = [busy("w1", 1), make_pod("a", gpus=1, created=1), make_pod("b", gpus=1, created=2),
            make_pod("c", gpus=1, created=3)]
    plan = plan_scale_up(make_snapshot([make_node("w1", gpus=1)], pods, pools=[make_pool(A30=1)]), GREEDY)
    assert [decision(plan, p).verdict for p in "abc"] == [Verdict.FITS_AFTER_GPUS, Verdict.NEEDS_NODE,
                                                          Verdict.NEEDS_NODE]
    assert plan.gpus == 1
    # b and c share one new node (it takes up to 4 GPUs), with 2 GPUs attached once it is up.
    assert [(n.count, n.gpus_per_node, n.pods) for n in plan.new_nodes] == [(1, (2,), ("default/b", "default/c"))]


def test_memory_bound_pod_needs_a_node_as_in_the_talks_second_demo() -> None:
    snapshot = make_snapshot([make_node("w1"), make_node("w2")], [make_pod("big", memory_gib=40)],
                             groups=[make_group(memory_gib=64)])
    plan = plan_scale_up(snapshot, GREEDY)
    big = decision(plan, "big")
    assert big.verdict == Verdict.NEEDS_NODE
    assert "2 Insufficient memory" in big.reason
    assert [r.reason for r in big.rejected[:2]] == ["Insufficient memory", "Insufficient memory"]


def test_a_pod_only_gets_the_model_it_selects() -> None:
    group = make_group(models=("A30", "A100"))
    nodes = [make_node("w1", gpus=1, model="A30"), make_node("w0")]  # w0 holds no GPU yet
    snapshot = make_snapshot(nodes, [busy("w1", 1), make_pod("p", gpus=1, model="A100")], groups=[group],
                             pools=[make_pool(A30=4, A100=4)])
    plan = plan_scale_up(snapshot, GREEDY)
    assert (decision(plan, "p").node, plan.attaches[0].model) == ("w0", "A100")


def test_a_model_the_group_cannot_hold_is_unschedulable() -> None:
    snapshot = make_snapshot([make_node("w0")], [make_pod("p", gpus=1, model="H100")], pools=[make_pool(A30=4)])
    plan = plan_scale_up(snapshot, GREEDY)
    assert decision(plan, "p").verdict == Verdict.UNSCHEDULABLE
    assert plan.is_empty


def test_more_gpus_than_any_node_can_hold_is_unschedulable() -> None:
    plan = plan_scale_up(make_snapshot([make_node("w1")], [make_pod("p", gpus=5)]), GREEDY)
    assert decision(plan, "p").verdict == Verdict.UNSCHEDULABLE
    assert "group:gpu: Insufficient nvidia.com/gpu" in decision(plan, "p").reason


def test_unsupported_constraint_is_never_promised_a_fit() -> None:
    pod = make_pod("p", gpus=1, unsupported=["topologySpreadConstraints"])
    snapshot = make_snapshot([make_node("w1", gpus=1)], [pod])
    plan = plan_scale_up(snapshot, GREEDY)
    p = decision(plan, "p")
    assert (p.verdict, p.node) == (Verdict.UNSUPPORTED, None)
    assert "topologySpreadConstraints" in p.reason and plan.is_empty


def test_affinity_on_another_topology_is_unsupported() -> None:
    term = replace(same_host(app="x"), topology_key="topology.kubernetes.io/zone")
    plan = plan_scale_up(make_snapshot([make_node("w1")], [make_pod("p", anti_affinity=[term])]), GREEDY)
    assert decision(plan, "p").verdict == Verdict.UNSUPPORTED


def test_tainted_node_is_skipped_unless_tolerated() -> None:
    taint = Taint(key="dedicated", value="x", effect="NoSchedule")
    nodes = [make_node("tainted", gpus=1, taints=[taint]), make_node("full", gpus=4)]
    pods = [busy("tainted", 1), busy("full", 4), make_pod("p", gpus=1),
            make_pod("q", gpus=1, tolerations=[Toleration(key="dedicated", operator="Exists")], created=1)]
    plan = plan_scale_up(make_snapshot(nodes, pods), GREEDY)
    p = decision(plan, "p")
    assert p.verdict == Verdict.NEEDS_NODE
    assert "1 node(s) had untolerated taint {dedicated: x}" in p.reason
    assert (decision(plan, "q").verdict, decision(plan, "q").node) == (Verdict.FITS_AFTER_GPUS, "tainted")


def test_unschedulable_and_not_ready_nodes_are_not_targets() -> None:
    nodes = [make_node("cordoned", gpus=2, unschedulable=True), make_node("down", gpus=2, ready=False),
             make_node("ok", gpus=1)]
    plan = plan_scale_up(make_snapshot(nodes, [busy("ok", 1), make_pod("p", gpus=1)]), GREEDY)
    assert (decision(plan, "p").verdict, decision(plan, "p").node) == (Verdict.FITS_AFTER_GPUS, "ok")


def test_host_port_conflict_moves_the_pod() -> None:
    nodes = [make_node("a", gpus=1), make_node("b", gpus=1)]
    pods = [make_pod("web", node="a", ports=[80]), make_pod("p", ports=[80])]
    plan = plan_scale_up(make_snapshot(nodes, pods), GREEDY)
    assert decision(plan, "p").node == "b"


def test_anti_affinity_spreads_replicas_over_nodes() -> None:
    nodes = [make_node("a", gpus=1), make_node("b", gpus=1)]
    pods = [make_pod(f"r{i}", gpus=1, labels={"app": "r"}, anti_affinity=[same_host(app="r")], created=i)
            for i in range(3)]
    plan = plan_scale_up(make_snapshot(nodes, pods), GREEDY)
    assert {decision(plan, "r0").node, decision(plan, "r1").node} == {"a", "b"}
    assert decision(plan, "r2").verdict == Verdict.NEEDS_NODE


def test_pod_affinity_follows_its_peer() -> None:
    nodes = [make_node("a", gpus=1), make_node("b", gpus=1)]
    pods = [make_pod("db", node="b", labels={"app": "db"}), make_pod("p", gpus=1, pod_affinity=[same_host(app="db")])]
    plan = plan_scale_up(make_snapshot(nodes, pods), GREEDY)
    assert decision(plan, "p").node == "b"


def test_nodes_outside_dds_never_get_gpus() -> None:
    snapshot = make_snapshot([make_node("plain", group=None)], [make_pod("p", gpus=1)])
    plan = plan_scale_up(snapshot, GREEDY)
    assert decision(plan, "p").verdict == Verdict.NEEDS_NODE and plan.attaches == ()


def test_priority_gets_the_last_device() -> None:
    pods = [busy("w1", 1), make_pod("low", gpus=1, created=0), make_pod("high", gpus=1, priority=100, created=5)]
    plan = plan_scale_up(make_snapshot([make_node("w1", gpus=1)], pods, pools=[make_pool(A30=1)]), GREEDY)
    assert decision(plan, "high").verdict == Verdict.FITS_AFTER_GPUS
    assert decision(plan, "low").verdict == Verdict.NEEDS_NODE
    assert [d.pod for d in plan.decisions] == ["default/high", "default/low"]


def test_pool_free_count_is_shared_by_the_whole_plan() -> None:
    nodes = [make_node("a", gpus=1), make_node("b", gpus=1)]
    pods = [busy("a", 1), busy("b", 1), make_pod("p", gpus=1), make_pod("q", gpus=1, created=1)]
    plan = plan_scale_up(make_snapshot(nodes, pods, pools=[make_pool(A30=1)]), PlannerConfig(allow_new_nodes=False))
    assert plan.gpus == 1
    assert decision(plan, "q").verdict == Verdict.NEEDS_NODE and "not allowed" in decision(plan, "q").reason
    assert plan.new_nodes == ()


def test_pool_slot_limit_caps_attaches_per_node() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=1)], [busy("w1", 1), make_pod("p", gpus=1)],
                             pools=[make_pool(max_slots=1, A30=4)])
    plan = plan_scale_up(snapshot, GREEDY)
    assert decision(plan, "p").verdict == Verdict.NEEDS_NODE


def test_nodes_on_their_way_are_capacity() -> None:
    snapshot = make_snapshot([make_node("w1")], [make_pod("big", memory_gib=40)], groups=[make_group(memory_gib=64)],
                             upcoming={"gpu": 1})
    plan = plan_scale_up(snapshot, GREEDY)
    big = decision(plan, "big")
    assert (big.verdict, big.node, big.group) == (Verdict.FITS_NOW, None, "gpu")
    assert plan.is_empty


def test_group_at_max_size_cannot_add_nodes() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=4)], [busy("w1", 4), make_pod("p", gpus=1)],
                             groups=[make_group(max_size=1, replicas=1)])
    plan = plan_scale_up(snapshot, GREEDY)
    p = decision(plan, "p")
    assert p.verdict == Verdict.UNSCHEDULABLE and "at its max size 1" in p.reason
    assert any(r.target == "group:gpu" and r.reason == "group at max size" for r in p.rejected)


def test_pass_restricted_to_other_groups_attaches_nothing_here() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=1)], [busy("w1", 1), make_pod("p", gpus=1)],
                             groups=[make_group(), make_group("other")])
    plan = plan_scale_up(snapshot, PlannerConfig(groups=("other",), batch_solver="greedy"))
    assert plan.attaches == ()
    assert [(n.group, n.count) for n in plan.new_nodes] == [("other", 1)]


@pytest.mark.parametrize("policy, expected", [
    pytest.param("best-fit", "full", id="best-fit-fills-the-fuller-node"),
    pytest.param("least-demand", "full", id="least-demand-ties-then-fills-slots"),
    pytest.param("concentrated", "full", id="concentrated-packs"),
    pytest.param("spread", "light", id="spread-balances"),
])
def test_policy_chooses_the_node_to_attach_to(policy: str, expected: str) -> None:
    nodes = [make_node("full", gpus=3), make_node("light", gpus=1)]
    pods = [busy("full", 3), busy("light", 1), make_pod("p", gpus=1)]
    plan = plan_scale_up(make_snapshot(nodes, pods), PlannerConfig(policy=policy, batch_solver="greedy"))
    assert decision(plan, "p").node == expected
    assert decision(plan, "p").reason.endswith(f"({policy} {decision(plan, 'p').score:.2f})")


@pytest.mark.parametrize("policy, expected", [
    pytest.param("best-fit", "tight", id="best-fit-least-left"),
    pytest.param("least-demand", "tight", id="least-demand-req-over-avail"),
    pytest.param("concentrated", "roomy", id="concentrated-most-gpus"),
    pytest.param("spread", "roomy", id="spread-least-used"),
])
def test_policy_chooses_among_nodes_that_fit_now(policy: str, expected: str) -> None:
    nodes = [make_node("tight", gpus=2), make_node("roomy", gpus=4)]
    pods = [busy("tight", 1), busy("roomy", 1), make_pod("p", gpus=1)]
    plan = plan_scale_up(make_snapshot(nodes, pods), PlannerConfig(policy=policy, batch_solver="greedy"))
    assert (decision(plan, "p").verdict, decision(plan, "p").node) == (Verdict.FITS_NOW, expected)


def test_same_snapshot_same_plan() -> None:
    snapshot = demo_snapshot()
    assert plan_scale_up(snapshot, PlannerConfig()) == plan_scale_up(snapshot, PlannerConfig())


def test_bound_pods_passed_in_are_not_planned() -> None:
    snapshot = demo_snapshot()
    plan = plan_scale_up(snapshot, GREEDY, [p for p in snapshot.pods if p.node_name])
    assert plan.decisions == () and any("already bound" in n or "is bound" in n for n in plan.notes)


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="PlannerConfig.policy 'fastest'"):
        plan_scale_up(demo_snapshot(), PlannerConfig(policy="fastest"))


def test_render_explains_each_pod() -> None:
    text = render_scale_up(plan_scale_up(demo_snapshot(), GREEDY))
    assert "pod default/train: fits-after-gpus: fits on worker-1 after 1 A30 GPU" in text
    assert "attach 1 A30 GPU from pool pool-a to worker-1" in text
    assert "rejected worker-2: fits after 1 GPU with an equal best-fit score" in text
