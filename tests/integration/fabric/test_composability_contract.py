"""The fabric contract on the ComposabilityRequest backend against the REAL CDI operator.

CoHDI's composable-resource-operator (harness/cdi_operator.py, DRA mode) reconciles DDS's ComposabilityRequests and
attaches through the fabric-manager emulator (harness/fabric_manager.py); the node side (nvidia-smi through kwok exec,
the vendor driver's ResourceSlice, GPU load) is harness/gpu_node_agent.py. DDS's fabric runs under its ServiceAccount
(manifests/dds RBAC). The contract of tests/unit/fabric/contract.py runs twice: reading the operator's objects with a
LIST per query, and from the watch cache. The cases after it settle, each by what the running operator does, the points
dds/fabric/composability.py's docstring makes about the operator.

One control plane, emulator, agent and operator serve the whole module (the operator's webhook port is fixed, so one
operator runs on a machine at a time); `reset` puts the world back between tests: no request, no resource, nothing
attached in the fabric, no fault armed, no pod holding a GPU.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
from kubernetes import client
from prometheus_client import REGISTRY
from kubernetes.client.rest import ApiException

from dds.config import ComposabilitySettings
from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, Fabric, FabricError, Operation,
                             OperationState)
from dds.controller.executor import OperationWatcher
from dds.fabric.composability import (ANN_DELETE_DEVICE, ANN_OPERATIONS, GROUP, REQUESTS, RESOURCES, VERSION,
                                      ComposabilityRequestFabric, request_name)
from dds.kube.cache import ClusterCache
from dds.kube.composability import WATCHED
from dds.kube.requests import instrument
from dds.model.events import ObjectRef
from harness import rbac
from harness.cdi_operator import (DRA_FEATURE_GATES, DRA_RUNTIME_CONFIG, CdiOperator,
                                  DeviceResourceType, FabricManagerAccess)
from harness.controlplane import KWOK_NODE_ANNOTATION, ControlPlane, ensure_binaries, start_control_plane
from harness.fabric_manager import FabricManagerEmulator
from harness.gpu_node_agent import NVIDIA_DRA_DRIVER, DeviceMode, GpuNodeAgent
from tests.unit.fabric import contract
from tests.unit.fabric.contract import MODEL, NODE_A, NODE_B, NODE_C, POOL, TOTAL
from tests.unit.fabric.harnesses import contract_pools

pytestmark = pytest.mark.integration

NODES = (NODE_A, NODE_B, NODE_C)
WORKLOADS = "gpu-workloads"  # the namespace of the pods that hold a GPU (mark_in_use)
GPU_CLASS = "gpu.nvidia.com"
# Long enough that the operator's retries of a transient error (backoff from 5 ms, and a fresh reconcile on each status
# write) win before DDS calls the error final; the cases about final errors build their fabric with a short one.
ERROR_BOUND_S = 30.0
SHORT_ERROR_BOUND_S = 3.0
# Long enough that no case but the ones about a hung operator meets it; those build their fabric with a short one.
WAIT_BOUND_S = 300.0
SHORT_WAIT_BOUND_S = 15.0
SETTLE_TIMEOUT_S = 90.0  # a broken run only: an attach or detach through the operator takes a few seconds here
RESET_TIMEOUT_S = 60.0
PORT_WAIT_S = 300.0  # another helper's operator may hold the webhook port for a while


@dataclass
class World:
    plane: ControlPlane
    fm: FabricManagerEmulator
    agent: GpuNodeAgent
    operator: CdiOperator
    admin: client.ApiClient
    dds_api: client.ApiClient
    machines: dict[str, str]  # node -> machine uuid

    @property
    def objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.admin)



def _create_node(core: client.CoreV1Api, name: str) -> None:
    key, value = KWOK_NODE_ANNOTATION
    core.create_node({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "annotations": {key: value},
                                   "labels": {"kubernetes.io/hostname": name}},
                      # DRA mode: the operator finds the node's fabric machine in its providerID.
                      "spec": {"providerID": f"fsas-cdi://{uuid.uuid4()}"}})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with start_control_plane(tmp_path_factory.mktemp("cdi-contract-plane"), bin_dir=ensure_binaries(),
                             feature_gates=DRA_FEATURE_GATES, runtime_config=DRA_RUNTIME_CONFIG) as plane, \
            FabricManagerEmulator({MODEL: TOTAL}) as fm, plane.api_client() as admin:
        operator = CdiOperator(plane, FabricManagerAccess.of(fm),
                               device_resource_type=DeviceResourceType.DRA).start_when_port_free(PORT_WAIT_S)
        try:
            core = client.CoreV1Api(admin)
            for node in NODES:
                _create_node(core, node)
            core.create_namespace({"metadata": {"name": WORKLOADS}})
            objects = client.CustomObjectsApi(admin)
            objects.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", {
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_DRA_DRIVER}'"}}]}})
            with GpuNodeAgent(admin, fm, mode=DeviceMode.DRA, resync_interval_s=0.5) as agent, \
                    rbac.api_client(rbac.install(plane, rbac.DDS)) as dds_api:
                machines = {node: agent.add_node(node) for node in NODES}
                yield World(plane, fm, agent, operator, admin, dds_api, machines)
        finally:
            operator.stop()


class RecordedEvents:
    """The Events the fabric emits, as (object, type, reason, message)."""

    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, str, str]] = []

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        self.emitted.append((involved.describe(), event_type, reason, message))

    def of(self, reason: str) -> list[tuple[str, str, str, str]]:
        return [e for e in self.emitted if e[2] == reason]


class RealOperatorHarness:
    """contract.Harness on the real operator: DDS's fabric (listed or watched) with its ServiceAccount's client."""

    def __init__(self, world: World, *, watched: bool = False, error_bound_s: float = ERROR_BOUND_S,
                 wait_bound_s: float = WAIT_BOUND_S) -> None:
        self.world = world
        self.objects = world.objects
        self.error_bound_s = error_bound_s
        self.wait_bound_s = wait_bound_s
        self.cache = (ClusterCache.for_cluster(world.dds_api, capi_version=None, composability=WATCHED)
                      if watched else None)
        if self.cache is not None:
            self.cache.start()
            assert self.cache.wait_synced(60)
        self.events = RecordedEvents()
        self.fabric: Fabric = self._build()

    def _build(self) -> ComposabilityRequestFabric:
        return ComposabilityRequestFabric(
            self.world.dds_api, ComposabilitySettings(operator_error_bound_seconds=self.error_bound_s,
                                                      operator_wait_bound_seconds=self.wait_bound_s),
            contract_pools(), clock=time.time, cache=self.cache.composability if self.cache else None,
            events=self.events)

    def settle(self, key: str) -> Operation:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            op = self.fabric.operation(key)
            assert op is not None, f"the fabric does not know operation {key}"
            if op.state.done:
                return op
            if time.monotonic() > deadline:
                raise AssertionError(f"operation {key} not done after {SETTLE_TIMEOUT_S:.0f} s: {op}\n"
                                     f"requests: {self.requests()}\noperator log:\n"
                                     f"{self.world.operator.log_tail(60)}")
            time.sleep(0.1)

    def restart(self) -> Fabric:
        self.fabric = self._build()
        return self.fabric

    def mark_in_use(self, device_id: str) -> bool:
        """A pod whose claim kube-scheduler allocated the device's GPU runs on its node: the agent shows its process
        in nvidia-smi, where the operator's in-use check finds it."""
        resource = self.objects.get_cluster_custom_object(GROUP, VERSION, RESOURCES, device_id)
        node, serial = resource["spec"]["target_node"], resource["status"]["device_id"]
        hold_gpu(self.world, node, serial)
        return True

    def requests(self) -> list[dict[str, Any]]:
        return self.objects.list_cluster_custom_object(GROUP, VERSION, REQUESTS)["items"]

    def resources(self) -> list[dict[str, Any]]:
        return self.objects.list_cluster_custom_object(GROUP, VERSION, RESOURCES)["items"]

    def close(self) -> None:
        if self.cache is not None:
            self.cache.stop()


def wait_for(what: str, world: World, check: Callable[[], Any], timeout_s: float = SETTLE_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = check()
        if seen:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s:.0f} s; operator log:\n"
                                 f"{world.operator.log_tail(60)}")
        time.sleep(0.1)


def hold_gpu(world: World, node: str, serial: str) -> str:
    """Run a pod on `node` whose ResourceClaim kube-scheduler allocates the GPU `serial`; wait until the agent shows
    its process on that GPU. Returns the pod's name."""
    name = f"holds-{serial[-8:].lower()}-{uuid.uuid4().hex[:5]}"
    objects, core = world.objects, client.CoreV1Api(world.admin)
    objects.create_namespaced_custom_object("resource.k8s.io", "v1", WORKLOADS, "resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": GPU_CLASS,
            "selectors": [{"cel": {"expression": f"device.attributes['{NVIDIA_DRA_DRIVER}'].uuid == '{serial}'"}}]}}]}}})
    core.create_namespaced_pod(WORKLOADS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                 "containers": [{"name": "main", "image": "registry.example/infer:1",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})
    wait_for(f"pod {name}'s process on GPU {serial}", world,
             lambda: serial in {p["gpu_uuid"] for p in world.agent.node_state(node)["processes"]})
    return name


def release_gpus(world: World) -> None:
    core = client.CoreV1Api(world.admin)
    objects = world.objects
    for pod in core.list_namespaced_pod(WORKLOADS).items:
        core.delete_namespaced_pod(pod.metadata.name, WORKLOADS, grace_period_seconds=0)
    for claim in objects.list_namespaced_custom_object("resource.k8s.io", "v1", WORKLOADS,
                                                       "resourceclaims")["items"]:
        name = claim["metadata"]["name"]
        objects.delete_namespaced_custom_object("resource.k8s.io", "v1", WORKLOADS, "resourceclaims", name)
        # An allocated claim keeps kube-controller-manager's finalizer, and no controller manager runs here.
        try:
            objects.patch_namespaced_custom_object("resource.k8s.io", "v1", WORKLOADS, "resourceclaims", name,
                                                   {"metadata": {"finalizers": None}})
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for("no pod holding a GPU", world,
             lambda: not core.list_namespaced_pod(WORKLOADS).items
             and all(not world.agent.node_state(node)["processes"] for node in NODES))
    wait_for("no claim on a GPU", world, lambda: not objects.list_namespaced_custom_object(
        "resource.k8s.io", "v1", WORKLOADS, "resourceclaims")["items"])


def _each_request(world: World, change: Callable[[str], None]) -> None:
    for item in world.objects.list_cluster_custom_object(GROUP, VERSION, REQUESTS)["items"]:
        try:
            change(item["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise


def _released(world: World) -> bool:
    """Whether every device is gone from the fabric and every ComposableResource from the cluster; nudges the
    operator on each resource still there. A detach the operator retried while its GPU was in use is retried with
    controller-runtime's exponential backoff (5 ms doubling, up to ~17 min), so once the load is gone it may not look
    again for minutes; any update of the object makes it reconcile at once."""
    objects = world.objects
    remaining = objects.list_cluster_custom_object(GROUP, VERSION, RESOURCES)["items"]
    for resource in remaining:
        try:
            objects.patch_cluster_custom_object(GROUP, VERSION, RESOURCES, resource["metadata"]["name"], {
                "metadata": {"annotations": {"dds-test/reset": str(time.monotonic())}}})
        except ApiException as exc:
            if exc.status != 404:
                raise
    if remaining:
        time.sleep(0.5)
        return False
    _detach_strays(world)
    return not world.fm.attachments()


def _detach_strays(world: World) -> None:
    """Devices the fabric holds while no ComposableResource is left: the operator lost track of them (seen under load
    on 1.36: a resource removed as "does not exist in FM" while the fabric held another device for it). Its upstream
    syncer would detach them only after a grace period of minutes; the reset detaches them itself and says so, so the
    next case starts from an empty fabric (the cases check their own leaks before this runs)."""
    for machine in world.fm.attachments():
        for device in world.fm.devices_of(machine):
            if not device.busy:
                print(f"reset: the fabric still held {device.serial} on machine {machine} with no ComposableResource "
                      "left; detaching it")
                world.fm.detach(machine, device.res_uuid)


def reset(world: World) -> None:
    """Back to an empty world: every request sized to 0 (the operator detaches its devices), then deleted.

    Not deleted at once: a deleted request's devices are released in its Cleaning state, which the operator
    re-examines only every 30 s (its watch of ComposableResources enqueues the resource's name, not the request's),
    while a size decrease is followed through at once."""
    objects = world.objects
    for node in NODES:
        world.agent.freeze(node, False)
    world.fm.fail_next_attaches(0)
    world.fm.fail_next_detaches(0)
    world.fm.attach_latency_s = world.fm.detach_latency_s = 0.0
    release_gpus(world)
    _each_request(world, lambda name: objects.patch_cluster_custom_object(
        GROUP, VERSION, REQUESTS, name, {"spec": {"resource": {"size": 0}}}))
    wait_for("no resource, nothing attached", world, lambda: _released(world), RESET_TIMEOUT_S)
    _each_request(world, lambda name: objects.delete_cluster_custom_object(GROUP, VERSION, REQUESTS, name))
    wait_for("no request", world,
             lambda: not objects.list_cluster_custom_object(GROUP, VERSION, REQUESTS)["items"], RESET_TIMEOUT_S)


@pytest.fixture
def fresh(world: World) -> Iterator[World]:
    reset(world)
    yield world


@pytest.fixture(params=["listed", "watched"])
def h(fresh: World, request: pytest.FixtureRequest) -> Iterator[RealOperatorHarness]:
    harness = RealOperatorHarness(fresh, watched=request.param == "watched")
    yield harness
    harness.close()


def short_bound(world: World) -> RealOperatorHarness:
    return RealOperatorHarness(world, error_bound_s=SHORT_ERROR_BOUND_S)


# --- the contract ---

# The contract's in-use case expects a refused detach to leave the device Online. The real operator cannot refuse a
# detach: the size decrease has already marked the device's ComposableResource for deletion when its in-use check
# fails, and it keeps retrying until the load ends. DDS reports DeviceInUse past the bound and counts the device
# DETACHING: test_a_gpu_in_use_is_not_detached_and_stays_counted_detaching below.
_CASES = [pytest.param(mode, case, id=f"{mode}-{case.__name__.removeprefix('test_')}")
          for mode in ("listed", "watched") for case in contract.CONTRACT
          if case is not contract.test_detaching_a_device_in_use_without_force_is_refused]


@pytest.mark.parametrize("mode, case", _CASES)
def test_fabric_contract(fresh: World, mode: str, case: Callable[[Any], None]) -> None:
    harness = RealOperatorHarness(fresh, watched=mode == "watched")
    try:
        case(harness)
    finally:
        harness.close()


def test_from_the_watch_cache_the_fabric_queries_send_no_list(fresh: World) -> None:
    harness = RealOperatorHarness(fresh, watched=True)
    try:
        counts = instrument(fresh.dds_api)
        op = harness.fabric.attach(AttachRequest(key="k", node=NODE_A, pool=POOL, model=MODEL, count=1))
        harness.settle(op.key)
        lists = counts.snapshot().get("LIST", 0)
        for _ in range(5):  # what every observe asks
            harness.fabric.devices(), harness.fabric.operations(), harness.fabric.pools()
        assert counts.snapshot().get("LIST", 0) == lists
        assert [d.node for d in harness.fabric.devices()] == [NODE_A]
    finally:
        harness.close()


# --- what the real operator does, settled ---

def _attach(h: RealOperatorHarness, key: str, node: str, count: int) -> Operation:
    return h.fabric.attach(AttachRequest(key=key, node=node, pool=POOL, model=MODEL, count=count, reason="test"))


def _slice_uuids(world: World, node: str) -> set[str]:
    try:
        found = world.objects.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                        world.agent.slice_name(node))
    except ApiException as exc:
        if exc.status == 404:
            return set()
        raise
    return {d["attributes"]["uuid"]["string"] for d in found["spec"].get("devices") or []}


def test_one_samenode_request_per_node_and_model_sized_to_the_devices(h: RealOperatorHarness) -> None:
    for index in range(2):
        _attach(h, f"k{index}", NODE_A, 1)
        assert h.settle(f"k{index}").state == OperationState.SUCCEEDED
    name = request_name("dds-", NODE_A, "gpu", MODEL)
    # An attach ends when its device is Online; the operator moves the request from Updating to Running on its next
    # reconcile after every device is Online, so that state follows shortly.
    [request] = wait_for("the request Running", h.world,
                         lambda: [r for r in h.requests() if (r.get("status") or {}).get("state") == "Running"])
    assert request["metadata"]["name"] == name
    resource = request["spec"]["resource"]
    assert (resource["size"], resource["allocation_policy"], resource["target_node"], resource["type"]) == (
        2, "samenode", NODE_A, "gpu")
    serials = {d.serial for d in h.fabric.devices(NODE_A)}
    # FabricDevice.serial is the GPU's UUID: what the fabric attached and the node's driver publishes.
    assert serials == set(h.world.fm.attachments()[h.world.machines[NODE_A]]) == _slice_uuids(h.world, NODE_A)


def test_a_detach_ends_only_when_the_device_is_gone_from_the_fabric_and_the_node(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        attached = _attach(h, "attach", NODE_A, 1)
        attached = h.settle(attached.key)
        [device] = h.fabric.devices(NODE_A)
        fresh.fm.detach_latency_s = 2.0  # the fabric takes its time: DDS must wait for it
        try:
            h.fabric.detach(DetachRequest(key="detach", node=NODE_A, device_ids=attached.devices, reason="test"))
            # At once the operator drops the device from the request's status; the fabric still holds it.
            wait_for("the device dropped from the request's status", fresh,
                     lambda: not (h.requests()[0].get("status") or {}).get("resources"))
            op = h.fabric.operation("detach")
            assert op is not None
            if not op.state.done:
                assert device.serial in fresh.fm.attachments().get(fresh.machines[NODE_A], [])
            done = h.settle("detach")
        finally:
            fresh.fm.detach_latency_s = 0.0
        assert done.state == OperationState.SUCCEEDED, done
        assert done.devices == attached.devices
        assert device.serial not in fresh.fm.attachments().get(fresh.machines[NODE_A], [])
        assert device.serial not in _slice_uuids(fresh, NODE_A)
        assert h.fabric.devices(NODE_A) == ()
    finally:
        h.close()


def test_one_fabric_error_is_retried_by_the_operator_and_the_attach_succeeds(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        fresh.fm.fail_next_attaches(1)
        done = h.settle(_attach(h, "flaky", NODE_A, 1).key)
        assert done.state == OperationState.SUCCEEDED, done
        assert len(fresh.fm.attachments()[fresh.machines[NODE_A]]) == 1
        # the error was there (the operator recorded it) and is gone
        assert any(c.method == "PATCH" and c.status == 500 for c in fresh.fm.calls())
        assert [d.state for d in h.fabric.devices(NODE_A)] == [DeviceState.ONLINE]
    finally:
        h.close()


def test_a_persistent_fabric_error_fails_past_the_bound_and_gives_the_size_back(fresh: World) -> None:
    h = short_bound(fresh)
    try:
        fresh.fm.fail_next_attaches(1000, message="fabric switch sw-3 is down")
        done = h.settle(_attach(h, "doomed", NODE_A, 1).key)
        assert done.state == OperationState.FAILED, done
        assert done.error is not None and done.error.code == ErrorCode.BACKEND
        assert "fabric switch sw-3 is down" in done.error.message
        assert f"{SHORT_ERROR_BOUND_S:g} s" in done.error.message
        [request] = h.requests()
        assert request["spec"]["resource"]["size"] == 0
        # The operator removes the resource it could not attach. The fabric stays down until it is gone: a reconcile
        # that read the resource before its deletion and whose add then succeeds loses the device's id when its status
        # write conflicts with the deletion (handleAttachingState, operator 38251b7), and only the operator's upstream
        # syncer reclaims such a device, after its 10-minute grace. That race is the operator's; what this pins is
        # DDS's side: once the size is given back, nothing DDS asked for arrives later.
        wait_for("the failed attach's resource gone", fresh, lambda: not h.resources())
        fresh.fm.fail_next_attaches(0)
        time.sleep(3)  # longer than the operator's first retry backoff: a retry still queued would attach by now
        assert fresh.fm.attachments() == {}
        assert h.fabric.devices() == ()
        assert contract.free(h.fabric) == TOTAL
    finally:
        h.close()


def test_of_two_gpus_the_one_dds_chose_is_the_one_removed(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        attached = h.settle(_attach(h, "two", NODE_A, 2).key)
        assert attached.state == OperationState.SUCCEEDED, attached
        by_id = {d.id: d for d in h.fabric.devices(NODE_A)}
        # The operator would remove the least recently used otherwise: choose each of the two in turn.
        for chosen in sorted(by_id, reverse=True):
            kept = next(i for i in by_id if i != chosen)
            done = h.settle(h.fabric.detach(DetachRequest(key=f"drop-{chosen}", node=NODE_A,
                                                          device_ids=(chosen,))).key)
            assert done.state == OperationState.SUCCEEDED, done
            assert done.devices == (chosen,)
            on_machine = fresh.fm.attachments().get(fresh.machines[NODE_A], [])
            assert by_id[chosen].serial not in on_machine and by_id[kept].serial in on_machine
            assert [d.id for d in h.fabric.devices(NODE_A)] == [kept]
            if len(by_id) == 2:
                h.settle(_attach(h, f"again-{chosen}", NODE_A, 1).key)
                by_id = {d.id: d for d in h.fabric.devices(NODE_A)}
                assert len(by_id) == 2
    finally:
        h.close()


def test_a_decrease_racing_an_increase_waits_and_then_takes_the_device_dds_chose(fresh: World) -> None:
    """An idle GPU's detach asked while an attach on the same request is on its way: the operator removes a resource
    still attaching before the one marked, so lowering the size now would cancel the attach instead. The detach waits
    (refused, retryably, with the reason) and, once the attach is done, takes the device DDS chose."""
    h = RealOperatorHarness(fresh)
    fresh.fm.attach_latency_s = 3.0  # the second attach is still on its way when the detach is asked
    try:
        first = h.settle(_attach(h, "first", NODE_A, 1).key)
        assert first.state == OperationState.SUCCEEDED, first
        second = _attach(h, "second", NODE_A, 1)
        with pytest.raises(FabricError) as waits:
            h.fabric.detach(DetachRequest(key="drop-first", node=NODE_A, device_ids=first.devices))
        assert waits.value.code == ErrorCode.BACKEND and (
            "on their way" in waits.value.message or "still applying the last size change" in waits.value.message), \
            waits.value.message
        assert h.settle(second.key).state == OperationState.SUCCEEDED
        accepted: list[Operation] = []
        wait_for("the detach accepted", fresh, lambda: _accepted(lambda: accepted.append(h.fabric.detach(
            DetachRequest(key="drop-first", node=NODE_A, device_ids=first.devices)))))
        done = h.settle(accepted[0].key)
        assert done.state == OperationState.SUCCEEDED and done.devices == first.devices, done
        assert [d.id for d in h.fabric.devices(NODE_A)] == list(h.settle(second.key).devices)
        assert len(fresh.fm.attachments()[fresh.machines[NODE_A]]) == 1
    finally:
        fresh.fm.attach_latency_s = 0.0
        h.close()


def test_a_gpu_in_use_is_not_detached_and_stays_counted_detaching(fresh: World) -> None:
    h = short_bound(fresh)
    try:
        attached = h.settle(_attach(h, "busy", NODE_A, 1).key)
        [device] = h.fabric.devices(NODE_A)
        assert h.mark_in_use(device.id)
        done = h.settle(h.fabric.detach(DetachRequest(key="unforced", node=NODE_A, device_ids=attached.devices)).key)
        assert done.state == OperationState.FAILED and done.error is not None
        assert done.error.code == ErrorCode.DEVICE_IN_USE, done.error
        assert "found gpu load" in done.error.message
        assert device.serial in fresh.fm.attachments()[fresh.machines[NODE_A]]
        # The operator keeps the resource (being deleted) and keeps retrying: on its way out, never Online again.
        [still] = h.fabric.devices(NODE_A)
        assert (still.id, still.state) == (device.id, DeviceState.DETACHING)
        assert contract.online(h.fabric, NODE_A) == []
    finally:
        h.close()


def test_resources_being_deleted_are_not_counted_online(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        attached = h.settle(_attach(h, "two", NODE_B, 2).key)
        [first, second] = attached.devices
        hold_gpu(fresh, NODE_B, next(d.serial for d in h.fabric.devices(NODE_B) if d.id == first))
        h.fabric.detach(DetachRequest(key="held", node=NODE_B, device_ids=(first,)))
        # The operator cannot detach it (in use) and the resource stays with a deletionTimestamp.
        wait_for("the resource marked for deletion", fresh, lambda: (
            fresh.objects.get_cluster_custom_object(GROUP, VERSION, RESOURCES, first)["metadata"]
            .get("deletionTimestamp")))
        states = {d.id: d.state for d in h.fabric.devices(NODE_B)}
        assert states == {first: DeviceState.DETACHING, second: DeviceState.ONLINE}
        assert contract.online(h.fabric, NODE_B) == [second]
        assert contract.free(h.fabric) == TOTAL - 2  # still held by the fabric: not free either
    finally:
        h.close()


def test_a_request_someone_else_created_for_the_node_and_model_is_refused_by_name(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        intruder = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest",
                    "metadata": {"name": "composability-someone-else"},
                    "spec": {"resource": {"type": "gpu", "model": MODEL, "size": 0, "allocation_policy": "samenode",
                                          "target_node": NODE_B}}}
        fresh.objects.create_cluster_custom_object(GROUP, VERSION, REQUESTS, intruder)
        with pytest.raises(FabricError) as refused:
            _attach(h, "mine", NODE_B, 1)
        assert refused.value.code == ErrorCode.INVALID
        assert "composability-someone-else" in str(refused.value)
        assert [r["metadata"]["name"] for r in h.requests()] == ["composability-someone-else"]
    finally:
        h.close()


def test_a_resize_of_dds_request_by_another_field_manager_is_refused_by_name(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        attached = h.settle(_attach(h, "mine", NODE_C, 1).key)
        name = request_name("dds-", NODE_C, "gpu", MODEL)
        fresh.objects.patch_cluster_custom_object(GROUP, VERSION, REQUESTS, name,
                                                  {"spec": {"resource": {"size": 2}}},
                                                  field_manager="dynamic-device-scaler")
        with pytest.raises(FabricError) as refused:
            _attach(h, "more", NODE_C, 1)
        assert refused.value.code == ErrorCode.INVALID and "dynamic-device-scaler" in str(refused.value)
        with pytest.raises(FabricError) as refused:
            h.fabric.detach(DetachRequest(key="less", node=NODE_C, device_ids=attached.devices))
        assert refused.value.code == ErrorCode.INVALID and "dynamic-device-scaler" in str(refused.value)
    finally:
        h.close()


def test_the_operator_restarted_mid_attach_completes_it_once(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        fresh.fm.attach_latency_s = 2.0  # the operator is restarted while the fabric composes
        _attach(h, "across-operator-restart", NODE_A, 2)
        wait_for("the fabric composing", fresh,
                 lambda: any(d.get("status", {}).get("state") == "Attaching" for d in h.resources()))
        fresh.operator.restart()
        done = h.settle("across-operator-restart")
        assert done.state == OperationState.SUCCEEDED, done
        on_machine = fresh.fm.attachments()[fresh.machines[NODE_A]]
        assert sorted(on_machine) == sorted(d.serial for d in h.fabric.devices(NODE_A))
        assert len(on_machine) == 2 and fresh.fm.free_count(MODEL) == TOTAL - 2
    finally:
        fresh.fm.attach_latency_s = 0.0
        h.close()


# --- waits the operator never ends (it requeues without an error) ---

def _machine_empty(world: World, node: str) -> bool:
    return not world.fm.attachments().get(world.machines[node])


def test_an_attach_the_node_never_shows_ends_past_the_wait_bound_and_its_gpu_is_given_back(fresh: World) -> None:
    h = RealOperatorHarness(fresh, wait_bound_s=SHORT_WAIT_BOUND_S)
    try:
        fresh.agent.freeze(NODE_A)  # the fabric attaches; the node's driver never shows the GPU
        done = h.settle(_attach(h, "unseen", NODE_A, 1).key)
        assert done.state == OperationState.FAILED, done
        assert done.error is not None and done.error.code == ErrorCode.TIMEOUT, done
        assert "without an error (operator_wait_bound_seconds 15)" in done.error.message
        assert "attached in the fabric, not visible on the node" in done.error.message
        assert "giving back the 1 not attached" in done.error.message and "stranded" in done.error.message
        [request] = h.requests()
        assert request["spec"]["resource"]["size"] == 0
        # Once the node shows it, the operator lets the stranded GPU go: nothing is left attached.
        fresh.agent.freeze(NODE_A, False)
        wait_for("the given-back GPU off the fabric", fresh,
                 lambda: not h.resources() and _machine_empty(fresh, NODE_A))
        assert contract.free(h.fabric) == TOTAL
    finally:
        h.close()


def test_a_detach_the_node_keeps_showing_ends_past_the_wait_bound_with_the_gpu_reported_stranded(
        fresh: World) -> None:
    h = RealOperatorHarness(fresh, wait_bound_s=SHORT_WAIT_BOUND_S)
    try:
        attached = h.settle(_attach(h, "seen", NODE_A, 1).key)
        assert attached.state == OperationState.SUCCEEDED, attached
        fresh.agent.freeze(NODE_A)  # the fabric lets the GPU go; the node keeps showing it
        gone = h.settle(h.fabric.detach(DetachRequest(key="unseen-detach", node=NODE_A,
                                                      device_ids=attached.devices)).key)
        assert gone.state == OperationState.FAILED, gone
        assert gone.error is not None and gone.error.code == ErrorCode.TIMEOUT, gone
        assert f"{attached.devices[0]} Detaching" in gone.error.message and "stranded" in gone.error.message
        assert [d.state for d in h.fabric.devices(NODE_A)] == [DeviceState.DETACHING]
        fresh.agent.freeze(NODE_A, False)
        wait_for("the device gone", fresh, lambda: not h.resources() and _machine_empty(fresh, NODE_A))
    finally:
        h.close()


def test_a_forced_detach_reclaims_a_hung_attach(fresh: World) -> None:
    h = RealOperatorHarness(fresh)  # the wait bound far off: the orphan reclaim comes first
    try:
        fresh.agent.freeze(NODE_A)
        hung = _attach(h, "hung", NODE_A, 1)
        [resource] = wait_for("the fabric's device on the resource", fresh, lambda: [
            r for r in h.resources() if (r.get("status") or {}).get("device_id")])
        name = resource["metadata"]["name"]
        reclaim = h.fabric.detach(DetachRequest(key="orphan-reclaim", node=NODE_A, device_ids=(name,), force=True,
                                                reason="attach hung past the orphan timeout"))
        ended = h.fabric.operation(hung.key)
        assert ended is not None and ended.state == OperationState.FAILED, ended
        assert ended.error is not None and "cancelled by the forced detach orphan-reclaim" in ended.error.message
        [request] = h.requests()
        assert request["spec"]["resource"]["size"] == 0
        fresh.agent.freeze(NODE_A, False)
        assert h.settle(reclaim.key).state == OperationState.SUCCEEDED
        assert _machine_empty(fresh, NODE_A) and contract.free(h.fabric) == TOTAL
    finally:
        h.close()


# --- one writer per request: the operator's own races ---

def _request_named(h: RealOperatorHarness, name: str) -> dict[str, Any]:
    return h.objects.get_cluster_custom_object(GROUP, VERSION, REQUESTS, name)


def _stopped_between_its_two_writes(fresh: World, h: RealOperatorHarness, key: str) -> str:
    """An attach whose request the operator had listed a resource for but not created it when it stopped (its
    NodeAllocating status write done, its Updating pass not run): the state a restart or a slow operator leaves.
    Returns the request's name."""
    fresh.operator.stop()
    _attach(h, key, NODE_A, 1)
    name = request_name("dds-", NODE_A, "gpu", MODEL)
    request = _request_named(h, name)
    request["status"] = {"state": "Updating", "scalarResource": dict(request["spec"]["resource"]),
                         "resources": {f"gpu-{uuid.uuid4()}": {"state": "", "node_name": NODE_A}}}
    h.objects.replace_cluster_custom_object_status(GROUP, VERSION, REQUESTS, name, request)
    return name


def test_two_quick_increases_attach_no_more_than_the_size_says(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        name = _stopped_between_its_two_writes(fresh, h, "first")
        # the operator would put new resources on top of the listed one
        _a_second_increase_waits_then_each_gets_one_device(fresh, h, name, "listed but not created yet")
    finally:
        _operator_back(fresh)
        h.close()


def test_an_increase_waits_while_the_operator_lists_the_devices_of_the_last_one(fresh: World) -> None:
    """The operator writes the size it takes up when it enters NodeAllocating and lists its entries only when it leaves
    it: an increase written in between would be counted against the objects alone (CI: the fast path's attach and
    CA's, 75 ms apart, both applied, and a device was left that no resource held)."""
    h = RealOperatorHarness(fresh)
    try:
        fresh.operator.stop()
        _attach(h, "first", NODE_A, 1)
        name = request_name("dds-", NODE_A, "gpu", MODEL)
        request = _request_named(h, name)
        request["status"] = {"state": "NodeAllocating", "scalarResource": dict(request["spec"]["resource"])}
        h.objects.replace_cluster_custom_object_status(GROUP, VERSION, REQUESTS, name, request)
        _a_second_increase_waits_then_each_gets_one_device(fresh, h, name, "(NodeAllocating)")
    finally:
        _operator_back(fresh)
        h.close()


def _a_second_increase_waits_then_each_gets_one_device(fresh: World, h: RealOperatorHarness, name: str,
                                                       why: str) -> None:
    """With the operator stopped before it applied the attach "first": a second attach is refused, retryably, saying
    `why`; once the operator runs again, asked again as DDS's next passes do, it is accepted, and the two attaches
    get one device each: no more than the size says."""
    with pytest.raises(FabricError) as waits:
        _attach(h, "second", NODE_A, 1)
    assert waits.value.code == ErrorCode.BACKEND and why in waits.value.message, waits.value.message
    fresh.operator.start_when_port_free(PORT_WAIT_S)
    wait_for("the second attach accepted", fresh, lambda: _accepted(lambda: _attach(h, "second", NODE_A, 1)))
    assert h.settle("first").state == OperationState.SUCCEEDED
    assert h.settle("second").state == OperationState.SUCCEEDED
    wait_for("the request Running", fresh, lambda: _request_named(h, name)["status"].get("state") == "Running")
    assert _request_named(h, name)["spec"]["resource"]["size"] == 2
    assert len(h.resources()) == 2 and len(fresh.fm.attachments()[fresh.machines[NODE_A]]) == 2


def _operator_back(world: World) -> None:
    """The operator running again after a test stopped it (started at most once: its webhook port is fixed)."""
    if not world.operator.running():
        world.operator.start_when_port_free(PORT_WAIT_S)


def _accepted(call: Callable[[], Any]) -> bool:
    try:
        call()
    except FabricError as exc:
        if exc.code != ErrorCode.BACKEND:
            raise
        return False
    return True


def test_an_over_attached_request_is_found_and_its_size_follows_what_is_attached(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        name = _stopped_between_its_two_writes(fresh, h, "first")
        # a second increase DDS's guard never sends: an older DDS (the client's default field manager) writes it
        h.objects.patch_cluster_custom_object(GROUP, VERSION, REQUESTS, name, {"spec": {"resource": {"size": 2}}})
        fresh.operator.start_when_port_free(PORT_WAIT_S)
        wait_for("the operator over-attaching and settling", fresh, lambda: (
            _request_named(h, name)["status"].get("state") == "Running" and len(h.resources()) == 3))
        h.fabric.operations()  # what every observe asks
        request = _request_named(h, name)
        assert request["spec"]["resource"]["size"] == 3
        [event] = h.events.of("OverAttached")
        assert event[:2] == (f"Node {NODE_A}", "Warning") and "where its size said 2" in event[3]
        assert len(fresh.fm.attachments()[fresh.machines[NODE_A]]) == 3 and contract.free(h.fabric) == TOTAL - 3
    finally:
        _operator_back(fresh)
        h.close()


def test_a_failed_size_write_leaves_no_removal_mark(fresh: World) -> None:
    h = RealOperatorHarness(fresh)
    try:
        attached = h.settle(_attach(h, "two", NODE_A, 2).key)
        assert attached.state == OperationState.SUCCEEDED, attached
        fresh.operator.kill()  # its webhook stays registered (failurePolicy Fail): every request write is refused
        with pytest.raises(FabricError):
            h.fabric.detach(DetachRequest(key="refused", node=NODE_A, device_ids=attached.devices[:1]))
        marked = [r["metadata"]["name"] for r in h.resources()
                  if ANN_DELETE_DEVICE in ((r["metadata"].get("annotations")) or {})]
        assert marked == [], "a later decrease would take these devices first"
        assert not any(r["spec"].get("force_detach") for r in h.resources())
    finally:
        fresh.operator.restart()
        h.close()


def test_a_webhook_refusal_of_dds_write_names_the_other_writer(fresh: World) -> None:
    h = short_bound(fresh)
    rival = f"composability-{NODE_A}-gpu"
    try:
        fresh.fm.fail_next_attaches(1000, message="fabric switch sw-3 is down")
        doomed = _attach(h, "doomed", NODE_A, 1)
        fresh.operator.stop()  # (its webhook would refuse the other writer's request for the same node)
        h.objects.create_cluster_custom_object(GROUP, VERSION, REQUESTS, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest", "metadata": {"name": rival},
            "spec": {"resource": {"type": "gpu", "model": MODEL, "size": 0, "allocation_policy": "samenode",
                                  "target_node": NODE_A}}})
        fresh.operator.start_when_port_free(PORT_WAIT_S)
        time.sleep(SHORT_ERROR_BOUND_S)
        failed = h.settle(doomed.key)  # its give-back is a write of DDS's request: refused
        assert failed.state == OperationState.FAILED, failed
        [event] = wait_for("the refusal reported", fresh, lambda: h.events.of("OperatorWebhookRefused"))
        assert event[:2] == (f"Node {NODE_A}", "Warning") and rival in event[3]
        assert REGISTRY.get_sample_value("dds_operator_webhook_refusals_total", {"other_request": rival}) >= 1
    finally:
        _operator_back(fresh)
        with contextlib.suppress(ApiException):
            h.objects.delete_cluster_custom_object(GROUP, VERSION, REQUESTS, rival)
        wait_for("the other writer's request gone", fresh, lambda: rival not in {
            r["metadata"]["name"] for r in h.requests()})
        h.close()


# --- the operator's removal order and a resource its controller has not picked up (state "") ---

# In DRA mode the operator's fabric-manager calls block its ComposableResource worker, the only one it has
# (controller-runtime's default per controller): a detach the fabric takes this long keeps a resource created
# meanwhile in state "" well past PICK_UP_WAIT_BOUND_S (the attach ends) and well short of twice it (the owed
# give-back's own bound, the same setting counted from the attach's end); HUNG_FABRIC_S holds it well past both.
BUSY_FABRIC_S = 15.0
HUNG_FABRIC_S = 32.0
PICK_UP_WAIT_BOUND_S = 10.0


def _state_of(h: RealOperatorHarness, resource: str) -> Optional[str]:
    """A ComposableResource's status.state ("" before its controller took it up); None once it is gone."""
    found = {r["metadata"]["name"]: r for r in h.resources()}.get(resource)
    return None if found is None else (found.get("status") or {}).get("state", "")


def _ended(h: RealOperatorHarness, key: str) -> Optional[Operation]:
    op = h.fabric.operation(key)
    return op if op is not None and op.state.done else None


def _fabric_detaches(world: World, node: str) -> list[Any]:
    """The fabric manager's detach calls for the node's machine so far."""
    return [c for c in world.fm.calls() if c.method == "DELETE" and world.machines[node] in c.path]


def _fabric_detaching(world: World, node: str) -> bool:
    """Whether the fabric manager is in the middle of a detach call for the node's machine."""
    return any(device.busy for device in world.fm.devices_of(world.machines[node]))


@pytest.mark.parametrize("late", ["fails", "succeeds", "hung"])
def test_a_failed_attach_not_yet_picked_up_gives_back_its_own_resource_not_the_gpu_in_use(fresh: World,
                                                                                          late: str) -> None:
    """The operator's removal order on a size decrease tests for a state "None" it never writes: a ComposableResource
    in state "" (its controller has not taken it up) goes after the Online ones (composabilityrequest_controller.go,
    NodeAllocating). Its ComposableResource controller has one worker, so while that worker waits on the fabric for
    a detach on another node, a resource created meanwhile stays in state "". An attach that ends meanwhile (here past
    its wait bound) must not give its size back yet: the operator would remove the GPU in use instead. Its outcome is
    stored at once all the same (AttachFailed, once), with the give-back owed. `late` says what the operator's attach
    of that resource does once it takes it up: "fails" — DDS then gives the size back and the operator removes that
    resource, the one DDS chose, and the GPU in use stays, alone; "succeeds" — the GPU comes Online after its attach
    was reported failed, DDS reading all along (it waits while the operator attaches it): the outcome stays FAILED,
    the GPU stays as an ordinary one (a `LateAttach` Event), nothing is given back and nothing attached twice;
    "hung" — the worker stays busy past the owed give-back's bound: a `GiveBackOverdue` warning Event names the
    request and the operator's state, the resource is reported stranded (beside the GPU in use it cannot be given
    back), the request takes size changes again (a next attach is written), and once the worker is free the stranded
    resource and the next attach's each bring one GPU: nothing twice."""
    h = RealOperatorHarness(fresh, wait_bound_s=PICK_UP_WAIT_BOUND_S)
    watcher = OperationWatcher(h.fabric, h.events, time.time)  # the controller's: AttachFailed when the attach ends
    try:
        assert h.settle(_attach(h, "in-use", NODE_A, 1).key).state == OperationState.SUCCEEDED
        [gpu] = h.fabric.devices(NODE_A)
        hold_gpu(fresh, NODE_A, gpu.serial or "")
        # The fabric emulator hands out its first free device. The late attach must not get the GPU just detached
        # from the other node: the operator's DRA visibility check looks for a GPU's uuid in every node's
        # ResourceSlice, so that detach would never end while the GPU shows on node A (docs/composability.md, Known
        # issues). A device freed on node C first is the one it gets ("hung" attaches two: both freed on node C).
        gap = h.settle(_attach(h, "gap", NODE_C, 2 if late == "hung" else 1).key)
        elsewhere = h.settle(_attach(h, "elsewhere", NODE_B, 1).key)
        assert elsewhere.state == OperationState.SUCCEEDED, elsewhere
        assert h.settle(h.fabric.detach(DetachRequest(key="gap-freed", node=NODE_C, device_ids=gap.devices)).key
                        ).state == OperationState.SUCCEEDED
        detaches_from_a = len(_fabric_detaches(fresh, NODE_A))  # the module's earlier cases' calls are recorded too
        attaches_to_a = len(_fabric_attaches(fresh, NODE_A))

        fresh.fm.detach_latency_s = HUNG_FABRIC_S if late == "hung" else BUSY_FABRIC_S
        drained = h.fabric.detach(DetachRequest(key="slow-fabric", node=NODE_B, device_ids=elsewhere.devices))
        wait_for("the operator waiting on the fabric's detach on the other node", fresh,
                 lambda: _fabric_detaching(fresh, NODE_B))
        fresh.fm.fail_next_attaches(1000, message="fabric switch sw-3 is down")  # the new attach cannot succeed
        second = _attach(h, "second", NODE_A, 1)
        watcher.watch(second)
        name = request_name("dds-", NODE_A, "gpu", MODEL)
        [unpicked] = wait_for("the new ComposableResource created", fresh, lambda: [
            r["metadata"]["name"] for r in h.resources()
            if r["metadata"]["labels"].get("app.kubernetes.io/managed-by") == name and r["metadata"]["name"] != gpu.id])
        [failed] = wait_for("the attach past its wait bound", fresh, watcher.poll, timeout_s=60)
        assert failed.state == OperationState.FAILED and failed.error is not None, failed
        assert failed.error.code == ErrorCode.TIMEOUT, failed.error
        assert f"{unpicked} not picked up by the operator" in failed.error.message, failed.error.message
        assert _state_of(h, unpicked) == "" and _fabric_detaching(fresh, NODE_B), \
            "the fabric's detach elsewhere no longer holds the operator's resource worker: the test proves nothing"
        assert _request_named(h, name)["spec"]["resource"]["size"] == 2, \
            "given back now, the operator would remove the GPU in use"
        assert _stored_outcome(h, name, second.key) == OperationState.FAILED.value, "reported, so stored at once"

        if late == "hung":
            stranded_before = REGISTRY.get_sample_value("dds_gpus_stranded_total") or 0.0
            [(node, kind, _, message)] = wait_for("the owed give-back past its bound", fresh, lambda: (
                h.fabric.operation(second.key) and h.events.of("GiveBackOverdue")), timeout_s=60)
            assert (node, kind) == (f"Node {NODE_A}", "Warning"), message
            # the request's state as the operator left it (Updating: it waits on its resources)
            assert re.search(rf"ComposabilityRequest {name} \((Updating|Running)\)", message), message
            assert f"has not taken up {unpicked}" in message and f"{unpicked} stranded" in message, message
            assert _state_of(h, unpicked) == "" and _fabric_detaching(fresh, NODE_B), \
                "the operator's worker no longer busy: the test proves nothing"
            assert (REGISTRY.get_sample_value("dds_gpus_stranded_total") or 0.0) - stranded_before == 1
            assert _request_named(h, name)["spec"]["resource"]["size"] == 2, "the GPU in use would have gone"
            fresh.fm.fail_next_attaches(0)
            # Released: the request takes a size change again (asked as DDS's passes do, should the operator be
            # between two passes on it).
            wait_for("the next attach accepted", fresh, lambda: _accepted(lambda: _attach(h, "third", NODE_A, 1)))
            third = h.fabric.operation("third")
            assert third is not None
            assert _request_named(h, name)["spec"]["resource"]["size"] == 3
            # DDS reads nothing until the worker is free and both resources are Online (as a DDS busy elsewhere
            # would; read before, past this harness's short wait bound, the next attach would end Timeout too).
            wait_for("the stranded resource and the next attach's Online", fresh, lambda: sum(
                (r.get("status") or {}).get("state") == "Online" for r in h.resources()
                if r["metadata"]["labels"].get("app.kubernetes.io/managed-by") == name) == 3, timeout_s=120)
            third = h.settle(third.key)
            assert third.state == OperationState.SUCCEEDED, third
            assert _state_of(h, unpicked) == "Online"
            assert sorted(d.id for d in h.fabric.devices(NODE_A)) == sorted([gpu.id, unpicked, *third.devices])
            assert unpicked not in third.devices
            assert len(fresh.fm.attachments()[fresh.machines[NODE_A]]) == 3
            assert not h.events.of("OverAttached") and not h.events.of("LateAttach"), h.events.emitted
        elif late == "fails":
            # The fabric's detach done, the operator takes the resource up (Attaching; the fabric refuses it); DDS's
            # next read gives the size back and the operator removes that resource, the one DDS chose.
            wait_for("the size given back", fresh, lambda: (
                h.fabric.operation(second.key)
                and _request_named(h, name)["spec"]["resource"]["size"] == 1), timeout_s=120)
            wait_for("the resource not attached gone", fresh, lambda: _state_of(h, unpicked) is None)
            assert [(d.id, d.state) for d in h.fabric.devices(NODE_A)] == [(gpu.id, DeviceState.ONLINE)]
            assert fresh.fm.attachments()[fresh.machines[NODE_A]] == [gpu.serial]
            assert not h.events.of("LateAttach"), h.events.emitted
        else:
            # The fabric works again before the operator takes the resource up. DDS reads on, as its passes do: it
            # sees the resource taken up and attaching (no error) before it is Online, and waits for it rather than
            # cancel that attach by giving the size back; then it finds a device it reported failed.
            fresh.fm.fail_next_attaches(0)

            def online_as_dds_reads() -> bool:
                h.fabric.operation(second.key)
                return _state_of(h, unpicked) == "Online"

            wait_for("the late resource Online", fresh, online_as_dds_reads, timeout_s=120)
            late_op = h.fabric.operation(second.key)
            assert late_op is not None and late_op.state == OperationState.FAILED, late_op
            assert late_op.error is not None and late_op.error.message == failed.error.message
            assert sorted((d.id, d.state) for d in h.fabric.devices(NODE_A)) == sorted(
                [(gpu.id, DeviceState.ONLINE), (unpicked, DeviceState.ONLINE)])
            assert _request_named(h, name)["spec"]["resource"]["size"] == 2, "the late GPU is counted, not given back"
            [(node, kind, _, message)] = h.events.of("LateAttach")
            assert (node, kind) == (f"Node {NODE_A}", "Normal") and unpicked in message, message
            assert len(fresh.fm.attachments()[fresh.machines[NODE_A]]) == 2
            assert not h.events.of("OverAttached"), h.events.emitted
        resource = {r["metadata"]["name"]: r for r in h.resources()}[gpu.id]
        assert not resource["metadata"].get("deletionTimestamp"), resource["metadata"]
        assert not (resource["metadata"].get("annotations") or {}).get(ANN_DELETE_DEVICE), resource["metadata"]
        assert len(_fabric_detaches(fresh, NODE_A)) == detaches_from_a, "the fabric was asked to detach from node A"
        assert len(_fabric_attaches(fresh, NODE_A)) - attaches_to_a == {"fails": 0, "succeeds": 1, "hung": 2}[late], \
            "the fabric attached to node A other than each GPU once"
        # Reported once and final: the stored outcome, a restarted DDS's read of it, and one AttachFailed Event (the
        # controller's watcher), no AttachedGPU for it; a restarted controller adopts nothing.
        assert h.fabric.operation(second.key).state == OperationState.FAILED
        assert _stored_outcome(h, name, second.key) == OperationState.FAILED.value
        # The slow detach elsewhere ends too (read once it is done: past this harness's short wait bound, read while
        # the operator still worked on it, it would have ended Timeout with its device counted detaching).
        wait_for("the other node's GPU off the fabric", fresh,
                 lambda: _machine_empty(fresh, NODE_B) and not h.fabric.devices(NODE_B))
        assert h.settle(drained.key).state == OperationState.SUCCEEDED
        assert h.restart().operation(second.key).state == OperationState.FAILED
        assert len(h.events.of("AttachFailed")) == 1 and not h.events.of("AttachedGPU"), h.events.emitted
        restarted = OperationWatcher(h.fabric, h.events, time.time)
        restarted.adopt_in_flight()
        assert second.key not in {op.key for op in restarted.in_flight()}, "a restarted DDS would follow it again"
        assert contract.free(h.fabric) == TOTAL - {"fails": 1, "succeeds": 2, "hung": 3}[late]
    finally:
        fresh.fm.detach_latency_s = 0.0
        h.close()


def _stored_outcome(h: RealOperatorHarness, name: str, key: str) -> Optional[str]:
    """The state DDS stored for operation `key` in its request's annotation (None while it runs)."""
    annotations = _request_named(h, name)["metadata"].get("annotations") or {}
    records = {r["key"]: r for r in json.loads(annotations.get(ANN_OPERATIONS, "[]"))}
    return records[key].get("state")


def _fabric_attaches(world: World, node: str) -> list[Any]:
    """The fabric manager's attach calls for the node's machine it answered with success so far."""
    return [c for c in world.fm.calls()
            if c.method == "PATCH" and world.machines[node] in c.path and 200 <= c.status < 300]
