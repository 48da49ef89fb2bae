"""One way to carry out planned steps. Every attach and detach the controller starts — for CA's scale-up and
scale-down (cases 1 and 3), the fast path, warm headroom and idle GPUs (cases 2 and 4), repairs and orphan reclaims —
goes through `Actions`: an idempotency key per step, the executor (the fabric call with its Events, metrics and crash
points), and the watcher that follows the operation to its end. What is decided stays with the planner; who asked is
the `case` and the key prefix. `dds simulate` carries out its plans through the same `Actions` (dds/sim/engine.py), on
the simulated fabric and a virtual clock.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

from dds.controller.executor import Executor, OperationWatcher
from dds.crashpoints import crashpoint
from dds.fabric.base import FabricError, Operation
from dds.planner.plan import Attach, Case, Detach

OnDone = Callable[[Operation], None]
_LOOP_OWN = (Case.FAST_PATH, Case.WARM_HEADROOM)  # the attaches the loop starts without CA asking


class Actions:
    def __init__(self, executor: Executor, watcher: OperationWatcher) -> None:
        self.executor = executor
        self.watcher = watcher

    def attach(self, step: Attach, key: str, case: Case, on_done: Optional[OnDone] = None) -> Operation:
        """Start one attach and follow it; raises FabricError when the fabric refuses it outright (the executor has
        already told the node's Events and the metrics)."""
        operation = self.executor.attach(step, key=key, case=case)
        self.watcher.watch(operation, on_done=on_done)
        return operation

    def attach_all(self, steps: Sequence[Attach], key_prefix: str, case: Case) -> list[tuple[Attach, Operation]]:
        """Start every attach; one the fabric refuses is skipped (the planner sees the pod again next pass). Returns
        the steps started, each with its operation."""
        keyed = [(step, f"{key_prefix}/{index}") for index, step in enumerate(steps)]
        return [(step, operation) for (step, _), operation in zip(keyed, self.attach_keyed(keyed, case))
                if isinstance(operation, Operation)]

    def attach_keyed(self, steps: Sequence[tuple[Attach, str]], case: Case,
                     on_done: Sequence[Optional[OnDone]] = ()) -> list[Union[Operation, FabricError]]:
        """Start several attaches at once (one transaction where the fabric has them: a burst is one write), each
        with its key and optional `on_done`, and follow those started. One result per step, in order: its operation,
        or the error that refused it (told by the executor)."""
        results = self.executor.attach_all(steps, case)
        for index, result in enumerate(results):
            if isinstance(result, Operation):
                self.watcher.watch(result, on_done=on_done[index] if index < len(on_done) else None)
                if case in _LOOP_OWN:
                    crashpoint("loop.attach-started")
        return results

    def detach(self, step: Detach, key: str, case: Case, on_done: Optional[OnDone] = None) -> Optional[Operation]:
        """Start one detach and follow it; None when the fabric refused it (told by the executor)."""
        operation = self.executor.detach(step, key=key, case=case)
        if operation is not None:
            self.watcher.watch(operation, on_done=on_done)
        return operation
