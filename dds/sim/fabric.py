"""The fabric as the trace simulator sees it: the `Fabric` protocol, on virtual time.

`build_sim_fabric` returns the production simulated backend (`dds.fabric.simulated.SimulatedFabric`) when it is
installed, driven by the simulator's virtual clock with fixed latencies and no faults. Without it, `LatencyFabric`
models the one thing the simulator needs from a fabric — devices that move between a pool and nodes after a fixed
latency — behind the same protocol, so the engine code is the same either way. `LatencyFabric` does not model faults,
partial attaches or persistence: those belong to the fabric's own tests, not to policy comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, Optional, Sequence

from dds.config import PoolSpec
from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, Fabric, FabricDevice, FabricError,
                             Operation, OperationKind, OperationState, PoolState)

Clock = Callable[[], float]


@dataclass
class _Device:
    id: str
    model: str
    pool: str
    node: Optional[str] = None
    state: DeviceState = DeviceState.ONLINE
    attached_at: Optional[float] = None
    freed_at: float = 0.0  # when it last returned to the pool (the pool hands out the longest-free device first)


@dataclass
class _Op:
    operation: Operation
    due: float
    device_ids: tuple[str, ...] = field(default_factory=tuple)


class LatencyFabric:
    """Pools of devices; an attach or detach completes `latency` seconds of virtual time after it was accepted."""

    name = "sim-latency"

    def __init__(self, pools: Sequence[PoolSpec], clock: Clock, attach_latency_s: float,
                 detach_latency_s: float) -> None:
        self._clock = clock
        self._attach_latency = attach_latency_s
        self._detach_latency = detach_latency_s
        self._slots = {p.name: p.max_slots_per_node for p in pools}
        self._devices: dict[str, _Device] = {}
        for pool in pools:
            for model, count in sorted(pool.devices.items()):
                for index in range(count):
                    device_id = f"{pool.name}/{model}-{index:03d}"
                    self._devices[device_id] = _Device(device_id, model, pool.name)
        self._ops: dict[str, _Op] = {}

    # --- queries: progress is computed from the clock first, so any caller sees the present ---
    def pools(self) -> tuple[PoolState, ...]:
        self.tick()
        out = []
        for pool in sorted({d.pool for d in self._devices.values()}):
            total: dict[str, int] = {}
            free: dict[str, int] = {}
            for device in self._devices.values():
                if device.pool != pool:
                    continue
                total[device.model] = total.get(device.model, 0) + 1
                if device.node is None:
                    free[device.model] = free.get(device.model, 0) + 1
            out.append(PoolState(pool, MappingProxyType(total), MappingProxyType(free)))
        return tuple(out)

    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        self.tick()
        return tuple(FabricDevice(d.id, d.model, d.pool, d.node, d.state, d.attached_at)
                     for d in self._devices.values() if d.node is not None and (node is None or d.node == node))

    def operation(self, key: str) -> Optional[Operation]:
        self.tick()
        op = self._ops.get(key)
        return op.operation if op else None

    def operations(self) -> tuple[Operation, ...]:
        self.tick()
        return tuple(op.operation for op in self._ops.values())

    # --- changes ---
    def attach(self, request: AttachRequest) -> Operation:
        existing = self._ops.get(request.key)
        if existing is not None:
            return existing.operation
        if request.count <= 0:
            raise FabricError(ErrorCode.INVALID, f"attach to {request.node}: count must be positive")
        now = self._clock()
        free = sorted((d for d in self._devices.values()
                       if d.pool == request.pool and d.model == request.model and d.node is None),
                      key=lambda d: (d.freed_at, d.id))
        if len(free) < request.count:
            raise FabricError(ErrorCode.OUT_OF_RESOURCES,
                              f"pool {request.pool} has {len(free)} free {request.model}, {request.count} asked")
        limit = self._slots.get(request.pool)
        on_node = sum(1 for d in self._devices.values() if d.node == request.node)
        if limit is not None and on_node + request.count > limit:
            raise FabricError(ErrorCode.SLOTS_FULL, f"{request.node} has {limit - on_node} free slot(s) in "
                                                    f"pool {request.pool}, {request.count} asked")
        chosen = free[:request.count]
        for device in chosen:
            device.node, device.state, device.attached_at = request.node, DeviceState.ATTACHING, None
        operation = Operation(key=request.key, kind=OperationKind.ATTACH, node=request.node,
                              state=OperationState.RUNNING, requested=request.count, model=request.model,
                              pool=request.pool, started_at=now)
        self._ops[request.key] = _Op(operation, now + self._attach_latency, tuple(d.id for d in chosen))
        self.tick()
        return self._ops[request.key].operation

    def detach(self, request: DetachRequest) -> Operation:
        existing = self._ops.get(request.key)
        if existing is not None:
            return existing.operation
        now = self._clock()
        devices = []
        for device_id in request.device_ids:
            device = self._devices.get(device_id)
            if device is None or device.node != request.node or device.state != DeviceState.ONLINE:
                raise FabricError(ErrorCode.NOT_FOUND, f"device {device_id} is not online on {request.node}")
            devices.append(device)
        if not devices:
            raise FabricError(ErrorCode.INVALID, f"detach from {request.node}: no device ids")
        for device in devices:
            device.state = DeviceState.DETACHING
        first = devices[0]
        operation = Operation(key=request.key, kind=OperationKind.DETACH, node=request.node,
                              state=OperationState.RUNNING, requested=len(devices), model=first.model,
                              pool=first.pool, started_at=now)
        self._ops[request.key] = _Op(operation, now + self._detach_latency, tuple(d.id for d in devices))
        self.tick()
        return self._ops[request.key].operation

    def tick(self) -> None:
        now = self._clock()
        for op in self._ops.values():
            if op.operation.state.done or op.due > now:
                continue
            for device_id in op.device_ids:
                device = self._devices[device_id]
                if op.operation.kind == OperationKind.ATTACH:
                    device.state, device.attached_at = DeviceState.ONLINE, op.due
                else:
                    device.node, device.state, device.attached_at, device.freed_at = (
                        None, DeviceState.ONLINE, None, op.due)
            op.operation = replace(op.operation, state=OperationState.SUCCEEDED, devices=op.device_ids,
                                   finished_at=op.due)

    def forget_finished(self) -> None:
        """Drop finished operations (the simulator has read them); keeps long runs from growing without bound."""
        self._ops = {k: op for k, op in self._ops.items() if not op.operation.state.done}

    def close(self) -> None:
        self._ops.clear()


def build_sim_fabric(pools: Sequence[PoolSpec], clock: Clock, attach_latency_s: float,
                     detach_latency_s: float) -> Fabric:
    return LatencyFabric(pools, clock, attach_latency_s, detach_latency_s)
