"""Where decisions are reported to users: a Kubernetes Event on the object involved (dds/kube/events.py implements it;
tests and the no-cluster mode use `LogEventRecorder`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str  # Pod, Node, MachineSet, ComposabilityRequest, ...
    name: str
    namespace: str = ""
    api_version: str = "v1"
    uid: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


class EventRecorder(Protocol):
    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None: ...


class LogEventRecorder:
    """Events as log lines (no cluster)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("dds.events")

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        level = logging.WARNING if event_type == WARNING else logging.INFO
        self._log.log(level, "%s %s: %s", involved.describe(), reason, message,
                      extra={"event_reason": reason, "object": involved.describe()})
