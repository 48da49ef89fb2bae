"""The wait for a node to report its attached CXL memory has an end: one Warning Event past the bound, naming what the
node must run, and a Normal one when the node reports it at last."""

from __future__ import annotations

from dataclasses import replace

from dds.controller.cxl_visibility import NOT_SHOWN, SHOWN, MemoryVisibility
from dds.model.snapshot import Device, Snapshot
from tests.unit.planner.builders import GiB, make_group, make_node
from tests.unit.provider.conftest import RecordingEvents

GROUP = make_group().model_copy(update={"max_cxl_memory": 64 * GiB, "cxl_memory_chunk": 16 * GiB})


def snapshot(now: float, reported_chunks: int) -> Snapshot:
    chunks = tuple(Device(id=f"mem-{i}", model="cxl-memory-16Gi", pool="pool-a") for i in range(2))
    node = make_node("w1", memory_gib=32 + 16 * reported_chunks)
    return Snapshot(now=now, nodes=(replace(node, cxl_chunks=chunks),), groups=(GROUP,))


def test_a_node_not_reporting_its_memory_is_told_once_past_the_bound_and_again_when_it_does():
    events = RecordingEvents()
    visibility = MemoryVisibility(events, bound_seconds=600)
    visibility.check(snapshot(0, reported_chunks=1))
    visibility.check(snapshot(599, reported_chunks=1))
    assert events.events == []
    visibility.check(snapshot(600, reported_chunks=1))
    visibility.check(snapshot(900, reported_chunks=1))
    [(ref, kind, reason, message)] = events.events
    assert (ref.name, kind, reason) == ("w1", "Warning", NOT_SHOWN)
    assert "w1 has not reported 16 GiB of CXL memory online on the fabric for 600s (bound 600s)" in message
    assert "NodeResourceHotPlug" in message
    visibility.check(snapshot(901, reported_chunks=2))
    assert [e[2] for e in events.events] == [NOT_SHOWN, SHOWN]


def test_a_node_that_reports_in_time_is_never_told():
    events = RecordingEvents()
    visibility = MemoryVisibility(events, bound_seconds=600)
    visibility.check(snapshot(0, reported_chunks=0))
    visibility.check(snapshot(30, reported_chunks=2))
    visibility.check(snapshot(10_000, reported_chunks=2))
    assert events.events == []
