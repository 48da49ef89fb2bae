"""Reservations carried out (dds/controller/reservations.py): the waiting pod tolerates before its node is tainted,
GPUs move towards the node, claims follow the plan, and the taint goes when the pod is bound."""

from __future__ import annotations

from dataclasses import replace

from dds.controller.journal import DecisionJournal
from dds.controller.reservations import Reservations
from dds.kube.errors import ApiError
from dds.model.plan import Case
from dds.planner.reservations import (CLAIM_TAINT_KEY, RESERVATION_TAINT_KEY, ReservationConfig, claim_taint,
                                      plan_reservations, reservation_taint)
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

GROUP = make_group(replicas=2, max_size=2, max_gpus=8)
CONFIG = ReservationConfig(min_age_seconds=600.0)


class Writes:
    def __init__(self, refuse: bool = False) -> None:
        self.done: list[tuple] = []
        self.refuse = refuse

    def tolerate(self, namespace, name, toleration):
        if self.refuse:
            raise ApiError(409, "Conflict")
        self.done.append(("tolerate", f"{namespace}/{name}", toleration.value))

    def taint(self, node, key, value, effect):
        self.done.append(("taint", node, key, value))

    def untaint(self, node, key):
        self.done.append(("untaint", node, key))


class Actions:
    def __init__(self) -> None:
        self.attached: list[tuple[str, int, Case]] = []
        self.detached: list[tuple[str, int, Case]] = []

    def attach_all(self, steps, key_prefix, case):
        self.attached += [(s.node, s.count, case) for s in steps]
        return []

    def detach(self, step, key, case, on_done=None):
        self.detached.append((step.node, len(step.device_ids), case))
        return object()


class Events:
    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def emit(self, ref, kind, reason, message):
        self.told.append((f"{ref.kind.lower()}/{ref.name}", reason))


def keeper(writes=None):
    writes, actions, events = writes or Writes(), Actions(), Events()
    return Reservations(writes, actions, events, DecisionJournal(lambda: 0.0), CONFIG), writes, actions, events


def reconcile(reservations: Reservations, snapshot):
    """What the loop's pass does with its reservations: plan them (dds/planner/passes.py), carry the plan out."""
    return reservations.apply(plan_reservations(snapshot, CONFIG), snapshot)


def test_the_pod_tolerates_before_the_node_is_tainted_and_gpus_are_gathered():
    reservations, writes, actions, events = keeper()
    nodes = [make_node("w1", gpus=2), make_node("w2", gpus=5)]
    pods = [make_pod("busy", gpus=2, node="w2"), make_pod("big", gpus=8, created=0.0)]
    plan = reconcile(reservations, make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=1)]))
    assert writes.done == [("tolerate", "default/big", "uid-big"), ("taint", "w2", RESERVATION_TAINT_KEY, "uid-big")]
    assert actions.attached == [("w2", 1, Case.RESERVATION)]
    assert actions.detached == [("w1", 2, Case.RESERVATION)]
    assert ("pod/big", "GPUsReserved") in events.told and ("node/w2", "ReservedForPod") in events.told
    assert plan.nodes == {"w2"} and [r.pod for r in plan.reservations] == ["default/big"]


def test_a_refused_toleration_taints_nothing_and_moves_no_gpu():
    reservations, writes, actions, events = keeper(Writes(refuse=True))
    pods = [make_pod("big", gpus=8, created=0.0)]
    reconcile(reservations, make_snapshot([make_node("w1", gpus=2)], pods, groups=[GROUP], pools=[make_pool(A30=6)]))
    assert writes.done == [] and events.told == []
    assert actions.attached == [], "GPUs gathered on a node nobody fences would go to the first small pod"


def test_claims_follow_the_plan_and_the_taint_goes_when_the_pod_is_bound():
    reservations, writes, _, events = keeper()
    nodes = [make_node("w1", gpus=4), make_node("w2", gpus=4)]
    pods = [make_pod("a", gpus=3, node="w1"), make_pod("b", gpus=4, node="w2"), make_pod("big", gpus=8)]
    reconcile(reservations, make_snapshot(nodes, pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    assert ("taint", "w2", RESERVATION_TAINT_KEY, "uid-big") in writes.done  # the most in use: it drains last
    assert ("taint", "w1", CLAIM_TAINT_KEY, "uid-big") in writes.done
    assert ("node/w1", "GPUsClaimed") in events.told

    writes.done.clear()
    reserved = replace(make_node("w2", gpus=8), taints=(reservation_taint("uid-big"),))
    claimed = replace(make_node("w1", gpus=0), taints=(claim_taint("uid-big"),))
    bound = [make_pod("big", gpus=8, node="w2")]
    plan = reconcile(reservations, make_snapshot([claimed, reserved], bound, groups=[GROUP], pools=[make_pool(A30=4)]))
    assert set(writes.done) == {("untaint", "w2", RESERVATION_TAINT_KEY), ("untaint", "w1", CLAIM_TAINT_KEY)}
    assert plan.nodes == frozenset()


def test_a_moved_reservation_fences_its_old_node_before_lifting_its_taint():
    """The drained node w1 hands the reservation to w2, whose pods still use the GPUs it lacks: w2 is reserved, w1
    claimed before its reservation taint goes (never open to a small pod while its idle GPUs are still there), and
    its GPUs are detached for w2."""
    reservations, writes, actions, events = keeper()
    reserved = replace(make_node("w1", gpus=5), taints=(reservation_taint("uid-big"),))
    claimed = replace(make_node("w2", gpus=3), taints=(claim_taint("uid-big"),))
    pods = [make_pod("a", gpus=3, node="w2"), make_pod("big", gpus=8, created=0.0)]
    reconcile(reservations, make_snapshot([reserved, claimed], pods, groups=[GROUP], pools=[make_pool(A30=0)]))
    assert writes.done == [("tolerate", "default/big", "uid-big"), ("taint", "w2", RESERVATION_TAINT_KEY, "uid-big"),
                           ("taint", "w1", CLAIM_TAINT_KEY, "uid-big"), ("untaint", "w2", CLAIM_TAINT_KEY),
                           ("untaint", "w1", RESERVATION_TAINT_KEY)]
    assert actions.detached == [("w1", 5, Case.RESERVATION)]
    assert ("node/w1", "ReservationReleased") in events.told and ("node/w2", "ReservedForPod") in events.told
