"""All or nothing after a plan is cut to what the pool can equip (dds/planner/gangs.py: whole_gangs_after_cut).

The planner serves a gang whole or not at all, but the edge then drops the new nodes the pool cannot equip
(dds/planner/equip.py). A gang that lost members' capacity in that cut must lose all of it: no attach, no node.
The property tests draw random pools and gangs and check the rule over the plan that is left.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

from dds.planner import plan_scale_up
from dds.planner.equip import equip_new_nodes
from dds.planner.gangs import GANG_INCOMPLETE, GANG_LARGER_THAN_CLUSTER, find_gangs, placed_pods, whole_gangs_after_cut
from dds.planner.equip import equip_every_group
from dds.model.plan import PlannerConfig, ScaleUpPlan, Verdict
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

CONFIG = PlannerConfig(policy="best-fit", batch_solver="greedy", groups=("gpu",))


def member(name: str, group: str, minimum: int, gpus: int, created: float):
    return replace(make_pod(name, gpus=gpus, created=created), pod_group=group, pod_group_min_member=minimum)


def cut_to_what_the_pool_equips(snapshot, group):
    def cut(plan: ScaleUpPlan):
        return equip_new_nodes(snapshot, plan, group, CONFIG)
    return cut


def after_cut(snapshot, pods):
    group = snapshot.groups[0]
    plan = plan_scale_up(snapshot, CONFIG, pods)
    return plan, whole_gangs_after_cut(plan, cut_to_what_the_pool_equips(snapshot, group),
                                       lambda chosen: plan_scale_up(snapshot, CONFIG, chosen), snapshot, pods,
                                       describe=lambda u: u.message)


def test_a_gang_whose_new_nodes_the_pool_cannot_all_equip_gets_no_node_and_no_attach():
    # One full worker; the gang's two 4-GPU members need two new nodes (1 boot GPU + 3 attached each: 8 from the
    # pool), the pool has 5: before this check one node was added for half of the gang.
    group = make_group(replicas=1, max_size=4, initial_gpus=1)
    busy = make_node("w1", gpus=4)
    pods = [make_pod("busy", gpus=4, node="w1")] + [member(f"ddp-{i}", "ddp", 2, 4, float(i)) for i in range(2)]
    snapshot = make_snapshot([busy], pods, groups=[group], pools=[make_pool(A30=5)])
    plan, after = after_cut(snapshot, snapshot.pending_pods())
    assert plan.nodes == 2  # the planner, which does not count the pool for new nodes, served the gang whole
    assert after.plan.is_empty
    assert after.taken is None  # the plan left after dropping the gang needs no cut
    assert list(after.dropped) == ["default/ddp"]
    decisions = {d.pod: d for d in after.plan.decisions}
    assert {d.refusal for d in decisions.values()} == {GANG_INCOMPLETE}
    reason = decisions["default/ddp-0"].reason
    assert "gang default/ddp needs 2 pod(s) at once, but none of the 2 still needed would get capacity" in reason
    assert "pool pool-a has 5 free A30" in reason and "nothing is attached or added for it" in reason


def test_the_pods_besides_the_dropped_gang_keep_their_capacity():
    group = make_group(replicas=1, max_size=4, initial_gpus=1)
    worker = make_node("w1", gpus=1)
    pods = [make_pod("busy", gpus=1, node="w1"), make_pod("single", gpus=1, created=9.0)]
    pods += [member(f"ddp-{i}", "ddp", 2, 4, float(i)) for i in range(2)]
    snapshot = make_snapshot([worker], pods, groups=[group], pools=[make_pool(A30=5)])
    _, after = after_cut(snapshot, snapshot.pending_pods())
    assert list(after.dropped) == ["default/ddp"]
    assert placed_pods(after.plan) == {"default/single"}
    assert after.plan.gpus == 1 and after.plan.nodes == 0


def test_without_a_cut_or_without_gangs_the_plan_is_the_cut_plan():
    group = make_group(replicas=1, max_size=4, initial_gpus=1)
    pods = [member(f"ddp-{i}", "ddp", 2, 2, float(i)) for i in range(2)]
    snapshot = make_snapshot([make_node("w1")], pods, groups=[group], pools=[make_pool(A30=8)])
    plan, after = after_cut(snapshot, pods)
    assert after.plan == plan and not after.dropped and after.taken is None


# --- properties -------------------------------------------------------------------------------------------------

@st.composite
def clusters(draw):
    """A group of up to 3 live workers (4 slots, up to 2 boot GPUs), a pool of 0–12 free A30s, up to 3 gangs of 1–4
    members (1–4 GPUs each, minimum 1..members) and up to 3 single pods."""
    initial = draw(st.integers(0, 2))
    workers = draw(st.integers(0, 3))
    group = make_group(replicas=workers, max_size=workers + draw(st.integers(0, 4)), initial_gpus=initial)
    nodes = [make_node(f"w{i}", gpus=draw(st.integers(0, 4))) for i in range(workers)]
    pods = []
    for i, node in enumerate(nodes):  # each worker's GPUs are busy or free
        busy = draw(st.integers(0, len(node.devices)))
        if busy:
            pods.append(make_pod(f"busy-{i}", gpus=busy, node=node.name))
    created = 0.0
    for g in range(draw(st.integers(1, 3))):
        members = draw(st.integers(1, 4))
        minimum = draw(st.integers(1, members))
        gpus = draw(st.integers(1, 4))
        for m in range(members):
            created += 1.0
            pods.append(member(f"g{g}-{m}", f"g{g}", minimum, gpus, created))
    for s in range(draw(st.integers(0, 3))):
        created += 1.0
        pods.append(make_pod(f"single-{s}", gpus=draw(st.integers(0, 3)), created=created))
    return make_snapshot(nodes, pods, groups=[group], pools=[make_pool(A30=draw(st.integers(0, 12)))])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_every_gang_gets_its_whole_minimum_or_nothing_after_the_cut(snapshot):
    pending = snapshot.pending_pods()
    _, after = after_cut(snapshot, pending)
    plan = after.plan
    placed = placed_pods(plan)
    for key, gang in find_gangs(snapshot, pending).items():
        got = [p for p in gang.pending if p in placed]
        assert not got or len(got) >= gang.needed, f"{key}: {len(got)} of {gang.needed} got capacity"
        if not got:
            capacity_for_it = [a for a in plan.attaches if set(a.pods) & set(gang.pending)]
            capacity_for_it += [n for n in plan.new_nodes if set(n.pods) & set(gang.pending)]
            assert capacity_for_it == [], f"{key} got nothing but the plan still adds {capacity_for_it}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_a_gang_that_gets_capacity_keeps_its_whole_minimum_out_of_the_cuts_reach(snapshot):
    pending = snapshot.pending_pods()
    _, after = after_cut(snapshot, pending)
    placed = placed_pods(after.plan)
    taken = set(after.taken.pods) if after.taken is not None else set()
    for key, gang in find_gangs(snapshot, pending).items():
        if any(p in placed for p in gang.pending):
            sure = [p for p in gang.pending if p in placed and p not in taken]
            assert len(sure) >= gang.needed, f"{key} is served though the cut may have taken its minimum's nodes"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_every_member_of_a_gang_left_out_is_told_why(snapshot):
    pending = snapshot.pending_pods()
    _, after = after_cut(snapshot, pending)
    decisions = {d.pod: d for d in after.plan.decisions}
    gangs = find_gangs(snapshot, pending)
    for key in after.dropped:
        for pod in gangs[key].pending:
            assert decisions[pod].verdict == Verdict.UNSCHEDULABLE
            assert decisions[pod].refusal in (GANG_INCOMPLETE, GANG_LARGER_THAN_CLUSTER)
            assert key in decisions[pod].reason


def test_a_plan_of_new_nodes_only_drops_a_gang_whose_nodes_the_pool_cannot_all_equip():
    # The loop's nodes for pods with ResourceClaims: new nodes only, each group cut to what its pool equips.
    group = make_group(replicas=1, max_size=4, initial_gpus=1)
    pods = [member(f"ddp-{i}", "ddp", 2, 4, float(i)) for i in range(2)]
    busy = [make_pod("busy", gpus=4, node="w1")]
    snapshot = make_snapshot([make_node("w1", gpus=4)], busy + pods, groups=[group], pools=[make_pool(A30=5)])
    plan = plan_scale_up(snapshot, CONFIG, pods)
    assert plan.nodes == 2
    after = whole_gangs_after_cut(plan, lambda p: equip_every_group(snapshot, p),
                                  lambda chosen: plan_scale_up(snapshot, CONFIG, chosen), snapshot, pods)
    assert list(after.dropped) == ["default/ddp"]
    assert after.plan.is_empty
    assert {d.refusal for d in after.plan.decisions} == {GANG_INCOMPLETE}
