"""The simulated fabric's memory pools: CXL memory chunks are devices whose model names their size; they attach,
show on the node and go back to the pool like GPUs, and take none of the node's GPU slots."""

from __future__ import annotations

import pytest

from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, DetachRequest, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.fabric.state import InMemoryFabricStateStore
from dds.model.cxl import chunk_bytes, cxl_memory_of, cxl_model, gpus_of
from tests.unit.fabric.harnesses import FakeClock

GiB = 2**30
CHUNK = cxl_model(16 * GiB)


def make_fabric(slots=1):
    clock, visible = FakeClock(), []
    settings = SimulatedFabricSettings(
        pools=[PoolSpec(name="pool-a", devices={"A30": 2, CHUNK: 4}, max_slots_per_node=slots)],
        attach_latency=LatencySpec(min=5, max=5), detach_latency=LatencySpec(min=5, max=5), faults=FaultSpec(seed=1))
    fabric = SimulatedFabric(settings, clock=clock, store=InMemoryFabricStateStore(),
                             on_node_devices_changed=lambda node, counts: visible.append((node, counts)))
    return fabric, clock, visible


def test_the_model_names_the_chunk_size():
    assert (CHUNK, chunk_bytes(CHUNK), cxl_model(512 * 2**20)) == ("cxl-memory-16Gi", 16 * GiB, "cxl-memory-512Mi")
    assert chunk_bytes("A30") is None and chunk_bytes("cxl-memory-lots") is None
    assert (cxl_memory_of({CHUNK: 3, "A30": 2}), gpus_of({CHUNK: 3, "A30": 2})) == (48 * GiB, 2)


def test_chunks_attach_show_on_the_node_and_go_back_to_the_pool():
    fabric, clock, visible = make_fabric()
    fabric.attach(AttachRequest(key="m1", node="n1", pool="pool-a", model=CHUNK, count=3))
    assert fabric.pools()[0].free[CHUNK] == 1
    clock.advance(6)
    assert fabric.operation("m1").state is OperationState.SUCCEEDED
    assert visible[-1] == ("n1", {CHUNK: 3})
    assert cxl_memory_of(visible[-1][1]) == 48 * GiB
    detach = fabric.detach(DetachRequest(key="d1", node="n1", device_ids=tuple(d.id for d in fabric.devices("n1"))[:2]))
    clock.advance(6)
    assert fabric.operation(detach.key).state is OperationState.SUCCEEDED
    assert visible[-1] == ("n1", {CHUNK: 1}) and fabric.pools()[0].free[CHUNK] == 3


def test_chunks_take_none_of_the_nodes_gpu_slots():
    fabric, clock, _ = make_fabric(slots=1)
    assert fabric.attach(AttachRequest(key="g", node="n1", pool="pool-a", model="A30", count=1)).state \
        is not OperationState.FAILED
    memory = fabric.attach(AttachRequest(key="m", node="n1", pool="pool-a", model=CHUNK, count=2))
    assert memory.state is not OperationState.FAILED
    assert fabric.attach(AttachRequest(key="g2", node="n1", pool="pool-a", model="A30", count=1)).state \
        is OperationState.FAILED  # the one GPU slot is taken; memory did not take it


def test_a_memory_model_without_a_size_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"devices\['cxl-memory-big'\]: a CXL memory model names its chunk size"):
        SimulatedFabric(SimulatedFabricSettings(pools=[PoolSpec(name="p", devices={"cxl-memory-big": 2})]),
                        clock=FakeClock(), store=InMemoryFabricStateStore())
