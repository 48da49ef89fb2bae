"""Orphaned devices: fabric devices held for a node that is gone, and attaches that never end (crash safety).

| orphan                                                     | reclaimed when                              | how                   |
|------------------------------------------------------------|---------------------------------------------|-----------------------|
| devices (online or failed) on a node missing from the cluster | the node has been missing `timeout` seconds | force detach          |
| devices on a node being deleted that a NodeHoldingFabric holds | at once                                     | force detach          |
| an attach in flight for `timeout` seconds (a hung composition) | at once                                   | force detach of the   |
|                                                            |                                             | node's attaching devices, which cancels it |

How a device ends up there: a node deleted by someone else (a machine that died, an operator) while it held GPUs; an
attach that completed onto a node removed meanwhile; an attach the fabric never finishes. Nothing else returns those
devices to the pool, and a pool that leaks devices ends in OutOfResources for everyone.

Pure: the controller passes the fabric's devices and operations, the live node names and "now". When a node went
missing is kept in memory only: a restarted DDS starts that clock again, which delays a reclaim but never makes one
early (the safe direction: a node that comes back — an apiserver blip, a slow list — keeps its devices). Hung attaches
are judged on the operation's own start time, which the fabric keeps across restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Iterable, Protocol, runtime_checkable

from dds.fabric.base import DeviceState, FabricDevice, Operation, OperationKind

_SETTLED = (DeviceState.ONLINE, DeviceState.FAILED)  # attached, nothing in flight: only a detach moves them


@runtime_checkable
class NodeHoldingFabric(Protocol):
    """A fabric that can only detach from a node that still exists, and so holds a node's deletion (a finalizer)
    until DDS has reclaimed its devices (the ComposabilityRequest backend)."""

    def deleted_nodes_to_reclaim(self, candidates: Collection[str]) -> set[str]:
        """Of `candidates` (nodes marked for deletion), those being deleted that still hold devices; the others it
        holds are let go."""
        ...


@dataclass(frozen=True)
class Reclaim:
    """Force-detach `device_ids` from `node`, for `reason`."""

    node: str
    device_ids: tuple[str, ...]
    reason: str


@dataclass
class OrphanFinder:
    timeout_seconds: float
    _missing_since: dict[str, float] = field(default_factory=dict)

    def find(self, devices: Iterable[FabricDevice], operations: Iterable[Operation], live_nodes: Collection[str],
             now: float, deleted: Collection[str] = ()) -> list[Reclaim]:
        """`deleted`: nodes being deleted that wait for DDS to reclaim their devices (a fabric that holds deleted nodes,
        `NodeHoldingFabric`): not live, and reclaimed at once (a deletion is no apiserver blip)."""
        devices = list(devices)
        # By node and model: a backend may detach one model per call (a ComposabilityRequest holds one model).
        settled_on_missing: dict[tuple[str, str], list[str]] = {}
        attaching: dict[str, list[str]] = {}
        for device in devices:
            if device.node is None:
                continue
            if device.state == DeviceState.ATTACHING:
                attaching.setdefault(device.node, []).append(device.id)
            elif device.node not in live_nodes and device.state in _SETTLED:
                settled_on_missing.setdefault((device.node, device.model), []).append(device.id)
        self._note_missing({d.node for d in devices if d.node and d.node not in live_nodes}, now)

        reclaims = []
        for node, model in sorted(settled_on_missing):
            ids = tuple(sorted(settled_on_missing[node, model]))
            if node in deleted:
                reclaims.append(Reclaim(node, ids, (
                    f"node {node} is being deleted with {len(ids)} {model} device(s) attached: returning them to "
                    f"the pool before it goes (the node waits for DDS's finalizer)")))
                continue
            gone_for = now - self._missing_since[node]
            if gone_for >= self.timeout_seconds:
                reclaims.append(Reclaim(node, ids, (
                    f"node {node} has been gone for {gone_for:.0f}s (orphan timeout {self.timeout_seconds:.0f}s): "
                    f"returning its devices to the pool")))
        reclaims += self._hung_attaches(operations, attaching, now)
        return reclaims

    def _note_missing(self, missing: set[str], now: float) -> None:
        for node in missing:
            self._missing_since.setdefault(node, now)
        for node in set(self._missing_since) - missing:
            del self._missing_since[node]

    def _hung_attaches(self, operations: Iterable[Operation], attaching: dict[str, list[str]],
                       now: float) -> list[Reclaim]:
        running: dict[str, list[Operation]] = {}
        for op in operations:
            if op.kind == OperationKind.ATTACH and not op.state.done:
                running.setdefault(op.node, []).append(op)
        reclaims = []
        for node in sorted(running):
            ops = running[node]
            # Only when every attach in flight on the node is overdue: the fabric tells attaching devices apart by
            # node, not by operation, and a young attach must not be cancelled with an old one.
            if not attaching.get(node) or any(now - op.started_at < self.timeout_seconds for op in ops):
                continue
            oldest = min(ops, key=lambda op: op.started_at)
            reclaims.append(Reclaim(node, tuple(sorted(attaching[node])), (
                f"attach {oldest.key} to {node} has run for {now - oldest.started_at:.0f}s (orphan timeout "
                f"{self.timeout_seconds:.0f}s): cancelling it and returning its devices to the pool")))
        return reclaims
