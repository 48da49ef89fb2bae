"""The garbage collector with a large cluster in memory.

The watch cache holds every pod and node as small frozen objects: at 50,000 pods, millions of them, none of which ever
forms a reference cycle. CPython's cyclic collector still walks every one of them on each full (oldest generation)
collection, a few hundred milliseconds at that size, at moments it chooses: inside a cluster-autoscaler call as often
as anywhere. `gc.freeze()` moves what is alive into a generation the collector never walks, so a full collection then
costs what was created since. Objects frozen are still freed when their last reference goes; only a cycle among them
would wait for the next thaw, which the hourly thaw bounds.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any, Callable

log = logging.getLogger(__name__)


class HeapKeeper:
    """Freeze what is alive after the cache's first LIST and every few minutes after; thaw and collect fully hourly."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, freeze_every_seconds: float = 300.0,
                 thaw_every_seconds: float = 3600.0) -> None:
        self._clock = clock
        self._freeze_every = freeze_every_seconds
        self._thaw_every = thaw_every_seconds
        self._frozen_at = self._thawed_at = clock()

    def settle(self, thaw: bool = False) -> None:
        started = time.perf_counter()
        if thaw:
            gc.unfreeze()
            self._thawed_at = self._clock()
        collected = gc.collect()  # what is garbage now is freed, not frozen
        gc.freeze()
        self._frozen_at = self._clock()
        log.debug("heap: %d objects frozen, %d collected%s in %.0f ms", gc.get_freeze_count(), collected,
                  " after a thaw" if thaw else "", 1000 * (time.perf_counter() - started))

    def on_pass(self, _observation: Any = None) -> None:
        """A control-loop listener: outside CA's calls, which is where a long collection should happen if anywhere."""
        now = self._clock()
        if now - self._thawed_at >= self._thaw_every:
            self.settle(thaw=True)
        elif now - self._frozen_at >= self._freeze_every:
            self.settle()
