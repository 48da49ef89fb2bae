"""The kinds of "no" a fabric answers with, shared by the fabric backends that report them (dds/fabric) and the
planner that decides what to do after one (dds/planner/attach_failures.py)."""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    OUT_OF_RESOURCES = "OutOfResources"  # the pool has too few free devices of the model
    SLOTS_FULL = "SlotsFull"  # the node has no free slot
    DEVICE_IN_USE = "DeviceInUse"  # detach refused: the device is in use and force was not set
    TIMEOUT = "Timeout"
    NOT_FOUND = "NotFound"  # unknown node, device, pool or operation
    INVALID = "Invalid"  # a request the backend can never accept
    BACKEND = "BackendError"  # anything else the backend reported; usually transient

    @property
    def retryable(self) -> bool:
        return self in (ErrorCode.TIMEOUT, ErrorCode.BACKEND)
