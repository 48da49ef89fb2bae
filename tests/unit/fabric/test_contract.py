"""The fabric contract (tests/unit/fabric/contract.py) on the simulated backend and on Redfish against the emulator.
The ComposabilityRequest backend runs the same contract in tests/integration/fabric/ (it needs an apiserver)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import pytest

from tests.unit.fabric import contract
from tests.unit.fabric.harnesses import RedfishHarness, RedfishMemoryHarness, SimulatedHarness


# Redfish: each way a service composes (docs/redfish.md): its Add/RemoveResourceBlock actions, a PATCH with If-Match,
# DMTF's public-compose-action mockup (the Compose action), and every change answered 202 with a task monitor.
REDFISH_SERVICES: dict[str, dict[str, Any]] = {
    "redfish-actions": {}, "redfish-patch": {"advertise_actions": False},
    "redfish-compose": {"mockup": "public-compose-action"}, "redfish-tasks": {"task_after_s": 0.0}}
# CXL memory: chunks bound through a CXL fabric's Connections (DMTF's public-cxl, public-cxl-multiswitch), at once or
# through task monitors.
REDFISH_MEMORY: dict[str, dict[str, Any]] = {
    "redfish-cxl-memory": {}, "redfish-cxl-memory-tasks": {"task_after_s": 0.0},
    "redfish-cxl-memory-multiswitch": {"mockup": "public-cxl-multiswitch"}}


@pytest.fixture(params=["simulated", *REDFISH_SERVICES, *REDFISH_MEMORY])
def h(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "simulated":
        yield SimulatedHarness()
        return
    harness = RedfishHarness(**REDFISH_SERVICES[request.param]) if request.param in REDFISH_SERVICES else \
        RedfishMemoryHarness(**REDFISH_MEMORY[request.param])
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.parametrize("case", contract.CONTRACT, ids=lambda case: case.__name__.removeprefix("test_"))
def test_fabric_contract(h: Any, case: Callable[[Any], None]) -> None:
    case(h)
