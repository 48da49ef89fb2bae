"""kube-scheduler's request rule and each scheduling filter, one table per question."""

from __future__ import annotations

from typing import Optional

import pytest

from dds.model.groups import Taint
from dds.model.resources import Resources
from dds.planner import effective_requests
from dds.planner.filters import (gpus_fit, host_ports_free, node_affinity_satisfied, node_not_being_deleted,
                                 node_ready, node_schedulable, node_selector_matches, pod_affinity_satisfied,
                                 pod_anti_affinity_satisfied, resources_fit, taints_tolerated)
from dds.planner.nodes import sim_node
from dds.planner.requests import pod_request
from dds.model.snapshot import NodeSelectorTerm, SelectorRequirement, Toleration
from tests.unit.planner.builders import GiB, GPU, make_node, make_pod, make_snapshot, same_host, term

CPU1 = Resources(milli_cpu=1000, memory=GiB)


@pytest.mark.parametrize("init, overhead, expected_cpu, expected_memory", [
    pytest.param((), Resources(), 1000, GiB, id="app-container-only"),
    pytest.param(((Resources(milli_cpu=3000, memory=GiB), False),), Resources(), 3000, GiB,
                 id="big-init-container-dominates"),
    pytest.param(((Resources(milli_cpu=500, memory=4 * GiB), False),), Resources(), 1000, 4 * GiB,
                 id="max-is-per-resource"),
    pytest.param(((Resources(milli_cpu=200, memory=GiB), True),), Resources(), 1200, 2 * GiB,
                 id="sidecar-adds-to-app"),
    pytest.param(((Resources(milli_cpu=200, memory=0), True), (Resources(milli_cpu=2000, memory=0), False)),
                 Resources(), 2200, GiB, id="init-after-sidecar-runs-beside-it"),
    pytest.param(((Resources(milli_cpu=2000, memory=0), False), (Resources(milli_cpu=200, memory=0), True)),
                 Resources(), 2000, GiB, id="init-before-sidecar-runs-alone"),
    pytest.param((), Resources(milli_cpu=250, memory=GiB // 2), 1250, GiB + GiB // 2, id="overhead-added"),
])
def test_effective_requests(init, overhead, expected_cpu, expected_memory) -> None:
    pod = make_pod("p", cores=1, memory_gib=1, init=init, overhead=overhead)
    requests = effective_requests(pod)
    assert (requests.milli_cpu, requests.memory) == (expected_cpu, expected_memory)


class _NoCluster:
    def __init__(self, match: bool = False) -> None:
        self.match = match

    def any_pod_matches(self, term, namespace) -> bool:
        return self.match


def _judge(check, pod, node, bound=(), cluster=None) -> Optional[str]:
    snapshot = make_snapshot([node], [*bound, pod])
    sim = sim_node(node, snapshot, None)
    for other in bound:
        sim.add_pod(pod_request(other))
    found = check(pod_request(pod), sim, cluster or _NoCluster())
    return None if found is None else found.reason


TAINT = Taint(key="dedicated", value="train", effect="NoSchedule")
NO_EXECUTE = Taint(key="dedicated", value="train", effect="NoExecute")
PREFER = Taint(key="dedicated", value="train", effect="PreferNoSchedule")

CASES = [
    # (id, filter, pod, node, bound pods, expected reason or None)
    ("ready-node", node_ready, make_pod("p"), make_node("n"), (), None),
    ("not-ready-node", node_ready, make_pod("p"), make_node("n", ready=False), (), "node(s) were not ready"),
    ("node-being-deleted", node_not_being_deleted, make_pod("p"), make_node("n", being_deleted=True), (),
     "node(s) were being deleted"),
    ("cordoned", node_schedulable, make_pod("p"), make_node("n", unschedulable=True), (),
     "node(s) were unschedulable"),
    ("cordoned-tolerated", node_schedulable,
     make_pod("p", tolerations=[Toleration(key="node.kubernetes.io/unschedulable", operator="Exists")]),
     make_node("n", unschedulable=True), (), None),
    ("selector-matches", node_selector_matches, make_pod("p", node_selector={"zone": "a"}),
     make_node("n", labels={"zone": "a"}), (), None),
    ("selector-misses", node_selector_matches, make_pod("p", node_selector={"zone": "a"}),
     make_node("n", labels={"zone": "b"}), (), "node(s) didn't match Pod's node affinity/selector"),
    ("affinity-in", node_affinity_satisfied, make_pod("p", affinity=[term("zone", "In", "a", "b")]),
     make_node("n", labels={"zone": "b"}), (), None),
    ("affinity-notin-absent-label", node_affinity_satisfied, make_pod("p", affinity=[term("zone", "NotIn", "a")]),
     make_node("n"), (), None),
    ("affinity-exists-missing", node_affinity_satisfied, make_pod("p", affinity=[term("zone", "Exists")]),
     make_node("n"), (), "node(s) didn't match Pod's node affinity/selector"),
    ("affinity-does-not-exist", node_affinity_satisfied, make_pod("p", affinity=[term("zone", "DoesNotExist")]),
     make_node("n"), (), None),
    ("affinity-gt", node_affinity_satisfied, make_pod("p", affinity=[term("gen", "Gt", "3")]),
     make_node("n", labels={"gen": "4"}), (), None),
    ("affinity-lt-fails", node_affinity_satisfied, make_pod("p", affinity=[term("gen", "Lt", "3")]),
     make_node("n", labels={"gen": "4"}), (), "node(s) didn't match Pod's node affinity/selector"),
    ("affinity-gt-not-a-number", node_affinity_satisfied, make_pod("p", affinity=[term("gen", "Gt", "3")]),
     make_node("n", labels={"gen": "new"}), (), "node(s) didn't match Pod's node affinity/selector"),
    ("affinity-terms-are-ored", node_affinity_satisfied,
     make_pod("p", affinity=[term("zone", "In", "x"), term("zone", "In", "a")]),
     make_node("n", labels={"zone": "a"}), (), None),
    ("affinity-match-fields-name", node_affinity_satisfied,
     make_pod("p", affinity=[NodeSelectorTerm(match_fields=(SelectorRequirement("metadata.name", "In", ("n",)),))]),
     make_node("n"), (), None),
    ("affinity-match-fields-other-name", node_affinity_satisfied,
     make_pod("p", affinity=[NodeSelectorTerm(match_fields=(SelectorRequirement("metadata.name", "In", ("m",)),))]),
     make_node("n"), (), "node(s) didn't match Pod's node affinity/selector"),
    ("taint-untolerated", taints_tolerated, make_pod("p"), make_node("n", taints=[TAINT]), (),
     "node(s) had untolerated taint {dedicated: train}"),
    ("no-execute-untolerated", taints_tolerated, make_pod("p"), make_node("n", taints=[NO_EXECUTE]), (),
     "node(s) had untolerated taint {dedicated: train}"),
    ("prefer-no-schedule-ignored", taints_tolerated, make_pod("p"), make_node("n", taints=[PREFER]), (), None),
    ("taint-tolerated-equal", taints_tolerated,
     make_pod("p", tolerations=[Toleration(key="dedicated", value="train", effect="NoSchedule")]),
     make_node("n", taints=[TAINT]), (), None),
    ("taint-tolerated-exists-any-key", taints_tolerated, make_pod("p", tolerations=[Toleration(operator="Exists")]),
     make_node("n", taints=[TAINT, NO_EXECUTE]), (), None),
    ("taint-wrong-effect", taints_tolerated,
     make_pod("p", tolerations=[Toleration(key="dedicated", operator="Exists", effect="NoExecute")]),
     make_node("n", taints=[TAINT]), (), "node(s) had untolerated taint {dedicated: train}"),
    ("host-port-free", host_ports_free, make_pod("p", ports=[8080]), make_node("n"),
     (make_pod("b", ports=[9090], node="n"),), None),
    ("host-port-taken", host_ports_free, make_pod("p", ports=[8080]), make_node("n"),
     (make_pod("b", ports=[8080], node="n"),), "node(s) didn't have free ports for the requested pod ports"),
    ("anti-affinity-hit", pod_anti_affinity_satisfied, make_pod("p", anti_affinity=[same_host(app="db")]),
     make_node("n"), (make_pod("b", labels={"app": "db"}, node="n"),),
     "node(s) didn't match pod anti-affinity rules"),
    ("anti-affinity-other-namespace", pod_anti_affinity_satisfied,
     make_pod("p", anti_affinity=[same_host(app="db")]), make_node("n"),
     (make_pod("b", labels={"app": "db"}, node="n", namespace="other"),), None),
    ("existing-pod-anti-affinity", pod_anti_affinity_satisfied, make_pod("p", labels={"app": "web"}),
     make_node("n"), (make_pod("b", anti_affinity=[same_host(app="web")], node="n"),),
     "node(s) didn't satisfy existing pods anti-affinity rules"),
    ("affinity-satisfied-on-node", pod_affinity_satisfied, make_pod("p", pod_affinity=[same_host(app="db")]),
     make_node("n"), (make_pod("b", labels={"app": "db"}, node="n"),), None),
    ("affinity-missing-on-node", pod_affinity_satisfied, make_pod("p", pod_affinity=[same_host(app="db")]),
     make_node("n"), (), "node(s) didn't match pod affinity rules"),
    ("cpu-short", resources_fit, make_pod("p", cores=9), make_node("n", cores=8), (), "Insufficient cpu"),
    ("memory-short", resources_fit, make_pod("p", memory_gib=20), make_node("n", memory_gib=32),
     (make_pod("b", memory_gib=16, node="n"),), "Insufficient memory"),
    ("pods-full", resources_fit, make_pod("p"), make_node("n", pods=1), (make_pod("b", node="n"),),
     "Too many pods"),
    ("extended-resource-missing", resources_fit, make_pod("p", extra={"example.com/fpga": 1}), make_node("n"), (),
     "Insufficient example.com/fpga"),
    ("gpus-short", gpus_fit, make_pod("p", gpus=2), make_node("n", gpus=1), (), f"Insufficient {GPU}"),
    ("gpus-fit", gpus_fit, make_pod("p", gpus=1), make_node("n", gpus=2), (make_pod("b", gpus=1, node="n"),), None),
]


@pytest.mark.parametrize("check, pod, node, bound, expected", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_filter(check, pod, node, bound, expected) -> None:
    assert _judge(check, pod, node, bound) == expected


def test_pod_affinity_first_of_its_group_may_go_anywhere() -> None:
    """Upstream rule: no pod matches the term anywhere and the pod matches its own term -> allowed."""
    pod = make_pod("p", labels={"app": "db"}, pod_affinity=[same_host(app="db")])
    assert _judge(pod_affinity_satisfied, pod, make_node("n"), cluster=_NoCluster(match=False)) is None
    assert _judge(pod_affinity_satisfied, pod, make_node("n"), cluster=_NoCluster(match=True)) == \
        "node(s) didn't match pod affinity rules"


def test_resource_reject_carries_the_numbers() -> None:
    node = make_node("n", cores=8)
    snapshot = make_snapshot([node], [])
    reject = resources_fit(pod_request(make_pod("p", cores=10)), sim_node(node, snapshot, None), _NoCluster())
    assert reject is not None
    assert (reject.resource, reject.requested, reject.free, reject.capacity) == ("cpu", 10_000, 8_000, 8_000)
    assert reject.message() == "n: Insufficient cpu (cpu: requested 10 cores, free 8 cores, capacity 8 cores)"


@pytest.mark.parametrize("resource, value, shown", [
    ("cpu", 500, "0.5 cores"), ("cpu", 1000, "1 core"), ("cpu", 2250, "2.25 cores"),
    ("memory", 25769803776, "24 GiB"), ("memory", 1610612736, "1.5 GiB"), ("memory", 512 << 20, "512 MiB"),
    ("memory", 100, "100 B"), ("ephemeral-storage", 100 << 30, "100 GiB"), ("pods", 110, "110"),
    ("nvidia.com/gpu", 4, "4"),
])
def test_amounts_are_shown_in_units_people_read(resource: str, value: int, shown: str) -> None:
    from dds.model.quantity import human_amount

    assert human_amount(resource, value) == shown
