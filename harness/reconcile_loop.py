"""A stand-in for a controller that runs outside DDS (the CDI operator, the servers' device plugins): `reconcile_once`
every `poll_interval_s` on a daemon thread, a failed pass logged and the next one started from a fresh read."""

from __future__ import annotations

import logging
import threading
from typing import Optional, TypeVar

log = logging.getLogger(__name__)

Self = TypeVar("Self", bound="ReconcileLoop")


class ReconcileLoop:
    def __init__(self, name: str, poll_interval_s: float) -> None:
        self._loop_name = name
        self._poll = poll_interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def reconcile_once(self) -> None:
        raise NotImplementedError

    def start(self: Self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self._loop_name, daemon=True)
        self._thread.start()
        return self

    def run_forever(self) -> None:
        """Passes in the calling thread until stop() (a program whose only work this loop is)."""
        self._run()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self: Self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception:  # the next pass starts from a fresh read (the apiserver may be restarting)
                log.exception("%s: pass failed", self._loop_name)
            self._stop.wait(self._poll)
