"""How a node's fabric GPUs are used: which are attached, which of them idle, how many in use.

Read by the scale-down (which idle GPUs to detach), the warm headroom (how many idle GPUs a group keeps) and the
controller's gang rollback; its own module so that none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dds.model.snapshot import Device, NodeInfo, PodInfo
from dds.planner.requests import RequestCache


@dataclass(frozen=True)
class GpuUsage:
    """A node's fabric devices split into in use and idle (idle ones newest attached first)."""

    devices: tuple[Device, ...]  # attached and not detaching
    idle: tuple[Device, ...]
    in_use: int


def gpu_usage(node: NodeInfo, pods: Sequence[PodInfo], cache: RequestCache) -> GpuUsage:
    """The node's fabric devices: which are attached, which of them idle (newest first), how many in use."""
    leaving = set(node.detaching)
    active = tuple(d for d in node.devices if d.id not in leaving)
    used = sum(cache.requests(p).get(node.gpu_resource) for p in pods)
    present = max(node.allocatable.get(node.gpu_resource), len(node.devices)) - len(leaving & {d.id for d in
                                                                                            node.devices})
    idle_count = min(len(active), max(0, present - used))
    # A device allocated to a ResourceClaim is in use whatever the counts say: never among the idle.
    newest_first = sorted((d for d in active if not d.in_claim), key=lambda d: (d.attached_at, d.id), reverse=True)
    return GpuUsage(active, tuple(newest_first[:idle_count]), min(used, len(active)))
