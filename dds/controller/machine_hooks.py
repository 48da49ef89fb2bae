"""GPUs back to the pool before a Machine's host goes: Cluster API's pre-terminate hook, held by DDS.

Cluster API deletes a Machine in this order: pre-drain hooks, drain, volume detach, pre-terminate hooks, then the
InfraMachine (the host goes) and last the Node. A fabric detach needs the host (the CDI operator drains the GPU on it),
so DDS's Node finalizer alone would wait for a host that is already gone. So every Machine of a DDS group whose node
holds fabric devices carries the annotation `pre-terminate.delete.hook.machine.cluster.x-k8s.io/dds`, and every
controller pass:

| the Machine                                       | DDS                                                         |
|---------------------------------------------------|-------------------------------------------------------------|
| live, its node holds devices, no hook             | adds the hook                                                |
| deleting, Cluster API waits for pre-terminate      | force-detaches the node's devices (back to the pool), then   |
| hooks (node drained), hook held                    | removes the hook once the node holds none                    |
| the same, still holding devices `bound_seconds`    | Warning Event PreTerminateDetachTimedOut on the node, the    |
| after the wait began (dead host, fabric refusing) | devices counted stranded (dds_gpus_stranded_total), hook     |
|                                                   | removed: never a Machine held forever                         |
| deleting, hook held, no node                       | removes the hook (nothing can hold devices for it)           |

A hook on a live Machine whose node holds nothing stays: it costs nothing and closes the race with an attach starting.
The Machines come from the observation (the watch cache's, or one LIST per pass), so this adds no reads; it writes
only the hook annotation, through the node backend. When the wait began is kept in memory: a restarted DDS starts that
clock again (later, never earlier). Installed with the Cluster API node backends (dds/app.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

from dds import metrics
from dds.controller.apply import Actions
from dds.controller.observe import MachineRef, Observation
from dds.fabric.base import Fabric, OperationKind
from dds.kube.capi import DDS_PRE_TERMINATE_HOOK
from dds.model.events import WARNING, EventRecorder
from dds.model.groups import NodeGroupSpec
from dds.model.plan import Case, Detach, by_device_kind
from dds.scaling.node_actions import node_ref

log = logging.getLogger(__name__)


class MachineHooks(Protocol):
    """Writes the hook annotation on a group's Machine (dds/nodes/machineset.py MachineSetProvisioner)."""

    def set_hook(self, group: NodeGroupSpec, machine: str, hook: str, held: bool, api_version: str = "") -> None: ...


class Verb(str, Enum):
    HOLD = "hold"  # add the hook
    DETACH = "detach"  # force-detach the node's devices
    RELEASE = "release"  # remove the hook: the devices are back
    GIVE_UP = "give-up"  # remove the hook after the bound: Event, devices stranded


@dataclass(frozen=True)
class HookStep:
    verb: Verb
    machine: str
    group_id: str
    node: str = ""
    device_ids: tuple[str, ...] = ()


def hook_steps(machines: Iterable[MachineRef], held: Mapping[str, Sequence[str]], detaching: set[str],
               waiting_since: Mapping[str, float], now: float, bound_seconds: float) -> list[HookStep]:
    """Pure: what to do for each Machine, from its state, the devices each node holds (`held`: node -> device ids),
    the nodes with a detach in flight and when each Machine's pre-terminate wait was first seen."""
    steps = []
    for machine in machines:
        node = machine.node_name or ""
        devices = tuple(held.get(node, ())) if node else ()
        if not machine.terminating:
            if devices and not machine.hooked:
                steps.append(HookStep(Verb.HOLD, machine.name, machine.group_id, node))
        elif machine.hooked and (machine.awaiting_pre_terminate or not node):
            if not devices:
                steps.append(HookStep(Verb.RELEASE, machine.name, machine.group_id, node))
            elif now - waiting_since.get(machine.name, now) >= bound_seconds:
                steps.append(HookStep(Verb.GIVE_UP, machine.name, machine.group_id, node, devices))
            elif node not in detaching:
                steps.append(HookStep(Verb.DETACH, machine.name, machine.group_id, node, devices))
    return steps


@dataclass
class PreTerminateHooks:
    """A controller listener (`controller.listeners.append(hooks.run)`); see the module docstring."""

    group: Callable[[str], Optional[NodeGroupSpec]]  # the catalog's group by id
    machines: MachineHooks
    fabric: Fabric
    actions: Actions
    events: EventRecorder
    clock: Callable[[], float]
    bound_seconds: float
    _waiting_since: dict[str, float] = field(default_factory=dict)  # Machine -> when its wait was first seen

    def run(self, observation: Observation) -> None:
        held: dict[str, list[str]] = {}
        models: dict[str, str] = {}
        for device in self.fabric.devices():
            models[device.id] = device.model
            if device.node:
                held.setdefault(device.node, []).append(device.id)
        detaching = {op.node for op in self.actions.watcher.in_flight() if op.kind == OperationKind.DETACH}
        now = self.clock()
        waiting = {m.name for m in observation.machines if m.awaiting_pre_terminate}
        self._waiting_since = {name: self._waiting_since.get(name, now) for name in waiting}
        versions = {m.name: m.api_version for m in observation.machines}
        for step in hook_steps(observation.machines, held, detaching, self._waiting_since, now, self.bound_seconds):
            group = self.group(step.group_id)
            if group is not None:  # a MachineSet DDS does not serve: its Machines are not DDS's to hold
                self._apply(group, step, versions.get(step.machine, ""), models)

    def _apply(self, group: NodeGroupSpec, step: HookStep, api_version: str, models: Mapping[str, str]) -> None:
        try:
            if step.verb is Verb.DETACH:
                reason = (f"Machine {step.machine} is being deleted: its devices go back to the pool before its host "
                          f"goes")
                for detach in by_device_kind(Detach(step.node, step.device_ids, reason=reason, force=True),
                                             models):
                    self.actions.detach(detach, f"pre-terminate/{uuid.uuid4().hex[:8]}", Case.ORPHAN_RECLAIM)
                return
            if step.verb is Verb.GIVE_UP:
                message = (f"Machine {step.machine} still holds {len(step.device_ids)} fabric device(s) "
                           f"({', '.join(step.device_ids)}) {self.bound_seconds:.0f} s after Cluster API began "
                           f"waiting for its pre-terminate hook (pre_terminate_detach_timeout_seconds): hook released "
                           f"so the Machine can go; the devices are stranded until the fabric returns them")
                log.error("%s: %s", group.id, message)
                metrics.GPUS_STRANDED.inc(len(step.device_ids))
                self.events.emit(node_ref(step.node), WARNING, "PreTerminateDetachTimedOut", message)
            self.machines.set_hook(group, step.machine, DDS_PRE_TERMINATE_HOOK, held=step.verb is Verb.HOLD,
                                   api_version=api_version)
            log.info("%s: Machine %s: pre-terminate hook %s (node %s)", group.id, step.machine,
                     "added" if step.verb is Verb.HOLD else "removed", step.node or "none")
        except Exception as exc:  # one Machine's failure must not stop the others; the next pass tries again
            log.warning("%s: Machine %s: %s the pre-terminate hook failed (%s); trying again next pass", group.id,
                        step.machine, step.verb.value, exc)
