"""A GPU DDS lists as a DRA device is tainted before its detach (KEP-5055, beta and on in Kubernetes 1.36): the node's
ResourceSlice shows the device with dds.cdi.dev/detaching NoSchedule until the fabric takes it off the node."""

from __future__ import annotations

from typing import Any

import pytest

from dds.kube import resourceslices
from dds.kube.decode import resource_slice
from dds.kube.resourceslices import DETACHING_TAINT, ResourceSlicePublisher, slice_devices
from dds.model.dra_devices import device_name


@pytest.fixture
def writes(monkeypatch) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    monkeypatch.setattr(resourceslices, "write_slice", lambda api, name, driver, pool, placement, devices, timeout:
                        out.append(list(devices)))
    return out


def tainted(devices: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    return {d["name"]: d["taints"] for d in devices if "taints" in d}


def test_the_leaving_device_is_tainted_and_reads_back_as_such() -> None:
    devices = slice_devices("w1", [("w1-gpu-0", "A30"), ("w1-gpu-1", "A30")], leaving={"w1-gpu-1"})
    assert tainted(devices) == {device_name("w1-gpu-1"): [{"key": "dds.cdi.dev/detaching", "effect": "NoSchedule"}]}
    decoded = resource_slice({"metadata": {"name": "w1.gpu.dds.cdi.dev"},
                              "spec": {"driver": "gpu.dds.cdi.dev", "pool": {"name": "w1"}, "devices": devices}})
    assert [d.taints for d in decoded.devices] == [(), (DETACHING_TAINT,)]


def test_a_detach_taints_first_and_the_taint_goes_with_the_device(writes) -> None:
    online = {"w1": [("w1-gpu-0", "A30"), ("w1-gpu-1", "A30")]}
    publisher = ResourceSlicePublisher(api=None, online=lambda node: online[node])  # type: ignore[arg-type]
    publisher.publish("w1")
    publisher.taint_for_detach("w1", ["w1-gpu-1"])
    assert tainted(writes[-1]) == {device_name("w1-gpu-1"): [{"key": "dds.cdi.dev/detaching",
                                                               "effect": "NoSchedule"}]}
    online["w1"] = [("w1-gpu-0", "A30")]  # the fabric accepted the detach: the device is no longer online
    publisher.publish("w1")
    assert [d["name"] for d in writes[-1]] == [device_name("w1-gpu-0")] and tainted(writes[-1]) == {}
    online["w1"] = [("w1-gpu-0", "A30"), ("w1-gpu-1", "A30")]  # attached again later: untainted
    publisher.publish("w1")
    assert tainted(writes[-1]) == {}


def test_a_node_whose_devices_dds_does_not_list_is_left_alone(writes) -> None:
    publisher = ResourceSlicePublisher(api=None, online=lambda node: [("x-gpu-0", "A30")],  # type: ignore[arg-type]
                                       lists=lambda node: False)
    publisher.taint_for_detach("x", ["x-gpu-0"])
    assert writes == []
