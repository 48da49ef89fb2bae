"""ProvisioningRequests of DDS's class planned as one gang (dds/planner/provisioning.py)."""

from __future__ import annotations

from dataclasses import replace

from dds.model.groups import Taint
from dds.model.plan import PlannerConfig
from dds.model.provisioning import (ACCEPTED, BOOKED_TAINT_KEY, BOOKING_EXPIRED, CAPACITY_REVOKED, FAILED, PROVISIONED,
                                    Condition, PodSet, ProvisioningRequest, ProvisioningView)
from dds.planner.passes import PassInputs, PassSettings, plan_pass, with_attaches
from dds.planner.provisioning import (EVENT_REVOKED, REASON_CONSUMED, REASON_EXPIRED, REASON_INVALID, REASON_NOT_FOUND,
                                      REASON_PROVISIONED, REASON_PROVISIONING, REASON_REVOKED, REASON_TOO_LARGE,
                                      ProvisioningConfig, booking_toleration, plan_provisioning, virtual_pods)
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

GROUP = make_group(replicas=2, max_size=2, max_gpus=4)
CONFIG = ProvisioningConfig(booking_seconds=300.0)


def request(name: str = "job-a", pods: int = 2, gpus: int = 2, conditions=None, error=None,
            created: float = 900.0) -> ProvisioningRequest:
    template = make_pod("template", gpus=gpus)
    return ProvisioningRequest("team", name, f"uid-{name}", created, (PodSet(template, pods),),
                               dict(conditions or {}), error)


def booked(uid: str) -> Taint:
    return Taint(key=BOOKED_TAINT_KEY, value=uid, effect="NoSchedule")


def plan(snapshot, *requests, complete: bool = True, config: ProvisioningConfig = CONFIG):
    return plan_provisioning(snapshot, ProvisioningView(tuple(requests), complete), config, PlannerConfig(),
                             with_attaches)


def kinds(decision) -> dict[str, tuple[str, str]]:
    return {c.kind: (c.status, c.reason) for c in decision.conditions}


def test_the_pod_sets_become_one_gang_of_virtual_pods_that_tolerate_their_booking():
    pods = virtual_pods(request(pods=3))
    assert len({p.key for p in pods}) == 3
    assert {p.pod_group for p in pods} == {"provisioningrequest.job-a"}
    assert {p.pod_group_min_member for p in pods} == {3}
    assert all(booking_toleration("uid-job-a") in p.tolerations and p.namespace == "team" for p in pods)


def test_a_request_served_by_attaches_books_the_nodes_and_attaches_without_a_node():
    snapshot = make_snapshot([make_node("w1"), make_node("w2")], groups=[GROUP], pools=[make_pool(A30=6)])
    out = plan(snapshot, request(pods=2, gpus=2))
    assert sum(a.count for a in out.attaches) == 4 and out.new_nodes is None
    assert {node for node, _ in out.book} == {a.node for a in out.attaches}
    (decision,) = out.decisions
    assert kinds(decision) == {ACCEPTED: ("True", "AcceptedByDDS"),
                               PROVISIONED: ("False", REASON_PROVISIONING)}
    assert decision.event_reason == REASON_PROVISIONING


def test_once_the_gpus_are_attached_the_request_is_provisioned_and_says_where():
    nodes = [make_node("w1", gpus=2, taints=[booked("uid-job-a")]), make_node("w2", gpus=2)]
    snapshot = make_snapshot(nodes, groups=[GROUP], pools=[make_pool(A30=0)])
    accepted = {ACCEPTED: Condition("True", "AcceptedByDDS", "")}
    out = plan(snapshot, request(pods=2, gpus=2, conditions=accepted))
    (decision,) = out.decisions
    assert kinds(decision) == {PROVISIONED: ("True", REASON_PROVISIONED)}
    assert "w1" in decision.conditions[0].message and "w2" in decision.conditions[0].message
    assert out.attaches == () and out.booked == {"w1", "w2"}


def test_a_request_the_pool_cannot_serve_fails_and_nothing_is_attached_or_booked():
    snapshot = make_snapshot([make_node("w1", gpus=1)], groups=[make_group(replicas=1, max_size=1, max_gpus=4)],
                             pools=[make_pool(A30=2)])
    out = plan(snapshot, request(pods=2, gpus=4))
    assert out.attaches == () and out.book == () and out.new_nodes is None
    (decision,) = out.decisions
    assert kinds(decision)[FAILED][0] == "True"
    assert kinds(decision)[FAILED][1] in (REASON_NOT_FOUND, REASON_TOO_LARGE)
    assert decision.warning and "nothing attached" in decision.event_message


def test_a_request_the_whole_cluster_is_too_small_for_says_so():
    snapshot = make_snapshot([make_node("w1")], groups=[make_group(replicas=1, max_size=1, max_gpus=4)],
                             pools=[make_pool(A30=2)])
    (decision,) = plan(snapshot, request(pods=4, gpus=2)).decisions
    assert kinds(decision)[FAILED] == ("True", REASON_TOO_LARGE)


def test_a_malformed_request_is_refused_with_its_error_and_the_next_is_still_served():
    snapshot = make_snapshot([make_node("w1")], groups=[GROUP], pools=[make_pool(A30=4)])
    bad = request("bad", error="podTemplate team/missing not found")
    out = plan(snapshot, bad, request("good", pods=1, gpus=2, created=950.0))
    by_name = {d.request.name: d for d in out.decisions}
    assert kinds(by_name["bad"])[FAILED] == ("True", REASON_INVALID)
    assert "missing" in by_name["bad"].event_message
    assert sum(a.count for a in out.attaches) == 2


def test_a_younger_request_is_never_planned_onto_an_older_ones_nodes():
    snapshot = make_snapshot([make_node("w1"), make_node("w2")], groups=[GROUP], pools=[make_pool(A30=8)])
    out = plan(snapshot, request("old", pods=1, gpus=4, created=1.0), request("young", pods=1, gpus=4, created=2.0))
    owners = dict(out.book)
    assert sorted(owners.values()) == ["uid-old", "uid-young"] and len(owners) == 2


def test_provisioned_capacity_waits_for_its_pods_which_get_the_toleration():
    provisioned = {ACCEPTED: Condition("True", "", ""), PROVISIONED: Condition("True", "", "", since=900.0)}
    nodes = [make_node("w1", gpus=4, taints=[booked("uid-job-a")])]
    pod = replace(make_pod("job-a-0", gpus=2, namespace="team"), consumes_provisioning_request="job-a")
    other = make_pod("other", gpus=2)
    snapshot = make_snapshot(nodes, [pod, other], groups=[GROUP], pools=[make_pool(A30=0)])
    out = plan(snapshot, request(conditions=provisioned))
    assert out.tolerate == (("team/job-a-0", "uid-job-a"),)
    assert out.consumers == {"team/job-a-0"} and out.release == () and out.decisions == ()
    # The pass: the booked node is kept from scale-down and the fast path leaves the request's pods alone.
    settings = PassSettings(provisioning=CONFIG)
    inputs = PassInputs(pending=(pod, other), waiting=(pod, other),
                        provisioning=ProvisioningView((request(conditions=provisioned),)))
    passed = plan_pass(snapshot, inputs, settings)
    assert [p.key for p in passed.waiting] == ["default/other"]
    assert passed.provisioning.booked == {"w1"}


def test_once_every_pod_is_bound_the_booking_is_released():
    provisioned = {PROVISIONED: Condition("True", "", "", since=900.0)}
    nodes = [make_node("w1", gpus=4, taints=[booked("uid-job-a")])]
    pods = [replace(make_pod(f"p{i}", gpus=2, namespace="team", node="w1"), consumes_provisioning_request="job-a")
            for i in range(2)]
    out = plan(make_snapshot(nodes, pods, groups=[GROUP]), request(conditions=provisioned))
    assert out.release == ("w1",)
    (decision,) = out.decisions  # Provisioned stays True and says the booking served its pods (no Event)
    assert kinds(decision) == {PROVISIONED: ("True", REASON_CONSUMED)} and not decision.event_reason
    assert "all 2 pod(s)" in decision.conditions[0].message and "w1" in decision.conditions[0].message


def test_pods_that_bound_and_ended_between_two_passes_count_as_bound():
    """A short job's pods may bind, run and end (Succeeded or Failed) before DDS looks again: they are not in the
    snapshot's pods any more, yet the booking has served them and is released, not kept until it expires."""
    provisioned = {PROVISIONED: Condition("True", "", "", since=900.0)}
    nodes = [make_node("w1", gpus=4, taints=[booked("uid-job-a")])]
    ran = replace(make_pod("p0", gpus=2, namespace="team", node="w1"), consumes_provisioning_request="job-a")
    ended = replace(make_pod("p1", gpus=2, namespace="team", node="w1"), consumes_provisioning_request="job-a")
    snapshot = replace(make_snapshot(nodes, [ran], groups=[GROUP]), ended_consumers=(ended,))
    out = plan(snapshot, request(conditions=provisioned))
    assert out.release == ("w1",) and [kinds(d) for d in out.decisions] == [{PROVISIONED: ("True", REASON_CONSUMED)}]
    assert plan(make_snapshot(nodes, [ran], groups=[GROUP]), request(conditions=provisioned)).release == (), \
        "one of two pods bound: still booked"


def test_a_booking_whose_pods_do_not_come_in_time_expires_and_is_released():
    provisioned = {PROVISIONED: Condition("True", "", "", since=600.0)}  # now = 1000, bound 300 s
    nodes = [make_node("w1", gpus=4, taints=[booked("uid-job-a")])]
    out = plan(make_snapshot(nodes, groups=[GROUP]), request(conditions=provisioned))
    assert out.release == ("w1",)
    (decision,) = out.decisions
    assert kinds(decision) == {BOOKING_EXPIRED: ("True", REASON_EXPIRED)}
    assert "w1" in decision.event_message and "300s" in decision.event_message


def test_a_deleted_requests_booking_is_released_only_when_every_request_was_read():
    nodes = [make_node("w1", gpus=4, taints=[booked("uid-gone")])]
    snapshot = make_snapshot(nodes, groups=[GROUP])
    assert plan(snapshot).release == ("w1",)
    assert plan(snapshot, complete=False).release == ()


def test_a_failed_request_keeps_nothing_booked():
    nodes = [make_node("w1", gpus=2, taints=[booked("uid-job-a")])]
    failed = {FAILED: Condition("True", "", "")}
    assert plan(make_snapshot(nodes, groups=[GROUP]), request(conditions=failed)).release == ("w1",)


def test_serving_no_class_plans_nothing():
    nodes = [make_node("w1", taints=[booked("uid-gone")])]
    assert plan(make_snapshot(nodes, groups=[GROUP]), config=ProvisioningConfig(class_name="")).release == ()


def test_nodes_are_added_only_for_what_attaches_on_live_nodes_cannot_serve():
    group = make_group(replicas=1, max_size=3, max_gpus=4)
    snapshot = make_snapshot([make_node("w1")], groups=[group], pools=[make_pool(A30=8)])
    out = plan(snapshot, request(pods=2, gpus=4))
    assert [(a.node, a.count) for a in out.attaches] == [("w1", 4)]
    assert out.new_nodes is not None and sum(n.count for n in out.new_nodes.new_nodes) == 1
    (decision,) = out.decisions
    assert kinds(decision)[PROVISIONED] == ("False", REASON_PROVISIONING)
    assert "new node" in decision.conditions[-1].message


def test_a_request_whose_node_is_on_its_way_is_not_failed_meanwhile():
    group = make_group(replicas=2, max_size=3, max_gpus=4)
    nodes = [make_node("w1", attaching=4, taints=[booked("uid-job-a")])]
    snapshot = make_snapshot(nodes, groups=[group], pools=[make_pool(A30=4)], upcoming={"gpu": 1})
    out = plan(snapshot, request(pods=2, gpus=4, conditions={ACCEPTED: Condition("True", "", "")}))
    (decision,) = out.decisions
    assert kinds(decision) == {PROVISIONED: ("False", REASON_PROVISIONING)}
    assert "already attaching to w1" in decision.conditions[0].message
    assert "group gpu on their way" in decision.conditions[0].message
    assert out.release == () and out.new_nodes is None and out.attaches == ()


def test_gpus_still_attaching_are_not_provisioned_capacity():
    nodes = [make_node("w1", gpus=2, attaching=2, taints=[booked("uid-job-a")])]
    snapshot = make_snapshot(nodes, groups=[GROUP], pools=[make_pool(A30=0)])
    out = plan(snapshot, request(pods=2, gpus=2, conditions={ACCEPTED: Condition("True", "", "")}))
    (decision,) = out.decisions
    assert kinds(decision) == {PROVISIONED: ("False", REASON_PROVISIONING)}
    assert "already attaching to w1" in decision.conditions[0].message


def test_a_node_booked_for_a_placement_the_plan_no_longer_uses_is_released():
    """w2's attach for the request failed and its pool is empty now: the request is served on w1, w2 is let go."""
    nodes = [make_node("w1", gpus=4, taints=[booked("uid-job-a")]), make_node("w2", taints=[booked("uid-job-a")])]
    snapshot = make_snapshot(nodes, groups=[GROUP], pools=[make_pool(A30=0)])
    out = plan(snapshot, request(pods=2, gpus=2, conditions={ACCEPTED: Condition("True", "", "")}))
    assert out.release == ("w2",) and out.booked == {"w1"}
    (decision,) = out.decisions
    assert kinds(decision) == {PROVISIONED: ("True", REASON_PROVISIONED)}


# --- capacity revoked: what DDS said was Provisioned is lost before the request's pods take it ---

PROVISIONED_AT_900 = {ACCEPTED: Condition("True", "", ""),
                      PROVISIONED: Condition("True", REASON_PROVISIONED, "", since=900.0)}


def consumer(name: str, gpus: int = 2, node=None, uid: str = "uid-job-a"):
    pod = replace(make_pod(name, gpus=gpus, namespace="team", node=node), consumes_provisioning_request="job-a")
    return pod if node else replace(pod, tolerations=pod.tolerations + (booking_toleration(uid),))


def revoked(out) -> str:
    (decision,) = out.decisions
    assert kinds(decision) == {CAPACITY_REVOKED: ("True", REASON_REVOKED)}
    assert decision.event_reason == EVENT_REVOKED and decision.warning
    assert decision.event_message == decision.conditions[0].message
    return decision.conditions[0].message


def test_capacity_that_still_holds_the_pods_is_not_revoked():
    nodes = [make_node("w1", gpus=2, taints=[booked("uid-job-a")]),
             make_node("w2", gpus=2, taints=[booked("uid-job-a")])]
    out = plan(make_snapshot(nodes, groups=[GROUP], pools=[make_pool(A30=0)]),
               request(pods=2, gpus=2, conditions=PROVISIONED_AT_900))
    assert out.decisions == () and out.release == () and out.booked == {"w1", "w2"}


def test_a_booked_node_deleted_before_the_pods_came_revokes_the_capacity_and_releases_the_rest():
    """w2 is gone (deleted with its GPUs): the second pod has nowhere to go; w1's booking is let go too."""
    nodes = [make_node("w1", gpus=2, taints=[booked("uid-job-a")]), make_node("w2", gpus=4)]
    out = plan(make_snapshot(nodes, groups=[GROUP], pools=[make_pool(A30=4)]),
               request(pods=2, gpus=2, conditions=PROVISIONED_AT_900))
    message = revoked(out)
    assert out.release == ("w1",) and out.booked == frozenset()
    assert "0 of the request's 2 pod(s) bound" in message and "w1 (Ready, 2 GPU(s) attached)" in message
    assert out.attaches == () and out.new_nodes is None, "a revoked request is not provisioned again"


def test_every_booked_node_deleted_revokes_the_capacity():
    nodes = [make_node("w9", gpus=4)]
    message = revoked(plan(make_snapshot(nodes, groups=[GROUP]),
                           request(pods=1, gpus=2, conditions=PROVISIONED_AT_900)))
    assert "no node booked for it is left" in message


def test_a_booked_node_gone_notready_or_being_removed_no_longer_counts():
    for lost in ({"ready": False}, {"being_deleted": True}):
        node = replace(make_node("w1", gpus=4, taints=[booked("uid-job-a")]), **lost)
        message = revoked(plan(make_snapshot([node], groups=[GROUP]),
                               request(pods=2, gpus=2, conditions=PROVISIONED_AT_900)))
        assert ("NotReady" if "ready" in lost else "being removed") in message


def test_booked_gpus_failed_or_detached_by_someone_else_revoke_the_capacity_of_the_pods_still_to_come():
    """One pod bound on w1 and running; the other pod's 2 GPUs on w2 are down to 1: it no longer fits."""
    nodes = [make_node("w1", gpus=2, taints=[booked("uid-job-a")]),
             make_node("w2", gpus=1, taints=[booked("uid-job-a")])]
    pods = [consumer("job-a-0", node="w1"), consumer("job-a-1")]
    message = revoked(plan(make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=4)]),
                           request(pods=2, gpus=2, conditions=PROVISIONED_AT_900)))
    assert "1 of the request's 2 pod(s) bound" in message and "w2 (Ready, 1 GPU(s) attached)" in message


def test_pods_bound_elsewhere_leave_the_booking_only_the_pods_still_to_come():
    """One pod bound on a node outside the booking: w1's 2 GPUs hold the other one; nothing is revoked."""
    nodes = [make_node("w1", gpus=2, taints=[booked("uid-job-a")]), make_node("w2", gpus=2)]
    pods = [consumer("job-a-0", node="w2")]
    out = plan(make_snapshot(nodes, pods, groups=[GROUP]), request(pods=2, gpus=2, conditions=PROVISIONED_AT_900))
    assert out.decisions == () and out.booked == {"w1"}


def test_a_consumed_booking_is_never_revoked_even_when_its_pods_are_replaced_later():
    """Every pod bound once (Provisioned says CapacityConsumed); a pod deleted and recreated by its Job, its node gone:
    an ordinary pending pod, not capacity lost."""
    consumed = {PROVISIONED: Condition("True", REASON_CONSUMED, "", since=900.0)}
    out = plan(make_snapshot([make_node("w2")], [consumer("job-a-2")], groups=[GROUP]),
               request(pods=2, gpus=2, conditions=consumed))
    assert out.decisions == () and out.tolerate == () and out.consumers == frozenset()


def test_a_revoked_request_keeps_nothing_booked():
    nodes = [make_node("w1", gpus=2, taints=[booked("uid-job-a")])]
    gone = {**PROVISIONED_AT_900, CAPACITY_REVOKED: Condition("True", REASON_REVOKED, "")}
    out = plan(make_snapshot(nodes, groups=[GROUP]), request(conditions=gone))
    assert out.release == ("w1",) and out.decisions == ()
