"""The Redfish backend against DMTF's mockups as a service behaves (harness/redfish_emulator.py): 202 + task monitors,
ETag / If-Match, sessions that expire, the Compose action, refusals as Base registry messages in Events, and the
read-only view `dds plan` uses."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, Optional

import pytest
import requests

from dds.config import RedfishSettings
from dds.controller.executor import Executor, OperationWatcher
from dds.fabric.base import AttachRequest, DetachRequest, ErrorCode, FabricError, OperationState
from dds.fabric.redfish import LOGIN_BACKOFF_BASE_SECONDS, RedfishFabric
from dds.fabric.state import InMemoryFabricStateStore
from dds.nodes.memory import MemoryProvisioner
from dds.model.plan import Attach, Case
from harness.redfish_emulator import (COMPOSE_ACTION, SESSIONS, TASK_MONITORS, EmulatedSystem, EmulatorConfig,
                                      RedfishEmulator, mockup_path)
from tests.unit.fabric.contract import MODEL, NODE_A, POOL
from tests.unit.fabric.harnesses import FakeClock, closing, contract_pools, wait_until_done

REPO = Path(__file__).resolve().parents[3]
USER, PASSWORD = "dds", "secret"


class World:
    """An emulator on a DMTF mockup with four GPU blocks in POOL and node A's system, and DDS's fabric on it."""

    def __init__(self, clock: Optional[FakeClock] = None, **config: object) -> None:
        settings: dict[str, object] = {"composition_latency_s": 0.1, "decomposition_latency_s": 0.05, **config}
        self.config = EmulatorConfig(systems=[EmulatedSystem("sys-1", NODE_A)], gpus={POOL: {MODEL: 4}},
                                     username=USER, password=PASSWORD, **settings)  # type: ignore[arg-type]
        self.emulator = RedfishEmulator(self.config)
        self.emulator.start()
        self.store = InMemoryFabricStateStore()
        self.clock = clock
        self.fabrics: list[RedfishFabric] = []
        self.fabric = self.build()

    def build(self, read_only: bool = False, store: object = None) -> RedfishFabric:
        fabric = RedfishFabric(RedfishSettings(endpoint=self.emulator.url, username=USER, timeout_seconds=5),
                               password=PASSWORD, clock=self.clock or time.time, store=store or self.store,
                               pools=contract_pools(), read_only=read_only)  # type: ignore[arg-type]
        self.fabrics.append(fabric)
        return fabric

    def attach(self, key: str, count: int = 1):
        return self.fabric.attach(AttachRequest(key=key, node=NODE_A, pool=POOL, model=MODEL, count=count))

    def linked(self) -> list[str]:
        return sorted(b for b, (_, system) in self.emulator.block_states().items() if system == "sys-1")

    def sent(self, method: str, suffix: str = "") -> list[str]:
        return [p for m, p in self.emulator.requests if m == method and p.endswith(suffix)]

    def changes(self) -> list[tuple[str, str]]:
        """Every request that could change the service, logins and logouts aside."""
        return [(m, p) for m, p in self.emulator.requests
                if m not in ("GET", "HEAD") and not p.startswith(SESSIONS)]

    def close(self) -> None:
        for fabric in self.fabrics:
            fabric.close()
        self.emulator.stop()


@pytest.fixture
def make_world() -> Iterator[Callable[..., World]]:
    """World(**EmulatorConfig fields), closed after the test."""
    yield from closing(World)


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    return make_world()


# --- 202 Accepted and task monitors ---
@pytest.mark.parametrize("advertise_actions", [True, False], ids=["action", "patch"])
def test_a_slow_composition_is_followed_through_its_task_monitor_to_completion(advertise_actions: bool) -> None:
    world = World(task_after_s=0.0, advertise_actions=advertise_actions)  # every change answers 202 + a task
    try:
        accepted = world.attach("k", 2)
        assert accepted.state == OperationState.RUNNING
        done = wait_until_done(lambda: world.fabric, "k")
        assert done.state == OperationState.SUCCEEDED and list(done.devices) == world.linked()
        assert world.sent("GET", f"{TASK_MONITORS}/1") and world.sent("GET", f"{TASK_MONITORS}/2")
        task = world.emulator.get("/redfish/v1/TaskService/Tasks/1")
        assert (task["TaskState"], task["TaskStatus"]) == ("Completed", "OK")
        detached = world.fabric.detach(DetachRequest(key="d", node=NODE_A, device_ids=done.devices))
        assert wait_until_done(lambda: world.fabric, detached.key).state == OperationState.SUCCEEDED
        assert world.linked() == []
    finally:
        world.close()


def test_a_task_that_fails_fails_the_block_with_the_services_message() -> None:
    world = World(task_after_s=0.0)
    try:
        world.config.faults.failing_tasks = {"GPU-001"}
        world.attach("k", 2)
        op = wait_until_done(lambda: world.fabric, "k")
        assert op.state == OperationState.FAILED and op.devices == ("GPU-002",)
        assert op.error is not None and op.error.code == ErrorCode.BACKEND
        assert "composition of resource block GPU-001 failed and was rolled back" in op.error.message
        assert world.emulator.block_states()["GPU-001"] == ("Unused", None)
    finally:
        world.close()


def test_a_task_monitor_is_followed_by_the_next_process_after_a_restart() -> None:
    world = World(task_after_s=0.0, composition_latency_s=0.3)
    try:
        world.attach("k", 1)
        fabric = world.fabric = world.build()  # the monitor's URI is in the operation log, not in the process
        assert wait_until_done(lambda: fabric, "k").state == OperationState.SUCCEEDED
        assert len(world.sent("POST", "AddResourceBlock")) == 1
    finally:
        world.close()


# --- ETag / If-Match ---
def test_a_patch_that_lost_to_another_writer_is_redone_on_what_that_writer_left(
        make_world: Callable[..., World]) -> None:
    world = make_world(advertise_actions=False)
    world.config.faults.concurrent_writes = 1  # another client changes the system between DDS's read and its PATCH
    world.attach("k", 1)
    assert wait_until_done(lambda: world.fabric, "k").state == OperationState.SUCCEEDED
    assert len(world.sent("PATCH", "/Systems/sys-1")) == 2  # 412 PreconditionFailed, then the same change again
    system = world.emulator.get("/redfish/v1/Systems/sys-1")
    assert system["AssetTag"].startswith("changed-by-another-client")  # the other writer's change kept
    assert world.linked() == ["GPU-001"]


def test_a_writer_that_always_wins_fails_the_block_with_precondition_failed(make_world: Callable[..., World]) -> None:
    world = make_world(advertise_actions=False)
    world.config.faults.concurrent_writes = 10
    world.attach("k", 1)
    op = wait_until_done(lambda: world.fabric, "k")
    assert op.state == OperationState.FAILED and op.error is not None
    assert "ETag supplied did not match" in op.error.message
    assert len(world.sent("PATCH", "/Systems/sys-1")) == 3 and world.linked() == []


def test_the_service_refuses_a_patch_with_a_stale_etag(make_world: Callable[..., World]) -> None:
    world = make_world(advertise_actions=False)
    session = requests.Session()
    session.auth = (USER, PASSWORD)
    url = f"{world.emulator.url}/redfish/v1/Systems/sys-1"
    etag = session.get(url, timeout=5).headers["ETag"]
    body = {"Links": {"ResourceBlocks": [{"@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/GPU-001"}]}}
    assert session.patch(url, json=body, headers={"If-Match": etag}, timeout=5).status_code == 200
    stale = session.patch(url, json={"Links": {"ResourceBlocks": []}}, headers={"If-Match": etag}, timeout=5)
    assert stale.status_code == 412
    assert stale.json()["error"]["@Message.ExtendedInfo"][0]["MessageId"].endswith(".PreconditionFailed")


# --- sessions ---
def test_an_expired_session_is_replaced_by_a_new_login(world: World) -> None:
    world.fabric.pools()
    world.emulator.expire_sessions()  # the session timed out, or the BMC restarted
    assert [p.name for p in world.fabric.pools()][-1] == POOL
    assert len(world.sent("POST", SESSIONS)) == 2
    world.attach("k", 1)
    assert wait_until_done(lambda: world.fabric, "k").state == OperationState.SUCCEEDED


def test_failed_logins_back_off_exponentially() -> None:
    clock = FakeClock()
    world = World(clock=clock)
    try:
        world.config.password = "rotated"  # the service's password changed under DDS
        world.emulator.expire_sessions()
        for _ in range(3):  # the first 401 logs in again and fails; the next calls wait out the backoff
            with pytest.raises(FabricError) as refused:
                world.fabric.pools()
            assert refused.value.code == ErrorCode.BACKEND and "401" in refused.value.message
        assert len(world.sent("POST", SESSIONS)) == 2
        clock.advance(LOGIN_BACKOFF_BASE_SECONDS)
        with pytest.raises(FabricError):
            world.fabric.pools()
        assert len(world.sent("POST", SESSIONS)) == 3
        clock.advance(LOGIN_BACKOFF_BASE_SECONDS)  # the second failure doubled the wait
        with pytest.raises(FabricError):
            world.fabric.pools()
        assert len(world.sent("POST", SESSIONS)) == 3
        world.config.password = PASSWORD
        clock.advance(LOGIN_BACKOFF_BASE_SECONDS)
        assert world.fabric.pools()
        assert len(world.sent("POST", SESSIONS)) == 4
    finally:
        world.close()


# --- the Compose action ---
@pytest.mark.parametrize("mockup,compose_action", [
    pytest.param("public-compose-action", None, id="public-compose-action"),
    pytest.param("public-composability", True, id="public-composability-with-compose"),
])
def test_a_service_that_advertises_compose_is_composed_through_it(mockup: str, compose_action: Optional[bool]) -> None:
    world = World(mockup=mockup_path(mockup), compose_action=compose_action)
    try:
        composition = world.emulator.get("/redfish/v1/CompositionService")
        target = composition["Actions"][f"#{COMPOSE_ACTION}"]["target"]
        world.attach("k", 2)
        done = wait_until_done(lambda: world.fabric, "k")
        assert done.state == OperationState.SUCCEEDED and list(done.devices) == world.linked()
        detached = world.fabric.detach(DetachRequest(key="d", node=NODE_A, device_ids=done.devices[:1]))
        assert wait_until_done(lambda: world.fabric, detached.key).state == OperationState.SUCCEEDED
        assert world.linked() == list(done.devices[1:])
        assert world.changes() == [("POST", target.rstrip("/"))] * 3  # at the target advertised, nothing else
    finally:
        world.close()


def test_a_service_without_compose_is_composed_with_its_add_and_remove_actions(
        make_world: Callable[..., World]) -> None:
    world = make_world(compose_action=False)
    world.attach("k", 1)
    done = wait_until_done(lambda: world.fabric, "k")
    world.fabric.detach(DetachRequest(key="d", node=NODE_A, device_ids=done.devices))
    wait_until_done(lambda: world.fabric, "d")
    assert [p.rsplit("/", 1)[1] for _, p in world.changes()] == ["ComputerSystem.AddResourceBlock",
                                                                  "ComputerSystem.RemoveResourceBlock"]


# --- refusals reach the node's Events ---
class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def emit(self, involved, event_type: str, reason: str, message: str) -> None:
        self.seen.append((f"{involved.kind}/{involved.name}", reason, message))


def test_a_refusal_puts_the_services_base_message_in_the_nodes_event(make_world: Callable[..., World]) -> None:
    world = make_world(max_blocks_per_system=1)
    events = Events()
    executor = Executor(world.fabric, MemoryProvisioner(time.time), events)
    watcher = OperationWatcher(world.fabric, events, time.time)
    step = Attach(node=NODE_A, pool=POOL, model=MODEL, count=2, pods=("ns/train",), reason="pending pod")
    watcher.watch(executor.attach(step, "attach-1", Case.FAST_PATH))
    deadline = time.monotonic() + 30
    while not any(reason == "AttachFailed" for _, reason, _ in events.seen):
        assert time.monotonic() < deadline, events.seen
        watcher.poll()
        time.sleep(0.02)
    [(involved, _, message)] = [e for e in events.seen if e[1] == "AttachFailed"]
    assert involved == f"Node/{NODE_A}"
    assert "unable to satisfy the request due to unavailability of resources" in message  # Base ResourceExhaustion
    assert world.fabric.operation("attach-1").error.code == ErrorCode.SLOTS_FULL


# --- dds plan: the read-only view ---
def test_the_read_only_view_sends_nothing_for_a_planned_block(world: World) -> None:
    world.config.faults.compose_http_errors = 1  # the compose fails: the block stays planned in the operation log
    world.attach("k", 1)
    [(key, op)] = world.store.load()[0]["operations"].items()
    assert [p["step"] for p in op["blocks"].values()] == ["planned"]
    before = len(world.changes())
    view = world.build(read_only=True)
    assert [p.name for p in view.pools()][-1] == POOL
    assert view.devices(NODE_A) == ()
    assert [o.state for o in view.operations()] == [OperationState.RUNNING]
    assert view.operation(key).state == OperationState.RUNNING
    view.tick()
    with pytest.raises(FabricError) as refused:
        view.attach(AttachRequest(key="k2", node=NODE_A, pool=POOL, model=MODEL, count=1))
    assert refused.value.code == ErrorCode.INVALID and "read-only" in refused.value.message
    assert len(world.changes()) == before and world.linked() == []


# --- the emulator as DMTF's tools see it ---
def test_the_service_serves_metadata_odata_and_sessions(world: World) -> None:
    url = world.emulator.url
    metadata = requests.get(f"{url}/redfish/v1/$metadata", timeout=5)
    assert metadata.status_code == 200 and metadata.headers["Content-Type"].startswith("application/xml")
    for namespace in ("ResourceBlock.v1_4_3", "Session.v1_8_0", "Task.v1_7_4", "Zone.v1_6_3"):
        assert f'Namespace="{namespace}"' in metadata.text
    odata = requests.get(f"{url}/redfish/v1/odata", timeout=5).json()
    assert {"SessionService", "CompositionService", "Tasks"} <= {v["name"] for v in odata["value"]}
    login = requests.post(f"{url}{SESSIONS}", json={"UserName": USER, "Password": PASSWORD}, timeout=5)
    assert login.status_code == 201 and login.headers["Location"].startswith(SESSIONS + "/")
    token = {"X-Auth-Token": login.headers["X-Auth-Token"]}
    members = requests.get(f"{url}{SESSIONS}", headers=token, timeout=5).json()["Members"]
    assert {"@odata.id": login.headers["Location"]} in members
    assert requests.delete(url + login.headers["Location"], headers=token, timeout=5).status_code == 204
    assert requests.get(f"{url}{SESSIONS}", headers=token, timeout=5).status_code == 401
    refused = requests.post(f"{url}{SESSIONS}", json={"UserName": USER, "Password": "no"}, timeout=5)
    assert refused.status_code == 401 and refused.json()["error"]["code"].startswith("Base.")


def test_gpu_blocks_have_the_shape_of_dmtfs_offload_block(world: World) -> None:
    dmtf = world.emulator.get("/redfish/v1/CompositionService/ResourceBlocks/OffloadBlock9")
    ours = world.emulator.get("/redfish/v1/CompositionService/ResourceBlocks/GPU-001")
    assert set(ours) == set(dmtf) and ours["ResourceBlockType"] == dmtf["ResourceBlockType"]
    assert set(ours["CompositionStatus"]) == set(dmtf["CompositionStatus"])
    processor = world.emulator.get(ours["Processors"][0]["@odata.id"])
    assert (processor["ProcessorType"], processor["Model"]) == ("GPU", MODEL)


def test_the_emulator_runs_on_its_own(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "harness.redfish_emulator", "--mockup",
                                str(mockup_path("public-constrained-composition")), "--listen", f"127.0.0.1:{port}"],
                               cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert "user admin, password password" in process.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        login = requests.post(f"{url}{SESSIONS}", json={"UserName": "admin", "Password": "password"}, timeout=5)
        assert login.status_code == 201
        blocks = requests.get(f"{url}/redfish/v1/CompositionService/ResourceBlocks",
                              headers={"X-Auth-Token": login.headers["X-Auth-Token"]}, timeout=5).json()
        assert {"@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/GPU-001"} in blocks["Members"]
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.parametrize("mockup", ["public-cxl", "public-cxl-multiswitch"])
def test_a_mockup_without_a_composition_service_is_refused_by_name(mockup: str) -> None:
    with pytest.raises(ValueError) as refused:
        RedfishEmulator(EmulatorConfig(systems=[], gpus={POOL: {MODEL: 1}}, mockup=mockup_path(mockup)))
    assert mockup in str(refused.value) and "no CompositionService" in str(refused.value)


class RemovalEndsBeforeTheNextCompose:
    """The emulator's clock: still until the `jump_at`-th Compose POST, which it sees 100 s later — so a removal
    requested by the previous POST ends between DDS's read of the system and its next Compose."""

    def __init__(self, emulator_requests: Callable[[], list[tuple[str, str]]], jump_at: int) -> None:
        self._requests, self._jump_at, self._after = emulator_requests, jump_at, 0.0

    def __call__(self) -> float:
        composes = [p for m, p in self._requests() if m == "POST" and p.endswith(COMPOSE_ACTION)]
        if len(composes) < self._jump_at:
            return 0.0
        self._after += 0.5
        return 100.0 + self._after


def test_a_removal_that_ends_while_the_next_block_is_composed_is_not_undone() -> None:
    config = EmulatorConfig(systems=[EmulatedSystem("sys-1", NODE_A)], gpus={POOL: {MODEL: 2}},
                            composition_latency_s=0.0, decomposition_latency_s=1.0, compose_action=True,
                            task_after_s=None)
    holder: list[RedfishEmulator] = []
    emulator = RedfishEmulator(config, clock=RemovalEndsBeforeTheNextCompose(lambda: holder[0].requests, jump_at=4))
    holder.append(emulator)
    emulator.start()
    fabric = RedfishFabric(RedfishSettings(endpoint=emulator.url), clock=time.time, store=InMemoryFabricStateStore())
    try:
        fabric.attach(AttachRequest(key="a", node=NODE_A, pool=POOL, model=MODEL, count=2))  # Compose POSTs 1, 2
        attached = wait_until_done(lambda: fabric, "a")
        assert attached.state == OperationState.SUCCEEDED
        fabric.detach(DetachRequest(key="d", node=NODE_A, device_ids=attached.devices))  # POSTs 3 and 4 (the jump)
        done = wait_until_done(lambda: fabric, "d")
        assert done.state == OperationState.SUCCEEDED and sorted(done.devices) == sorted(attached.devices)
        assert emulator.block_states()["GPU-001"] == ("Unused", None)  # not composed again by the second POST
    finally:
        fabric.close()
        emulator.stop()
