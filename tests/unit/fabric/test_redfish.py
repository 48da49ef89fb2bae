"""The Redfish backend beyond the contract: crash between the operation log and the service, service faults, the
node-to-system rule, authentication, and what the emulator serves."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from dds.config import RedfishSettings
from dds.fabric.base import AttachRequest, DeviceState, ErrorCode, FabricError, OperationState
from dds.fabric.redfish import RedfishFabric
from dds.fabric.state import InMemoryFabricStateStore
from harness.redfish_emulator import ADD_ACTION, BLOCKS, EmulatedSystem, EmulatorConfig, RedfishEmulator
from tests.unit.fabric.contract import MODEL, NODE_A, NODE_B, POOL
from tests.unit.fabric.harnesses import RedfishHarness, contract_pools, wait_until_done


@pytest.fixture
def h() -> Iterator[RedfishHarness]:
    harness = RedfishHarness(composition_latency_s=0.1, decomposition_latency_s=0.05)
    yield harness
    harness.close()


def attach(h: RedfishHarness, key: str, count: int, node: str = NODE_A):
    return h.fabric.attach(AttachRequest(key=key, node=node, pool=POOL, model=MODEL, count=count))


def compose_calls(h: RedfishHarness) -> int:
    return sum(1 for method, path in h.emulator.requests if method == "POST" and path.endswith(ADD_ACTION))


def test_a_compose_the_service_failed_is_retried_by_the_next_process_and_done_once(h: RedfishHarness) -> None:
    h.config.faults.compose_http_errors = 1  # the first compose answers 500: the block stays planned in the log
    accepted = attach(h, "k", 1)
    assert accepted.state == OperationState.RUNNING
    fabric = h.restart()
    done = wait_until_done(lambda: fabric, "k")
    assert done.state == OperationState.SUCCEEDED
    assert compose_calls(h) == 2  # the failed try and one more, never a third
    linked = [b for b, (_, system) in h.emulator.block_states().items() if system == "sys-1"]
    assert linked == list(done.devices)


def test_a_compose_that_went_through_before_a_crash_is_not_sent_again(h: RedfishHarness) -> None:
    attach(h, "k", 2)
    before = compose_calls(h)
    fabric = h.restart()
    assert wait_until_done(lambda: fabric, "k").state == OperationState.SUCCEEDED
    assert compose_calls(h) == before == 2


def test_a_service_that_keeps_failing_ends_the_operation_with_its_message(h: RedfishHarness) -> None:
    h.config.faults.compose_http_errors = 10
    attach(h, "k", 1)
    op = wait_until_done(lambda: h.fabric, "k")
    assert (op.state, op.error.code) == (OperationState.FAILED, ErrorCode.BACKEND)
    assert "composition engine failed" in op.error.message
    assert compose_calls(h) == 3


def test_a_block_whose_composition_fails_shows_as_a_failed_device(h: RedfishHarness) -> None:
    h.config.faults.failing_blocks = {"GPU-001"}
    attach(h, "k", 2)
    op = wait_until_done(lambda: h.fabric, "k")
    assert op.state == OperationState.FAILED and op.devices == ("GPU-002",)
    states = {d.id: d.state for d in h.fabric.devices(NODE_A)}
    assert states == {"GPU-001": DeviceState.FAILED, "GPU-002": DeviceState.ONLINE}


def test_the_service_running_out_of_slots_reads_as_slots_full() -> None:
    harness = RedfishHarness(composition_latency_s=0.05)
    try:
        harness.config.max_blocks_per_system = 1
        attach(harness, "k", 2)
        op = wait_until_done(lambda: harness.fabric, "k")
        assert (op.state, op.error.code, len(op.devices)) == (OperationState.FAILED, ErrorCode.SLOTS_FULL, 1)
    finally:
        harness.close()


@pytest.mark.parametrize("node,system", [
    pytest.param(NODE_A, "sys-1", id="by-name"),
    pytest.param(NODE_B, "sys-2", id="by-host-name"),
])
def test_a_node_is_the_system_with_that_host_name_or_name(h: RedfishHarness, node: str, system: str) -> None:
    op = attach(h, f"k-{node}", 1, node=node)
    done = wait_until_done(lambda: h.fabric, op.key)
    assert h.emulator.block_states()[done.devices[0]][1] == system
    assert [d.node for d in h.fabric.devices(node)] == [node]


def test_an_unknown_node_is_not_found(h: RedfishHarness) -> None:
    with pytest.raises(FabricError) as refused:
        attach(h, "k", 1, node="no-such-node")
    assert refused.value.code == ErrorCode.NOT_FOUND and "no-such-node" in refused.value.message
    assert h.fabric.operations() == ()


def test_wrong_credentials_surface_as_a_backend_error_naming_the_status(h: RedfishHarness) -> None:
    fabric = RedfishFabric(RedfishSettings(endpoint=h.emulator.url, username="dds"), password="wrong",
                           clock=time.time, store=InMemoryFabricStateStore())
    with pytest.raises(FabricError) as refused:
        fabric.pools()
    assert refused.value.code == ErrorCode.BACKEND and "401" in refused.value.message
    fabric.close()


def test_session_login_is_used_and_ended_on_close(h: RedfishHarness) -> None:
    h.fabric.pools()
    h.fabric.close()
    methods = [(m, p.rsplit("/", 1)[0]) for m, p in h.emulator.requests]
    assert ("POST", "/redfish/v1/SessionService") in methods
    assert ("DELETE", "/redfish/v1/SessionService/Sessions") in methods


def test_the_emulator_serves_gpu_blocks_as_dmtf_resources(h: RedfishHarness) -> None:
    session = requests.Session()
    session.auth = ("dds", "secret")
    block = session.get(f"{h.emulator.url}{BLOCKS}/GPU-001").json()
    assert block["@odata.type"].startswith("#ResourceBlock.v1_")
    assert block["ResourceBlockType"] == ["Processor"]
    assert block["CompositionStatus"]["CompositionState"] == "Unused"
    processor = session.get(h.emulator.url + block["Processors"][0]["@odata.id"]).json()
    assert (processor["ProcessorType"], processor["Model"]) == ("GPU", MODEL)
    system = session.get(f"{h.emulator.url}/redfish/v1/Systems/sys-1").json()
    assert f"#{ADD_ACTION}" in system["Actions"]
    assert session.get(f"{h.emulator.url}/redfish/v1/Systems").status_code == 200
    assert requests.get(f"{h.emulator.url}/redfish/v1/Systems").status_code == 401


def test_a_zone_the_service_lacks_is_not_found_and_the_mockups_own_gpu_is_a_pool() -> None:
    config = EmulatorConfig(systems=[EmulatedSystem("s", NODE_A)], gpus={})
    with RedfishEmulator(config) as emulator:
        fabric = RedfishFabric(RedfishSettings(endpoint=emulator.url), clock=time.time,
                               store=InMemoryFabricStateStore(), pools=contract_pools())
        # DMTF's public-composability has one GPU offload block (OffloadBlock9, zone 2) and nothing else that is one.
        assert [(p.name, dict(p.total)) for p in fabric.pools()] == [("2", {"Contoso Workstation VID2000": 1})]
        with pytest.raises(FabricError) as refused:
            fabric.attach(AttachRequest(key="k", node=NODE_A, pool=POOL, model=MODEL, count=1))
        assert refused.value.code == ErrorCode.NOT_FOUND
        fabric.close()
