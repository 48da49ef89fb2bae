"""Attach/detach round trips per backend at the configured latencies: `python -m tests.unit.fabric.bench_roundtrip`.

Round trip = from the attach (detach) call until the operation reads SUCCEEDED, polling every 20 ms on wall time
(simulated: on virtual time, reading the operation's own finished_at). What the numbers leave out: the node seeing the
device (the visibility hook's Node patch, device plugin restart) and, for Redfish, a real BMC's composition time.
The ComposabilityRequest backend needs an apiserver: it is measured with tests/integration/fabric's harness.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from dds.config import SimulatedFabricSettings
from dds.fabric.base import AttachRequest, DetachRequest, Fabric, OperationState
from dds.fabric.simulated import SimulatedFabric
from tests.unit.fabric.contract import MODEL, NODE_A, POOL
from tests.unit.fabric.harnesses import FakeClock, RedfishHarness, contract_pools, wait_until_done

ROUNDS = 10


def round_trips(fabric: Fabric, wait: Callable[[str], float], rounds: int = ROUNDS) -> tuple[list[float], list[float]]:
    attaches, detaches = [], []
    for index in range(rounds):
        start = time.monotonic()
        fabric.attach(AttachRequest(key=f"a{index}", node=NODE_A, pool=POOL, model=MODEL, count=1))
        attaches.append(wait(f"a{index}") or time.monotonic() - start)
        devices = fabric.operation(f"a{index}").devices
        start = time.monotonic()
        fabric.detach(DetachRequest(key=f"d{index}", node=NODE_A, device_ids=devices))
        detaches.append(wait(f"d{index}") or time.monotonic() - start)
    return attaches, detaches


def simulated() -> tuple[list[float], list[float]]:
    clock = FakeClock()
    settings = SimulatedFabricSettings(pools=contract_pools())  # default latencies: attach 20-40 s, detach 5-10 s
    fabric = SimulatedFabric(settings, clock=clock)

    def wait(key: str) -> float:
        clock.advance(60)
        op = fabric.operation(key)
        assert op.state == OperationState.SUCCEEDED
        return op.finished_at - op.started_at
    return round_trips(fabric, wait)


def redfish() -> tuple[list[float], list[float]]:
    harness = RedfishHarness(composition_latency_s=0.3, decomposition_latency_s=0.1)
    try:
        return round_trips(harness.fabric, lambda key: (wait_until_done(lambda: harness.fabric, key), 0.0)[1])
    finally:
        harness.close()


def main() -> None:
    for name, run, latency in (("simulated (virtual time)", simulated, "attach 20-40 s, detach 5-10 s"),
                               ("redfish (emulator)", redfish, "compose 0.3 s, decompose 0.1 s")):
        attaches, detaches = run()
        print(f"{name:28s} [{latency}]  attach median {statistics.median(attaches):.3f}s max {max(attaches):.3f}s"
              f"  detach median {statistics.median(detaches):.3f}s max {max(detaches):.3f}s")


if __name__ == "__main__":
    main()
