"""What DDS does when a scale-up's GPUs cannot be had: the decision behind PlannerScaleUp after an attach failed, on
plain data (dds/controller/ca_requests.py carries it out: the retry, the node, or the failed instance CA is told of).

After an attach of an instance failed (the whole of it, or part: `missing` devices not attached):

| error (first failure)        | attempts left | action                                                              |
|------------------------------|---------------|---------------------------------------------------------------------|
| BackendError, Timeout        | yes           | retry what is missing on the same node after `retry_delay(attempt)` |
| SlotsFull                    | -             | a node instead, when the group has room and the pool can equip it   |
| OutOfResources               | -             | fail: instanceCreating + errorInfo class OutOfResources             |
| anything else / no attempts  | -             | fail: errorInfo class Other, with the last error                    |

Why no node for OutOfResources: a new node of the group draws its GPUs, the boot-time ones included, from the very pool
that is empty — it would come up without the GPUs the pods wait for, and CA would ask again for another. Reporting
OutOfResources lets CA back off (or try another group) instead; when devices free up, CA's next scale-up (or DDS's
case-2 loop) attaches them. A full node (SlotsFull) is the case a node does solve: its slots are empty.

The same rule judges a plan before anything is started (dds/planner/equip.py): new nodes that only GPU pods would use,
which the pool cannot equip, are not added; CA is told OutOfResources for them at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from dds.model.fabric_errors import ErrorCode

ATTACH_ATTEMPTS = 4  # the first try and up to three retries of what an instance's attaches did not attach
RETRY_BASE_SECONDS = 2.0
RETRY_MAX_SECONDS = 30.0
ERROR_CLASS_OUT_OF_RESOURCES = 1  # cloudprovider.OutOfResourcesErrorClass
ERROR_CLASS_OTHER = 99  # cloudprovider.OtherErrorClass


class AttachError(Protocol):
    """What the decision reads of a failed attach (a `dds.fabric.base.FabricError` is one)."""

    @property
    def code(self) -> ErrorCode: ...

    @property
    def message(self) -> str: ...


def retry_delay(attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (1 = the first retry): 2, 4, 8, ... up to 30.

    The same exponential backoff as the executor's retries of a refused call; those block, but a retry here cannot (an
    attach ends long after CA's RPC answered, and the control loop never sleeps), so the wait is computed and the retry
    scheduled by the caller."""
    if attempt < 1:
        raise ValueError(f"retry attempt numbers start at 1, got {attempt}")
    return float(min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** (attempt - 1)))


class Action(str, Enum):
    RETRY = "retry"
    NODE = "node"
    FAIL = "fail"


@dataclass(frozen=True)
class AfterFailure:
    action: Action
    code: ErrorCode
    message: str
    delay: float = 0.0  # RETRY: seconds before it
    error_class: int = ERROR_CLASS_OTHER  # FAIL: what CA reads from errorInfo


def after_attach_failure(error: AttachError, attempts: int, *, group_has_room: bool, pool_free: int,
                         gpus_for_new_node: int) -> AfterFailure:
    """The next step for an instance whose attach failed; `attempts` = tries made so far (1 after the first).

    `pool_free`: free devices of the group's pool and model now; `gpus_for_new_node`: what a new node would need from
    it (its boot-time GPUs, or the missing ones when more)."""
    if attempts < 1:
        raise ValueError(f"attempts counts the tries made so far, at least 1, got {attempts}")
    code = error.code
    if code.retryable and attempts < ATTACH_ATTEMPTS:
        delay = retry_delay(attempts)
        return AfterFailure(Action.RETRY, code, f"{error.message}; retry {attempts} of {ATTACH_ATTEMPTS - 1} in "
                                                f"{delay:g}s", delay=delay)
    if code == ErrorCode.SLOTS_FULL:
        if group_has_room and pool_free >= gpus_for_new_node:
            return AfterFailure(Action.NODE, code, f"{error.message}; adding a node instead (its slots are free)")
        why = "the group is at its max size" if not group_has_room else \
            f"the pool has {pool_free} free device(s), a new node needs {gpus_for_new_node}"
        return AfterFailure(Action.FAIL, code, f"{error.message}; no node instead: {why}",
                            error_class=ERROR_CLASS_OUT_OF_RESOURCES)
    if code == ErrorCode.OUT_OF_RESOURCES:
        return AfterFailure(Action.FAIL, code, f"{error.message}; no node instead: a new node would draw its GPUs "
                                               f"from the same pool", error_class=ERROR_CLASS_OUT_OF_RESOURCES)
    tries = f" after {attempts} attempt(s)" if code.retryable else ""
    return AfterFailure(Action.FAIL, code, f"attach failed{tries}: {error.message}")
