"""The simulated fabric: a CDI manager in a box, the default backend (demo, test cluster, trace simulator).

It holds pools of devices (settings.simulated_fabric.pools), attaches them to nodes after a latency drawn uniformly from
`attach_latency` (detach: `detach_latency`), and injects the faults `FaultSpec` asks for. Nothing runs in the
background: every call first advances the state to `clock()`, so the same class runs on wall time (clock=time.time) and on
the trace simulator's virtual time. `tick()` is that advance on its own; the controller calls it every loop.

Lifecycles (one transition table, applied lazily when the clock passes an operation's due time):

| operation | accepted                               | due time passed                                              |
|-----------|----------------------------------------|--------------------------------------------------------------|
| attach    | free devices reserved: ATTACHING       | ONLINE (SUCCEEDED); fault error: back to the pool (FAILED);   |
|           | (too few free / no slot: FAILED now)   | partial: k < n ONLINE, rest back (FAILED); hang: never due    |
| detach    | ONLINE/FAILED devices -> DETACHING     | back to the pool (SUCCEEDED); fault error: stay (FAILED)      |

A device drawn for "failure after attach" turns FAILED some time after it came ONLINE (a GPU falling off the bus); it stays
on the node until detached. A hung attach holds its devices until the caller gives up and force-detaches them, which
cancels the attach (FAILED, Timeout) — what an operator does with a stuck composition.

Faults are drawn once, when an operation is accepted, from a random generator seeded with (seed, operation key): the
outcome is part of the persisted operation, so a restarted DDS sees the same story, and a seeded run is reproducible.
`faults.max_faults` caps each kind (counted in the state, see `faults_injected()`): a fault strikes that many times,
then the fabric behaves.

Crash safety: the whole state (devices, operations, the random salt) is written to a `FabricStateStore` before any call
returns, so an acknowledged operation is never lost and never done twice: the same key returns the recorded operation.
Finished operations are kept for `FINISHED_RETENTION_SECONDS` (far longer than any caller retries a key), then dropped.
The trace simulator builds it with `persist=False` (no store): its process is the manager's whole life.

Memory pools: a pool's CXL memory is devices too, one per chunk, whose model names the chunk's size
(`cxl-memory-16Gi`, dds/model/cxl.py): `devices: {A30: 8, cxl-memory-16Gi: 16}` is 8 GPUs and 256 GiB of memory.
Chunks attach and detach like GPUs and take none of a node's GPU slots (`max_slots_per_node`).

Visibility: `on_node_devices_changed(node, {model: online count})` is called whenever the ONLINE devices of a node change
(the lead wires it to patch the Node's GPU capacity). A failed callback is retried by the next `tick()`, which also
delivers the current counts of every node once after a restart.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar, Union

from dds.config import LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.crashpoints import crashpoint
from dds.model.cxl import CXL_MODEL_PREFIX, chunk_bytes, cxl_model, is_cxl_model
from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, FabricDevice, FabricError, Operation,
                             OperationKind, OperationState, PoolState)
from dds.fabric.state import (Document, FabricStateStore, InMemoryFabricStateStore, StateConflict,
                              StateStoreError)

log = logging.getLogger(__name__)

Clock = Callable[[], float]
VisibilityHook = Callable[[str, dict[str, int]], None]
DeviceInUse = Callable[[FabricDevice], bool]
T = TypeVar("T")

STATE_SCHEMA = 1
FINISHED_RETENTION_SECONDS = 3600.0
MAX_FINISHED_OPERATIONS = 1000  # keeps the ConfigMap well under its 1 MiB limit
_CONFLICT_ATTEMPTS = 5


class InvariantViolation(AssertionError):
    """The simulated manager's bookkeeping is inconsistent (a bug): raised by check_invariants()."""


@dataclass(frozen=True, slots=True)
class _Device:
    id: str
    model: str
    pool: str
    node: Optional[str] = None
    state: DeviceState = DeviceState.ONLINE
    attached_at: Optional[float] = None
    freed_at: float = 0.0  # the pool hands out the longest-free device first
    fails_at: Optional[float] = None  # injected failure after attach


@dataclass(frozen=True, slots=True)
class _Op:
    key: str
    kind: OperationKind
    node: str
    pool: str
    model: str
    requested: int
    started_at: float
    state: OperationState
    due: Optional[float] = None  # None while RUNNING: hangs until cancelled
    held: tuple[str, ...] = ()  # devices the operation holds while in flight
    keep: Optional[int] = None  # attach: how many of `held` end up attached (None: all); detach: unused
    fail_after: tuple[tuple[str, float], ...] = ()  # attach: (device, seconds after attach) that will fail
    detach_fails: bool = False
    were_failed: tuple[str, ...] = ()  # detach: devices that were FAILED before (they stay FAILED if it fails)
    devices: tuple[str, ...] = ()  # the result: attached / released devices
    error_code: Optional[ErrorCode] = None
    error_message: str = ""
    finished_at: Optional[float] = None
    reason: str = ""

    def public(self) -> Operation:
        error = FabricError(self.error_code, self.error_message) if self.error_code else None
        return Operation(key=self.key, kind=self.kind, node=self.node, state=self.state, requested=self.requested,
                         model=self.model, pool=self.pool, devices=self.devices, error=error,
                         started_at=self.started_at, finished_at=self.finished_at)


@dataclass
class _State:
    salt: str
    devices: dict[str, _Device] = field(default_factory=dict)
    operations: dict[str, _Op] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)  # FaultSpec field -> faults injected so far

    def copy(self) -> "_State":
        # Records are frozen: copying the dicts is enough for a private scratch copy.
        return _State(self.salt, dict(self.devices), dict(self.operations), dict(self.faults))

    def to_document(self) -> Document:
        return {"schema": STATE_SCHEMA, "salt": self.salt,
                "devices": [_device_to_json(d) for d in self.devices.values()],
                "operations": [_op_to_json(o) for o in self.operations.values()],
                "faults": dict(self.faults)}

    @classmethod
    def from_document(cls, document: Document, where: str) -> "_State":
        if document.get("schema") != STATE_SCHEMA:
            raise ValueError(f"{where}: unsupported simulated fabric state schema {document.get('schema')!r} "
                             f"(this DDS reads schema {STATE_SCHEMA})")
        try:
            devices = [_device_from_json(d) for d in document.get("devices", [])]
            ops = [_op_from_json(o) for o in document.get("operations", [])]
            faults = {str(kind): int(n) for kind, n in (document.get("faults") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: malformed simulated fabric state: {exc}") from exc
        return cls(str(document["salt"]), {d.id: d for d in devices}, {o.key: o for o in ops}, faults)


def _flat(record: Any) -> dict[str, Any]:
    """A record's fields as a dict, not copied: every field is a scalar or a tuple (what `asdict` would deep-copy, at
    thousands of records per write)."""
    return {name: getattr(record, name) for name in _FIELDS[type(record)]}


def _device_to_json(device: _Device) -> dict[str, Any]:
    data = _flat(device)
    data["state"] = device.state.value
    return data


def _device_from_json(data: dict[str, Any]) -> _Device:
    return _Device(**{**data, "state": DeviceState(data["state"])})


def _op_to_json(op: _Op) -> dict[str, Any]:
    data = _flat(op)
    data.update(kind=op.kind.value, state=op.state.value, error_code=op.error_code.value if op.error_code else None,
                held=list(op.held), devices=list(op.devices), were_failed=list(op.were_failed),
                fail_after=[list(pair) for pair in op.fail_after])
    return data


def _op_from_json(data: dict[str, Any]) -> _Op:
    return _Op(**{**data, "kind": OperationKind(data["kind"]), "state": OperationState(data["state"]),
                  "error_code": ErrorCode(data["error_code"]) if data.get("error_code") else None,
                  "held": tuple(data.get("held", ())), "devices": tuple(data.get("devices", ())),
                  "were_failed": tuple(data.get("were_failed", ())),
                  "fail_after": tuple((str(d), float(s)) for d, s in data.get("fail_after", ()))})


_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in (_Device, _Op)}


def _draw(latency: LatencySpec, rng: random.Random) -> float:
    low, high = sorted((latency.min, latency.max))
    return rng.uniform(low, high)


class SimulatedFabric:
    """A `Fabric` whose devices, latencies and faults are simulated; see the module docstring."""

    def __init__(self, settings: SimulatedFabricSettings, *, clock: Clock, store: Optional[FabricStateStore] = None,
                 on_node_devices_changed: Optional[VisibilityHook] = None,
                 device_in_use: Optional[DeviceInUse] = None, name: str = "simulated", persist: bool = True) -> None:
        """`persist=False`: no store at all, the state lives and dies with this object. For the trace simulator, whose
        process is the simulated manager's whole life: it spares serializing the whole state on every change."""
        _validate_pools(settings.pools)
        if store is not None and not persist:
            raise ValueError("SimulatedFabric: a state store was given with persist=False; give one or the other")
        self.name = name
        self._settings = settings
        self._clock = clock
        self._persist = persist
        self._store = store if store is not None else InMemoryFabricStateStore()
        self._hook = on_node_devices_changed
        self._device_in_use = device_in_use
        self._slots = {p.name: p.max_slots_per_node for p in settings.pools}
        self._lock = threading.RLock()
        self._hook_lock = threading.RLock()  # re-entrant: a hook may query the fabric
        self._delivered: dict[str, dict[str, int]] = {}  # what the visibility hook last heard, per node
        self._state, self._version = self._load_or_create()
        # Nodes whose counts this process owes the hook: every node the loaded state names (a previous process may
        # have died between storing a change and publishing it, e.g. a node's last GPU detached), then every node
        # whose publication failed. Delivered on the next tick().
        self._owed: set[str] = _nodes_named(self._state)
        self._failing: dict[str, str] = {}  # node -> the last publication error, reported once

    # --- the Fabric protocol: queries see the present (advanced to clock()) ---
    def pools(self) -> tuple[PoolState, ...]:
        state = self._current()
        totals: dict[str, Counter[str]] = {}
        free: dict[str, Counter[str]] = {}
        for device in state.devices.values():
            totals.setdefault(device.pool, Counter())[device.model] += 1
            bucket = free.setdefault(device.pool, Counter())
            bucket[device.model] += 1 if device.node is None else 0
        return tuple(PoolState(pool, MappingProxyType(dict(totals[pool])), MappingProxyType(dict(free[pool])))
                     for pool in sorted(totals))

    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        state = self._current()
        attached = (d for d in state.devices.values() if d.node is not None and (node is None or d.node == node))
        return tuple(_public_device(d) for d in sorted(attached, key=lambda d: d.id))

    def operation(self, key: str) -> Optional[Operation]:
        op = self._current().operations.get(key)
        return op.public() if op else None

    def operations(self) -> tuple[Operation, ...]:
        return tuple(op.public() for op in self._current().operations.values())

    def faults_injected(self) -> dict[str, int]:
        """Faults injected so far by kind (FaultSpec field names), kept with the state: a restart does not reset it."""
        return dict(self._current().faults)

    def attach(self, request: AttachRequest) -> Operation:
        self._check_attach(request)
        operation = self._transact(lambda state: self._accept_attach(state, request)).public()
        crashpoint("fabric.attach.accepted")
        return operation

    def attach_many(self, requests: Sequence[AttachRequest]) -> list[Union[Operation, FabricError]]:
        """Several attaches in one transaction: one write of the manager's state for the lot, each acknowledged (or
        refused on its own) exactly as `attach` would, in order. A request the manager refuses outright leaves the
        others untouched."""
        checked: list[Optional[FabricError]] = []
        for request in requests:
            try:
                self._check_attach(request)
                checked.append(None)
            except FabricError as exc:
                checked.append(exc)

        def accept_all(state: _State) -> list[Union[_Op, FabricError]]:
            out: list[Union[_Op, FabricError]] = []
            stock = _Stock(state)  # one walk over the devices for the lot, not one per request
            for request, refused in zip(requests, checked):
                if refused is not None:
                    out.append(refused)
                    continue
                trial = state.copy()  # a refusal must leave no trace of the request in the transaction
                try:
                    out.append(self._accept_attach(trial, request, stock))
                except FabricError as exc:
                    out.append(exc)
                    continue
                state.devices, state.operations, state.faults = trial.devices, trial.operations, trial.faults
            return out

        results = self._transact(accept_all)
        crashpoint("fabric.attach.accepted")
        return [r if isinstance(r, FabricError) else r.public() for r in results]

    def _check_attach(self, request: AttachRequest) -> None:
        """What refuses an attach before the manager's state is read: a malformed request, an unconfigured pool."""
        _validate_attach(request)
        if request.pool not in self._slots:
            raise FabricError(ErrorCode.NOT_FOUND, f"attach {request.key}: pool {request.pool!r} is not configured "
                                                   f"(pools: {', '.join(sorted(self._slots))})")

    def detach(self, request: DetachRequest) -> Operation:
        if not request.key or not request.node or not request.device_ids:
            raise FabricError(ErrorCode.INVALID, f"detach {request.key or '<no key>'}: key, node and device_ids "
                                                 f"are required")
        if len(set(request.device_ids)) != len(request.device_ids):
            raise FabricError(ErrorCode.INVALID, f"detach {request.key}: device_ids lists a device twice")
        operation = self._transact(lambda state: self._accept_detach(state, request)).public()
        crashpoint("fabric.detach.accepted")
        return operation

    def tick(self) -> None:
        """Advance operations to clock() and (re)deliver node visibility changes."""
        self._current()
        self._deliver_visibility(None)

    def close(self) -> None:
        """Nothing to release: the state is already stored (the manager itself outlives DDS)."""

    def resync(self) -> None:
        """Read the stored state again: what another DDS process (the previous leader) did since this one loaded it."""
        if not self._persist:
            return
        with self._lock:
            self._reload()

    # --- for tests and operators ---
    def check_invariants(self) -> None:
        """Raise InvariantViolation unless every device is in exactly one place and every pool adds up."""
        with self._lock:
            _check_invariants(self._state)

    def free_count(self, pool: str, model: str) -> int:
        return sum(1 for d in self._current().devices.values()
                   if d.pool == pool and d.model == model and d.node is None)

    # --- state: load, advance, commit ---
    def _load_or_create(self) -> tuple[_State, Optional[str]]:
        if not self._persist:
            state = _State(salt=self._salt_for_new_state())
            _reconcile_with_config(state, self._settings.pools)
            return state, None
        document, version = self._store.load()
        if document is None:
            state = _State(salt=self._salt_for_new_state())
            _reconcile_with_config(state, self._settings.pools)
            return state, self._store.save(state.to_document(), version)
        state = _State.from_document(document, self._store.describe())
        before = state.copy()
        _reconcile_with_config(state, self._settings.pools)
        if state != before:
            version = self._store.save(state.to_document(), version)
        return state, version

    def _salt_for_new_state(self) -> str:
        seed = self._settings.faults.seed
        # Unseeded: a random salt, stored with the state so a restarted DDS draws nothing new for old operations.
        return f"seed-{seed}" if seed is not None else secrets.token_hex(8)

    def _current(self) -> _State:
        with self._lock:
            if not _has_due_work(self._state, self._clock()):
                return self._state
        self._transact(lambda state: None)
        return self._state

    def _transact(self, change: Callable[[_State], T]) -> T:
        """Advance to now, apply `change` on a private copy, store it, and only then make it current."""
        changed_nodes: set[str] = set()
        with self._lock:
            for _ in range(_CONFLICT_ATTEMPTS):
                scratch = self._state.copy()
                _advance(scratch, self._clock())
                result = change(scratch)  # a FabricError here leaves the current state untouched
                if scratch == self._state:
                    return result
                if not self._persist:
                    changed_nodes = _nodes_with_changed_online(self._state, scratch)
                    self._state = scratch
                    break
                try:
                    self._version = self._store.save(scratch.to_document(), self._version)
                except StateConflict:
                    log.warning("%s changed under this DDS (another writer?); re-reading it", self._store.describe())
                    self._reload()
                    continue
                except StateStoreError as exc:  # not acknowledged: the caller may retry (BackendError is retryable)
                    raise FabricError(ErrorCode.BACKEND, str(exc)) from exc
                changed_nodes = _nodes_with_changed_online(self._state, scratch)
                finished = _newly_finished(self._state, scratch)
                self._state = scratch
                if OperationKind.ATTACH in finished:
                    crashpoint("fabric.attach.completed")
                if OperationKind.DETACH in finished:
                    crashpoint("fabric.detach.completed")
                break
            else:
                raise FabricError(ErrorCode.BACKEND, f"{self._store.describe()} kept changing under this DDS "
                                                     f"({_CONFLICT_ATTEMPTS} attempts)")
        if changed_nodes:
            self._deliver_visibility(changed_nodes)
        return result

    def _reload(self) -> None:
        document, version = self._store.load()
        if document is None:
            raise FabricError(ErrorCode.BACKEND, f"{self._store.describe()} disappeared")
        self._state, self._version = _State.from_document(document, self._store.describe()), version

    # --- accepting operations (called inside _transact on the scratch state) ---
    def _accept_attach(self, state: _State, request: AttachRequest, stock: Optional["_Stock"] = None) -> _Op:
        existing = state.operations.get(request.key)
        if existing is not None:
            return existing
        now = self._clock()
        stock = stock or _Stock(state)
        pool_models, free = stock.models(request.pool), stock.free_count(request.pool, request.model)
        if request.model not in pool_models:
            models = ", ".join(sorted(pool_models))
            raise FabricError(ErrorCode.NOT_FOUND, f"attach {request.key}: pool {request.pool} has no "
                                                   f"{request.model} devices (models: {models})")
        base = _Op(key=request.key, kind=OperationKind.ATTACH, node=request.node, pool=request.pool,
                   model=request.model, requested=request.count, started_at=now, state=OperationState.RUNNING,
                   reason=request.reason)
        refusal = self._capacity_refusal(state, request, free)
        if refusal is not None:
            code, message = refusal
            op = replace(base, state=OperationState.FAILED, error_code=code, error_message=message, finished_at=now)
        else:
            op = self._plan_attach(state, base, now, stock)
        state.operations[op.key] = op
        return op

    def _capacity_refusal(self, state: _State, request: AttachRequest, free: int) -> Optional[tuple[ErrorCode, str]]:
        if free < request.count:
            return ErrorCode.OUT_OF_RESOURCES, (f"pool {request.pool} has {free} free {request.model}, "
                                                f"{request.count} asked for {request.node}")
        limit = self._slots.get(request.pool)
        if limit is not None:
            # Slots hold GPUs: CXL memory chunks take none (a node's memory has its own maximum, the group's).
            used = sum(1 for d in state.devices.values() if d.node == request.node and d.pool == request.pool
                       and not is_cxl_model(d.model))
            if not is_cxl_model(request.model) and used + request.count > limit:
                return ErrorCode.SLOTS_FULL, (f"{request.node} uses {used} of {limit} slot(s) for pool "
                                              f"{request.pool}; {request.count} more asked")
        return None

    def _plan_attach(self, state: _State, op: _Op, now: float, stock: "_Stock") -> _Op:
        """`stock`: the pool's free devices as of `state`, from which the op's are taken."""
        rng = random.Random(f"{state.salt}/{op.key}")
        chosen = stock.take(op.pool, op.model, op.requested)
        for device in chosen:
            state.devices[device.id] = replace(device, node=op.node, state=DeviceState.ATTACHING, attached_at=None,
                                               fails_at=None)
        held = tuple(d.id for d in chosen)
        due = now + _draw(self._settings.attach_latency, rng)
        if self._inject(state, "attach_hang", rng):
            return replace(op, held=held, due=None)
        if self._inject(state, "attach_error", rng):
            return replace(op, held=held, due=due, keep=0)
        keep = rng.randrange(0, op.requested) if self._inject(state, "partial_attach", rng) else None
        fail_after = tuple((device_id, _draw(self._settings.attach_latency, rng)) for device_id in held
                           if self._inject(state, "device_failure_after_attach", rng))
        return replace(op, held=held, due=due, keep=keep, fail_after=fail_after)

    def _inject(self, state: _State, kind: str, rng: random.Random) -> bool:
        """Draw fault `kind` (a FaultSpec probability) and count it in the state when it hits. The draw happens even
        when `max_faults` of this kind are used up, so the budget never shifts the random sequence before it ends."""
        faults = self._settings.faults
        hit = rng.random() < getattr(faults, kind)
        if not hit or (faults.max_faults is not None and state.faults.get(kind, 0) >= faults.max_faults):
            return False
        state.faults[kind] = state.faults.get(kind, 0) + 1
        return True

    def _accept_detach(self, state: _State, request: DetachRequest) -> _Op:
        existing = state.operations.get(request.key)
        if existing is not None:
            return existing
        now = self._clock()
        devices = [self._detachable(state, request, device_id) for device_id in request.device_ids]
        for device in devices:
            if device.state == DeviceState.ATTACHING:
                _cancel_hung_attach(state, device.id, request.key, now)
            state.devices[device.id] = replace(state.devices[device.id], state=DeviceState.DETACHING)
        rng = random.Random(f"{state.salt}/{request.key}")
        due = now + _draw(self._settings.detach_latency, rng)
        first = devices[0]
        op = _Op(key=request.key, kind=OperationKind.DETACH, node=request.node, pool=first.pool, model=first.model,
                 requested=len(devices), started_at=now, state=OperationState.RUNNING, due=due,
                 held=tuple(d.id for d in devices), detach_fails=self._inject(state, "detach_error", rng),
                 were_failed=tuple(d.id for d in devices if d.state == DeviceState.FAILED),
                 reason=request.reason)
        state.operations[op.key] = op
        return op

    def _detachable(self, state: _State, request: DetachRequest, device_id: str) -> _Device:
        device = state.devices.get(device_id)
        if device is None or device.node != request.node:
            raise FabricError(ErrorCode.NOT_FOUND, f"detach {request.key}: device {device_id} is not attached to "
                                                   f"{request.node}")
        if device.state == DeviceState.DETACHING:
            raise FabricError(ErrorCode.INVALID, f"detach {request.key}: device {device_id} is already detaching")
        if device.state == DeviceState.ATTACHING:
            owner = _holder(state, device_id)
            if not (request.force and owner is not None and owner.due is None):
                raise FabricError(ErrorCode.INVALID, f"detach {request.key}: device {device_id} is still attaching "
                                                     f"(only a hung attach can be cancelled, with force)")
        if (not request.force and device.state == DeviceState.ONLINE and self._device_in_use is not None
                and self._device_in_use(_public_device(device))):
            raise FabricError(ErrorCode.DEVICE_IN_USE, f"detach {request.key}: device {device_id} on {request.node} "
                                                       f"is in use; set force to detach it anyway")
        return device

    # --- visibility ---
    def _deliver_visibility(self, nodes: Optional[Iterable[str]]) -> None:
        if self._hook is None:
            return
        with self._hook_lock:
            with self._lock:
                state = self._state
                wanted = set(nodes) if nodes is not None else (
                    {d.node for d in state.devices.values() if d.node} | set(self._delivered) | self._owed)
                current = {node: _online_by_model(state, node) for node in wanted}
            for node in sorted(wanted):
                if self._delivered.get(node) == current[node]:
                    self._owed.discard(node)
                    continue
                try:
                    self._hook(node, dict(current[node]))
                except Exception as exc:  # the next tick() retries; a broken hook must not fail a fabric call
                    self._owed.add(node)
                    self._report_failed_publication(node, exc)
                    continue
                self._delivered[node] = current[node]
                self._owed.discard(node)
                self._failing.pop(node, None)

    def _report_failed_publication(self, node: str, exc: Exception) -> None:
        """Once per node and cause (with the traceback), not once a tick: a deleted node holding devices fails every
        tick until its devices are reclaimed as orphans."""
        if self._failing.get(node) == str(exc):
            log.debug("still cannot publish the devices of node %s: %s", node, exc)
            return
        self._failing[node] = str(exc)
        log.warning("could not publish the devices of node %s (retried every tick): %s", node, exc, exc_info=exc)


# --- pure helpers over a _State ---
def _validate_pools(pools: Iterable[PoolSpec]) -> None:
    seen: set[str] = set()
    for index, pool in enumerate(pools):
        where = f"simulated_fabric.pools[{index}] ({pool.name!r})"
        if not pool.name or "/" in pool.name:
            raise ValueError(f"{where}: name must be non-empty and contain no '/'")
        if pool.name in seen:
            raise ValueError(f"{where}: pool name used twice")
        seen.add(pool.name)
        for model, count in pool.devices.items():
            if not model or count < 0:
                raise ValueError(f"{where}.devices[{model!r}]: model must be non-empty and count >= 0, got {count}")
            if is_cxl_model(model) and chunk_bytes(model) is None:
                raise ValueError(f"{where}.devices[{model!r}]: a CXL memory model names its chunk size after "
                                 f"{CXL_MODEL_PREFIX!r}, a positive memory quantity such as {cxl_model(16 * 2**30)}")
        if pool.max_slots_per_node is not None and pool.max_slots_per_node < 0:
            raise ValueError(f"{where}.max_slots_per_node: must be >= 0, got {pool.max_slots_per_node}")


def _validate_attach(request: AttachRequest) -> None:
    if not request.key or not request.node:
        raise FabricError(ErrorCode.INVALID, f"attach {request.key or '<no key>'}: key and node are required")
    if request.count <= 0:
        raise FabricError(ErrorCode.INVALID, f"attach {request.key}: count must be positive, got {request.count}")


def _device_id(pool: str, model: str, index: int) -> str:
    return f"{pool}/{model}-{index:03d}"


def _reconcile_with_config(state: _State, pools: Iterable[PoolSpec]) -> None:
    """Make the devices match the configured pools: add missing ones, drop free ones no longer configured.

    Attached devices that the configuration no longer lists stay until they are detached (the manager cannot pull a
    GPU out from under a workload because a config file changed).
    """
    wanted = {_device_id(p.name, model, i): (p.name, model)
              for p in pools for model, count in p.devices.items() for i in range(count)}
    for device_id, (pool, model) in wanted.items():
        if device_id not in state.devices:
            state.devices[device_id] = _Device(device_id, model, pool)
    for device_id, device in list(state.devices.items()):
        if device_id in wanted:
            continue
        if device.node is None:
            del state.devices[device_id]
        else:
            log.warning("device %s is no longer configured but attached to %s; it leaves when detached",
                        device_id, device.node)


class _Stock:
    """The pools' models and free devices as of one state, for a run of attaches in one transaction: each attach takes
    the first free devices of its model (longest free first) through `take`, which keeps the stock in step with the
    state it changes."""

    def __init__(self, state: _State) -> None:
        self._models: dict[str, set[str]] = {}
        self._free: dict[tuple[str, str], list[_Device]] = {}
        for d in state.devices.values():
            self._models.setdefault(d.pool, set()).add(d.model)
            if d.node is None:
                self._free.setdefault((d.pool, d.model), []).append(d)
        for devices in self._free.values():
            devices.sort(key=lambda d: (d.freed_at, d.id))

    def models(self, pool: str) -> set[str]:
        return self._models.get(pool, set())

    def free_count(self, pool: str, model: str) -> int:
        return len(self._free.get((pool, model), ()))

    def take(self, pool: str, model: str, count: int) -> list[_Device]:
        free = self._free.get((pool, model), [])
        taken, free[:count] = free[:count], []
        return taken


def _public_device(device: _Device) -> FabricDevice:
    return FabricDevice(device.id, device.model, device.pool, device.node, device.state, device.attached_at)


def _holder(state: _State, device_id: str) -> Optional[_Op]:
    for op in state.operations.values():
        if op.state == OperationState.RUNNING and device_id in op.held:
            return op
    return None


def _online_by_model(state: _State, node: str) -> dict[str, int]:
    return dict(Counter(d.model for d in state.devices.values() if d.node == node and d.state == DeviceState.ONLINE))


def _nodes_named(state: _State) -> set[str]:
    return {d.node for d in state.devices.values() if d.node} | {op.node for op in state.operations.values()}


def _newly_finished(old: _State, new: _State) -> set[OperationKind]:
    """Kinds of the operations that ended between `old` and `new`."""
    return {op.kind for key, op in new.operations.items()
            if op.state.done and (key not in old.operations or not old.operations[key].state.done)}


def _nodes_with_changed_online(old: _State, new: _State) -> set[str]:
    def online(state: _State) -> set[tuple[str, str]]:
        return {(d.node, d.id) for d in state.devices.values() if d.node and d.state == DeviceState.ONLINE}
    return {node for node, _ in online(old) ^ online(new)}


def _has_due_work(state: _State, now: float) -> bool:
    if any(op.state == OperationState.RUNNING and op.due is not None and op.due <= now
           for op in state.operations.values()):
        return True
    return any(d.fails_at is not None and d.fails_at <= now and d.state == DeviceState.ONLINE
               for d in state.devices.values())


def _advance(state: _State, now: float) -> None:
    """Apply every transition whose time has come, in time order (so a virtual clock can jump far ahead)."""
    due_ops = sorted((op for op in state.operations.values()
                      if op.state == OperationState.RUNNING and op.due is not None and op.due <= now),
                     key=lambda op: (op.due, op.key))
    for op in due_ops:
        finished = _finish_attach(state, op) if op.kind == OperationKind.ATTACH else _finish_detach(state, op)
        state.operations[op.key] = finished
    for device in list(state.devices.values()):
        if device.fails_at is not None and device.fails_at <= now and device.state == DeviceState.ONLINE:
            state.devices[device.id] = replace(device, state=DeviceState.FAILED, fails_at=None)
    _prune(state, now)


def _finish_attach(state: _State, op: _Op) -> _Op:
    assert op.due is not None
    keep = len(op.held) if op.keep is None else op.keep
    attached, returned = op.held[:keep], op.held[keep:]
    fail_after = dict(op.fail_after)
    for device_id in attached:
        fails_at = op.due + fail_after[device_id] if device_id in fail_after else None
        state.devices[device_id] = replace(state.devices[device_id], state=DeviceState.ONLINE, attached_at=op.due,
                                           fails_at=fails_at)
    for device_id in returned:
        state.devices[device_id] = replace(state.devices[device_id], node=None, state=DeviceState.ONLINE,
                                           attached_at=None, fails_at=None, freed_at=op.due)
    result = replace(op, state=OperationState.SUCCEEDED, devices=attached, held=(), finished_at=op.due)
    if returned:
        message = (f"the fabric attached {len(attached)} of {op.requested} {op.model} to {op.node}"
                   if attached else f"the fabric failed to attach {op.model} to {op.node}")
        result = replace(result, state=OperationState.FAILED, error_code=ErrorCode.BACKEND, error_message=message)
    return result


def _finish_detach(state: _State, op: _Op) -> _Op:
    assert op.due is not None
    if op.detach_fails:
        for device_id in op.held:
            # It never left: back to what it was (a broken device stays broken).
            state.devices[device_id] = replace(state.devices[device_id], state=DeviceState.FAILED
                                               if device_id in op.were_failed else DeviceState.ONLINE)
        return replace(op, state=OperationState.FAILED, held=(), finished_at=op.due, error_code=ErrorCode.BACKEND,
                       error_message=f"the fabric failed to detach {len(op.held)} device(s) from {op.node}")
    for device_id in op.held:
        state.devices[device_id] = replace(state.devices[device_id], node=None, state=DeviceState.ONLINE,
                                           attached_at=None, fails_at=None, freed_at=op.due)
    return replace(op, state=OperationState.SUCCEEDED, devices=op.held, held=(), finished_at=op.due)


def _cancel_hung_attach(state: _State, device_id: str, detach_key: str, now: float) -> None:
    """A force-detach of a device a hung attach holds ends that attach; its other devices go back to the pool."""
    owner = _holder(state, device_id)
    assert owner is not None and owner.due is None
    for other in owner.held:
        if other != device_id and state.devices[other].state == DeviceState.ATTACHING:
            state.devices[other] = replace(state.devices[other], node=None, state=DeviceState.ONLINE, freed_at=now)
    state.operations[owner.key] = replace(owner, state=OperationState.FAILED, held=(), finished_at=now,
                                          error_code=ErrorCode.TIMEOUT,
                                          error_message=f"attach never completed; cancelled by detach {detach_key}")


def _prune(state: _State, now: float) -> None:
    finished = sorted((op for op in state.operations.values() if op.state.done),
                      key=lambda op: (op.finished_at or 0.0, op.key))
    too_many = max(0, len(finished) - MAX_FINISHED_OPERATIONS)
    for index, op in enumerate(finished):
        if index < too_many or (op.finished_at or 0.0) + FINISHED_RETENTION_SECONDS < now:
            del state.operations[op.key]


def _check_invariants(state: _State) -> None:
    problems: list[str] = []
    holders: dict[str, list[str]] = {}
    for op in state.operations.values():
        if op.state == OperationState.RUNNING:
            for device_id in op.held:
                holders.setdefault(device_id, []).append(op.key)
        elif op.held:
            problems.append(f"finished operation {op.key} still holds {op.held}")
    for device in state.devices.values():
        held_by = holders.get(device.id, [])
        if len(held_by) > 1:
            problems.append(f"device {device.id} is held by several operations: {held_by}")
        in_flight = device.state in (DeviceState.ATTACHING, DeviceState.DETACHING)
        if in_flight and not held_by:
            problems.append(f"device {device.id} is {device.state.value} but no running operation holds it")
        if held_by and not in_flight:
            problems.append(f"device {device.id} is {device.state.value} but operation {held_by[0]} holds it")
        if device.node is None and device.state != DeviceState.ONLINE:
            problems.append(f"free device {device.id} is {device.state.value}")
    for device_id in holders:
        if device_id not in state.devices:
            problems.append(f"operation holds unknown device {device_id}")
    by_pool: dict[tuple[str, str], Counter[str]] = {}
    for device in state.devices.values():
        bucket = by_pool.setdefault((device.pool, device.model), Counter())
        bucket["total"] += 1
        if device.node is None:
            bucket["free"] += 1
        elif device.state in (DeviceState.ATTACHING, DeviceState.DETACHING):
            bucket["in_flight"] += 1
        else:
            bucket["attached"] += 1
    for (pool, model), counts in by_pool.items():
        if counts["free"] + counts["attached"] + counts["in_flight"] != counts["total"]:
            problems.append(f"pool {pool} {model}: free {counts['free']} + attached {counts['attached']} + "
                            f"in flight {counts['in_flight']} != total {counts['total']}")
    if problems:
        raise InvariantViolation("; ".join(problems))
