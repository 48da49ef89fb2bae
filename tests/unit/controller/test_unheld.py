"""Devices a node shows that no fabric record holds are reported (dds/controller/unheld.py; issue 38, point 5)."""

from __future__ import annotations

from types import SimpleNamespace

from dds.controller.loop import Controller
from dds.controller.unheld import UnheldDevices
from dds.fabric.base import DeviceState, FabricDevice
from dds.model.groups import GpuApi
from dds.model.snapshot import Snapshot
from tests.unit.planner.builders import make_group, make_node

GRACE = 120.0


def test_a_device_beyond_the_records_is_reported_once_its_excess_outlasts_the_grace() -> None:
    unheld = UnheldDevices(GRACE)
    assert unheld.find({"w1": 0}, {}, 0.0) == []  # first look: a GPU-less node
    assert unheld.find({"w1": 2}, {"w1": 1}, 10.0) == []  # one more than held: within the grace
    [found] = unheld.find({"w1": 2}, {"w1": 1}, 10.0 + GRACE)
    assert (found.node, found.shown, found.held, found.count, found.since) == ("w1", 2, 1, 1, 10.0)


def test_the_ordinary_lags_are_not_reported() -> None:
    unheld = UnheldDevices(GRACE)
    unheld.find({"w1": 0}, {}, 0.0)
    assert unheld.find({"w1": 1}, {}, 10.0) == []  # shown before its record took it
    assert unheld.find({"w1": 1}, {"w1": 1}, 20.0) == []  # taken: the clock starts again
    assert unheld.find({"w1": 2}, {"w1": 1}, 30.0) == []
    assert unheld.find({"w1": 0}, {"w1": 2}, 30.0 + GRACE) == []  # the device plugin restarting: fewer, not more


def test_gpus_a_node_showed_beyond_the_records_at_first_look_are_its_own() -> None:
    unheld = UnheldDevices(GRACE)
    assert unheld.find({"w1": 2}, {}, 0.0) == []
    assert unheld.find({"w1": 3}, {"w1": 1}, GRACE) == []
    assert unheld.find({"w1": 4}, {"w1": 1}, GRACE + 1) == []
    [found] = unheld.find({"w1": 4}, {"w1": 1}, 2 * GRACE + 1)
    assert (found.count, found.held) == (1, 3)


def test_each_node_and_count_is_reported_once() -> None:
    unheld = UnheldDevices(GRACE)
    unheld.find({"w1": 0, "w2": 0}, {}, 0.0)
    first = unheld.find({"w1": 2, "w2": 1}, {"w1": 1, "w2": 1}, 1.0)
    assert first == [] and unheld.newly_reported(first) == []
    found = unheld.find({"w1": 2, "w2": 1}, {"w1": 1, "w2": 1}, 1.0 + GRACE)
    assert [u.node for u in unheld.newly_reported(found)] == ["w1"]
    assert unheld.newly_reported(unheld.find({"w1": 2, "w2": 1}, {"w1": 1, "w2": 1}, 2.0 + GRACE)) == []
    assert [u.count for u in unheld.newly_reported(unheld.find({"w1": 3}, {"w1": 1}, 3.0 + GRACE))] == [2]


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    def emit(self, involved, event_type: str, reason: str, message: str) -> None:
        self.seen.append((involved.name, event_type, reason, message))


def device(node: str, index: int) -> FabricDevice:
    return FabricDevice(f"gpu-{node}-{index}", "A30", "pool-a", node, DeviceState.ONLINE, serial=f"GPU-{node}-{index}")


def test_the_controller_reports_a_device_plugin_node_showing_more_gpus_than_its_resources_hold() -> None:
    """In an extended-resource group only (a DRA node shows its GPUs in ResourceSlices), Ready nodes not being
    deleted; a warning Event on the node names what it shows and what the records hold."""
    plugin = make_group("plugin")
    dra = make_group("dra").model_copy(update={"gpu_api": GpuApi.DRA_NODE_LOCAL})
    fabric = SimpleNamespace(devices=lambda: (device("w1", 0), device("w1", 1), device("w2", 0)))
    events = Events()
    controller = SimpleNamespace(unheld=UnheldDevices(GRACE), fabric=fabric, events=events)
    report = Controller._report_unheld.__get__(controller)

    def snapshot(now: float, gpus: int) -> Snapshot:
        return Snapshot(now=now, groups=(plugin, dra), nodes=(
            make_node("w1", gpus=gpus, group="plugin"), make_node("w2", gpus=gpus, group="dra"),
            make_node("w3", gpus=gpus, group="plugin", ready=False),
            make_node("w4", gpus=gpus, group="plugin", being_deleted=True)))

    report(snapshot(0.0, 2))
    report(snapshot(1.0, 3))
    report(snapshot(1.0 + GRACE, 3))
    report(snapshot(2.0 + GRACE, 3))
    assert [(e[0], e[1], e[2]) for e in events.seen] == [("w1", "Warning", "UnheldDevice")]
    message = events.seen[0][3]
    assert "w1 shows 3 nvidia.com/gpu where the fabric's records of devices on it (and its own GPUs) account for 2" \
        in message and "1 device(s) attached that no ComposableResource holds" in message, message
