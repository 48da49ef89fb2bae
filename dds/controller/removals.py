"""Node removals, from the request to the node backend: a node goes only once its GPUs are released, it holds no work,
its group stays at or above its min size, and a NoSchedule taint has been put on and the node looked at again.

Who asks: cluster-autoscaler's DeleteNodes (case 3, `request`), the control loop's scale-down of empty nodes of
spec-fixed groups (case 4, `plan`), and a restarted DDS finding a node a previous process was removing (`resume`: the
removals under way live in memory; the node carries our `dds.cdi.dev/removing` taint or CA's ToBeDeleted taint).
Each loop pass (`finish`) judges every removal once and moves it through this table:

| from | on | to | why |
|---|---|---|---|
| in-service | ca-asked | requested | cluster-autoscaler's DeleteNodes planned its removal (case 3) |
| in-service | planned | requested | the loop's scale-down: an empty node of a spec-fixed group past its cooldown (case 4) |
| in-service | resumed | requested | a restarted DDS finds our removal taint or CA's ToBeDeleted taint on it |
| requested | ca-asked | requested | asked again while under way: the first request (and its case) stands |
| requested | planned | requested | asked again while under way: the first request (and its case) stands |
| requested | resumed | requested | asked again while under way: the first request (and its case) stands |
| requested | gpus-held | requested | GPUs still on it or operations on it in flight: they are released first, judged again next pass |
| requested | node-gone | gone | the node is no longer in the cluster: nothing left to remove |
| requested | group-gone | kept | its group is no longer served: kept, our taint lifted if it has it |
| requested | work-arrived | kept | it holds work again (and CA is not draining it): kept, our taint lifted if it has it |
| requested | below-min | kept | its group would go below its min size (it shrank since): kept, our taint lifted if it has it |
| requested | released | tainted | no GPUs, no work, min size holds: tainted NoSchedule, then its pods read again |
| tainted | pods-landed | kept | a pod landed before the taint: kept, the taint lifted, a RemovalCancelled Event |
| tainted | still-empty | removing | still empty under the taint: the node backend removes it (key `remove/<node>/<providerID>`) |

*requested* is the only state a removal waits in between passes. *tainted* lasts within one pass: when the taint
write, the second look or the node backend fails, the removal is still *requested* and the next pass starts over (the
taint is put on once, and the removal's key makes the node backend do it once).
*removing*, *kept* and *gone* are final: the removal is forgotten; a node kept can be asked for again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Iterable, Optional, Protocol

from dds import metrics
from dds.controller.apply import Actions
from dds.scaling.node_actions import node_ref
from dds.controller.observe import Observation
from dds.crashpoints import crashpoint
from dds.fabric.base import Operation
from dds.kube.convert import TAINT_TO_BE_DELETED
from dds.model.events import NORMAL, EventRecorder
from dds.model.groups import NodeGroupSpec
from dds.model.lifecycle import Lifecycle, Transition
from dds.model.plan import Case, RemoveNode
from dds.model.snapshot import NodeInfo
from dds.planner.requests import is_work

log = logging.getLogger(__name__)

REMOVAL_TAINT = "dds.cdi.dev/removing"


class RemovalState(str, Enum):
    IN_SERVICE = "in-service"
    REQUESTED = "requested"
    TAINTED = "tainted"
    REMOVING = "removing"
    KEPT = "kept"
    GONE = "gone"


class RemovalEvent(str, Enum):
    CA_ASKED = "ca-asked"
    PLANNED = "planned"
    RESUMED = "resumed"
    GPUS_HELD = "gpus-held"
    NODE_GONE = "node-gone"
    GROUP_GONE = "group-gone"
    WORK_ARRIVED = "work-arrived"
    BELOW_MIN = "below-min"
    RELEASED = "released"
    PODS_LANDED = "pods-landed"
    STILL_EMPTY = "still-empty"


_S, _E = RemovalState, RemovalEvent
_ASKS = (
    (_E.CA_ASKED, "cluster-autoscaler's DeleteNodes planned its removal (case 3)"),
    (_E.PLANNED, "the loop's scale-down: an empty node of a spec-fixed group past its cooldown (case 4)"),
    (_E.RESUMED, "a restarted DDS finds our removal taint or CA's ToBeDeleted taint on it"),
)

NODE_REMOVAL_LIFECYCLE: Lifecycle[RemovalState, RemovalEvent] = Lifecycle("node removal", _S.IN_SERVICE, [
    *(Transition(_S.IN_SERVICE, event, _S.REQUESTED, why) for event, why in _ASKS),
    *(Transition(_S.REQUESTED, event, _S.REQUESTED, "asked again while under way: the first request (and its case) "
                                                     "stands") for event, _ in _ASKS),
    Transition(_S.REQUESTED, _E.GPUS_HELD, _S.REQUESTED,
               "GPUs still on it or operations on it in flight: they are released first, judged again next pass"),
    Transition(_S.REQUESTED, _E.NODE_GONE, _S.GONE, "the node is no longer in the cluster: nothing left to remove"),
    Transition(_S.REQUESTED, _E.GROUP_GONE, _S.KEPT, "its group is no longer served: kept, our taint lifted if it has it"),
    Transition(_S.REQUESTED, _E.WORK_ARRIVED, _S.KEPT,
               "it holds work again (and CA is not draining it): kept, our taint lifted if it has it"),
    Transition(_S.REQUESTED, _E.BELOW_MIN, _S.KEPT,
               "its group would go below its min size (it shrank since): kept, our taint lifted if it has it"),
    Transition(_S.REQUESTED, _E.RELEASED, _S.TAINTED,
               "no GPUs, no work, min size holds: tainted NoSchedule, then its pods read again"),
    Transition(_S.TAINTED, _E.PODS_LANDED, _S.KEPT,
               "a pod landed before the taint: kept, the taint lifted, a RemovalCancelled Event"),
    Transition(_S.TAINTED, _E.STILL_EMPTY, _S.REMOVING,
               "still empty under the taint: the node backend removes it (key `remove/<node>/<providerID>`)"),
], final=[_S.REMOVING, _S.KEPT, _S.GONE])


@dataclass(frozen=True)
class PendingRemoval:
    node: str
    group_id: str
    case: Case  # who decided it: CA's DeleteNodes (SCALE_DOWN) or the loop (SCALE_DOWN_BLOCKED)
    state: RemovalState = RemovalState.REQUESTED


class RemovalTaints(Protocol):
    """The node writes and the fresh read a removal needs: `REMOVAL_TAINT` put on and lifted, the node's work read
    fresh from the apiserver (not a cache: it decides whether the node may go)."""

    def taint(self, node: str) -> None: ...

    def lift_taint(self, node: str) -> None: ...

    def work_on(self, node: str) -> list[str]: ...


def is_ca_drained(node: NodeInfo) -> bool:
    return any(t.key == TAINT_TO_BE_DELETED for t in node.taints)


def carries_removal_taint(node: NodeInfo) -> bool:
    return any(t.key == REMOVAL_TAINT for t in node.taints)


class NodeRemovals:
    """The removals under way in this process, node name -> PendingRemoval. Driven under the controller's lock."""

    def __init__(self, executor: Actions, taints: RemovalTaints, events: EventRecorder,  # the applier (apply.py)
                 in_flight: Callable[[], Iterable[Operation]]) -> None:
        self._executor = executor
        self._taints = taints
        self._events = events
        self._in_flight = in_flight
        self._pending: dict[str, PendingRemoval] = {}
        self._resumed = False  # the removals a previous process left half done are picked up once

    # --- who asks ---
    def request(self, node: str, group_id: str) -> None:
        """Case 3: CA asked to delete this node; its GPUs are being released, the node goes when they are gone."""
        self._ask(node, group_id, Case.SCALE_DOWN, RemovalEvent.CA_ASKED)

    def plan(self, node: str, group_id: str) -> None:
        """Case 4: the loop's scale-down removes an empty node of a spec-fixed group."""
        self._ask(node, group_id, Case.SCALE_DOWN_BLOCKED, RemovalEvent.PLANNED)

    def resume(self, observation: Observation) -> None:
        """Once, on the first pass: a node carrying our removal taint (or CA's ToBeDeleted taint) was being removed by a
        previous process (pending removals live in memory) — cordoned, maybe its Machine already marked. Resume it:
        `finish` removes it with the same idempotency key if it still holds no work and no GPUs, or keeps it and lifts
        the taint."""
        if self._resumed:
            return
        self._resumed = True
        for node in observation.snapshot.nodes:
            if node.group_id and carries_removal_taint(node):
                log.info("resuming the removal of %s, cordoned by a previous process", node.name)
                self._ask(node.name, node.group_id, Case.SCALE_DOWN_BLOCKED, RemovalEvent.RESUMED)
            elif node.group_id and is_ca_drained(node):
                # CA's DeleteNodes was accepted (request_removal), its GPUs maybe still being released: CA counts the
                # node as deleted and will neither ask again nor lift its taint. (A drain CA has under way right now
                # is resumed too: the node then goes when it holds no work, as CA's DeleteNodes would have it.)
                log.info("resuming the removal of %s, which cluster-autoscaler asked for", node.name)
                self._ask(node.name, node.group_id, Case.SCALE_DOWN, RemovalEvent.RESUMED)

    def _ask(self, node: str, group_id: str, case: Case, event: RemovalEvent) -> None:
        current = self._pending.get(node)
        state = NODE_REMOVAL_LIFECYCLE.next(current.state if current else RemovalState.IN_SERVICE, event)
        if current is None:
            self._pending[node] = PendingRemoval(node, group_id, case, state)

    # --- reads ---
    def nodes(self) -> frozenset[str]:
        return frozenset(self._pending)

    def get(self, node: str) -> Optional[PendingRemoval]:
        return self._pending.get(node)

    def __bool__(self) -> bool:
        return bool(self._pending)

    # --- each loop pass ---
    def finish(self, observation: Observation) -> None:
        removed: dict[str, int] = {}  # group id -> nodes this pass took out of it
        for removal in list(self._pending.values()):
            if self._finish_one(removal, observation, removed.get(removal.group_id, 0)):
                removed[removal.group_id] = removed.get(removal.group_id, 0) + 1

    def _finish_one(self, removal: PendingRemoval, observation: Observation, removed_this_pass: int) -> bool:
        """One removal judged and moved on; True when it took a live node out of its group this pass."""
        node = observation.node(removal.node)
        group = observation.snapshot.group(removal.group_id)
        event, why = self.judge(removal, node, group, observation, removed_this_pass)
        state = _moved(removal, event)
        if state == RemovalState.REQUESTED:
            return False
        if state == RemovalState.GONE or node is None:  # judge() says NODE_GONE exactly when there is no node
            self._forget(removal)
            return False
        if state == RemovalState.KEPT or group is None:  # ... and GROUP_GONE (a KEPT) when there is no group
            self._give_up(removal, node, why)
            return False
        return self._taint_then_remove(replace(removal, state=state), node, group)

    def judge(self, removal: PendingRemoval, node: Optional[NodeInfo], group: Optional[NodeGroupSpec],
              observation: Observation, removed_this_pass: int) -> tuple[RemovalEvent, str]:
        """The event this pass makes of a requested removal, with why (for the log line of a node kept)."""
        if node is None:
            return RemovalEvent.NODE_GONE, "the node is gone"
        if group is None:
            return RemovalEvent.GROUP_GONE, f"its group {removal.group_id} is no longer served"
        if node.devices or node.detaching or node.attaching or self._operations_on(node.name):
            # GPUs are released first (and their operations seen to the end: a backend may drop the record of an
            # operation on a node that is gone, as the CDI operator deletes its requests)
            return RemovalEvent.GPUS_HELD, "its GPUs are being released"
        work = [p for p in observation.snapshot.pods_on(node.name) if is_work(p)]
        if work and not is_ca_drained(node):
            return RemovalEvent.WORK_ARRIVED, f"it holds work again ({', '.join(p.key for p in work)})"
        if leaves_group_below_min(observation, node, group, removed_this_pass):
            return RemovalEvent.BELOW_MIN, f"group {group.id} would go below its min size {group.min_size}"
        return RemovalEvent.RELEASED, "its GPUs are released and it holds no work"

    def _operations_on(self, node_name: str) -> bool:
        return any(op.node == node_name for op in self._in_flight())

    def _give_up(self, removal: PendingRemoval, node: NodeInfo, why: str) -> None:
        """Keep the node after all; lift our removal taint if it carries it (else it would take no pod ever again)."""
        self._forget(removal)
        log.info("keeping %s: %s", removal.node, why)
        if carries_removal_taint(node):
            self._taints.lift_taint(removal.node)

    def _taint_then_remove(self, removal: PendingRemoval, node: NodeInfo, group: NodeGroupSpec) -> bool:
        """Taint the node NoSchedule, then look again: a pod that landed meanwhile keeps the node (and lifts the taint);
        otherwise the node backend removes it."""
        self._taints.taint(removal.node)
        work = self._taints.work_on(removal.node)
        if work:
            _moved(removal, RemovalEvent.PODS_LANDED)
            self._taints.lift_taint(removal.node)
            self._events.emit(node_ref(removal.node), NORMAL, "RemovalCancelled",
                              f"kept: pods arrived before removal ({', '.join(work)})")
            self._forget(removal)
            return False
        crashpoint("remove.cordoned")
        _moved(removal, RemovalEvent.STILL_EMPTY)
        self._executor.remove_node(
            RemoveNode(removal.node, removal.group_id, "its GPUs are released and it holds no work"), group,
            key=f"remove/{removal.node}/{node.provider_id}", case=removal.case)
        if removal.case == Case.SCALE_DOWN_BLOCKED:  # CA's removals (case 3) are counted when DeleteNodes decides them
            metrics.DECISIONS.labels(removal.case.value, "node").inc()
        self._forget(removal)
        return not node.being_deleted

    def _forget(self, removal: PendingRemoval) -> None:
        self._pending.pop(removal.node, None)


def _moved(removal: PendingRemoval, event: RemovalEvent) -> RemovalState:
    """The state the table moves `removal` to on `event` (IllegalTransition when it has no such row)."""
    state = NODE_REMOVAL_LIFECYCLE.next(removal.state, event)
    if state != removal.state:
        log.debug("removal of %s: %s -> %s on %s", removal.node, removal.state.value, state.value, event.value)
    return state


def leaves_group_below_min(observation: Observation, node: NodeInfo, group: NodeGroupSpec,
                           removed_this_pass: int) -> bool:
    """The min size was checked when the removal was planned; a removal resumed after a restart (or one that waited
    for its GPUs) may find the group smaller by now. A node whose Machine is already marked is past that."""
    if any(m.node_name == node.name and m.deleting for m in observation.machines):
        return False
    others = sum(1 for n in observation.snapshot.nodes
                 if n.group_id == group.id and n.name != node.name and not n.being_deleted)
    return others - removed_this_pass < group.min_size
