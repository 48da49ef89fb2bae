"""The crash campaign's invariants (harness/invariants.py) on hand-made readings: each one catches what it is for,
and none fires on a healthy cluster with work in flight."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.groups.labels import node_group_label_value
from harness.invariants import (CA_VIEW, CONVERGED, DEVICE_ONCE, GPUS_VISIBLE, NO_ORPHANS, NO_WORK_LOST, NODE_SLOTS,
                                    POOL_COUNTS, CaGroupView, ClusterHistory, DeviceRow, FabricReading, GroupRow,
                                    HistoryBounds, NodeRow, OperationRow, PodRow, Reading, check_settled,
                                    instant_violations, parse_fabric)

GROUP = "MachineSet/default/gpu-workers"
LABEL = node_group_label_value(GROUP)


def node(name: str, gpus: int = 0, ready: bool = True, tainted: bool = False) -> NodeRow:
    return NodeRow(name, LABEL, gpus, ready, tainted)


def pod_on(name: str, node_name: str | None, phase: str = "Running", uid: str = "") -> PodRow:
    return PodRow(f"demo/{name}", uid or name, node_name, phase, deleting=False, daemonset=False)


def healthy() -> Reading:
    """Two nodes: n1 with one GPU online and one attaching, n2 empty; six devices free."""
    devices = (DeviceRow("default/A30-000", "default", "A30", "n1", "online"),
               DeviceRow("default/A30-001", "default", "A30", "n1", "attaching"),
               *(DeviceRow(f"default/A30-00{i}", "default", "A30", None, "online") for i in range(2, 8)))
    operations = (OperationRow("attach-1", "attach", "n1", "running", ("default/A30-001",), 0.0),
                  OperationRow("attach-0", "attach", "n1", "succeeded", (), 0.0))
    return Reading(
        fabric=FabricReading(devices, operations), pools={("default", "A30"): 8},
        nodes=(node("n1", gpus=1), node("n2")), pods=(pod_on("train", "n1"),),
        groups=(GroupRow(GROUP, True, 1, 4, replicas=2, machines=2, marked=(), ready_nodes=2),),
        stored_instances=frozenset({"dds://g/gpu/1"}),
        ca=(CaGroupView(GROUP, 1, ("dds://g/gpu/1",), 0),))


def invariants(violations) -> set[str]:
    return {v.invariant for v in violations}


def test_a_healthy_cluster_with_work_in_flight_violates_nothing():
    assert instant_violations(healthy()) == []


@pytest.mark.parametrize("change,expected", [
    pytest.param(lambda r: replace(r, fabric=replace(r.fabric, devices=r.fabric.devices + (r.fabric.devices[0],))),
                 {DEVICE_ONCE, POOL_COUNTS}, id="device-listed-twice"),
    pytest.param(lambda r: replace(r, fabric=replace(r.fabric, operations=r.fabric.operations + (
        OperationRow("attach-2", "attach", "n2", "running", ("default/A30-001",), 0.0),))),
        {DEVICE_ONCE}, id="device-held-by-two-operations"),
    pytest.param(lambda r: replace(r, fabric=replace(r.fabric, operations=r.fabric.operations[1:])),
                 {DEVICE_ONCE}, id="attaching-without-an-operation"),
    pytest.param(lambda r: replace(r, fabric=replace(r.fabric, devices=r.fabric.devices[:-1])),
                 {POOL_COUNTS}, id="device-lost"),
    pytest.param(lambda r: replace(r, groups=(replace(r.groups[0], max_gpus_per_node=1),)),
                 {NODE_SLOTS}, id="more-devices-than-slots"),
    pytest.param(lambda r: replace(r, ca=(CaGroupView(GROUP, 2, ("dds://g/gpu/1",), 0),)),
                 {CA_VIEW}, id="target-size-not-what-is-listed"),
    pytest.param(lambda r: replace(r, stored_instances=frozenset()), {CA_VIEW}, id="listed-but-not-persisted"),
])
def test_each_instant_invariant_catches_its_fault(change, expected):
    assert invariants(instant_violations(change(healthy()))) == expected


def test_a_dds_that_does_not_answer_is_not_a_ca_view_violation_at_any_instant():
    assert instant_violations(replace(healthy(), ca=None)) == []


def test_settled_wants_nothing_in_flight_and_everything_in_its_place():
    reading = healthy()
    assert {v.subject for v in check_settled(reading)} == {"attach-1", GROUP}  # attach in flight, one CA instance
    at_rest = replace(reading,
                      fabric=FabricReading(tuple(replace(d, state="online", node=None) if d.state == "attaching" else d
                                                 for d in reading.fabric.devices), ()),
                      ca=(CaGroupView(GROUP, 0, (), 0),), stored_instances=frozenset())
    assert check_settled(at_rest) == []
    wrong = replace(at_rest, nodes=(node("n1", gpus=2), node("n2", tainted=True)),
                    pods=(pod_on("train", None, phase="Pending"),),
                    groups=(replace(at_rest.groups[0], machines=3, marked=("m-1",)),))
    assert invariants(check_settled(wrong)) == {GPUS_VISIBLE, CONVERGED}
    subjects = {v.subject for v in check_settled(wrong)}
    assert {"n1", "n2", "demo/train", GROUP} <= subjects


def make_history(orphan_seconds: float = 30.0, visibility_seconds: float = 20.0) -> ClusterHistory:
    history = ClusterHistory(reader=None, bounds=HistoryBounds(orphan_seconds, visibility_seconds))  # type: ignore[arg-type]
    history.note_dds_start(0.0)
    return history


def test_history_catches_a_node_removed_while_a_pod_was_bound():
    history = make_history()
    reading = healthy()
    history.observe(reading, now=1.0)
    history.observe(replace(reading, nodes=(node("n2"),)), now=2.0)  # n1 gone, pod train still bound to it
    assert invariants(history.violations()) == {NO_WORK_LOST}


def test_history_does_not_blame_dds_for_a_removal_after_the_pods_left_or_for_an_excused_node():
    history = make_history()
    reading = healthy()
    history.observe(reading, now=1.0)
    empty = replace(reading, pods=())
    history.observe(empty, now=2.0)
    history.observe(replace(empty, nodes=(node("n2"),)), now=3.0)
    assert NO_WORK_LOST not in invariants(history.violations())
    excused = make_history()
    excused.excuse_node("n1")
    excused.observe(reading, now=1.0)
    excused.observe(replace(reading, nodes=(node("n2"),)), now=2.0)
    assert NO_WORK_LOST not in invariants(excused.violations())


def test_history_allows_an_orphan_its_bound_counted_from_the_latest_dds_start():
    history = make_history(orphan_seconds=30.0)
    reading = replace(healthy(), nodes=(node("n2"),), pods=())  # n1 is gone with its devices
    history.observe(reading, now=10.0)
    history.note_dds_start(30.0)  # DDS restarted: its orphan clock started over
    history.observe(reading, now=55.0)
    assert history.violations() == []
    history.observe(reading, now=61.0)
    assert invariants(history.violations()) == {NO_ORPHANS}


def test_history_allows_node_gpus_to_lag_the_fabric_within_the_bound():
    history = make_history(visibility_seconds=20.0)
    lagging = replace(healthy(), fabric=replace(healthy().fabric, operations=()), nodes=(node("n1", gpus=0),
                                                                                        node("n2")))
    lagging = replace(lagging, fabric=replace(lagging.fabric, devices=tuple(
        replace(d, state="online") for d in lagging.fabric.devices)))
    history.observe(lagging, now=1.0)
    history.observe(lagging, now=15.0)
    assert history.violations() == []
    history.observe(lagging, now=22.0)
    assert invariants(history.violations()) == {GPUS_VISIBLE}


def test_parse_fabric_reads_the_simulated_fabrics_document():
    document = {"schema": 1, "salt": "s", "devices": [
        {"id": "default/A30-000", "model": "A30", "pool": "default", "node": "n1", "state": "online",
         "attached_at": 1.0, "freed_at": 0.0, "fails_at": None}],
        "operations": [{"key": "k", "kind": "attach", "node": "n1", "pool": "default", "model": "A30",
                        "requested": 1, "started_at": 1.0, "state": "succeeded", "held": []}]}
    reading = parse_fabric(document)
    assert reading.devices == (DeviceRow("default/A30-000", "default", "A30", "n1", "online"),)
    assert reading.operations[0].running is False


def test_history_counts_a_ca_view_inconsistency_only_when_it_lasts():
    history = make_history()
    racing = replace(healthy(), stored_instances=frozenset())  # the instance completed between the two reads
    history.observe(racing, now=1.0)
    history.observe(healthy(), now=2.0)
    history.observe(racing, now=3.0)
    assert history.violations() == []
    for now in (4.0, 5.0):
        history.observe(racing, now=now)
    assert invariants(history.violations()) == {CA_VIEW}


def test_history_counts_what_the_workload_made_dds_do():
    history = make_history()
    start = healthy()
    history.observe(start, now=1.0)
    attached = replace(start, fabric=FabricReading(tuple(replace(d, state="online") for d in start.fabric.devices),
                                                   start.fabric.operations[1:]))
    history.observe(attached, now=2.0)
    released = replace(attached, fabric=FabricReading(tuple(replace(d, node=None) for d in attached.fabric.devices),
                                                      ()), nodes=(node("n1"), node("n3")), pods=())
    history.observe(released, now=3.0)
    assert history.activity == {"gpus_attached": 1, "gpus_detached": 2, "nodes_added": 1, "nodes_removed": 1}


def test_a_spec_fixed_groups_companion_lists_live_nodes_and_is_not_work_in_flight():
    companion = CaGroupView(f"{GROUP}#live", 2, ("kwok://n1", "kwok://n2"), 0)
    reading = replace(healthy(), ca=(*healthy().ca, companion))
    assert instant_violations(reading) == []
    at_rest = replace(reading, fabric=FabricReading((), ()), pools={}, nodes=(node("n1"), node("n2")),
                      ca=(CaGroupView(GROUP, 0, (), 0), companion), stored_instances=frozenset())
    assert check_settled(at_rest) == []
    wrong = replace(reading, ca=(healthy().ca[0], CaGroupView(f"{GROUP}#live", 1, ("dds://g/gpu/1",), 0)))
    assert [v.subject for v in instant_violations(wrong)] == [f"{GROUP}#live"]
