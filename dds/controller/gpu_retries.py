"""GPU instances of CA's scale-ups, followed to their end: the attaches that stand in for a node, retried after a
backoff when they fail, replaced by a node or failed for CA when retrying cannot help.

One GPU instance (dds/scaling/instances.py, `InstanceKind.GPU`) owns the attaches its IncreaseSize started. Each loop
pass (`GpuInstanceRetries.follow`) looks at every such instance and moves it through this table; what a failure leads
to is decided by dds/planner/attach_failures.py (`after_attach_failure`), whose answer is the event:

| from | on | to | why |
|---|---|---|---|
| attaching | attach-succeeded | done | every attach of the round ended and nothing is missing: the instance is complete |
| attaching | attach-failed | waiting-to-retry | a retryable error with attempts left: what is missing is tried again after the backoff |
| attaching | node-instead | fell-back-to-node | the node is full (SlotsFull) and the group has room: a node instance replaces it |
| attaching | gave-up | failed | no retry or node can serve it: CA is told (errorInfo) and backs off |
| attaching | refused-at-start | failed | the fabric refused an attach of the scale-up outright: CA is told its error |
| waiting-to-retry | backoff-elapsed | attaching | the clock passed the backoff: the missing attaches start again, as attempt n+1 |

- **attaching**: some of its attaches are still running (or, when the pods fit on capacity already on its way, it waits
  on another request's attaches — their failure is not this instance's).
- **waiting-to-retry**: a round failed with a retryable error; what it did not attach is started again, on the same
  node, once `retry_delay(attempt)` has passed on the injected clock (2, 4, 8 s ... at most `ATTACH_ATTEMPTS` tries).
- **done**, **fell-back-to-node**, **failed** are final: the instance is completed (CA stops listing it), replaced by
  a node instance, or listed to CA with errorInfo. A final instance is followed no more: its work entry is dropped.

An instance can also end outside this table: CA deletes its placeholder (DeleteNodes, DecreaseTargetSize) and the
tracker drops it, or something else fails it. Each pass forgets the work of every instance the tracker no longer holds
as a live one (`forget_ended`), so nothing is followed, and kept in memory, for an instance that is gone.

After a restart the table is entered again from the fabric's operations (`_adopt`: their keys carry the instance id and
the attempt, `<instance id>#<index>.r<attempt>`): an instance with operations running is *attaching*; one whose latest
round failed is judged again at once (a backoff under way is not persisted, so it starts over).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable, Optional, Sequence

from dds.crashpoints import crashpoint
from dds.fabric.base import ErrorCode, FabricError, Operation, OperationKind, OperationState
from dds.model.events import WARNING
from dds.model.cxl import chunk_bytes, chunks_text, is_cxl_model
from dds.model.groups import NodeGroupSpec
from dds.model.lifecycle import Lifecycle, Transition
from dds.planner.attach_failures import Action, after_attach_failure
from dds.planner.equip import pool_free
from dds.model.plan import Attach
from dds.model.snapshot import Snapshot
from dds.scaling.instances import InstanceRecord

log = logging.getLogger(__name__)

RETRY_KEY = re.compile(r"\.r(\d+)$")  # "<instance id>#<index>.r<attempt>": a retry's operation key


class GpuInstanceState(str, Enum):
    ATTACHING = "attaching"
    WAITING_TO_RETRY = "waiting-to-retry"
    FELL_BACK_TO_NODE = "fell-back-to-node"
    DONE = "done"
    FAILED = "failed"


class GpuInstanceEvent(str, Enum):
    ATTACH_SUCCEEDED = "attach-succeeded"
    ATTACH_FAILED = "attach-failed"  # ... and `after_attach_failure` says: retry
    NODE_INSTEAD = "node-instead"  # ... and it says: a node serves it (SlotsFull, the group has room)
    GAVE_UP = "gave-up"  # ... and it says: fail (OutOfResources, no attempts left, not retryable)
    BACKOFF_ELAPSED = "backoff-elapsed"
    REFUSED_AT_START = "refused-at-start"  # the fabric refused one of the scale-up's first attaches outright


_S, _E = GpuInstanceState, GpuInstanceEvent

GPU_INSTANCE_LIFECYCLE: Lifecycle[GpuInstanceState, GpuInstanceEvent] = Lifecycle("GPU instance", _S.ATTACHING, [
    Transition(_S.ATTACHING, _E.ATTACH_SUCCEEDED, _S.DONE,
               "every attach of the round ended and nothing is missing: the instance is complete"),
    Transition(_S.ATTACHING, _E.ATTACH_FAILED, _S.WAITING_TO_RETRY,
               "a retryable error with attempts left: what is missing is tried again after the backoff"),
    Transition(_S.ATTACHING, _E.NODE_INSTEAD, _S.FELL_BACK_TO_NODE,
               "the node is full (SlotsFull) and the group has room: a node instance replaces it"),
    Transition(_S.ATTACHING, _E.GAVE_UP, _S.FAILED,
               "no retry or node can serve it: CA is told (errorInfo) and backs off"),
    Transition(_S.ATTACHING, _E.REFUSED_AT_START, _S.FAILED,
               "the fabric refused an attach of the scale-up outright: CA is told its error"),
    Transition(_S.WAITING_TO_RETRY, _E.BACKOFF_ELAPSED, _S.ATTACHING,
               "the clock passed the backoff: the missing attaches start again, as attempt n+1"),
], final=[_S.DONE, _S.FELL_BACK_TO_NODE, _S.FAILED])

# What `after_attach_failure` decides, as the event it is in the table.
_EVENT_OF_ACTION = {Action.RETRY: _E.ATTACH_FAILED, Action.NODE: _E.NODE_INSTEAD, Action.FAIL: _E.GAVE_UP}

OnDone = Callable[[Operation], None]


@dataclass
class GpuInstanceWork:
    state: GpuInstanceState = GpuInstanceState.ATTACHING
    pending: set[str] = field(default_factory=set)  # operation keys still running
    failed: list[Operation] = field(default_factory=list)
    attached: int = 0
    attached_elsewhere: bool = False  # waits on another request's attaches: their failure is not this instance's
    steps: dict[str, Attach] = field(default_factory=dict)  # operation key -> the plan step it carries out
    attempts: int = 1  # tries of this instance's attaches so far (attach_failures.ATTACH_ATTEMPTS at most)
    retry_at: Optional[float] = None  # when `retries` are started again (after a failure, with backoff)
    retries: list[Attach] = field(default_factory=list)

    def move(self, event: GpuInstanceEvent) -> GpuInstanceState:
        """Through the table only: a move it does not have raises IllegalTransition."""
        self.state = GPU_INSTANCE_LIFECYCLE.next(self.state, event)
        return self.state


@dataclass(frozen=True)
class InstanceOutcomes:
    """What following a group's GPU instances does outside this module: the caller's (PlannerScaleUp's) effects."""

    has_room: Callable[[], bool]  # the group can take one more node now (asked when a node is considered)
    fall_back_to_node: Callable[[InstanceRecord, str], None]  # replace the GPU instance by a node instance
    fail: Callable[[InstanceRecord, ErrorCode, str, int], None]  # list it to CA as failed (code, message, class)
    tell: Callable[[str, str, str, Sequence[str], Sequence[str]], None]  # Events: kind, reason, message, nodes, pods


class GpuInstanceRetries:
    """The GPU instances this process follows: their attaches, their retries, the table's state of each."""

    def __init__(self, clock: Callable[[], float], start_attach: Callable[[Attach, str, OnDone], object],
                 watch: Callable[[Operation, OnDone], None], operations: Callable[[], Iterable[Operation]]) -> None:
        self._clock = clock
        self._start_attach = start_attach  # raises FabricError when the fabric refuses the attach outright
        self._watch = watch
        self._operations = operations
        self._work: dict[str, GpuInstanceWork] = {}
        self._lock = threading.Lock()

    # --- what the scale-up started ---
    def start(self, instance_id: str) -> GpuInstanceWork:
        work = self._work[instance_id] = GpuInstanceWork()
        return work

    def expect(self, instance_id: str, key: str, step: Attach) -> None:
        """Before the attach starts: an attach that ends at once reports to it."""
        work = self._work[instance_id]
        work.pending.add(key)
        work.steps[key] = step

    def refused_at_start(self, instance_id: str) -> None:
        """The fabric refused an attach `expect` announced: the caller fails the instance, so it is followed no more
        (its other attaches, if any started, report to nobody). A second refusal for the same instance finds it
        gone already."""
        with self._lock:
            work = self._work.pop(instance_id, None)
        if work is not None:
            work.move(GpuInstanceEvent.REFUSED_AT_START)

    def forget_ended(self, still_live: Callable[[str], bool]) -> None:
        """Drop the work of every followed instance for which `still_live(id)` is false: CA deleted it (the tracker no
        longer holds it) or it failed outside this table. Asked at the time of dropping, so an instance a concurrent
        IncreaseSize has just recorded (recorded before it is started here) is kept."""
        with self._lock:
            for instance_id in [i for i in self._work if not still_live(i)]:
                del self._work[instance_id]

    def followed(self) -> frozenset[str]:
        """The ids of the instances whose work this process holds."""
        with self._lock:
            return frozenset(self._work)

    def wait_for(self, instance_id: str, operation: Operation) -> None:
        """The instance ends with another request's attach (its pods fit on capacity already on its way)."""
        work = self._work[instance_id]
        work.pending.add(operation.key)
        work.attached_elsewhere = True
        self._watch(operation, self.reporter(instance_id))

    def reporter(self, instance_id: str) -> OnDone:
        return lambda operation: self.on_attach_done(instance_id, operation)

    def on_attach_done(self, instance_id: str, operation: Operation) -> None:
        with self._lock:
            work = self._work.get(instance_id)
            if work is None:
                return
            work.pending.discard(operation.key)
            work.attached += len(operation.devices)
            if operation.state == OperationState.FAILED:
                work.failed.append(operation)

    def state_of(self, instance_id: str) -> Optional[GpuInstanceState]:
        work = self._work.get(instance_id)
        return work.state if work is not None else None

    # --- each loop pass ---
    def follow(self, group: NodeGroupSpec, records: Sequence[InstanceRecord], snapshot: Snapshot,
               outcomes: InstanceOutcomes, done: list[str]) -> None:
        """Move each of the group's GPU instances on; the ids of those done are appended to `done` (the caller
        completes them in one write, even when this raises)."""
        now = self._clock()
        for record in records:
            work = self._work.get(record.id)
            if work is None:
                # Left by a previous process: follow the fabric operations it started (keys carry its id).
                work = self._adopt(record)
            if work.state == GpuInstanceState.WAITING_TO_RETRY:
                if work.retry_at is not None and now >= work.retry_at:
                    self._retry(record, work, now)
                continue
            if work.pending:
                continue
            crashpoint("scale-up.gpu-instance-done")
            missing = [] if work.attached_elsewhere else missing_steps(work)
            if missing:
                self._after_failure(group, record, work, missing, snapshot, outcomes, now)
                continue
            work.move(GpuInstanceEvent.ATTACH_SUCCEEDED)
            done.append(record.id)
            self._work.pop(record.id, None)

    def _adopt(self, record: InstanceRecord) -> GpuInstanceWork:
        work = GpuInstanceWork()
        mine = [op for op in self._operations() if op.key.startswith(f"{record.id}#")]
        work.attempts = max((attempt_of(op.key) for op in mine), default=1)
        for operation in mine:
            if operation.state.done:
                work.attached += len(operation.devices)
                # Only the latest round's failures count: earlier ones were retried already.
                if operation.state == OperationState.FAILED and attempt_of(operation.key) == work.attempts:
                    work.failed.append(operation)
            else:
                work.pending.add(operation.key)
                self._watch(operation, self.reporter(record.id))
        self._work[record.id] = work
        return work

    # --- when attaches fail (see dds/planner/attach_failures.py for the rules) ---
    def _after_failure(self, group: NodeGroupSpec, record: InstanceRecord, work: GpuInstanceWork,
                       missing: list[Attach], snapshot: Snapshot, outcomes: InstanceOutcomes, now: float) -> None:
        error = work.failed[0].error or FabricError(ErrorCode.BACKEND, "attach failed")
        wanted = sum(step.count for step in missing)
        decision = after_attach_failure(error, work.attempts, group_has_room=outcomes.has_room(),
                                        pool_free=pool_free(snapshot, group),
                                        gpus_for_new_node=max(group.initial_gpus, wanted))
        work.move(_EVENT_OF_ACTION[decision.action])
        pods = tuple(sorted({p for step in missing for p in step.pods}))
        where = ", ".join(sorted({step.node for step in missing}))
        if decision.action == Action.RETRY:
            work.retry_at, work.retries, work.failed = now + decision.delay, missing, []
            message = f"attaching {attaches_text(missing)} to {where} failed: {decision.message}"
            log.warning("instance %s of %s: %s", record.id, group.id, message)
            outcomes.tell(WARNING, "RetryingAttach", message, [step.node for step in missing], pods)
            return
        self._work.pop(record.id, None)
        if decision.action == Action.NODE:
            outcomes.fall_back_to_node(record, f"pool {group.fabric_pool} could not serve {where}: "
                                               f"{decision.message}")
            return
        outcomes.fail(record, decision.code, decision.message, decision.error_class)
        outcomes.tell(WARNING, "ScaleUpFailed", f"{decision.message}; cluster-autoscaler is told {decision.code.value}",
                      [], pods)

    def _retry(self, record: InstanceRecord, work: GpuInstanceWork, now: float) -> None:
        work.move(GpuInstanceEvent.BACKOFF_ELAPSED)
        steps, work.retries, work.retry_at = work.retries, [], None
        work.attempts += 1
        for index, step in enumerate(steps):
            key = f"{record.id}#{index}.r{work.attempts}"
            work.steps[key] = step
            work.pending.add(key)  # before the attach starts: an attach that ends at once reports to it
            try:
                self._start_attach(step, key, self.reporter(record.id))
            except FabricError as exc:  # refused outright: judged like an attach that failed at once
                work.pending.discard(key)
                work.failed.append(Operation(key=key, kind=OperationKind.ATTACH, node=step.node,
                                             state=OperationState.FAILED, requested=step.count, model=step.model,
                                             pool=step.pool, error=exc, started_at=now, finished_at=now))


def attempt_of(key: str) -> int:
    match = RETRY_KEY.search(key)
    return int(match.group(1)) if match else 1


def missing_steps(work: GpuInstanceWork) -> list[Attach]:
    """What the failed operations of this round did not attach, as steps to try again (same node, pool, model)."""
    out = []
    for op in work.failed:
        count = op.requested - len(op.devices)
        if count <= 0:
            continue
        step = work.steps.get(op.key)
        out.append(Attach(node=op.node, pool=op.pool, model=op.model, count=count,
                          pods=step.pods if step else (), score=step.score if step else None,
                          reason=step.reason if step else f"what attach {op.key} did not attach"))
    return out


def attaches_text(steps: Sequence[Attach]) -> str:
    """What attaches ask for, as people read it: `2 GPU(s)`, `1 CXL memory chunk of 8 GiB (8 GiB)`, or both."""
    gpus = sum(step.count for step in steps if not is_cxl_model(step.model))
    memory = [chunks_text(step.count, chunk_bytes(step.model) or 0) for step in steps if is_cxl_model(step.model)]
    return " and ".join(([f"{gpus} GPU(s)"] if gpus or not memory else []) + memory)
