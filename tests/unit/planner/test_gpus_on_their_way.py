"""GPUs already attaching (NodeInfo.attaching) are capacity on its way: a pass re-planning the pods they were ordered
for fills them instead of ordering more (a bug the trace simulator found under the spread policy)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dds.planner import plan_scale_up
from dds.model.plan import PlannerConfig, Verdict
from dds.planner.reference import plan_scale_up_reference
from tests.bench.synthetic import Shape, random_snapshot
from tests.unit.planner.builders import make_node, make_pod, make_snapshot

POLICIES = ("best-fit", "least-demand", "concentrated", "spread")


def greedy(policy: str) -> PlannerConfig:
    """The greedy planner alone (the simulator's solver): the batch solver may repair a greedy plan, not replace it."""
    return PlannerConfig(policy=policy, batch_solver="greedy")


def placements(plan) -> dict[str, tuple[Verdict, str | None]]:
    return {d.pod.partition("/")[2]: (d.verdict, d.node) for d in plan.decisions}


@pytest.mark.parametrize("policy", POLICIES)
def test_pods_fill_the_gpus_ordered_for_them_and_nothing_more_is_attached(policy: str) -> None:
    # The simulator's case: a (1 GPU) got 1 GPU ordered on n0, b (2 GPUs) 2 on n1; both still pending. Spread used
    # to put a on n1 (emptier), leave b 1 GPU short on either node, and order one more.
    nodes = [make_node("n0", attaching=1), make_node("n1", attaching=2)]
    pods = [make_pod("a", gpus=1, created=0.0), make_pod("b", gpus=2, created=5.0)]
    plan = plan_scale_up(make_snapshot(nodes, pods), greedy(policy))
    assert plan.attaches == () and plan.new_nodes == ()
    assert placements(plan) == {"a": (Verdict.FITS_NOW, "n0"), "b": (Verdict.FITS_NOW, "n1")}
    assert "once the GPUs already attaching there are online" in plan.decisions[0].reason


@pytest.mark.parametrize("policy", POLICIES)
def test_the_pods_asking_most_go_first_so_small_ones_do_not_split_the_room(policy: str) -> None:
    # 3 GPUs coming to n0 (ordered for a and b), 2 to n1 (for c). Taking pods in scheduling order, the tightest node
    # for a (1 GPU) is n1, after which b and c (2 each) find 1 GPU on either node: largest first fits all three.
    nodes = [make_node("n0", attaching=3), make_node("n1", attaching=2)]
    pods = [make_pod("a", gpus=1, created=0.0), make_pod("b", gpus=2, created=1.0), make_pod("c", gpus=2, created=2.0)]
    plan = plan_scale_up(make_snapshot(nodes, pods), greedy(policy))
    assert plan.attaches == () and plan.new_nodes == ()
    assert all(verdict == Verdict.FITS_NOW for verdict, _ in placements(plan).values())


def test_visible_gpus_are_used_before_gpus_on_their_way() -> None:
    # n0 has a free GPU now; n1 has one coming (ordered for q). p fits now on n0; q takes n1's GPU on its way.
    nodes = [make_node("n0", gpus=1), make_node("n1", attaching=1)]
    pods = [make_pod("p", gpus=1, created=0.0), make_pod("q", gpus=1, created=1.0)]
    plan = plan_scale_up(make_snapshot(nodes, pods), greedy("spread"))
    assert placements(plan) == {"p": (Verdict.FITS_NOW, "n0"), "q": (Verdict.FITS_NOW, "n1")}
    assert plan.decisions[0].reason.startswith("fits now on n0")
    assert plan.attaches == ()


def test_a_pod_beyond_the_gpus_on_their_way_gets_its_own_attach() -> None:
    # 1 GPU coming to n0 and two 1-GPU pods: one takes it, the other needs a GPU attached.
    plan = plan_scale_up(make_snapshot([make_node("n0", attaching=1)],
                                       [make_pod("a", gpus=1, created=0.0), make_pod("b", gpus=1, created=1.0)]),
                         greedy("best-fit"))
    assert placements(plan)["a"] == (Verdict.FITS_NOW, "n0")
    assert placements(plan)["b"] == (Verdict.FITS_AFTER_GPUS, "n0")
    assert [(a.node, a.count, a.pods) for a in plan.attaches] == [("n0", 1, ("default/b",))]


def _with_attaches_in_flight(seed: int, shape: Shape):
    """A synthetic snapshot where some DDS nodes have GPUs on their way (and slots for them), of a model the planner
    can tell: the node's own, or its group's default (the controller labels a node with the model it attaches)."""
    snapshot = random_snapshot(seed, shape)
    rng = random.Random(seed + 1)
    nodes = []
    for node in snapshot.nodes:
        group = snapshot.group(node.group_id) if node.group_id else None
        known_model = bool(node.devices) or bool(group and group.gpu_models)
        room = shape.slots - len(node.devices)
        coming = rng.randint(0, room) if known_model and room > 0 and rng.random() < 0.5 else 0
        nodes.append(dataclasses.replace(node, attaching=coming))
    return dataclasses.replace(snapshot, nodes=tuple(nodes))


SHAPES = st.builds(Shape, nodes=st.integers(1, 12), pending=st.integers(1, 10), slots=st.sampled_from((2, 4, 8)),
                   pools=st.integers(1, 3), pool_free=st.integers(0, 6), busy=st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), shape=SHAPES, policy=st.sampled_from(POLICIES))
def test_fast_planner_agrees_with_the_reference_when_gpus_are_on_their_way(seed: int, shape: Shape,
                                                                         policy: str) -> None:
    snapshot = _with_attaches_in_flight(seed, shape)
    config = PlannerConfig(policy=policy, batch_solver="greedy")
    fast = plan_scale_up(snapshot, config)
    naive = plan_scale_up_reference(snapshot, config)
    assert [(d.pod, d.verdict, d.node, d.group, d.gpus_added) for d in fast.decisions] == \
        [(d.pod, d.verdict, d.node, d.group, d.gpus_added) for d in naive.decisions]
