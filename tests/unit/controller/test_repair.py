"""GPUs that fail while attached (dds/controller/repair.py): the failed device goes back to the fabric, the node gets a
replacement for the work bound to it, and the failure is counted — driven through the controller's `Actions` (the
real executor and operation watcher) on the real simulated fabric and a fake clock."""

from __future__ import annotations

from dataclasses import replace

from dds import metrics
from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.controller.apply import Actions
from dds.controller.executor import Executor, OperationWatcher
from dds.controller.observe import Observation
from dds.controller.repair import DEVICE_FAILED, DeviceRepair
from dds.controller.devices import devices_by_node
from dds.fabric.base import AttachRequest, DeviceState
from dds.fabric.simulated import SimulatedFabric
from dds.nodes.memory import MemoryProvisioner
from tests.unit.controller.node_writes import NodesInMemory
from dds.planner.shortfalls import gpu_shortfalls
from dds.model.snapshot import PoolInfo, Snapshot
from tests.unit.planner.builders import make_group, make_node, make_pod


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    def emit(self, involved, event_type: str, reason: str, message: str) -> None:
        self.seen.append((f"{involved.kind}/{involved.name}", event_type, reason, message))


def test_a_failed_gpu_is_detached_replaced_and_counted():
    clock, events = Clock(), Events()
    settings = SimulatedFabricSettings(
        pools=[PoolSpec(name="pool-a", devices={"A30": 4})], attach_latency=LatencySpec(min=1.0, max=1.0),
        detach_latency=LatencySpec(min=1.0, max=1.0),
        faults=FaultSpec(device_failure_after_attach=1.0, max_faults=1, seed=7))
    fabric = SimulatedFabric(settings, clock=clock, persist=False)
    fabric.attach(AttachRequest(key="boot", node="w1", pool="pool-a", model="A30", count=2))
    clock.now += 5.0  # attached after 1 s, failed 1 s later (the fault's delay is drawn from the attach latency)
    assert [d.state for d in fabric.devices("w1")].count(DeviceState.FAILED) == 1
    assert fabric.faults_injected() == {"device_failure_after_attach": 1}

    executor = Executor(fabric, MemoryProvisioner(clock), events)
    watcher = OperationWatcher(fabric, events, clock)
    repair = DeviceRepair(fabric, Actions(executor, watcher, NodesInMemory()), events, clock)
    before = metrics.FABRIC_ERRORS.labels("simulated", "device", DEVICE_FAILED)._value.get()

    def observe() -> Observation:
        online = devices_by_node(fabric.devices()).online.get("w1", [])
        attaching = sum(op.requested - len(op.devices) for op in fabric.operations()
                        if op.kind.value == "attach" and not op.state.done)
        node = replace(make_node("w1", gpus=0), devices=tuple(online), attaching=attaching)
        return Observation(Snapshot(now=clock.now, nodes=(node,), groups=(make_group(initial_gpus=1),),
                                    pods=(make_pod("train", gpus=2, node="w1"),),
                                    pools=(PoolInfo("pool-a", {"A30": 2}),)))

    repair.run(observe())
    assert metrics.FABRIC_ERRORS.labels("simulated", "device", DEVICE_FAILED)._value.get() == before + 1
    assert any(reason == "GPUFailed" and kind == "Warning" for _, kind, reason, _ in events.seen)
    clock.now += 3.0
    watcher.poll()
    repair.run(observe())  # the same failure is not counted twice
    clock.now += 3.0
    watcher.poll()
    states = sorted(d.state.value for d in fabric.devices("w1"))
    assert states == ["online", "online"], states  # the failed one went back, a replacement came
    assert metrics.FABRIC_ERRORS.labels("simulated", "device", DEVICE_FAILED)._value.get() == before + 1
    pool = fabric.pools()[0]
    assert (pool.total["A30"], pool.free["A30"]) == (4, 2)  # nothing leaked


def test_a_node_short_of_gpus_for_another_reason_is_left_alone():
    # E.g. a DaemonSet's GPU force-detached before the node's removal: made so on purpose, not replaced.
    clock, events = Clock(), Events()
    fabric = SimulatedFabric(SimulatedFabricSettings(pools=[PoolSpec(name="pool-a", devices={"A30": 4})]),
                             clock=clock, persist=False)
    watcher = OperationWatcher(fabric, events, clock)
    actions = Actions(Executor(fabric, MemoryProvisioner(clock), events), watcher, NodesInMemory())
    repair = DeviceRepair(fabric, actions, events, clock)
    snapshot = Snapshot(now=clock.now, groups=(make_group(),), nodes=(make_node("w1", gpus=0),),
                        pods=(make_pod("ds", gpus=1, node="w1", owner="DaemonSet"),),
                        pools=(PoolInfo("pool-a", {"A30": 4}),))
    assert gpu_shortfalls(snapshot)  # it is short ...
    repair.run(Observation(snapshot))
    assert fabric.operations() == () and events.seen == []  # ... and nothing is attached
