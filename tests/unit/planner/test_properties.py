"""Properties on seeded random clusters: the plan never promises what does not exist, the fast planner agrees with the
naive reference, and the batch solver is never worse than greedy."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dds.planner import plan_scale_down, plan_scale_up
from dds.planner.batch import cost
from dds.planner.nodes import gpu_facts
from dds.model.plan import PlannerConfig, Verdict
from dds.planner.reference import plan_scale_up_reference
from tests.bench.synthetic import Shape, random_snapshot

POLICIES = st.sampled_from(("best-fit", "least-demand", "concentrated", "spread"))
SHAPES = st.builds(Shape, nodes=st.integers(1, 14), pending=st.integers(0, 10), slots=st.sampled_from((2, 4, 8)),
                   pools=st.integers(1, 3), pool_free=st.integers(0, 6), busy=st.booleans())
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(seed=st.integers(0, 10_000), shape=SHAPES, policy=POLICIES)
def test_attaches_stay_within_pool_free_counts_and_node_slots(seed: int, shape: Shape, policy: str) -> None:
    snapshot = random_snapshot(seed, shape)
    plan = plan_scale_up(snapshot, PlannerConfig(policy=policy))
    per_pool: Counter[tuple[str, str]] = Counter()
    per_node: Counter[str] = Counter()
    for attach in plan.attaches:
        assert attach.count > 0 and attach.pods and attach.reason
        per_pool[(attach.pool, attach.model)] += attach.count
        per_node[attach.node] += attach.count
    for (pool, model), count in per_pool.items():
        assert count <= snapshot.pool(pool).free.get(model, 0), f"{pool}/{model} over-planned"
    nodes = {n.name: n for n in snapshot.nodes}
    for name, count in per_node.items():
        facts = gpu_facts(nodes[name], snapshot, None)
        assert count <= facts.free_slots, f"{name}: {count} GPUs planned, {facts.free_slots} free slots"
        assert len({a.model for a in plan.attaches if a.node == name}) == 1, "a node holds one model"
    for new in plan.new_nodes:
        group = snapshot.group(new.group)
        assert all(0 <= extra <= group.max_gpus_per_node - group.initial_gpus for extra in new.gpus_per_node)
    assert all(d.reason for d in plan.decisions)


@SETTINGS
@given(seed=st.integers(0, 10_000), shape=SHAPES, policy=POLICIES)
def test_fast_planner_agrees_with_the_naive_reference(seed: int, shape: Shape, policy: str) -> None:
    snapshot = random_snapshot(seed, shape)
    config = PlannerConfig(policy=policy, batch_solver="greedy")
    fast = plan_scale_up(snapshot, config)
    naive = plan_scale_up_reference(snapshot, config)
    assert [(d.pod, d.verdict, d.node, d.group, d.gpus_added) for d in fast.decisions] == \
        [(d.pod, d.verdict, d.node, d.group, d.gpus_added) for d in naive.decisions]
    assert fast.gpus <= naive.gpus


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), shape=SHAPES, policy=POLICIES)
def test_batch_solver_is_never_worse_than_greedy(seed: int, shape: Shape, policy: str) -> None:
    snapshot = random_snapshot(seed, shape)
    greedy = plan_scale_up(snapshot, PlannerConfig(policy=policy, batch_solver="greedy"))
    batch = plan_scale_up(snapshot, PlannerConfig(policy=policy, batch_solver="milp"))
    assert cost(batch) <= cost(greedy) and batch.nodes <= greedy.nodes
    placed = {Verdict.FITS_NOW, Verdict.FITS_AFTER_GPUS, Verdict.NEEDS_NODE}
    assert {d.pod for d in batch.decisions if d.verdict in placed} == \
        {d.pod for d in greedy.decisions if d.verdict in placed}


@SETTINGS
@given(seed=st.integers(0, 10_000), shape=SHAPES, removal=st.booleans())
def test_scale_down_never_detaches_a_device_twice_or_one_in_use(seed: int, shape: Shape, removal: bool) -> None:
    snapshot = random_snapshot(seed, shape)
    candidates = [n.name for n in snapshot.nodes[: max(1, len(snapshot.nodes) // 3)]]
    plan = plan_scale_down(snapshot, PlannerConfig(node_removal_enabled=removal), candidates)
    ids = [i for d in plan.detaches for i in d.device_ids]
    assert len(ids) == len(set(ids))
    nodes = {n.name: n for n in snapshot.nodes}
    for detach in plan.detaches:
        assert detach.reason and set(detach.device_ids) <= {d.id for d in nodes[detach.node].devices}
        group = snapshot.group(nodes[detach.node].group_id)
        assert not detach.force or group.force_detach
    assert all(r.reason for r in plan.removals) and all(k.reason for k in plan.kept)
    if not removal:
        assert plan.removals == ()
