"""ProvisioningRequests of cluster-autoscaler's best-effort-atomic class (dds/planner/provisioning.py): planned as one
gang when CA's IncreaseSize arrives with no pending pod behind it, held by the loop until their pods bind; CA writes
every condition, DDS none."""

from __future__ import annotations

from dataclasses import replace

from dds.model.groups import Taint
from dds.model.plan import PlannerConfig
from dds.model.provisioning import (ACCEPTED, BOOKED_TAINT_KEY, BOOKING_EXPIRED, CA_ATOMIC_CLASS, DEFAULT_CLASS,
                                    FAILED, PROVISIONED, Condition, PodSet, ProvisioningRequest, ProvisioningView)
from dds.planner.passes import PassInputs, PassSettings, plan_pass, with_attaches
from dds.planner.provisioning import (EVENT_CONSUMED, REASON_EXPIRED, REASON_NOT_FOUND, REASON_PROVISIONED,
                                      REASON_PROVISIONING, REASON_RELEASED, REASON_TOO_LARGE, ProvisioningConfig,
                                      booking_toleration, plan_atomic_scale_up, plan_provisioning)
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

CONFIG = ProvisioningConfig(booking_seconds=300.0)
TRIGGER = "cluster-autoscaler's scale-up of gpu"
# CA's own reason and time when its scale-up call succeeded (besteffortatomic/provisioning_class.go).
CA_PROVISIONED = {ACCEPTED: Condition("True", "Accepted", "", since=900.0),
                  PROVISIONED: Condition("True", "CapacityIsProvisioned", "", since=900.0)}


def request(name: str = "job-a", pods: int = 4, gpus: int = 2, conditions=None, created: float = 900.0,
            class_name: str = CA_ATOMIC_CLASS) -> ProvisioningRequest:
    return ProvisioningRequest("team", name, f"uid-{name}", created, (PodSet(make_pod("template", gpus=gpus), pods),),
                               dict(conditions or {}), class_name=class_name)


def booked(uid: str) -> Taint:
    return Taint(key=BOOKED_TAINT_KEY, value=uid, effect="NoSchedule")


def increase(snapshot, *requests, group: str = "gpu"):
    """What DDS plans inside CA's IncreaseSize of `group`: the planner restricted to that group, as the call is."""
    return plan_atomic_scale_up(snapshot, ProvisioningView(tuple(requests)), CONFIG, PlannerConfig(groups=(group,)),
                                with_attaches, TRIGGER)


def loop_pass(snapshot, *requests):
    return plan_provisioning(snapshot, ProvisioningView(tuple(requests)), CONFIG, PlannerConfig(), with_attaches)


def two_workers(pool: int = 8, max_size: int = 2, gpus: int = 0, taints=()):
    group = make_group(replicas=2, max_size=max_size, max_gpus=4)
    nodes = [make_node("w1", gpus=gpus, taints=taints), make_node("w2", gpus=gpus, taints=taints)]
    return make_snapshot(nodes, groups=[group], pools=[make_pool(A30=pool)], now=1000.0)


def test_a_job_of_4_pods_x_2_gpus_is_served_by_attaches_on_the_live_workers_with_no_node():
    out = increase(two_workers(), request())

    assert sum(a.count for a in out.attaches) == 8 and {a.node for a in out.attaches} == {"w1", "w2"}
    assert out.new_nodes is None
    assert dict(out.book) == {"w1": "uid-job-a", "w2": "uid-job-a"}
    assert out.served == ("team/job-a",)
    (decision,) = out.decisions
    assert decision.conditions == (), "CA writes the conditions of its own class"
    assert decision.event_reason == REASON_PROVISIONING and not decision.warning
    assert decision.event_message.startswith(TRIGGER) and "to w1" in decision.event_message \
        and "to w2" in decision.event_message


def test_what_attaches_cannot_serve_gets_a_node_of_the_group_and_only_that():
    # 3 pods x 4 GPUs: the two workers take one pod each, the third needs a node.
    out = increase(two_workers(pool=12, max_size=3), request(pods=3, gpus=4))

    assert sum(a.count for a in out.attaches) == 8
    assert out.new_nodes is not None and sum(n.count for n in out.new_nodes.new_nodes) == 1
    assert out.served == ("team/job-a",)
    assert "new node(s) of group gpu" in out.decisions[0].event_message


def test_a_gang_the_pool_cannot_serve_whole_gets_nothing_and_says_why():
    out = increase(two_workers(pool=3), request())

    assert out.attaches == () and out.book == () and out.new_nodes is None and out.served == ()
    (decision,) = out.decisions
    assert decision.conditions == () and decision.warning
    assert decision.event_reason in (REASON_NOT_FOUND, REASON_TOO_LARGE)
    assert "nothing attached or added" in decision.event_message


def test_a_failed_gang_releases_what_an_earlier_call_booked_for_it():
    out = increase(two_workers(pool=0, taints=[booked("uid-job-a")]), request(pods=4, gpus=3))

    assert out.served == () and sorted(out.release) == ["w1", "w2"] and out.booked == frozenset()


def test_requests_ca_is_done_with_and_dds_own_class_are_not_planned_in_cas_call():
    out = increase(two_workers(), request("provisioned", conditions=CA_PROVISIONED),
                   request("failed", conditions={FAILED: Condition("True", "", "")}),
                   request("ddss", class_name=DEFAULT_CLASS))

    assert out.attaches == () and out.book == () and out.decisions == () and out.served == ()


def test_two_waiting_requests_are_planned_oldest_first_each_on_what_the_other_leaves():
    out = increase(two_workers(), request("old", pods=1, gpus=4, created=1.0),
                   request("young", pods=1, gpus=4, created=2.0))

    assert sorted(dict(out.book).values()) == ["uid-old", "uid-young"] and len(dict(out.book)) == 2
    assert out.served == ("team/old", "team/young")


def test_cas_next_call_for_a_request_already_booked_and_attached_finds_it_in_place():
    # CA asks again for a request DDS served in an earlier call (CA's condition write failed, or CA chose another
    # request then): its pods fit the GPUs attached for it, nothing more is planned.
    out = increase(two_workers(gpus=4, taints=[booked("uid-job-a")]), request())

    assert out.attaches == () and out.new_nodes is None and out.served == ("team/job-a",)
    (decision,) = out.decisions
    assert decision.event_reason == REASON_PROVISIONED and decision.conditions == ()


def test_the_loop_keeps_a_booking_ca_has_not_said_provisioned_of_yet_and_plans_nothing_for_it():
    waiting = request(conditions={ACCEPTED: Condition("True", "Accepted", "", since=950.0)})
    out = loop_pass(two_workers(gpus=4, taints=[booked("uid-job-a")]), waiting)

    assert out.release == () and out.attaches == () and out.decisions == ()
    assert out.booked == {"w1", "w2"}, "kept from idle scale-down and moves like DDS's own class's booking"


def test_the_loop_never_plans_a_waiting_request_of_cas_class_on_its_own():
    out = loop_pass(two_workers(), request())

    assert out.attaches == () and out.book == () and out.decisions == () and out.new_nodes is None


def test_a_booking_ca_never_said_provisioned_of_is_released_at_the_bound_after_cas_attempt():
    waiting = request(conditions={ACCEPTED: Condition("True", "Accepted", "", since=600.0)}, created=500.0)
    out = loop_pass(two_workers(gpus=4, taints=[booked("uid-job-a")]), waiting)

    assert sorted(out.release) == ["w1", "w2"]
    (decision,) = out.decisions
    assert decision.event_reason == REASON_EXPIRED and decision.warning and decision.conditions == ()


def test_once_ca_says_provisioned_the_jobs_pods_get_the_toleration_and_are_left_to_the_booking():
    snapshot = two_workers(gpus=4, taints=[booked("uid-job-a")])
    pods = [replace(make_pod(f"job-a-{i}", gpus=2, namespace="team"), consumes_provisioning_request="job-a")
            for i in range(4)]
    snapshot = replace(snapshot, pods=tuple(pods))
    out = loop_pass(snapshot, request(conditions=CA_PROVISIONED))

    assert sorted(p for p, _ in out.tolerate) == [f"team/job-a-{i}" for i in range(4)]
    assert out.consumers == {f"team/job-a-{i}" for i in range(4)}
    assert out.release == () and out.decisions == ()
    # The pass: the fast path leaves them to the booking, the booked GPUs are not idle for scale-down.
    passed = plan_pass(snapshot, PassInputs(pending=tuple(pods), waiting=tuple(pods),
                                            provisioning=ProvisioningView((request(conditions=CA_PROVISIONED),))),
                       PassSettings(provisioning=CONFIG))
    assert passed.waiting == () and passed.scale_down.detaches == ()


def test_once_every_pod_bound_the_booking_goes_with_an_event_and_no_condition():
    toleration = booking_toleration("uid-job-a")
    pods = [replace(make_pod(f"job-a-{i}", gpus=2, namespace="team", node="w1" if i < 2 else "w2",
                             tolerations=[toleration]), consumes_provisioning_request="job-a") for i in range(4)]
    snapshot = replace(two_workers(gpus=4, taints=[booked("uid-job-a")]), pods=tuple(pods))
    out = loop_pass(snapshot, request(conditions=CA_PROVISIONED))

    assert sorted(out.release) == ["w1", "w2"] and out.booked == frozenset()
    (decision,) = out.decisions
    assert decision.event_reason == EVENT_CONSUMED and decision.conditions == ()
    # The next pass: nothing booked for it, nothing to say.
    assert loop_pass(replace(two_workers(gpus=4), pods=tuple(pods)), request(conditions=CA_PROVISIONED)).decisions \
        == ()


def test_a_booking_whose_pods_do_not_come_within_the_bound_of_provisioned_is_released():
    old = {PROVISIONED: Condition("True", "CapacityIsProvisioned", "", since=600.0)}
    out = loop_pass(two_workers(gpus=4, taints=[booked("uid-job-a")]), request(conditions=old))

    assert sorted(out.release) == ["w1", "w2"]
    (decision,) = out.decisions
    assert decision.event_reason == REASON_EXPIRED and decision.warning and decision.conditions == ()


def test_cas_booking_expired_or_failed_releases_dds_booking():
    for ended in (BOOKING_EXPIRED, FAILED):
        conditions = {**CA_PROVISIONED, ended: Condition("True", "", "", since=990.0)}
        out = loop_pass(two_workers(gpus=4, taints=[booked("uid-job-a")]), request(conditions=conditions))
        assert sorted(out.release) == ["w1", "w2"]
        assert [d.event_reason for d in out.decisions] == [REASON_RELEASED]
        assert ended in out.decisions[0].event_message


def test_pods_of_a_request_ca_said_provisioned_without_asking_dds_are_the_fast_paths_to_serve():
    # CA placed the request on what it already counted (CapacityIsFound): nothing is booked for it, and its pods are
    # ordinary pending pods to DDS.
    found = {PROVISIONED: Condition("True", "CapacityIsFound", "", since=990.0)}
    pods = tuple(replace(make_pod(f"job-a-{i}", gpus=2, namespace="team"), consumes_provisioning_request="job-a")
                 for i in range(2))
    snapshot = replace(two_workers(), pods=pods)
    passed = plan_pass(snapshot, PassInputs(pending=pods, waiting=pods,
                                            provisioning=ProvisioningView((request(pods=2, conditions=found),))),
                       PassSettings(provisioning=CONFIG))

    assert passed.provisioning.decisions == () and passed.provisioning.tolerate == ()
    assert [p.key for p in passed.waiting] == ["team/job-a-0", "team/job-a-1"]
    assert passed.fast_path is not None and sum(a.count for a in passed.fast_path.attaches) == 4
