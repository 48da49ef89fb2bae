"""The registry's view of live nodes (what TargetSize and IncreaseSize count): rebuilt once its age has passed, each
node's entry kept while the cache hands over the same record and the node stays in its group."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dds.app import ObservedClusterView
from dds.controller.observe import MachineRef


@dataclass(frozen=True)
class Record:  # what the view reads of the watch cache's node records
    name: str
    provider_id: str = ""
    ready: bool = True
    labels: dict = field(default_factory=dict)


class Observer:
    def __init__(self, records: list[Record], machines: tuple[MachineRef, ...]) -> None:
        self.records, self.machines_now = records, machines

    def node_records(self) -> list[Record]:
        return list(self.records)

    def machines(self) -> tuple[MachineRef, ...]:
        return self.machines_now


def machine(node: str, group: str) -> MachineRef:
    return MachineRef("default", f"m-{node}", group, f"kwok://{node}", node, deleting=False)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def view_over(observer: Observer) -> tuple[ObservedClusterView, Clock]:
    clock = Clock()
    view = ObservedClusterView(observer, api=None, clock=clock, max_age_seconds=1.0)  # type: ignore[arg-type]
    return view, clock


def by_name(view: ObservedClusterView) -> dict[str, Any]:
    return {n.name: n for n in view.nodes()}


def test_unchanged_nodes_keep_their_entries_and_a_changed_one_is_read_again() -> None:
    a, b = Record("a", "kwok://a", ready=False), Record("b", "kwok://b")
    observer = Observer([a, b], (machine("a", "MachineSet/default/gpu"), machine("b", "MachineSet/default/gpu")))
    view, clock = view_over(observer)
    first = by_name(view)
    assert (first["a"].ready, first["a"].group_id) == (False, "MachineSet/default/gpu")
    observer.records = [replace(a, ready=True), b]  # the cache hands over a new record for a node that changed
    clock.now = 2.0
    second = by_name(view)
    assert second["a"].ready and second["a"] is not first["a"]
    assert second["b"] is first["b"]


def test_a_node_that_moves_group_or_leaves_is_seen_so() -> None:
    a, b = Record("a", "kwok://a"), Record("b", "kwok://b")
    observer = Observer([a, b], (machine("a", "MachineSet/default/gpu"), machine("b", "MachineSet/default/gpu")))
    view, clock = view_over(observer)
    by_name(view)
    observer.machines_now = (machine("a", "MachineSet/default/other"),)  # b's Machine is gone
    observer.records = [a]
    clock.now = 2.0
    nodes = by_name(view)
    assert list(nodes) == ["a"] and nodes["a"].group_id == "MachineSet/default/other"


def test_the_view_is_read_again_only_once_its_age_has_passed() -> None:
    observer = Observer([Record("a", "kwok://a")], (machine("a", "MachineSet/default/gpu"),))
    view, clock = view_over(observer)
    assert list(by_name(view)) == ["a"]
    observer.records = []
    clock.now = 0.5
    assert list(by_name(view)) == ["a"]
    clock.now = 1.5
    assert by_name(view) == {}
