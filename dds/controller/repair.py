"""GPUs that fail while attached (a device falling off the bus, an ECC storm): return them and give the work new ones.

A failed device still holds a slot of its node and a device of the pool, and serves nobody: without this it stays
there forever (the device plugin stops advertising it, so the node's GPU capacity drops, and nothing else ever
detaches it). Every controller loop, on live nodes of DDS's groups:

| found                                                   | action                                                   |
|---------------------------------------------------------|----------------------------------------------------------|
| a device in state failed                                | force-detach it: back to the fabric, which repairs it     |
|                                                         | (Warning Event GPUFailed, dds_fabric_errors_total        |
|                                                         | {kind="device",code="DeviceFailed"})                     |
| on a node that lost GPUs that way: bound pods asking    | attach the difference, up to the GPUs it lost, from the   |
| for more GPUs than it has online or on their way        | group's pool (the work that ran on them can run again)    |

Only GPUs lost to failure are replaced: a node with fewer GPUs than its pods ask for for another reason (a force-detach
of a DaemonSet's GPU before a removal, say) was made so on purpose. Nodes being removed (by DDS or by CA) get nothing.
A detach or attach that fails is tried again with the same backoff as a scale-up's attaches (2, 4, 8 ... 30 s).
Attempt counts and GPUs owed live in memory: a restarted DDS retries sooner, and no longer replaces GPUs that failed
before it started (their failure is not seen again once they are detached).

Which nodes are short, and by how many GPUs, is the planner's (dds/planner/shortfalls.py); this module keeps the counts
and starts the detaches and attaches through the controller's `Actions`.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from dds import metrics
from dds.controller.apply import Actions
from dds.scaling.node_actions import node_ref
from dds.controller.observe import Observation
from dds.fabric.base import DeviceState, Fabric, FabricDevice, FabricError, Operation, OperationState
from dds.model.events import WARNING, EventRecorder
from dds.planner.attach_failures import retry_delay
from dds.model.plan import Attach, Case, Detach
from dds.planner.shortfalls import Restore, gpu_shortfalls

log = logging.getLogger(__name__)

DEVICE_FAILED = "DeviceFailed"  # the code label of dds_fabric_errors_total for a device that failed while attached


@dataclass
class _Tries:
    attempts: int = 0
    not_before: float = 0.0


@dataclass
class DeviceRepair:
    """A controller listener (`controller.listeners.append(repair.run)`); see the module docstring."""

    fabric: Fabric
    actions: Actions  # the controller's: every detach and attach here is started and followed like the others
    events: EventRecorder
    clock: Callable[[], float]
    _tries: dict[str, _Tries] = field(default_factory=dict)  # "device/<id>" or "node/<name>" -> attempts
    _owed: dict[str, int] = field(default_factory=dict)  # node -> GPUs it lost to failure, not replaced yet

    def run(self, observation: Observation) -> None:
        snapshot = observation.snapshot
        live = {n.name for n in snapshot.nodes if n.group_id and not n.being_deleted}
        now = self.clock()
        failed = [d for d in self.fabric.devices() if d.state == DeviceState.FAILED and d.node in live]
        for device in failed:
            self._detach_failed(device, now)
        # Only where GPUs are owed (a failed one was taken off): a node's shortfall elsewhere is not repair's to close.
        shortfalls = gpu_shortfalls(snapshot, among=self._owed) if self._owed else []
        # Owed only while the node still lacks GPUs for its pods (they may have left) or holds the failed ones.
        keep = {r.node for r in shortfalls} | {d.node for d in failed}
        self._owed = {node: owed for node, owed in self._owed.items() if node in live and node in keep}
        restores = [replace(r, count=min(r.count, self._owed[r.node])) for r in shortfalls if r.node in self._owed]
        for restore in restores:
            self._restore(restore, now)
        wanted = {f"device/{d.id}" for d in failed} | {f"node/{r.node}" for r in restores}
        for key in set(self._tries) - wanted:  # repaired (or gone): forget its attempts
            del self._tries[key]

    def _due(self, key: str, now: float) -> Optional[_Tries]:
        tries = self._tries.setdefault(key, _Tries())
        return tries if now >= tries.not_before else None

    def _next(self, tries: _Tries, now: float) -> None:
        tries.attempts += 1
        tries.not_before = now + retry_delay(tries.attempts)

    def _detach_failed(self, device: FabricDevice, now: float) -> None:
        tries = self._due(f"device/{device.id}", now)
        if tries is None:
            return
        if tries.attempts == 0:  # first seen: it is one failure, however many detaches it takes
            metrics.FABRIC_ERRORS.labels(self.fabric.name, "device", DEVICE_FAILED).inc()
            self._owed[device.node or ""] = self._owed.get(device.node or "", 0) + 1
            message = (f"GPU {device.id} ({device.model}) failed on {device.node}; detaching it so the fabric takes it "
                       f"back for repair")
            log.warning(message)
            self.events.emit(node_ref(device.node or ""), WARNING, "GPUFailed", message)
        self._next(tries, now)
        step = Detach(node=device.node or "", device_ids=(device.id,), force=True,
                      reason=f"GPU {device.id} failed while attached")
        self.actions.detach(step, f"repair/{device.id}/{tries.attempts}/{uuid.uuid4().hex[:6]}", Case.REPAIR)

    def _restore(self, restore: Restore, now: float) -> None:
        tries = self._due(f"node/{restore.node}", now)
        if tries is None:
            return
        self._next(tries, now)
        step = Attach(node=restore.node, pool=restore.pool, model=restore.model, count=restore.count, pods=(),
                      reason=f"pods bound to {restore.node} ask for {restore.requested} GPU(s) and it has "
                             f"{restore.have} (a GPU failed or went missing): replacing {restore.count}")
        try:
            self.actions.attach(step, f"restore/{restore.node}/{uuid.uuid4().hex[:8]}", Case.REPAIR,
                                on_done=lambda op: self._restored(restore.node, op))
        except FabricError:
            return  # counted and told by the executor; tried again after the backoff

    def _restored(self, node: str, operation: Operation) -> None:
        owed = self._owed.get(node, 0) - len(operation.devices)
        if owed > 0:
            self._owed[node] = owed
        else:
            self._owed.pop(node, None)
        if operation.state == OperationState.SUCCEEDED:
            self._tries.pop(f"node/{node}", None)

