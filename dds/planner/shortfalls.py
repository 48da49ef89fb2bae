"""Nodes short of GPUs for the pods bound to them: what the controller's device repair (dds/controller/repair.py) gives
back after GPUs failed while attached. Pure: a snapshot in, the attaches that would close each gap out."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Optional

from dds.planner.requests import effective_requests
from dds.model.snapshot import NodeInfo, Snapshot

REMOVAL_TAINTS = ("dds.cdi.dev/removing", "ToBeDeletedByClusterAutoscaler")  # DDS's and CA's, on nodes going away


@dataclass(frozen=True)
class Restore:
    """Attach `count` GPUs to `node`: its bound pods ask for `requested`, it has `have` (online or attaching)."""

    node: str
    pool: str
    model: str
    count: int
    requested: int
    have: int


def gpu_shortfalls(snapshot: Snapshot, among: Optional[Collection[str]] = None) -> list[Restore]:
    """Live, Ready nodes of DDS's groups (`among`: of those named) whose bound pods request more GPUs than the node
    has, each with as many GPUs as closes the gap and its free slots allow (a node being removed gets none)."""
    out = []
    for node in snapshot.nodes if among is None else (n for n in snapshot.nodes if n.name in among):
        group = snapshot.group(node.group_id) if node.group_id else None
        if group is None or not node.ready or _going_away(node):
            continue
        requested = sum(effective_requests(p).get(node.gpu_resource) for p in snapshot.pods_on(node.name))
        have = len(node.devices) + node.attaching
        model = node.devices[0].model if node.devices else group.default_gpu_model
        if requested > have and model:
            room = max(0, group.max_gpus_per_node - have - len(node.detaching))
            if room:
                out.append(Restore(node.name, group.fabric_pool, model, min(requested - have, room), requested, have))
    return out


def _going_away(node: NodeInfo) -> bool:
    return node.being_deleted or any(t.key in REMOVAL_TAINTS for t in node.taints)
