"""Where a fabric backend keeps the state that must outlive a DDS process.

A backend that DDS itself drives step by step (the simulated CDI manager, the Redfish client's operation log) writes its
state here *before* it acknowledges an operation, so a DDS killed with SIGKILL and started again finds every operation it
acknowledged and resumes it: each device ends up attached exactly once or not at all.

Writes are compare-and-swap on an opaque version string (optimistic concurrency): `save(document, expected_version)`
fails with `StateConflict` when someone else wrote in between, and the caller re-reads and re-applies its change.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Optional, Protocol, runtime_checkable

Document = dict[str, Any]


from dds.kube.configmap import StateConflict, StateStoreError  # noqa: E402 (one definition for every store)

__all__ = ["Document", "FabricStateStore", "InMemoryFabricStateStore", "StateConflict", "StateStoreError"]


@runtime_checkable
class FabricStateStore(Protocol):
    def describe(self) -> str:
        """Where the state lives, for log and error messages."""
        ...

    def load(self) -> tuple[Optional[Document], Optional[str]]:
        """The stored document and its version; (None, None) when nothing was stored yet."""
        ...

    def save(self, document: Document, expected_version: Optional[str]) -> str:
        """Store `document` if the stored version is still `expected_version` (None: nothing stored yet).

        Returns the new version. Raises StateConflict when the version moved, StateStoreError when the store failed.
        """
        ...


class InMemoryFabricStateStore:
    """A process-local store: survives a new backend instance in the same process (tests, the trace simulator)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._document: Optional[Document] = None
        self._version = 0
        self.saves = 0  # how many writes succeeded: tests use it to check that queries do not write

    def describe(self) -> str:
        return "in-memory fabric state"

    def load(self) -> tuple[Optional[Document], Optional[str]]:
        with self._lock:
            if self._document is None:
                return None, None
            return copy.deepcopy(self._document), str(self._version)

    def save(self, document: Document, expected_version: Optional[str]) -> str:
        with self._lock:
            current = None if self._document is None else str(self._version)
            if current != expected_version:
                raise StateConflict(f"{self.describe()}: version is {current}, expected {expected_version}")
            self._document = copy.deepcopy(document)
            self._version += 1
            self.saves += 1
            return str(self._version)
