"""The applier (dds/controller/apply.py): every kind of action goes through `Actions`, over its three ports."""

from __future__ import annotations

import pytest

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.controller.apply import Actions
from dds.controller.executor import Executor, OperationWatcher
from dds.fabric.base import FabricError, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.model.plan import Attach, Case, Detach, NewNodes, RemoveNode
from dds.nodes.base import MachinePhase
from dds.nodes.memory import MemoryProvisioner
from tests.unit.controller.node_writes import NodesInMemory
from tests.unit.planner.builders import make_group


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def emit(self, involved, event_type: str, reason: str, message: str) -> None:
        self.seen.append((f"{involved.kind}/{involved.name}", reason))


def _applier(nodes: NodesInMemory | None = None):
    clock, events = Clock(), Events()
    settings = SimulatedFabricSettings(pools=[PoolSpec(name="pool-a", devices={"A30": 4})],
                                       attach_latency=LatencySpec(min=1.0, max=1.0),
                                       detach_latency=LatencySpec(min=1.0, max=1.0), faults=FaultSpec(seed=0))
    fabric = SimulatedFabric(settings, clock=clock, persist=False)
    provisioner = MemoryProvisioner(clock)
    actions = Actions(Executor(fabric, provisioner, events), OperationWatcher(fabric, events, clock),
                      nodes or NodesInMemory())
    return actions, fabric, provisioner, clock, events


def test_an_attach_and_its_detach_go_to_the_fabric_and_are_followed_to_their_end():
    actions, fabric, _, clock, events = _applier()
    done = []
    operation = actions.attach(Attach(node="w1", pool="pool-a", model="A30", count=2, pods=("ns/p",), reason="r"),
                               "k/1", Case.FAST_PATH, on_done=done.append)
    assert [op.key for op in actions.watcher.in_flight()] == ["k/1"]
    clock.now += 2.0
    actions.watcher.poll()
    assert [op.state for op in done] == [OperationState.SUCCEEDED]
    devices = tuple(d.id for d in fabric.devices("w1"))
    assert len(devices) == 2 and operation.key == "k/1"
    assert actions.detach(Detach(node="w1", device_ids=devices, reason="idle"), "k/2", Case.SCALE_DOWN) is not None
    assert ("Node/w1", "DetachingGPU") in events.seen


def test_an_attach_the_fabric_refuses_raises_and_is_told_on_the_node():
    actions, _, _, _, events = _applier()
    with pytest.raises(FabricError):
        actions.attach(Attach(node="w1", pool="no-such-pool", model="A30", count=1, pods=(), reason="r"),
                       "k/1", Case.FAST_PATH)
    assert ("Node/w1", "AttachFailed") in events.seen
    assert actions.watcher.in_flight() == ()


def test_nodes_are_added_and_removed_through_the_provisioner_and_every_change_moves_the_generation():
    actions, _, provisioner, _, events = _applier()
    group = make_group("gpu")
    generation = actions.executor.generation
    actions.add_nodes(NewNodes(group="gpu", count=2, pods=("ns/p",), reason="pods need a node"), group,
                      "claims/1", Case.SCALE_UP)
    machines = provisioner.machines(group)
    assert len(machines) == 2 and {m.phase for m in machines} == {MachinePhase.PROVISIONING}
    assert ("Pod/p", "AddingNode") in events.seen
    actions.remove_node(RemoveNode(machines[0].name, "gpu", "empty"), group, "remove/1", Case.SCALE_DOWN_BLOCKED)
    assert [m.name for m in provisioner.machines(group)] == [machines[1].name]
    assert (f"Node/{machines[0].name}", "RemovingNode") in events.seen
    assert actions.executor.generation == generation + 2


def test_taints_labels_and_a_nodes_work_go_through_the_node_writer():
    nodes = NodesInMemory(work={"w1": ["p1"]})
    actions, *_ = _applier(nodes)
    actions.taint("w1", "dds.cdi.dev/removing", "true", "NoSchedule")
    actions.label("w1", {"dds.cdi.dev/initial-gpus-attached": "true"})
    assert nodes.taints["w1"] == {"dds.cdi.dev/removing": ("true", "NoSchedule")}
    assert nodes.labels["w1"] == {"dds.cdi.dev/initial-gpus-attached": "true"}
    assert actions.work_on("w1") == ["p1"]
    actions.untaint("w1", "dds.cdi.dev/removing", uncordon_if_cordoned_with_it=True)
    assert nodes.taints["w1"] == {} and nodes.uncordoned == ["w1"]
