"""The simulated CDI manager's state in a ConfigMap on the real apiserver: compare-and-swap, and a restart resuming."""

from __future__ import annotations

from typing import Any

import pytest

from dds.config import LatencySpec, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, OperationState
from dds.fabric.simulated import SimulatedFabric
from dds.fabric.state import StateConflict
from dds.fabric.state_configmap import ConfigMapFabricStateStore
from tests.unit.fabric.harnesses import FakeClock, contract_pools

pytestmark = pytest.mark.integration


@pytest.fixture
def store(dds_api: Any, namespace: str) -> ConfigMapFabricStateStore:
    """DDS's store as its ServiceAccount, in the test's namespace (where DDS's Roles are bound), under the name the
    simulated fabric's Role grants."""
    return ConfigMapFabricStateStore(dds_api, namespace, SimulatedFabricSettings().state_configmap)


def test_a_write_based_on_a_stale_version_is_a_conflict(store: ConfigMapFabricStateStore) -> None:
    assert store.load() == (None, None)
    first = store.save({"n": 1}, None)
    with pytest.raises(StateConflict):
        store.save({"n": 2}, None)  # someone created it in between
    second = store.save({"n": 2}, first)
    with pytest.raises(StateConflict):
        store.save({"n": 3}, first)
    assert store.load() == ({"n": 2}, second)


def test_the_simulated_manager_resumes_from_the_configmap_after_a_kill(store: ConfigMapFabricStateStore) -> None:
    clock = FakeClock()
    settings = SimulatedFabricSettings(pools=contract_pools(), attach_latency=LatencySpec(min=20, max=40))
    accepted = SimulatedFabric(settings, clock=clock, store=store).attach(
        AttachRequest(key="k", node="node-a", pool="default", model="A30", count=2))
    reborn = SimulatedFabric(settings, clock=clock, store=store)  # the first one is gone without a word
    assert reborn.operation("k") == accepted
    clock.advance(41)
    done = reborn.operation("k")
    assert done.state == OperationState.SUCCEEDED and len(done.devices) == 2
    assert reborn.pools()[0].free["A30"] == 2
    reborn.check_invariants()
