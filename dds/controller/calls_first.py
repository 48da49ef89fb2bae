"""cluster-autoscaler's calls before the control loop's work.

CA's externalgrpc calls carry a deadline (5 s by default) and CA waits on each; the loop has none. Both are Python
threads of one process, so a pass that plans while a call plans shares the interpreter with it and stretches the call
by what the pass has left to do: at 5,000 nodes a pass is a third of a second of planning, as much as the call itself.
So a call announces itself while it decides and acts, and the loop waits at the boundaries of its steps (before
observing, before planning, before acting) until no call is under way. The wait is bounded: a stream of calls
delays a pass, never stops it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class CallsFirst:
    def __init__(self, longest_wait_seconds: float = 5.0) -> None:
        self._changed = threading.Condition()
        self._calls = 0
        self._longest_wait = longest_wait_seconds

    @contextmanager
    def call(self) -> Iterator[None]:
        """Held by one of CA's calls while it decides and acts."""
        with self._changed:
            self._calls += 1
        try:
            yield
        finally:
            with self._changed:
                self._calls -= 1
                if not self._calls:
                    self._changed.notify_all()

    def under_way(self) -> int:
        return self._calls

    def wait_for_calls(self) -> float:
        """Blocks until no call is under way, or the longest wait has passed; the seconds it waited."""
        started = time.monotonic()
        with self._changed:
            self._changed.wait_for(lambda: not self._calls, timeout=self._longest_wait)
        return time.monotonic() - started
