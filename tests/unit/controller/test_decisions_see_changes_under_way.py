"""A decision never misses a change that was under way while it read its snapshot (issue 38).

The interleaving CI hit under load on the CDI operator: the control loop's fast path had started an attach for a pod
(the executor counted the change, the write to the fabric was on its way) when CA's IncreaseSize for the same pod took
its snapshot; the snapshot did not show the attach yet and, the change having been counted before the snapshot, the
decision was not taken again before it acted: both attached a GPU for the one pod, 75 ms apart. Reproduced here step
by step with a fabric that holds an attach's write until the other decision has read its snapshot.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.controller.calls_first import CallsFirst
from dds.controller.executor import Executor
from dds.controller.loop import Controller
from dds.fabric.base import AttachRequest, Operation, OperationKind
from dds.fabric.simulated import SimulatedFabric
from dds.model.plan import Attach, Case
from dds.nodes.memory import MemoryProvisioner

WAIT_S = 10.0  # a bound against a hung test only: every step is released by the test itself
STEP = Attach(node="w1", pool="pool-a", model="A30", count=1, pods=("demo/retry-0",), reason="retry-0 fits on w1")


class HeldWrites(SimulatedFabric):
    """The simulated fabric, whose attach waits (once `hold` is set) between its call and its write."""

    def __init__(self, clock) -> None:
        super().__init__(SimulatedFabricSettings(pools=[PoolSpec(name="pool-a", devices={"A30": 4})],
                                                 attach_latency=LatencySpec(min=5.0, max=5.0),
                                                 detach_latency=LatencySpec(min=1.0, max=1.0),
                                                 faults=FaultSpec(seed=0)), clock=clock, persist=False)
        self.hold = False
        self.writing = threading.Event()
        self.write = threading.Event()

    def attach(self, request: AttachRequest) -> Operation:
        if self.hold:
            self.writing.set()
            assert self.write.wait(WAIT_S)
        return super().attach(request)


class Events:
    def emit(self, involved, event_type: str, reason: str, message: str) -> None:
        pass


def attaches_for_the_pod(fabric: SimulatedFabric) -> list[Operation]:
    return [op for op in fabric.operations() if op.kind == OperationKind.ATTACH and op.node == "w1"]


def test_a_decision_whose_snapshot_missed_an_attach_under_way_is_taken_again_before_it_acts():
    clock = lambda: 1000.0  # noqa: E731 - nothing here waits on time
    fabric = HeldWrites(clock)
    executor = Executor(fabric, MemoryProvisioner(clock), Events())
    controller = SimpleNamespace(calls_first=CallsFirst(), executor=executor, _lock=threading.RLock())
    decide_then_act = Controller.decide_then_act.__get__(controller)
    fabric.hold = True

    def fast_path_pass() -> None:  # the loop acts under the planning lock, as Controller._pass does
        with controller._lock:
            executor.attach(STEP, "fast-path/1/0", Case.FAST_PATH)

    loop = threading.Thread(target=fast_path_pass)
    loop.start()
    assert fabric.writing.wait(WAIT_S), "the fast path's attach did not reach the fabric"

    snapshots: list[int] = []
    read = threading.Event()

    def decide() -> bool:  # CA's IncreaseSize: attach for the pod unless an attach for it is on its way
        on_its_way = len(attaches_for_the_pod(fabric))
        snapshots.append(on_its_way)
        read.set()
        return on_its_way == 0

    started: list[str] = []

    def act(attach: bool) -> None:
        if attach:
            started.append(executor.attach(STEP, "increase/1#0", Case.SCALE_UP).key)

    ca = threading.Thread(target=lambda: decide_then_act(decide, act))
    ca.start()
    assert read.wait(WAIT_S)
    assert snapshots == [0], "CA's first snapshot was to be read while the fast path's write was on its way"
    fabric.hold = False
    fabric.write.set()
    loop.join(WAIT_S)
    ca.join(WAIT_S)
    assert not loop.is_alive() and not ca.is_alive()

    assert snapshots == [0, 1], "the decision was not taken again on a snapshot showing the attach"
    assert started == [], "CA's call attached a second GPU for the pod"
    assert [op.key for op in attaches_for_the_pod(fabric)] == ["fast-path/1/0"]


def test_a_decision_taken_after_every_change_has_been_written_is_not_taken_again():
    clock = lambda: 1000.0  # noqa: E731
    fabric = HeldWrites(clock)
    executor = Executor(fabric, MemoryProvisioner(clock), Events())
    executor.attach(STEP, "fast-path/1/0", Case.FAST_PATH)
    mark = executor.mark()
    assert not executor.changed_since(mark)
    executor.attach(STEP, "fast-path/2/0", Case.FAST_PATH)
    assert executor.changed_since(mark)
