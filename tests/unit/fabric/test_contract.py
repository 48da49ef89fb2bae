"""The fabric contract (tests/unit/fabric/contract.py) on the simulated backend and on Redfish against the emulator.
The ComposabilityRequest backend runs the same contract in tests/integration/fabric/ (it needs an apiserver)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import pytest

from tests.unit.fabric import contract
from tests.unit.fabric.harnesses import RedfishHarness, SimulatedHarness


@pytest.fixture(params=["simulated", "redfish-actions", "redfish-patch"])
def h(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "simulated":
        yield SimulatedHarness()
        return
    harness = RedfishHarness(advertise_actions=request.param == "redfish-actions")
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.parametrize("case", contract.CONTRACT, ids=lambda case: case.__name__.removeprefix("test_"))
def test_fabric_contract(h: Any, case: Callable[[Any], None]) -> None:
    case(h)
