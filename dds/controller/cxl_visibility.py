"""The wait for a node to report the CXL memory attached to it, with an end.

A chunk the fabric has online shows in the node's memory only once the node's kernel has onlined it and its kubelet
has published it (docs/cxl-memory.md: kubelet v1.36 reads memory at start only). Meanwhile the observer counts it as
on its way (dds/controller/observe.py), so nothing is ordered twice. This keeps that wait bounded: a node still not
reporting memory that has been online for `bound_seconds` gets one Warning Event `CXLMemoryNotShown` and a log line
saying what the node must run, and one Normal Event `CXLMemoryShown` when it finally reports it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from dds.model.events import NORMAL, WARNING, EventRecorder
from dds.model.quantity import human_amount
from dds.model.snapshot import Snapshot
from dds.scaling.node_actions import node_ref

log = logging.getLogger(__name__)

NOT_SHOWN = "CXLMemoryNotShown"
SHOWN = "CXLMemoryShown"


def unreported_chunks(snapshot: Snapshot) -> dict[str, tuple[int, int]]:
    """Per node: (chunks online that its memory does not show, the chunk size)."""
    out = {}
    for node in snapshot.nodes:
        group = snapshot.group(node.group_id) if node.group_id else None
        if group is None or not group.cxl_memory_chunk or not node.cxl_chunks:
            continue
        reported = max(0, (node.allocatable.memory - group.memory) // group.cxl_memory_chunk)
        missing = len(node.cxl_chunks) - reported
        if missing > 0:
            out[node.name] = (missing, group.cxl_memory_chunk)
    return out


@dataclass
class MemoryVisibility:
    events: EventRecorder
    bound_seconds: float
    _since: dict[str, float] = field(default_factory=dict)
    _told: set[str] = field(default_factory=set)

    def check(self, snapshot: Snapshot) -> None:
        waiting = unreported_chunks(snapshot)
        for name in set(self._since) - set(waiting):
            del self._since[name]
            if name in self._told:
                self._told.discard(name)
                self.events.emit(node_ref(name), NORMAL, SHOWN, f"{name} now reports the CXL memory attached to it")
        for name, (missing, chunk) in sorted(waiting.items()):
            since = self._since.setdefault(name, snapshot.now)
            waited = snapshot.now - since
            if waited < self.bound_seconds or name in self._told:
                continue
            self._told.add(name)
            message = (f"{name} has not reported {human_amount('memory', missing * chunk)} of CXL memory online on "
                       f"the fabric for {waited:.0f}s (bound {self.bound_seconds:g}s): pods counting on it stay "
                       f"Pending; the node's kernel must online it and its kubelet publish it (a kubelet reads memory "
                       f"at start unless built with KEP-3953's NodeResourceHotPlug): docs/cxl-memory.md")
            log.warning("%s", message)
            self.events.emit(node_ref(name), WARNING, NOT_SHOWN, message)
