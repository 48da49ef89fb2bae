"""In-flight instances: the units of work DDS reports to cluster-autoscaler through TargetSize and NodeGroupNodes.

One instance stands for one unit of an IncreaseSize `delta`: a node being provisioned (`InstanceKind.NODE`) or GPUs
being attached in place of a node (`InstanceKind.GPU`). It is listed to CA as `instanceCreating` until its work is done
(then it is dropped: `complete`) or has failed (it stays listed with errorInfo until CA deletes its placeholder).

Lifecycle (`INSTANCE_LIFECYCLE`, which every change goes through: a move the table does not have raises
IllegalTransition). CA reads *creating* as instanceCreating, *creating, failed* as instanceCreating with errorInfo, and
*deleting* as instanceDeleting; *gone* is not stored (the record is dropped):

| from | on | to | why |
|---|---|---|---|
| creating | complete | gone | its node is up / its attaches ended: no longer listed |
| creating | fail | creating, failed | its work failed for good: listed with errorInfo, CA backs off and deletes the placeholder |
| creating | remove | gone | CA deleted its placeholder or decreased the target size, or the node backend refused the node |
| creating | start-deleting | deleting | its removal started: listed as instanceDeleting |
| creating, failed | fail | creating, failed | another part of its work failed too (two of its attaches refused): the latest error is listed |
| creating, failed | remove | gone | CA deleted its placeholder (or decreased the target size) |
| creating, failed | start-deleting | deleting | its removal started: listed as instanceDeleting, the error kept |
| deleting | remove | gone | the removal is done |

A change asked for an id the tracker no longer holds returns None and touches nothing: CA drops instances from its own
thread (DeleteNodes of a placeholder, DecreaseTargetSize) while the loop may be finishing their work, so "gone already"
is expected there, not a bug. The stored JSON is unchanged: the table's state is read from `state` and `error_code`.
Nothing moves an instance to *deleting* today (CA's deletions drop it at once); the rows say what such a move may do.

The tracker is the only owner of these records. Every change is written through a `StateStore` so that a restarted
DDS lists the same instances (CA would otherwise see its scale-up vanish and count the group size as wrong).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Optional, Protocol, Sequence

from dds import metrics
from dds.model.groups import NodeGroupSpec
from dds.model.lifecycle import IllegalTransition, Lifecycle, Transition
from dds.model.text import bounded_text

log = logging.getLogger(__name__)

ERROR_CLASS_OUT_OF_RESOURCES = 1
ERROR_CLASS_OTHER = 99
INSTANCE_ID_SCHEME = "dds://"


class InstanceKind(str, Enum):
    NODE = "node"  # a whole node, through the node backend
    GPU = "gpu"  # GPUs attached to existing nodes instead of a node


class InstanceState(str, Enum):
    """What is stored and what CA is told (instanceCreating / instanceDeleting); a failure is `error_code` beside it."""

    CREATING = "creating"
    DELETING = "deleting"


class InstancePhase(str, Enum):
    """The lifecycle's state of a record: its stored `state` and whether it failed, read together."""

    CREATING = "creating"
    FAILED = "creating, failed"
    DELETING = "deleting"
    GONE = "gone"  # dropped from the tracker and the store


class InstanceEvent(str, Enum):
    COMPLETE = "complete"
    FAIL = "fail"
    REMOVE = "remove"
    START_DELETING = "start-deleting"  # set_state(InstanceState.DELETING)


_P, _E = InstancePhase, InstanceEvent

INSTANCE_LIFECYCLE: Lifecycle[InstancePhase, InstanceEvent] = Lifecycle("instance", _P.CREATING, [
    Transition(_P.CREATING, _E.COMPLETE, _P.GONE, "its node is up / its attaches ended: no longer listed"),
    Transition(_P.CREATING, _E.FAIL, _P.FAILED,
               "its work failed for good: listed with errorInfo, CA backs off and deletes the placeholder"),
    Transition(_P.CREATING, _E.REMOVE, _P.GONE,
               "CA deleted its placeholder or decreased the target size, or the node backend refused the node"),
    Transition(_P.CREATING, _E.START_DELETING, _P.DELETING, "its removal started: listed as instanceDeleting"),
    Transition(_P.FAILED, _E.FAIL, _P.FAILED,
               "another part of its work failed too (two of its attaches refused): the latest error is listed"),
    Transition(_P.FAILED, _E.REMOVE, _P.GONE, "CA deleted its placeholder (or decreased the target size)"),
    Transition(_P.FAILED, _E.START_DELETING, _P.DELETING,
               "its removal started: listed as instanceDeleting, the error kept"),
    Transition(_P.DELETING, _E.REMOVE, _P.GONE, "the removal is done"),
], final=[_P.GONE])


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    id: str  # dds://<group-id>/<kind>/<short-uuid>; CA uses it as the placeholder node's name and providerID
    group_id: str
    kind: InstanceKind
    state: InstanceState = InstanceState.CREATING
    created_at: float = 0.0
    error_code: str = ""  # empty = no error
    error_message: str = ""
    error_class: int = 0  # ERROR_CLASS_OUT_OF_RESOURCES | ERROR_CLASS_OTHER when failed
    reason: str = ""  # why DDS started this work, for humans
    request_key: str = ""  # the IncreaseSize call it answers (idempotency key of the work it started)

    @property
    def failed(self) -> bool:
        return bool(self.error_code)

    @property
    def phase(self) -> InstancePhase:
        if self.state == InstanceState.DELETING:
            return InstancePhase.DELETING
        return InstancePhase.FAILED if self.failed else InstancePhase.CREATING

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "InstanceRecord":
        fields = dict(data)
        fields["kind"] = InstanceKind(fields["kind"])
        fields["state"] = InstanceState(fields.get("state", InstanceState.CREATING.value))
        return cls(**fields)


def instance_id(group_id: str, kind: InstanceKind, short_uuid: str) -> str:
    return f"{INSTANCE_ID_SCHEME}{group_id}/{kind.value}/{short_uuid}"


def group_of_instance_id(value: str) -> Optional[str]:
    """The group id inside an instance id, or None when `value` is not one of ours (a placeholder CA made from it)."""
    if not value.startswith(INSTANCE_ID_SCHEME):
        return None
    parts = value[len(INSTANCE_ID_SCHEME):].rsplit("/", 2)
    if len(parts) != 3 or parts[1] not in {k.value for k in InstanceKind} or not parts[0]:
        return None
    return parts[0]


# What a record keeps of its reason and of its error message. Every in-flight record lives in one ConfigMap (at most
# 1 MiB), and one IncreaseSize may record a hundred of them: a reason naming every attach of a 500-pod plan (20 KB)
# copied into each made the document too large to store at 5,000 nodes.
MAX_REASON_CHARS = 400
MAX_ERROR_MESSAGE_CHARS = 1000


class InstanceFactory:
    """Makes new records: `factory(group, kind, reason, request_key)`, ids from a short uuid, times from `clock`; the
    reason is kept to MAX_REASON_CHARS."""

    def __init__(self, clock: Callable[[], float], short_id: Callable[[], str] = lambda: uuid.uuid4().hex[:10]) -> None:
        self._clock = clock
        self._short_id = short_id

    def __call__(self, group: NodeGroupSpec, kind: InstanceKind, reason: str, request_key: str) -> InstanceRecord:
        return InstanceRecord(id=instance_id(group.id, kind, self._short_id()), group_id=group.id, kind=kind,
                              created_at=self._clock(), reason=bounded_text(reason, MAX_REASON_CHARS),
                              request_key=request_key)


# --- persistence ---

Document = MutableMapping[str, dict[str, Any]]  # instance id -> InstanceRecord.to_json()


class StateStore(Protocol):
    """Where the tracker keeps its records between processes. `update` is a read-modify-write of the whole document,
    atomic against other writers (optimistic concurrency in the ConfigMap store)."""

    def load(self) -> dict[str, dict[str, Any]]: ...

    def update(self, mutate: Callable[[Document], None]) -> None: ...


class MemoryStateStore:
    """Keeps the document in this process (no cluster, tests). Lost on exit, by design."""

    def __init__(self, initial: Optional[Mapping[str, dict[str, Any]]] = None) -> None:
        self._document: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (initial or {}).items()}
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in self._document.items()}

    def update(self, mutate: Callable[[Document], None]) -> None:
        with self._lock:
            document = {k: dict(v) for k, v in self._document.items()}
            mutate(document)
            self._document = document


class InstanceTracker:
    """Thread-safe set of in-flight instances, written through to a `StateStore`.

    Memory is the truth for this process: a failed write is logged and the whole set is written again with the next
    change (or `flush()`), so a slow or briefly unavailable store never fails a CA call.
    """

    def __init__(self, store: Optional[StateStore] = None) -> None:
        self._store: StateStore = store or MemoryStateStore()
        self._lock = threading.RLock()
        self._records: dict[str, InstanceRecord] = {}
        self._unsynced = False
        self._load()

    def _load(self) -> None:
        for key, data in self._store.load().items():
            try:
                record = InstanceRecord.from_json(data)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("dropping unreadable stored instance %s: %s", key, exc)
                self._unsynced = True
                continue
            self._records[record.id] = record
        if self._records:
            log.info("resumed %d in-flight instance(s) left by a previous process", len(self._records))
        self._update_gauges({r.group_id for r in self._records.values()})

    def reload(self) -> None:
        """Replace the records with the stored ones: a standby becoming the leader takes over the instances the previous
        leader tracked (CA counts them in TargetSize; forgetting one makes CA ask for the same capacity again)."""
        with self._lock:
            before = {r.group_id for r in self._records.values()}
            self._records.clear()
            self._unsynced = False
            self._load()
            self._update_gauges(before)

    # --- reads ---
    def get(self, instance_id: str) -> Optional[InstanceRecord]:
        with self._lock:
            return self._records.get(instance_id)

    def list(self, group_id: Optional[str] = None) -> tuple[InstanceRecord, ...]:
        """Records of one group (or all), oldest first."""
        with self._lock:
            records = [r for r in self._records.values() if group_id is None or r.group_id == group_id]
        return tuple(sorted(records, key=lambda r: (r.created_at, r.id)))

    def count(self, group_id: str) -> int:
        with self._lock:
            return sum(1 for r in self._records.values() if r.group_id == group_id)

    # --- changes ---
    def add(self, record: InstanceRecord) -> InstanceRecord:
        return self.add_all([record])[0]

    def add_all(self, records: Sequence[InstanceRecord]) -> list[InstanceRecord]:
        """Track new records, in one write of the store (one IncreaseSize may record a hundred). All or none: an id
        already tracked, or twice among them, raises before any is added."""
        records = list(records)
        with self._lock:
            counts = Counter(r.id for r in records)
            taken = sorted(i for i, n in counts.items() if n > 1 or i in self._records)
            if taken:
                raise ValueError(f"instance(s) {', '.join(taken)} already tracked")
            for record in records:
                self._records[record.id] = record
            if records:
                self._persist(upserts=tuple(records))
        return records

    def complete(self, instance_id: str) -> Optional[InstanceRecord]:
        """The work is done (node up, GPUs attached): stop listing it."""
        return self._end(instance_id, InstanceEvent.COMPLETE)

    def remove(self, instance_id: str) -> Optional[InstanceRecord]:
        """CA deleted its placeholder or decreased the target size, or its removal is done: stop listing it."""
        return self._end(instance_id, InstanceEvent.REMOVE)

    def complete_all(self, instance_ids: Iterable[str]) -> list[InstanceRecord]:
        """`complete` for many at once, in one write of the store (a loop pass may end dozens). All or none: one
        illegal move raises before any record is dropped."""
        with self._lock:
            records = [r for r in (self._records.get(i) for i in dict.fromkeys(instance_ids)) if r is not None]
            for record in records:
                INSTANCE_LIFECYCLE.next(record.phase, InstanceEvent.COMPLETE)
            for record in records:
                del self._records[record.id]
            if records:
                self._persist(deletes=tuple(records))
        return records

    def fail(self, instance_id: str, code: str, message: str, klass: int) -> Optional[InstanceRecord]:
        """Keep listing it, with errorInfo: CA records a failed scale-up, backs off and deletes the placeholder."""
        if not code:
            raise ValueError(f"instance {instance_id}: a failure needs a non-empty error code")
        return self._move(instance_id, InstanceEvent.FAIL, error_code=code,
                          error_message=bounded_text(message, MAX_ERROR_MESSAGE_CHARS), error_class=klass)

    def set_state(self, instance_id: str, state: InstanceState) -> Optional[InstanceRecord]:
        """Only to `deleting` (the table's start-deleting); any other state is an IllegalTransition."""
        if state == InstanceState.DELETING:
            return self._move(instance_id, InstanceEvent.START_DELETING, state=state)
        record = self.get(instance_id)
        if record is None:
            return None
        raise IllegalTransition(INSTANCE_LIFECYCLE.name, record.phase, f"set_state({state.value})",
                                INSTANCE_LIFECYCLE.events_from(record.phase))

    def flush(self) -> None:
        """Write the whole set if an earlier write failed (call it from a periodic loop)."""
        with self._lock:
            if self._unsynced:
                self._persist()

    # --- internals ---
    def _move(self, instance_id: str, event: InstanceEvent, **changes: Any) -> Optional[InstanceRecord]:
        """A move that keeps the record: the table says where it goes, `changes` are the stored fields that say so."""
        with self._lock:
            record = self._records.get(instance_id)
            if record is None:
                return None
            target = INSTANCE_LIFECYCLE.next(record.phase, event)
            record = replace(record, **changes)
            if record.phase != target:
                raise RuntimeError(f"instance {instance_id}: {event.value} stored {record.phase.value!r}, "
                                   f"the table says {target.value!r}")
            self._records[instance_id] = record
            self._persist(upserts=(record,))
        return record

    def _end(self, instance_id: str, event: InstanceEvent) -> Optional[InstanceRecord]:
        """A move to `gone`: the record is dropped from memory and the store."""
        with self._lock:
            record = self._records.get(instance_id)
            if record is None:
                return None
            INSTANCE_LIFECYCLE.next(record.phase, event)
            del self._records[instance_id]
            self._persist(deletes=(record,))
        return record

    def _persist(self, upserts: tuple[InstanceRecord, ...] = (), deletes: tuple[InstanceRecord, ...] = ()) -> None:
        """Called with the lock held."""
        resync = self._unsynced or (not upserts and not deletes)
        snapshot = {r.id: r.to_json() for r in self._records.values()}

        def mutate(document: Document) -> None:
            if resync:
                document.clear()
                document.update(snapshot)
                return
            for upsert in upserts:
                document[upsert.id] = upsert.to_json()
            for delete in deletes:
                document.pop(delete.id, None)

        try:
            self._store.update(mutate)
            self._unsynced = False
        except Exception as exc:  # the store is an edge (apiserver): never fail the caller for it, retry later
            self._unsynced = True
            log.error("could not save in-flight instances (kept in memory, retried on the next change): %s", exc)
        groups = {r.group_id for r in (*upserts, *deletes)}
        self._update_gauges(groups)

    def _update_gauges(self, group_ids: set[str]) -> None:
        for group_id in group_ids:
            counts: dict[tuple[str, str], int] = {}
            for r in self._records.values():
                if r.group_id == group_id:
                    state = "failed" if r.failed else r.state.value
                    counts[(r.kind.value, state)] = counts.get((r.kind.value, state), 0) + 1
            for kind in InstanceKind:
                for state in ("creating", "deleting", "failed"):
                    metrics.INSTANCES.labels(group_id, kind.value, state).set(counts.get((kind.value, state), 0))
