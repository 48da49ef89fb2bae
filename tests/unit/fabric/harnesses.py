"""Harnesses for the contract suite: each backend on a fresh world matching contract.POOL/MODEL/TOTAL/SLOTS."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Callable, Optional, TypeVar

from dds.config import LatencySpec, PoolSpec, RedfishSettings, SimulatedFabricSettings
from dds.fabric.base import Fabric, FabricDevice, Operation
from dds.fabric.redfish import RedfishFabric
from dds.fabric.simulated import SimulatedFabric
from dds.fabric.state import InMemoryFabricStateStore
from dds.model.cxl import cxl_model
from harness.redfish_emulator import EmulatedSystem, EmulatorConfig, RedfishEmulator, mockup_path
from tests.unit.fabric.contract import MODEL, NODE_A, NODE_B, NODE_C, POOL, SLOTS, TOTAL


T = TypeVar("T")


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def contract_pools() -> list[PoolSpec]:
    return [PoolSpec(name=POOL, devices={MODEL: TOTAL}, max_slots_per_node=SLOTS)]


def wait_until_done(fabric: Callable[[], Fabric], key: str, timeout_s: float = 30.0) -> Operation:
    deadline = time.monotonic() + timeout_s
    while True:
        op = fabric().operation(key)
        assert op is not None, f"the fabric does not know operation {key}"
        if op.state.done:
            return op
        if time.monotonic() > deadline:
            raise AssertionError(f"operation {key} not done after {timeout_s}s: {op}")
        time.sleep(0.02)


class SimulatedHarness:
    """The simulated fabric on a virtual clock: settling advances time past the largest latency."""

    def __init__(self, settings: Optional[SimulatedFabricSettings] = None) -> None:
        self.clock = FakeClock()
        self.store = InMemoryFabricStateStore()
        self.settings = settings or SimulatedFabricSettings(
            pools=contract_pools(), attach_latency=LatencySpec(min=20, max=40),
            detach_latency=LatencySpec(min=5, max=10))
        self.busy: set[str] = set()
        self.visible: dict[str, dict[str, int]] = {}
        self.fabric = self._build()

    def _build(self) -> SimulatedFabric:
        return SimulatedFabric(self.settings, clock=self.clock, store=self.store,
                               on_node_devices_changed=self._on_visible, device_in_use=self._in_use)

    def _on_visible(self, node: str, counts: dict[str, int]) -> None:
        self.visible[node] = counts

    def _in_use(self, device: FabricDevice) -> bool:
        return device.id in self.busy

    def settle(self, key: str) -> Operation:
        self.clock.advance(max(self.settings.attach_latency.max, self.settings.detach_latency.max) + 1)
        op = self.fabric.operation(key)
        assert op is not None and op.state.done, op
        self.fabric.check_invariants()
        return op

    def restart(self) -> Fabric:
        self.fabric = self._build()
        return self.fabric

    def mark_in_use(self, device_id: str) -> bool:
        self.busy.add(device_id)
        return True


class RedfishHarness:
    """The Redfish backend against the emulator on loopback, on wall time: short composition latencies, yet long
    enough that an attach is still in flight when a busy 2-core machine reads it back (a query walks every block of
    the DMTF mockup)."""

    def __init__(self, composition_latency_s: float = 0.8, decomposition_latency_s: float = 0.1,
                 advertise_actions: bool = True, mockup: Optional[str] = None,
                 task_after_s: Optional[float] = 1.0) -> None:
        self.config = EmulatorConfig(
            systems=[EmulatedSystem("sys-1", NODE_A), EmulatedSystem("sys-2", "blade-2", host_name=NODE_B),
                     EmulatedSystem("sys-3", NODE_C)],
            gpus={POOL: {MODEL: TOTAL}}, composition_latency_s=composition_latency_s,
            decomposition_latency_s=decomposition_latency_s, username="dds", password="secret",
            advertise_actions=advertise_actions, mockup=mockup_path(mockup) if mockup else None,
            task_after_s=task_after_s)
        self.emulator = RedfishEmulator(self.config)
        self.emulator.start()
        self.store = InMemoryFabricStateStore()
        self._fabrics: list[RedfishFabric] = []
        self.fabric = self._build()

    def _build(self) -> RedfishFabric:
        fabric = RedfishFabric(RedfishSettings(endpoint=self.emulator.url, username="dds", timeout_seconds=5),
                               password="secret", clock=time.time, store=self.store, pools=contract_pools())
        self._fabrics.append(fabric)
        return fabric

    def settle(self, key: str) -> Operation:
        return wait_until_done(lambda: self.fabric, key)

    def restart(self) -> Fabric:
        self.fabric = self._build()
        return self.fabric

    def mark_in_use(self, device_id: str) -> bool:
        return False  # Redfish has no notion of a device in use

    def close(self) -> None:
        for fabric in self._fabrics:
            fabric.close()
        self.emulator.stop()


class RedfishMemoryHarness(RedfishHarness):
    """The Redfish backend binding CXL memory through the emulator's CXL fabric (DMTF's `public-cxl`): TOTAL chunks of
    `CHUNK_MIB` in the mockup's pooled Type 3 device, zone `pool`. DDS gives the zone one GPU slot per node: chunks take
    none of it."""

    CHUNK_MIB = 8192  # a size DMTF's own chunks (16 and 4 GiB) do not have: the contract's pool is the emulator's
    model, pool, slots = cxl_model(CHUNK_MIB * 2**20), "3", None

    def __init__(self, mockup: str = "public-cxl", connection_wait_seconds: float = 120.0, **config: Any) -> None:
        settings: dict[str, Any] = {"composition_latency_s": 0.8, "decomposition_latency_s": 0.1, **config}
        self.config = EmulatorConfig(
            systems=[EmulatedSystem("sys-1", NODE_A), EmulatedSystem("sys-2", "blade-2", host_name=NODE_B),
                     EmulatedSystem("sys-3", NODE_C)],
            gpus={}, memory={self.pool: {self.CHUNK_MIB: TOTAL}}, username="dds", password="secret",
            mockup=mockup_path(mockup), **settings)
        self.connection_wait_seconds = connection_wait_seconds
        self.emulator = RedfishEmulator(self.config)
        self.emulator.start()
        self.store = InMemoryFabricStateStore()
        self._fabrics = []
        self.fabric = self._build()

    def _build(self) -> RedfishFabric:
        fabric = RedfishFabric(RedfishSettings(endpoint=self.emulator.url, username="dds", timeout_seconds=5,
                                               connection_wait_seconds=self.connection_wait_seconds),
                               password="secret", clock=time.time, store=self.store,
                               pools=[PoolSpec(name=self.pool, devices={}, max_slots_per_node=1)])
        self._fabrics.append(fabric)
        return fabric


def closing(factory: Callable[..., T]) -> Iterator[Callable[..., T]]:
    """A fixture's body: `factory(**config)` for the test; whatever it made is closed after."""
    made: list[T] = []

    def make(**config: Any) -> T:
        made.append(factory(**config))
        return made[-1]

    yield make
    for thing in made:
        thing.close()  # type: ignore[attr-defined]
