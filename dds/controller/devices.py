"""Fabric devices as the planner sees them: per node, the online ones (capacity now) and the ones on their way out.

Pure, so the production observer and the trace simulator build their snapshots from the same fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from dds.fabric.base import DeviceState, FabricDevice
from dds.model.snapshot import Device


@dataclass(frozen=True)
class DevicesByNode:
    online: dict[str, list[Device]] = field(default_factory=dict)
    detaching: dict[str, list[str]] = field(default_factory=dict)  # device ids


def devices_by_node(devices: Iterable[FabricDevice]) -> DevicesByNode:
    grouped = DevicesByNode()
    for d in devices:
        if d.node is None:
            continue
        if d.state == DeviceState.ONLINE:
            grouped.online.setdefault(d.node, []).append(Device(d.id, d.model, d.pool, d.attached_at or 0.0))
        elif d.state == DeviceState.DETACHING:
            grouped.detaching.setdefault(d.node, []).append(d.id)
    return grouped
