"""CXL memory attaches and detaches are told and counted as memory, apart from the GPUs (docs/cxl-memory.md): their
own Event reasons (AttachingMemory, AttachedMemory, DetachingMemory, DetachedMemory) whose messages name the chunks and
their bytes, and their own counters (dds_cxl_memory_chunks_*_total), never dds_gpus_*_total. Through the applier on
the real simulated fabric and a fake clock."""

from __future__ import annotations

from prometheus_client import REGISTRY

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.controller.apply import Actions
from dds.controller.executor import Executor, OperationWatcher
from dds.controller.gpu_retries import attaches_text
from dds.fabric.simulated import SimulatedFabric
from dds.model.plan import DEVICE_CXL_MEMORY, DEVICE_GPU, Attach, Case, Detach, by_device_kind
from dds.nodes.memory import MemoryProvisioner
from tests.unit.controller.node_writes import NodesInMemory
from tests.unit.controller.test_apply import Clock, Events as AppliedEvents

CHUNK = "cxl-memory-16Gi"


class Events(AppliedEvents):
    """The applier tests' Events, with each message kept as well."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: dict[str, str] = {}  # reason -> its last message

    def emit(self, involved, event_type: str, reason: str, message: str) -> None:
        super().emit(involved, event_type, reason, message)
        self.messages[reason] = message


def applier() -> tuple[Actions, SimulatedFabric, Clock, Events]:
    clock, events = Clock(), Events()
    settings = SimulatedFabricSettings(pools=[PoolSpec(name="pool-m", devices={"A30": 2, CHUNK: 4})],
                                       attach_latency=LatencySpec(min=1.0, max=1.0),
                                       detach_latency=LatencySpec(min=1.0, max=1.0), faults=FaultSpec(seed=0))
    fabric = SimulatedFabric(settings, clock=clock, persist=False)
    actions = Actions(Executor(fabric, MemoryProvisioner(clock), events), OperationWatcher(fabric, events, clock),
                      NodesInMemory())
    return actions, fabric, clock, events


def counted(name: str, model: str) -> float:
    return REGISTRY.get_sample_value(name, {"pool": "pool-m", "model": model}) or 0.0


def counters() -> tuple[float, ...]:
    return tuple(counted(f"dds_{name}_total", model) for name, model in (
        ("cxl_memory_chunks_attached", CHUNK), ("cxl_memory_chunks_detached", CHUNK),
        ("gpus_attached", CHUNK), ("gpus_detached", CHUNK), ("gpus_attached", "A30"), ("gpus_detached", "A30")))


def settle(actions: Actions, clock: Clock) -> None:
    clock.now += 2.0
    actions.watcher.poll()


def test_a_memory_attach_and_its_detach_have_their_own_events_and_counters():
    actions, fabric, clock, events = applier()
    before = counters()
    actions.attach(Attach(node="w1", pool="pool-m", model=CHUNK, count=2, pods=("demo/mem-0",), reason="mem-0 fits"),
                   "k/1", Case.FAST_PATH)
    settle(actions, clock)
    chunks = tuple(d.id for d in fabric.devices("w1"))
    actions.detach(Detach(node="w1", device_ids=chunks, reason="idle", kind=DEVICE_CXL_MEMORY), "k/2",
                   Case.SCALE_DOWN)
    settle(actions, clock)
    assert events.seen == [("Node/w1", "AttachingMemory"), ("Pod/mem-0", "AttachingMemory"),
                                ("Node/w1", "AttachedMemory"), ("Node/w1", "DetachingMemory"),
                                ("Node/w1", "DetachedMemory")]
    said = events.messages
    assert said["AttachingMemory"].startswith(
        f"attaching 2 CXL memory chunks of 16 GiB (32 GiB) from pool pool-m ({CHUNK}) to w1 for demo/mem-0: ")
    assert said["AttachedMemory"].startswith("attached 2 CXL memory chunks of 16 GiB (32 GiB) to w1 in 1.0s (")
    assert said["DetachingMemory"] == f"detaching 2 CXL memory chunk(s) ({', '.join(chunks)}) from w1: idle"
    assert said["DetachedMemory"].startswith("detached 2 CXL memory chunks of 16 GiB (32 GiB) from w1 in 1.0s (")
    after = counters()
    assert tuple(a - b for a, b in zip(after, before)) == (2, 2, 0, 0, 0, 0)


def test_a_gpu_attach_stays_a_gpu_attach():
    actions, _, clock, events = applier()
    before = counters()
    actions.attach(Attach(node="w1", pool="pool-m", model="A30", count=1, pods=("demo/train-0",), reason="r"),
                   "k/1", Case.FAST_PATH)
    settle(actions, clock)
    assert [r for _, r in events.seen] == ["AttachingGPU", "AttachingGPU", "AttachedGPU"]
    assert tuple(a - b for a, b in zip(counters(), before)) == (0, 0, 0, 0, 1, 0)


def test_a_detach_naming_gpus_and_chunks_goes_as_one_detach_of_each():
    step = Detach(node="w1", device_ids=("gpu-1", "mem-1", "gpu-2", "unknown"), reason="the node is gone", force=True)
    split = by_device_kind(step, {"gpu-1": "A30", "gpu-2": "A30", "mem-1": CHUNK})
    assert split == (Detach("w1", ("gpu-1", "gpu-2", "unknown"), "the node is gone", True, DEVICE_GPU),
                     Detach("w1", ("mem-1",), "the node is gone", True, DEVICE_CXL_MEMORY))


def test_a_nodes_gpus_and_chunks_reclaimed_together_are_each_told_as_what_they_are():
    actions, fabric, clock, events = applier()
    actions.attach(Attach(node="w1", pool="pool-m", model="A30", count=1, pods=(), reason="r"), "k/1", Case.FAST_PATH)
    actions.attach(Attach(node="w1", pool="pool-m", model=CHUNK, count=1, pods=(), reason="r"), "k/2", Case.FAST_PATH)
    settle(actions, clock)
    devices = fabric.devices("w1")
    step = Detach(node="w1", device_ids=tuple(d.id for d in devices), reason="gone", force=True)
    for part in by_device_kind(step, {d.id: d.model for d in devices}):
        actions.detach(part, f"orphan/{part.kind}", Case.ORPHAN_RECLAIM)
    settle(actions, clock)
    assert [r for _, r in events.seen][-4:] == ["DetachingGPU", "DetachingMemory", "DetachedGPU",
                                                     "DetachedMemory"]
    assert fabric.devices("w1") == ()


def test_a_retried_attach_says_whether_it_asked_for_gpus_or_memory():
    gpus = Attach(node="w1", pool="pool-m", model="A30", count=2, pods=(), reason="r")
    memory = Attach(node="w1", pool="pool-m", model=CHUNK, count=1, pods=(), reason="r")
    assert attaches_text([gpus]) == "2 GPU(s)"
    assert attaches_text([memory]) == "1 CXL memory chunk of 16 GiB (16 GiB)"
    assert attaches_text([gpus, memory]) == "2 GPU(s) and 1 CXL memory chunk of 16 GiB (16 GiB)"
