"""Fabric devices as the planner sees them: per node, the online ones (capacity now) and the ones on their way out;
GPUs and CXL memory chunks apart.

Pure, so the production observer and the trace simulator build their snapshots from the same fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from dds.fabric.base import DeviceState, FabricDevice
from dds.model.cxl import is_cxl_model
from dds.model.snapshot import Device


@dataclass(frozen=True)
class DevicesByNode:
    online: dict[str, list[Device]] = field(default_factory=dict)  # GPUs
    detaching: dict[str, list[str]] = field(default_factory=dict)  # GPU ids
    cxl_online: dict[str, list[Device]] = field(default_factory=dict)  # CXL memory chunks (dds/model/cxl.py)


def devices_by_node(devices: Iterable[FabricDevice]) -> DevicesByNode:
    grouped = DevicesByNode()
    for d in devices:
        if d.node is None:
            continue
        if d.state == DeviceState.ONLINE and is_cxl_model(d.model):
            grouped.cxl_online.setdefault(d.node, []).append(Device(d.id, d.model, d.pool, d.attached_at or 0.0))
        elif is_cxl_model(d.model):
            continue  # a chunk on its way out: the node's memory shrinks when it is gone, nothing counts on it
        elif d.state == DeviceState.ONLINE:
            grouped.online.setdefault(d.node, []).append(Device(d.id, d.model, d.pool, d.attached_at or 0.0))
        elif d.state == DeviceState.DETACHING:
            grouped.detaching.setdefault(d.node, []).append(d.id)
    return grouped
