"""CXL memory over Redfish: DDS's Redfish backend binds pooled memory chunks to a node's host through a CXL fabric's
Connections (DMTF's `public-cxl` model), against the emulator serving DMTF's CXL mockups. The first tests pin how DDS
reads DMTF's resources; the rest are the contract between the emulator's CXL fabric and the client: what DDS sends,
what the service answers, and what DDS makes of it (attach, detach, retries, task monitors, refusals, bounded waits)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import requests

from dds.config import RedfishSettings
from dds.fabric.base import AttachRequest, DetachRequest, DeviceState, ErrorCode, FabricError, OperationState
from dds.fabric.redfish import (RedfishFabric, _Block, _Endpoint, _Inventory, _System, _binding_from, _chunk_id,
                                _connection_state, connection_request)
from harness.redfish_emulator import SESSIONS, load_mockup, mockup_path
from tests.unit.fabric import contract
from tests.unit.fabric.contract import NODE_A, NODE_B, TOTAL
from tests.unit.fabric.harnesses import RedfishMemoryHarness, closing

ZONE, MODEL, CHUNK_MIB = RedfishMemoryHarness.pool, RedfishMemoryHarness.model, RedfishMemoryHarness.CHUNK_MIB
CONNECTIONS = "/redfish/v1/Fabrics/CXL/Connections"


# --- how DDS reads DMTF's resources ---

def test_a_connection_status_reads_as_a_composition_state() -> None:
    assert _connection_state({"State": "Enabled", "Health": "OK"}) == "Composed"
    assert _connection_state({"State": "Starting", "Health": "OK"}) == "Composing"
    assert _connection_state(None) == "Composing"
    assert _connection_state({"State": "Enabled", "Health": "Critical"}) == "Failed"
    assert _connection_state({"State": "UnavailableOffline"}) == "Failed"


def test_dmtfs_connection_reads_as_the_chunk_it_binds_to_its_initiator() -> None:
    connection = load_mockup(mockup_path("public-cxl"))[f"{CONNECTIONS}/13"]
    binding = _binding_from(connection)
    assert binding.chunks == ("/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/1/MemoryChunks/1",)
    assert binding.initiators == ("/redfish/v1/Fabrics/CXL/Endpoints/I3",)
    assert binding.state == "Composed"


def test_the_binding_dds_posts_has_dmtfs_shape() -> None:
    body = connection_request("/c/1", "/e/I1", "/e/T3", "DDS: c.1 to node-a")
    assert body == {"Name": "DDS: c.1 to node-a", "ConnectionType": "Memory",
                    "MemoryChunkInfo": [{"AccessCapabilities": ["Read", "Write"],
                                         "MemoryChunk": {"@odata.id": "/c/1"}}],
                    "Links": {"InitiatorEndpoints": [{"@odata.id": "/e/I1"}],
                              "TargetEndpoints": [{"@odata.id": "/e/T3"}]}}
    assert "MemoryRegionInfo" not in body  # not allowed in a CXL fabric's Connections (Connection v1_3_3)


def test_chunk_ids_differ_where_dmtfs_chunk_ids_repeat() -> None:
    assert _chunk_id("/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/1/MemoryChunks/1") == "PooledCXLType3.1.1"
    assert _chunk_id("/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/6/MemoryChunks/1") == "PooledCXLType3.6.1"


def test_a_chunk_is_bound_through_the_hosts_endpoint_in_its_zone() -> None:
    target = _Endpoint("/e/T3", ("/z/3",), chunks=("/c/1",))
    chunk = _Block("c.1", "/c/1", MODEL, "3", "Unused", None, target=target.uri)
    elsewhere, here = _Endpoint("/e/I1", ("/z/1",), ("/s/1/cpu",)), _Endpoint("/e/I3", ("/z/3",), ("/s/1/cpu",))
    system = _System("/s/1", NODE_A, (NODE_A, ""), (), {}, (elsewhere, here))
    inventory = _Inventory({}, {system.uri: system}, endpoints=(target, elsewhere, here))
    assert inventory.initiator_for(system, chunk) == "/e/I3"
    lone = _System("/s/1", NODE_A, (NODE_A, ""), (), {}, (elsewhere,))
    assert inventory.initiator_for(lone, chunk) == "/e/I1"  # the service says whether zoning allows it
    assert inventory.initiator_for(_System("/s/2", NODE_B, (NODE_B, ""), (), {}), chunk) is None


# --- the emulator's CXL fabric and the client ---

class World(RedfishMemoryHarness):
    """The memory harness's world (TOTAL chunks of MODEL in ZONE, hosts sys-1..3 for nodes A..C) with quick latencies,
    and what these tests look at."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**{"composition_latency_s": 0.1, "decomposition_latency_s": 0.05, **config})

    def attach(self, key: str, count: int, node: str = NODE_A):
        return self.fabric.attach(AttachRequest(key=key, node=node, pool=ZONE, model=MODEL, count=count))

    def free(self) -> int:
        return contract.free(self.fabric, MODEL, ZONE)

    def online(self, node: str = NODE_A) -> list[str]:
        return contract.online(self.fabric, node)

    def sent(self, method: str) -> list[str]:
        return [p for m, p in self.emulator.requests if m == method and p.startswith(CONNECTIONS)]

    def session(self) -> requests.Session:
        http = requests.Session()
        login = http.post(f"{self.emulator.url}{SESSIONS}", json={"UserName": "dds", "Password": "secret"}, timeout=5)
        http.headers["X-Auth-Token"] = login.headers["X-Auth-Token"]
        return http


@pytest.fixture
def make_world() -> Iterator[Callable[..., World]]:
    """World(mockup=..., connection_wait_seconds=..., **EmulatorConfig fields), closed after the test."""
    yield from closing(World)


def test_the_pool_is_the_type3_chunks_of_the_zone(make_world: Callable[..., World]) -> None:
    world = make_world()
    [pool] = world.fabric.pools()
    # DMTF's own pooled chunks count too: the pooled device's 16 GiB and 4 GiB chunks (bound to the mockup's
    # CXL-System by its Connections 13 and 14). The Type 2 device's (a GPU's HBM, Connection 12) is no pooled memory,
    # nor is the host's own 16 GiB Type 3 device in the same zone (Chassis/CXLType3, in CXL-System's CXL-Chassis).
    assert (pool.name, dict(pool.total), dict(pool.free)) == (
        ZONE, {MODEL: TOTAL, "cxl-memory-16Gi": 1, "cxl-memory-4Gi": 1}, {MODEL: TOTAL, "cxl-memory-16Gi": 0,
                                                                          "cxl-memory-4Gi": 0})
    assert [(d.id, d.node) for d in world.fabric.devices()] == [("PooledCXLType3.1.1", "CXL System"),
                                                                ("PooledCXLType3.6.1", "CXL System")]


def test_attach_binds_chunks_to_the_host_and_detach_unbinds_them(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.attach("attach-2", 2)  # two chunks although the node has one GPU slot: memory takes none
    op = world.settle("attach-2")
    assert op.state == OperationState.SUCCEEDED, op
    assert len(op.devices) == 2 and world.online() == sorted(op.devices)
    assert world.free() == TOTAL - 2
    assert world.emulator.bound_memory_mib() == {"sys-1": 2 * CHUNK_MIB, "sys-2": 0, "sys-3": 0}  # the host sees it
    assert len(world.sent("POST")) == 2  # one Connection per chunk
    host = world.emulator.get("/redfish/v1/Systems/sys-1/Memory")
    assert host["Members@odata.count"] == 2
    assert world.attach("attach-2", 2).state == OperationState.SUCCEEDED  # the same key: the same operation
    assert len(world.sent("POST")) == 2

    world.fabric.detach(DetachRequest(key="detach-2", node=NODE_A, device_ids=op.devices))
    done = world.settle("detach-2")
    assert done.state == OperationState.SUCCEEDED and sorted(done.devices) == sorted(op.devices)
    assert world.online() == [] and world.free() == TOTAL
    assert len(world.sent("DELETE")) == 2 and world.emulator.bound_memory_mib()["sys-1"] == 0


def test_asking_for_more_chunks_than_the_zone_has_free_fails_out_of_resources(make_world: Callable[..., World]) \
        -> None:
    world = make_world()
    op = world.attach("too-many", TOTAL + 1)
    assert op.state == OperationState.FAILED and op.error is not None
    assert op.error.code == ErrorCode.OUT_OF_RESOURCES and world.sent("POST") == []


def test_a_chunk_is_bound_to_one_host_at_a_time(make_world: Callable[..., World]) -> None:
    world = make_world()
    op = world.attach("mine", 1)
    assert world.settle("mine").state == OperationState.SUCCEEDED
    chunk = next(c for c, (_, system) in world.emulator.chunks().items() if system == "sys-1")
    second = world.session().post(f"{world.emulator.url}{CONNECTIONS}", json=connection_request(
        chunk, "/redfish/v1/Fabrics/CXL/Endpoints/I-sys-2", None, "another client"), timeout=5)
    assert second.status_code == 409
    assert second.json()["error"]["@Message.ExtendedInfo"][0]["MessageId"].endswith("ResourceInUse")
    world.attach("theirs", 1, node=NODE_B)
    theirs = world.settle("theirs")
    assert theirs.state == OperationState.SUCCEEDED and set(theirs.devices).isdisjoint(op.devices or ("x",))


def test_memory_regions_are_refused_in_a_cxl_fabric(make_world: Callable[..., World]) -> None:
    world = make_world()
    chunk = next(c for c, (state, _) in world.emulator.chunks().items() if state == "Unused")
    body = connection_request(chunk, "/redfish/v1/Fabrics/CXL/Endpoints/I-sys-1", None, "regions")
    body["MemoryRegionInfo"] = [{"MemoryRegion": {"@odata.id": "/some/region"}}]
    answer = world.session().post(f"{world.emulator.url}{CONNECTIONS}", json=body, timeout=5)
    assert answer.status_code == 400 and "not allowed in a CXL fabric" in answer.json()["error"]["message"]


def test_a_connection_across_zones_is_refused(make_world: Callable[..., World]) -> None:
    world = make_world()
    chunk = next(c for c, (state, _) in world.emulator.chunks().items() if state == "Unused")
    across = connection_request(chunk, "/redfish/v1/Fabrics/CXL/Endpoints/I1", None, "zone 1 to zone 3")  # DMTF's I1
    answer = world.session().post(f"{world.emulator.url}{CONNECTIONS}", json=across, timeout=5)
    assert answer.status_code == 400 and "shares no zone with" in answer.json()["error"]["message"]
    assert world.emulator.chunks()[chunk] == ("Unused", None)


def test_a_hosts_local_device_is_not_bound_elsewhere(make_world: Callable[..., World]) -> None:
    world = make_world()
    local = "/redfish/v1/Chassis/CXLType3/MemoryDomains/1/MemoryChunks/1"  # 16 GiB, CXL-System's own, in zone 3
    op = world.fabric.attach(AttachRequest(key="local", node=NODE_A, pool=ZONE, model="cxl-memory-16Gi", count=1))
    done = world.settle(op.key)
    # DDS never offers it (the zone's other 16 GiB chunk is bound to CXL-System): refused before any Connection.
    assert done.state == OperationState.FAILED and done.error is not None
    assert done.error.code == ErrorCode.OUT_OF_RESOURCES, done.error
    assert "zone 3 has 0 free cxl-memory-16Gi" in done.error.message
    assert world.sent("POST") == [] and world.emulator.chunks()[local] == ("Local", "CXL-System")


def test_a_restarted_backend_binds_each_chunk_exactly_once(make_world: Callable[..., World]) -> None:
    world = make_world(composition_latency_s=0.6)
    world.attach("across-restart", 2)
    world.restart()  # the first one is dropped without closing (kill -9)
    world.attach("across-restart", 2)
    done = world.settle("across-restart")
    assert done.state == OperationState.SUCCEEDED, done
    assert len(world.sent("POST")) == 2 and world.free() == TOTAL - 2


def test_a_server_error_is_retried(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.config.faults.compose_http_errors = 1
    world.attach("retried", 1)
    assert world.settle("retried").state == OperationState.SUCCEEDED
    assert len(world.sent("POST")) == 2


def test_the_read_only_fabric_of_dds_plan_binds_nothing(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.config.faults.compose_http_errors = 1
    assert world.attach("planned", 1).state == OperationState.RUNNING  # the POST answered 500: the chunk is planned
    posts = len(world.sent("POST"))
    plan = RedfishFabric(RedfishSettings(endpoint=world.emulator.url, username="dds"), password="secret",
                         clock=time.time, store=world.store, read_only=True)
    try:
        assert [o.key for o in plan.operations()] == ["planned"] and contract.free(plan, MODEL, ZONE) == TOTAL
        with pytest.raises(FabricError):
            plan.attach(AttachRequest(key="other", node=NODE_A, pool=ZONE, model=MODEL, count=1))
    finally:
        plan.close()
    assert len(world.sent("POST")) == posts and world.sent("DELETE") == []


def test_slow_bindings_are_followed_through_task_monitors(make_world: Callable[..., World]) -> None:
    world = make_world(task_after_s=0.0, decomposition_latency_s=0.1)
    world.attach("slow", 2)
    op = world.settle("slow")
    assert op.state == OperationState.SUCCEEDED and len(op.devices) == 2
    assert any(p.startswith("/redfish/v1/TaskService/TaskMonitors/") for m, p in world.emulator.requests if m == "GET")
    world.fabric.detach(DetachRequest(key="slow-detach", node=NODE_A, device_ids=op.devices))
    assert world.settle("slow-detach").state == OperationState.SUCCEEDED and world.free() == TOTAL


def test_a_failed_binding_task_fails_the_chunk_with_the_services_message(make_world: Callable[..., World]) -> None:
    world = make_world(task_after_s=0.0)
    first = min(c for c, (state, _) in world.emulator.chunks().items() if state == "Unused"
                and c.startswith("/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/1/"))
    world.config.faults.failing_tasks = {first}
    world.attach("failing-task", 1)
    op = world.settle("failing-task")
    assert op.state == OperationState.FAILED and op.error is not None
    assert f"Binding memory chunk {first} failed" in op.error.message
    assert world.emulator.chunks()[first] == ("Unused", None) and world.free() == TOTAL  # rolled back


def test_a_connection_that_ends_failed_fails_the_attach(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.config.faults.failing_blocks = {c for c in world.emulator.chunks()}
    world.attach("broken", 1)
    op = world.settle("broken")
    assert op.state == OperationState.FAILED and op.error is not None
    assert "binding memory chunk" in op.error.message and "failed (Failed)" in op.error.message
    assert [d.state for d in world.fabric.devices(NODE_A)] == [DeviceState.FAILED]


def test_a_connection_that_never_appears_fails_after_the_bound(make_world: Callable[..., World]) -> None:
    world = make_world(connection_wait_seconds=0.5)
    world.config.faults.phantom_connections = 1
    world.attach("phantom", 1)
    op = world.settle("phantom")
    assert op.state == OperationState.FAILED and op.error is not None
    assert "listed none within redfish.connection_wait_seconds (0.5 s)" in op.error.message
    assert world.free() == TOTAL


def test_a_connection_deleted_while_the_fabric_is_read_is_not_an_error(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.config.faults.gone_connections = [f"{CONNECTIONS}/999"]
    assert world.free() == TOTAL
    world.attach("meanwhile", 1)
    assert world.settle("meanwhile").state == OperationState.SUCCEEDED


def test_a_refusal_fails_the_attach_with_the_services_message(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.config.faults.refusal_chars = 60
    world.attach("refused", 1)
    op = world.settle("refused")
    assert op.state == OperationState.FAILED and op.error is not None
    assert op.error.message.startswith("The connection was refused: zzz")
    assert len(world.sent("POST")) == 1  # a 4xx is not retried


def test_one_chunk_of_a_connection_binding_two_is_not_detached_alone(make_world: Callable[..., World]) -> None:
    world = make_world()
    chunks = sorted(c for c, (state, _) in world.emulator.chunks().items() if state == "Unused")[-2:]
    body = connection_request(chunks[0], "/redfish/v1/Fabrics/CXL/Endpoints/I-sys-1", None, "two at once")
    body["MemoryChunkInfo"].append({"AccessCapabilities": ["Read"], "MemoryChunk": {"@odata.id": chunks[1]}})
    assert world.session().post(f"{world.emulator.url}{CONNECTIONS}", json=body, timeout=5).status_code == 201
    time.sleep(0.2)
    with pytest.raises(FabricError) as refused:
        world.fabric.detach(DetachRequest(key="half", node=NODE_A, device_ids=(_chunk_id(chunks[0]),)))
    assert refused.value.code == ErrorCode.INVALID and "detach them together" in refused.value.message
    world.fabric.detach(DetachRequest(key="both", node=NODE_A, device_ids=tuple(_chunk_id(c) for c in chunks)))
    assert world.settle("both").state == OperationState.SUCCEEDED and len(world.sent("DELETE")) == 1


def test_the_multiswitch_mockup_serves_memory_too(make_world: Callable[..., World]) -> None:
    world = make_world(mockup="public-cxl-multiswitch")
    world.attach("multi", 2, node=NODE_B)
    op = world.settle("multi")
    assert op.state == OperationState.SUCCEEDED and world.online(NODE_B) == sorted(op.devices)
