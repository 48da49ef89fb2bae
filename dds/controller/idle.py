"""Idleness is a duration: remember since when each node has had an idle GPU, and since when it has held no work.

Kept across loops by the controller (and rebuilt after a restart from scratch, which only delays a scale-down: the safe
direction).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional


@dataclass(frozen=True, slots=True)
class NodeUsage:
    name: str
    fabric_gpus: int  # devices attached through the fabric and online
    used_gpus: int  # GPUs requested by pods bound to the node
    has_work: bool  # any pod that is not a DaemonSet or mirror pod
    spare_cxl_chunks: int = 0  # CXL memory chunks attached that the node's pods' requests do not need


@dataclass
class IdleTracker:
    _gpus_idle_since: dict[str, float] = field(default_factory=dict)
    _empty_since: dict[str, float] = field(default_factory=dict)
    _cxl_idle_since: dict[str, float] = field(default_factory=dict)
    # CA's calls and the loop observe concurrently (they decide outside the controller's lock).
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def observe(self, usages: Iterable[NodeUsage], now: float) -> None:
        with self._lock:
            self._observe(usages, now)

    def _observe(self, usages: Iterable[NodeUsage], now: float) -> None:
        seen = set()
        for usage in usages:
            seen.add(usage.name)
            if usage.fabric_gpus > usage.used_gpus:
                self._gpus_idle_since.setdefault(usage.name, now)
            else:
                self._gpus_idle_since.pop(usage.name, None)
            if usage.has_work:
                self._empty_since.pop(usage.name, None)
            else:
                self._empty_since.setdefault(usage.name, now)
            if usage.spare_cxl_chunks:
                self._cxl_idle_since.setdefault(usage.name, now)
            else:
                self._cxl_idle_since.pop(usage.name, None)
        for gone in set(self._gpus_idle_since) - seen:
            del self._gpus_idle_since[gone]
        for gone in set(self._cxl_idle_since) - seen:
            del self._cxl_idle_since[gone]
        for gone in set(self._empty_since) - seen:
            del self._empty_since[gone]

    def gpus_idle_since(self, node: str) -> Optional[float]:
        return self._gpus_idle_since.get(node)

    def empty_since(self, node: str) -> Optional[float]:
        return self._empty_since.get(node)

    def cxl_idle_since(self, node: str) -> Optional[float]:
        """Since when the node has had CXL memory chunks its pods' requests do not need."""
        return self._cxl_idle_since.get(node)

    def lookups(self) -> tuple[Callable[[str], Optional[float]], Callable[[str], Optional[float]]]:
        """`gpus_idle_since` and `empty_since` as plain lookups, for a walk over thousands of nodes."""
        return self._gpus_idle_since.get, self._empty_since.get

    def reset(self, node: str) -> None:
        """After acting on a node, idleness starts over (a detach that is still running must not be repeated)."""
        with self._lock:
            self._gpus_idle_since.pop(node, None)
            self._cxl_idle_since.pop(node, None)

    def as_dict(self) -> Mapping[str, Mapping[str, float]]:
        with self._lock:
            return {"gpus_idle_since": dict(self._gpus_idle_since), "empty_since": dict(self._empty_since)}
