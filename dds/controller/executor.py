"""Act: turn plan steps into fabric and node-backend calls, and tell people what was done and why.

Every call carries an idempotency key derived from what asked for it (a CA instance id, or a controller pass), so a retry
or a restarted DDS never attaches twice. Transient fabric errors on the *call* are retried with backoff (tenacity);
an operation that fails later is seen by `OperationWatcher`.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterator, Optional, Sequence, Union

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from dds import metrics
from dds.crashpoints import crashpoint
from dds.fabric.base import (AttachRequest, BatchAttachFabric, DetachRequest, ErrorCode, Fabric, FabricError, Operation,
                             OperationKind, OperationState)
from dds.model.cxl import chunk_bytes, chunks_text, is_cxl_model
from dds.model.events import NORMAL, WARNING, EventRecorder
from dds.nodes.base import NodeProvisioner
from dds.scaling.node_actions import NodeActions, node_ref, pod_ref
from dds.model.plan import DEVICE_CXL_MEMORY, Attach, Case, Detach

log = logging.getLogger(__name__)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, FabricError) and exc.code.retryable


_fabric_call = retry(retry=retry_if_exception(_retryable), stop=stop_after_attempt(4),
                     wait=wait_exponential(multiplier=0.2, max=2.0), reraise=True)


class Executor:
    def __init__(self, fabric: Fabric, provisioner: NodeProvisioner, events: EventRecorder,
                 before_detach: Optional[Callable[[Detach], None]] = None) -> None:
        self.fabric = fabric
        self.events = events
        # Runs before every detach reaches the fabric (the controller's GPU label keeper: dds/controller/gpu_label.py).
        self.before_detach = before_detach
        # Changes (attach, detach, node added or removed) finished, and under way: a decision taken on a snapshot
        # that a change may not show is taken again before it acts (Controller.decide_then_act, `changed_since`).
        self._generation = 0
        self._under_way = 0
        self._generation_lock = threading.Lock()
        # Node adds and removals: the same port the no-cluster mode uses (dds/scaling/node_actions.py).
        self.nodes = NodeActions(provisioner, events, changing=self._changing)

    @property
    def generation(self) -> int:
        """Changes finished (each one counted once it has been written, or refused)."""
        return self._generation

    def mark(self) -> tuple[int, int]:
        """Where the changes stand, taken before a snapshot: (finished, under way)."""
        with self._generation_lock:
            return self._generation, self._under_way

    def changed_since(self, mark: tuple[int, int]) -> bool:
        """Whether a snapshot taken after `mark` may miss a change: one finished since, or one that was under way
        then. A change counts from before its first write until after its last: a snapshot read while an attach's
        write is on its way to the fabric shows the state before it, though the attach has started (a decision on
        it would count the same pending pod again: the fast path and CA's IncreaseSize attaching twice for one
        pod)."""
        finished, under_way = mark
        with self._generation_lock:
            return under_way > 0 or self._generation != finished

    @contextmanager
    def _changing(self) -> Iterator[None]:
        with self._generation_lock:
            self._under_way += 1
        try:
            yield
        finally:
            with self._generation_lock:
                self._under_way -= 1
                self._generation += 1

    def attach(self, step: Attach, key: str, case: Case) -> Operation:
        """Start an attach; raises FabricError when the fabric refuses the request outright."""
        [result] = self.attach_all([(step, key)], case)
        if isinstance(result, FabricError):
            raise result
        return result

    def attach_all(self, steps: Sequence[tuple[Attach, str]], case: Case) -> list[Union[Operation, FabricError]]:
        """Start several attaches, each with its key: one result per step, its operation or the error that refused
        it. A backend that takes several attaches in one transaction (`BatchAttachFabric`) gets them at once, so a
        burst is one durable write rather than one per attach; a failure of that transaction as a whole refuses them
        all."""
        if not steps:
            return []
        requests = [AttachRequest(key=key, node=step.node, pool=step.pool, model=step.model, count=step.count,
                                  reason=step.reason) for step, key in steps]
        crashpoint("attach.before-fabric")
        results: list[Union[Operation, FabricError]]
        with self._changing():
            if isinstance(self.fabric, BatchAttachFabric) and len(requests) > 1:
                try:
                    results = _fabric_call(self.fabric.attach_many)(requests)
                except FabricError as exc:
                    results = [exc] * len(requests)
            else:
                results = []
                for request in requests:
                    try:
                        results.append(_fabric_call(self.fabric.attach)(request))
                    except FabricError as exc:
                        results.append(exc)
        for (step, key), result in zip(steps, results):
            self._report_attach(step, key, case, result)
        return results

    def _report_attach(self, step: Attach, key: str, case: Case, result: Union[Operation, FabricError]) -> None:
        if isinstance(result, FabricError):
            metrics.FABRIC_ERRORS.labels(self.fabric.name, "attach", result.code.value).inc()
            log.warning("attach %s x %s to %s refused: %s", step.count, step.model, step.node, result,
                        extra={"case": case.value, "key": key})
            self.events.emit(node_ref(step.node), WARNING, "AttachFailed",
                             f"could not attach {step.count} x {step.model} from pool {step.pool}: {result.message}")
            return
        memory = is_cxl_model(step.model)
        what = (f"{chunks_text(step.count, chunk_bytes(step.model) or 0)} from pool {step.pool} ({step.model})" if memory
                else f"{step.count} x {step.model}")
        message = f"attaching {what} to {step.node} for {', '.join(step.pods) or 'capacity'}: {step.reason}"
        log.info(message, extra={"case": case.value, "key": key, "node": step.node})
        for subject in (node_ref(step.node), *(pod_ref(pod) for pod in step.pods)):
            self.events.emit(subject, NORMAL, "AttachingMemory" if memory else "AttachingGPU", message)

    def detach(self, step: Detach, key: str, case: Case) -> Optional[Operation]:
        request = DetachRequest(key=key, node=step.node, device_ids=step.device_ids, force=step.force,
                                reason=step.reason)
        crashpoint("detach.before-fabric")
        with self._changing():
            if self.before_detach is not None:
                self.before_detach(step)
            try:
                operation = _fabric_call(self.fabric.detach)(request)
            except FabricError as exc:
                metrics.FABRIC_ERRORS.labels(self.fabric.name, "detach", exc.code.value).inc()
                log.warning("detach of %s from %s refused: %s", ",".join(step.device_ids), step.node, exc,
                            extra={"case": case.value, "key": key})
                self.events.emit(node_ref(step.node), WARNING, "DetachFailed",
                                 f"could not detach {_devices(step)}: {exc.message}")
                return None
        message = f"detaching {_devices(step)} ({', '.join(step.device_ids)}) from {step.node}: {step.reason}"
        log.info(message, extra={"case": case.value, "key": key, "node": step.node})
        self.events.emit(node_ref(step.node), NORMAL,
                         "DetachingMemory" if step.kind == DEVICE_CXL_MEMORY else "DetachingGPU", message)
        return operation


def _devices(step: Detach) -> str:
    """What a detach takes away: `2 GPU(s)`, `2 CXL memory chunk(s)`."""
    return f"{len(step.device_ids)} {'CXL memory chunk(s)' if step.kind == DEVICE_CXL_MEMORY else 'GPU(s)'}"


@dataclass
class _Watched:
    operation: Operation
    on_done: list[Callable[[Operation], None]] = field(default_factory=list)


@dataclass
class OperationWatcher:
    """Follows started fabric operations to their end: metrics, Events, and callbacks (instance bookkeeping)."""

    fabric: Fabric
    events: EventRecorder
    clock: Callable[[], float]
    _watched: dict[str, _Watched] = field(default_factory=dict)

    def watch(self, operation: Operation, on_done: Optional[Callable[[Operation], None]] = None) -> None:
        """Follow `operation`; every `on_done` given for it (by its starter, or by an instance waiting on it) runs once
        when it ends."""
        watched = self._watched.setdefault(operation.key, _Watched(operation))
        if on_done is not None:
            watched.on_done.append(on_done)

    def adopt_in_flight(self) -> int:
        """After a restart: follow every operation the fabric still has in flight."""
        adopted = 0
        for operation in self.fabric.operations():
            if not operation.state.done and operation.key not in self._watched:
                self._watched[operation.key] = _Watched(operation)
                adopted += 1
        return adopted

    def in_flight(self) -> tuple[Operation, ...]:
        return tuple(w.operation for w in self._watched.values())

    def poll(self, keys: Optional[Collection[str]] = None) -> list[Operation]:
        """Ask the fabric about the operations followed (only those of `keys`, when given: a caller that knows which
        ones can have ended spares the fabric the other reads); record and call back those that ended, in the order
        they were started."""
        finished = []
        for key, watched in [(k, w) for k, w in self._watched.items() if keys is None or k in keys]:
            current = self.fabric.operation(key)
            if current is None:
                # The backend forgot it (e.g. a restarted simulated manager without state): nothing more will happen.
                current = Operation(key=key, kind=watched.operation.kind, node=watched.operation.node,
                                    state=OperationState.FAILED, requested=watched.operation.requested,
                                    model=watched.operation.model, pool=watched.operation.pool,
                                    error=FabricError(ErrorCode.NOT_FOUND, "the fabric no longer knows this operation"),
                                    started_at=watched.operation.started_at, finished_at=self.clock())
            watched.operation = current
            if not current.state.done:
                continue
            del self._watched[key]
            self._record(current)
            for callback in watched.on_done:
                callback(current)
            finished.append(current)
        return finished

    def _record(self, op: Operation) -> None:
        took = max(0.0, (op.finished_at or self.clock()) - op.started_at)
        done = len(op.devices)
        if done:
            self._record_done(op, done, took)
        if op.state == OperationState.FAILED:
            code = op.error.code.value if op.error else "Unknown"
            metrics.FABRIC_ERRORS.labels(self.fabric.name, op.kind.value, code).inc()
            self.events.emit(node_ref(op.node), WARNING, f"{op.kind.value.capitalize()}Failed",
                             f"{op.kind.value} on {op.node} failed after {took:.1f}s "
                             f"({done} of {op.requested} done): {op.error.message if op.error else 'unknown error'}")

    def _record_done(self, op: Operation, done: int, took: float) -> None:
        """Count and tell the devices an operation attached or released: GPUs, or CXL memory chunks (an operation
        moves one kind: its model's; DDS splits a detach naming both, `by_device_kind`)."""
        attach = op.kind == OperationKind.ATTACH
        (metrics.ATTACH_LATENCY if attach else metrics.DETACH_LATENCY).labels(self.fabric.name).observe(took)
        said = f"in {took:.1f}s ({', '.join(op.devices)})"
        if is_cxl_model(op.model):
            (metrics.CXL_CHUNKS_ATTACHED if attach else metrics.CXL_CHUNKS_DETACHED).labels(op.pool, op.model).inc(done)
            amount = chunks_text(done, chunk_bytes(op.model) or 0)
            self.events.emit(node_ref(op.node), NORMAL, "AttachedMemory" if attach else "DetachedMemory",
                             f"{'attached' if attach else 'detached'} {amount} {'to' if attach else 'from'} {op.node} "
                             f"{said}")
        else:
            (metrics.GPUS_ATTACHED if attach else metrics.GPUS_DETACHED).labels(op.pool, op.model).inc(done)
            self.events.emit(node_ref(op.node), NORMAL, "AttachedGPU" if attach else "DetachedGPU",
                             f"attached {done} x {op.model} to {op.node} {said}" if attach
                             else f"detached {done} GPU(s) from {op.node} {said}")
