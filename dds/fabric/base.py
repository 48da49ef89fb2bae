"""The one small interface every fabric backend implements (simulated, ComposabilityRequest, Redfish).

Operations are asynchronous: `attach`/`detach` return at once with an `Operation` and the backend progresses on its own;
callers poll `operation(key)`. Every call carries an idempotency key: repeating a call with the same key returns the same
operation and never acts twice (this is what makes CA's retries and DDS restarts safe). Errors are data (`FabricError`)
on the operation, or raised as `FabricError` only for a call that could not be accepted at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Mapping, Optional, Protocol, Sequence, Union, runtime_checkable

from dds.model.fabric_errors import ErrorCode  # the backends' codes; the planner reads them too

__all__ = ["AttachRequest", "DetachRequest", "DeviceState", "ErrorCode", "Fabric", "FabricDevice", "FabricError",
           "Operation", "OperationKind", "OperationState", "PoolState", "ResumableFabric"]


class OperationKind(str, Enum):
    ATTACH = "attach"
    DETACH = "detach"


class OperationState(str, Enum):
    PENDING = "pending"  # accepted, nothing done yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # see error; devices listed are the ones that did get attached/detached

    @property
    def done(self) -> bool:
        return self in (OperationState.SUCCEEDED, OperationState.FAILED)


class FabricError(Exception):
    def __init__(self, code: ErrorCode, message: str):
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class DeviceState(str, Enum):
    ATTACHING = "attaching"
    ONLINE = "online"
    DETACHING = "detaching"
    FAILED = "failed"  # attached but broken (e.g. failed after attach): needs replacement


@dataclass(frozen=True, slots=True)
class FabricDevice:
    id: str
    model: str
    pool: str
    node: Optional[str]  # None = free in the pool
    state: DeviceState = DeviceState.ONLINE
    attached_at: Optional[float] = None
    # The device's own identity where the backend's id is another (a ComposableResource's name): the GPU UUID the
    # node's driver publishes, so a vendor DRA driver's devices can be told apart by fabric device.
    serial: Optional[str] = None


@dataclass(frozen=True, slots=True)
class PoolState:
    name: str
    total: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # model -> devices
    free: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class AttachRequest:
    key: str  # idempotency key
    node: str
    pool: str
    model: str
    count: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DetachRequest:
    key: str
    node: str
    device_ids: tuple[str, ...]
    force: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Operation:
    key: str
    kind: OperationKind
    node: str
    state: OperationState
    requested: int
    model: str = ""
    pool: str = ""
    devices: tuple[str, ...] = ()  # devices attached (attach) or released (detach) so far
    error: Optional[FabricError] = None
    started_at: float = 0.0
    finished_at: Optional[float] = None


@runtime_checkable
class Fabric(Protocol):
    """What DDS needs from a composable fabric."""

    name: str

    def pools(self) -> tuple[PoolState, ...]: ...

    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        """Devices attached (or attaching/detaching) to `node`, or to any node when None."""
        ...

    def attach(self, request: AttachRequest) -> Operation: ...

    def detach(self, request: DetachRequest) -> Operation: ...

    def operation(self, key: str) -> Optional[Operation]: ...

    def operations(self) -> tuple[Operation, ...]:
        """Operations the backend still knows (in flight and recently finished): how DDS resumes after a restart."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class BatchAttachFabric(Protocol):
    """A backend that can accept several attaches in one transaction: a burst of pending pods (a plan of dozens of
    attaches, which CA's IncreaseSize must answer within its deadline) costs one durable write instead of one each."""

    def attach_many(self, requests: Sequence[AttachRequest]) -> list[Union[Operation, FabricError]]:
        """One result per request, in order: its operation (as `attach` answers it), or the error that refused it
        alone. Raises FabricError only when the transaction as a whole failed (nothing was accepted)."""
        ...


@runtime_checkable
class ResumableFabric(Protocol):
    """A backend that keeps its state outside the process (simulated manager, Redfish operation log) and caches it.

    A standby DDS replica reads that state when it starts; when it becomes the leader it calls `resync()` to read it again,
    so it resumes what the previous leader did instead of planning on the state of its own start.
    """

    def resync(self) -> None: ...
