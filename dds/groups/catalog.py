"""The node groups served to cluster-autoscaler: the last good groups a source (dds/groups/sources.py) gave, re-read
on `refresh()`; a malformed group is reported once (log line, Event, metric) and skipped, and a source that cannot be
read at all keeps the last good groups.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Optional, Sequence

from dds import metrics
from dds.groups.schema import GroupConfigError
from dds.groups.sources import NodeGroupSource, SourceUnavailable
from dds.model.events import WARNING, EventRecorder, ObjectRef
from dds.model.groups import NodeGroupSpec

log = logging.getLogger(__name__)


# --- the catalog: last good groups, errors reported once ---

CAPI_KINDS = ("MachineSet", "MachineDeployment")

def _event_target(error: GroupConfigError) -> ObjectRef:
    source = error.source
    return ObjectRef(kind=source.kind, name=source.name, namespace=source.namespace,
                     api_version=source.api_version or ("cluster.x-k8s.io/v1beta2" if source.kind in CAPI_KINDS else "v1"),
                     uid=source.uid)


@dataclass
class NodeGroupCatalog:
    """The groups served to CA. `refresh()` re-reads the source: a transient failure keeps the last good groups, a
    malformed group is reported once (until its definition changes) and skipped."""

    source: NodeGroupSource
    events: EventRecorder
    _groups: tuple[NodeGroupSpec, ...] = ()
    _reported: frozenset[GroupConfigError] = frozenset()
    _lock: threading.Lock = field(default_factory=threading.Lock)
    last_error: Optional[str] = None  # why the last refresh kept the previous groups

    def groups(self) -> tuple[NodeGroupSpec, ...]:
        return self._groups

    def group(self, group_id: str) -> Optional[NodeGroupSpec]:
        return next((s for s in self._groups if s.id == group_id), None)

    def refresh(self) -> bool:
        """True when the source was read (even if some groups were malformed)."""
        try:
            result = self.source.read()
        except SourceUnavailable as exc:
            with self._lock:
                self.last_error = str(exc)
            log.warning("node groups not re-read, keeping the %d last good group(s): %s", len(self._groups), exc)
            return False
        self._report(result.errors)
        with self._lock:
            previous = {s.id for s in self._groups}
            self._groups = result.groups
            self.last_error = None
        current = {s.id for s in result.groups}
        for added in sorted(current - previous):
            log.info("serving node group %s", added)
        for removed in sorted(previous - current):
            log.info("node group %s is no longer served", removed)
        metrics.NODE_GROUPS.set(len(result.groups))
        return True

    def _report(self, errors: Sequence[GroupConfigError]) -> None:
        current = frozenset(errors)
        for error in sorted(current - self._reported, key=lambda e: (e.group_id, e.key)):
            log.warning("not serving %s (%s)", error.describe(), error.reason)
            metrics.NODE_GROUP_CONFIG_ERRORS.labels(self.source.kind, error.reason).inc()
            try:
                self.events.emit(_event_target(error), WARNING, "InvalidNodeGroup",
                                 f"{error.key}: {error.message}; the group is not served until this is fixed")
            except Exception as exc:  # an Event is best effort: never let it stop the other groups
                log.warning("could not record an Event for %s: %s", error.describe(), exc)
        self._reported = current
