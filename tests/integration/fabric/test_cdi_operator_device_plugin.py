"""The CDI operator's DEVICE_PLUGIN mode at the pinned commit, as it runs: through the FTI cluster manager (CM API) it
attaches and detaches; through the fabric manager (FM API) it cannot (upstream's bug, pinned here).

`DEVICE_RESOURCE_TYPE=DEVICE_PLUGIN` needs `FTI_CDI_CLUSTER_ID`; the operator then finds a node's machine through the
Node's `machine.openshift.io/machine` annotation. With `FTI_CDI_API_TYPE=CM` (harness/cluster_manager.py) that chain
is OpenShift Machine -> BareMetalHost -> the CM machine uuid, and an attach is: a resize POST, a requeue of 30 s (the
CM client's ErrWaitingDeviceAttaching), the device taken from the machine's ADD_COMPLETE devices, then seen by
`nvidia-smi` in the node's driver pod (harness/gpu_node_agent.py plays the node: driver pod, nvidia-smi, capacity
`nvidia.com/gpu`). With `FTI_CDI_API_TYPE=FM` the client reads a Metal3Machine, a type the operator's scheme does not
register, and every attach fails before any fabric call (docs/composability.md, "Known issues").

A control plane of its own (as test_cdi_operator_process.py): the operator reconciles every request in its cluster.
One operator at a time in a network (its webhook port is fixed), so each test starts and stops its own.

Why a test takes about two minutes: the operator's own pace, not the harness's. After every resize POST the CM client
returns ErrWaitingDeviceAttaching (or ...Detaching) and the ComposableResource controller looks again only 30 s later
(composableresource_controller.go, `requeueAfter(30*time.Second)`, constants at the pinned commit): two attaches and
two detaches are four such looks; and of two resources requested together one POSTs, the other's POST is refused
(409: one resize of a spec at a time) and its quick retry takes the device the first one's POST added, so the first
finds none at its next look and POSTs again: a second round. Nothing on the harness side is slower than a second.

Each test has a control plane of its own (about 10 s to start): the operator reconciles every request in its cluster,
and the requests an earlier test left (its cluster manager gone with it) kept a later test's operator busy and counted
in DDS's pool. Under pytest-xdist the tests may run in separate workers side by side (`spread`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from harness.cdi_operator import CdiOperator, DeviceResourceType, FabricManagerAccess
from harness.cluster_manager import ClusterManagerEmulator, FailedAdds
from harness.controlplane import KWOK_NODE_ANNOTATION, ControlPlane, ensure_binaries, start_control_plane
from harness.fabric_manager import FabricManagerEmulator
from dds.config import ComposabilitySettings, PoolSpec
from dds.controller.executor import OperationWatcher
from dds.fabric.base import AttachRequest, DetachRequest, DeviceState, ErrorCode, FabricError, OperationState
from dds.fabric.composability import ComposabilityRequestFabric
from harness import rbac
from harness.gpu_node_agent import GPU_RESOURCE, DeviceMode, GpuNodeAgent, NodeTimings
from tests.integration.fabric.test_composability_contract import RecordedEvents

pytestmark = [pytest.mark.integration, pytest.mark.spread]

GROUP, VERSION = "cro.hpsys.ibm.ie.com", "v1alpha1"
MODEL = "A100"
CLUSTER_ID = "6d0c3c9e-3f5e-4a7b-9f1e-2b8c4d5e6f70"
UPSTREAM_ERROR = "no kind is registered for the type v1beta1.Metal3Machine"
# The operator looks at the CM again 30 s after each resize: an attach takes that, a failed one about twice that plus
# the CM's memory of the failure. The bounds only keep a broken run from hanging.
SETTLE_TIMEOUT_S = 150.0
# Another run's operator (outside pytest-xdist's workers, which each have a network of their own) may hold the fixed
# webhook port for a while.
PORT_WAIT_S = 300.0
# The CM keeps a failed add's ADD_FAILED for this long, then forgets it (and the operator's retry attaches). It must
# outlast the operator's look 30 s after its POST (the add fails 1-2 s after the POST, the attach latency, so this
# leaves about 5 s for a loaded machine); any longer only delays the retry the test waits for.
FAILED_ADD_VISIBLE_S = 35.0


@pytest.fixture
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with start_control_plane(tmp_path_factory.mktemp("cdi-device-plugin-plane"), bin_dir=ensure_binaries()) as started:
        yield started


@pytest.fixture
def api(plane: ControlPlane) -> Iterator[Any]:
    with plane.api_client() as api_client:
        yield api_client


class DevicePluginCluster:
    """One CM emulator, the node agent in device-plugin mode and the operator in DEVICE_PLUGIN + CM mode."""

    def __init__(self, plane: ControlPlane, api: Any, manager: ClusterManagerEmulator,
                 timings: NodeTimings = NodeTimings()) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.manager = manager
        self.agent = GpuNodeAgent(api, manager, mode=DeviceMode.DEVICE_PLUGIN, timings=timings).start()
        self.operator = CdiOperator(plane, FabricManagerAccess.of(manager),
                                    device_resource_type=DeviceResourceType.DEVICE_PLUGIN)

    def close(self) -> None:
        self.operator.stop()
        self.agent.stop()

    def add_node(self) -> tuple[str, str]:
        name = f"gpu-node-{uuid.uuid4().hex[:6]}"
        key, value = KWOK_NODE_ANNOTATION
        self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                                                                                "annotations": {key: value}}})
        return name, self.agent.add_node(name)

    def request(self, node: str, size: int) -> str:
        name = f"gpus-{node}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest", "metadata": {"name": name},
                "spec": {"resource": {"type": "gpu", "model": MODEL, "size": size, "allocation_policy": "samenode",
                                      "target_node": node}}}
        self.custom.create_cluster_custom_object(GROUP, VERSION, "composabilityrequests", body)
        return name

    def resize(self, request: str, size: int) -> None:
        self.custom.patch_cluster_custom_object(GROUP, VERSION, "composabilityrequests", request,
                                                {"spec": {"resource": {"size": size}}})

    def resources(self, node: str) -> list[dict[str, Any]]:
        items = self.custom.list_cluster_custom_object(GROUP, VERSION, "composableresources")["items"]
        return [item for item in items if item["spec"].get("target_node") == node]

    def capacity(self, node: str) -> str:
        return (self.core.read_node(node).status.capacity or {}).get(GPU_RESOURCE, "0")

    def wait(self, what: str, predicate: Callable[[], Any], timeout: float = SETTLE_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            assert time.monotonic() < deadline, (f"not reached in {timeout:.0f} s: {what}; fabric: "
                                                 f"{self.manager.attachments()}\n{self.operator.log_tail(60)}")
            time.sleep(0.5)


@pytest.fixture
def cluster(plane: ControlPlane, api: Any) -> Iterator[DevicePluginCluster]:
    # Attach 1-2 s and detach 1 s: the CM's resize stays asynchronous (the operator's wait-and-look path, and the 409
    # of a second resize while one is under way), yet far below the operator's 30 s between looks, which the tests'
    # time is made of.
    with ClusterManagerEmulator({MODEL: 3}, attach_latency_s=(1.0, 2.0), detach_latency_s=1.0,
                                failed_add_visible_s=FAILED_ADD_VISIBLE_S) as manager:
        started = DevicePluginCluster(plane, api, manager)
        try:
            started.operator.start_when_port_free(PORT_WAIT_S)
            yield started
        finally:
            started.close()


def online(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in resources if (r.get("status") or {}).get("state") == "Online"
            and not r["metadata"].get("deletionTimestamp")]


def test_device_plugin_mode_attaches_and_detaches_through_the_cluster_manager(cluster: DevicePluginCluster) -> None:
    node, machine = cluster.add_node()
    request = cluster.request(node, 2)
    attached = cluster.wait("two ComposableResources Online", lambda: len(online(cluster.resources(node))) == 2
                            and online(cluster.resources(node)))
    # Each resource holds one of the devices the CM attached to the node's machine: its device_id is the GPU's UUID,
    # which the operator saw in nvidia-smi on the node; the device plugin's capacity shows both.
    serials = sorted(cluster.manager.attachments()[machine])
    assert sorted(r["status"]["device_id"] for r in attached) == serials
    assert cluster.capacity(node) == "2"
    increases = [c for c in cluster.manager.resize_calls() if c.status == 202]
    assert len(increases) == 2  # one resize per device, nothing attached twice

    # Detach one: the CM removes the device the operator chose, the node loses it, the resource goes.
    cluster.resize(request, 1)
    cluster.wait("one ComposableResource left", lambda: len(cluster.resources(node)) == 1)
    [left] = cluster.resources(node)
    assert cluster.manager.attachments()[machine] == [left["status"]["device_id"]]
    cluster.wait("the node's capacity down to 1", lambda: cluster.capacity(node) == "1")
    assert cluster.manager.free_count(MODEL) == 2

    cluster.resize(request, 0)
    cluster.wait("no ComposableResource left", lambda: not cluster.resources(node))
    assert not cluster.manager.attachments().get(machine) and cluster.capacity(node) == "0"


def test_device_plugin_mode_refuses_a_detach_while_any_gpu_of_the_node_is_busy(cluster: DevicePluginCluster) -> None:
    """The operator's in-use check in DEVICE_PLUGIN mode covers every GPU of the node (composableresource_controller.go
    handleDetachingState: CheckNoGPULoads with no target GPU), not only the one going: DDS sees a detach of an idle GPU
    refused while another GPU of the node runs a pod (DeviceInUse), and the detach goes once the node is idle."""
    node, machine = cluster.add_node()
    request = cluster.request(node, 2)
    cluster.wait("two ComposableResources Online", lambda: len(online(cluster.resources(node))) == 2)
    cluster.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"busy-{node}"},
        "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "train", "image": "train",
                                 "resources": {"limits": {GPU_RESOURCE: "1"}}}]}})
    cluster.wait("the pod's process on a GPU (nvidia-smi)", lambda: cluster.agent.node_state(node)["processes"])
    busy = cluster.agent.node_state(node)["processes"][0]["gpu_uuid"]
    idle = next(r for r in cluster.resources(node) if r["status"]["device_id"] != busy)
    # DDS's way of choosing the device: the annotation the operator removes first, then the size.
    cluster.custom.patch_cluster_custom_object(GROUP, VERSION, "composableresources", idle["metadata"]["name"],
                                               {"metadata": {"annotations": {"cohdi.io/delete-device": "true"}}})
    cluster.resize(request, 1)

    def refused() -> str:
        current = [r for r in cluster.resources(node) if r["metadata"]["name"] == idle["metadata"]["name"]]
        return next(((r.get("status") or {}).get("error", "") for r in current
                     if "found gpu load" in (r.get("status") or {}).get("error", "")), "")

    error = cluster.wait("the idle GPU's detach refused for the other GPU's load", refused)
    assert busy in error, error
    assert sorted(cluster.manager.attachments()[machine]) == sorted(
        [busy, idle["status"]["device_id"]]), "the fabric let a GPU go that the operator refused to detach"

    cluster.core.delete_namespaced_pod(f"busy-{node}", "default", grace_period_seconds=0)
    cluster.wait("the idle GPU detached once the node is idle", lambda: len(cluster.resources(node)) == 1)
    assert cluster.manager.attachments()[machine] == [busy]
    cluster.resize(request, 0)
    cluster.wait("no ComposableResource left", lambda: not cluster.resources(node))


def test_a_failed_add_is_the_resources_error_and_the_operators_retry_attaches(cluster: DevicePluginCluster) -> None:
    node, machine = cluster.add_node()
    cluster.manager.fail_next_attaches(1, message="switch port 7 did not come up")
    request = cluster.request(node, 1)

    errors: set[str] = set()

    def failure_reported() -> bool:
        errors.update(e for r in cluster.resources(node) if (e := (r.get("status") or {}).get("error")))
        return any("switch port 7 did not come up" in e for e in errors)

    # On the way the operator may also show a 409: a reconcile that sent the resize again while the failing add was
    # under way (the CM allows one resize of a spec at a time); it retries, and the add's own failure follows.
    cluster.wait("the CM's ADD_FAILED reason in the resource's status.error", failure_reported)
    others = {e for e in errors if "switch port 7 did not come up" not in e and "http returned status: 409" not in e}
    assert not others, others
    assert not cluster.manager.attachments().get(machine), "a failed add left a device attached"
    [resource] = cluster.wait("the operator's retry attaching once the CM forgot the failure",
                              lambda: online(cluster.resources(node)))
    assert cluster.manager.attachments()[machine] == [resource["status"]["device_id"]]
    assert not (resource.get("status") or {}).get("error")
    cluster.resize(request, 0)
    cluster.wait("no ComposableResource left", lambda: not cluster.resources(node))


def test_fabric_manager_api_still_fails_every_attach_on_the_unregistered_metal3machine(plane: ControlPlane,
                                                                                       api: Any) -> None:
    """Upstream's bug at 38251b7: with FTI_CDI_API_TYPE=FM the DEVICE_PLUGIN path reads a Metal3Machine the manager's
    scheme never registers. When this starts failing because a GPU *was* attached, the FM API works in this mode."""
    with FabricManagerEmulator({MODEL: 2}) as fm:
        operator = CdiOperator(plane, FabricManagerAccess.of(fm, cluster_id=CLUSTER_ID),
                               device_resource_type=DeviceResourceType.DEVICE_PLUGIN).start_when_port_free(PORT_WAIT_S)
        try:
            node = f"gpu-node-{uuid.uuid4().hex[:6]}"
            key, value = KWOK_NODE_ANNOTATION
            client.CoreV1Api(api).create_node({"apiVersion": "v1", "kind": "Node",
                                               "metadata": {"name": node, "annotations": {key: value}}})
            with GpuNodeAgent(api, fm, mode=DeviceMode.DEVICE_PLUGIN) as agent:
                machine = agent.add_node(node)
                custom = client.CustomObjectsApi(api)
                custom.create_cluster_custom_object(GROUP, VERSION, "composabilityrequests", {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest",
                    "metadata": {"name": f"gpus-{node}"},
                    "spec": {"resource": {"type": "gpu", "model": MODEL, "size": 1, "allocation_policy": "samenode",
                                          "target_node": node}}})
                errors: list[str] = []
                deadline = time.monotonic() + SETTLE_TIMEOUT_S
                while not any(UPSTREAM_ERROR in e for e in errors):
                    assert time.monotonic() < deadline, (f"no {UPSTREAM_ERROR!r} after {SETTLE_TIMEOUT_S:.0f} s; "
                                                         f"errors seen: {errors}\n{operator.log_tail()}")
                    items = custom.list_cluster_custom_object(GROUP, VERSION, "composableresources")["items"]
                    errors = [(item.get("status") or {}).get("error", "") for item in items
                              if item["spec"].get("target_node") == node]
                    time.sleep(0.5)
                # The Metal3 chain the client would follow is there: only the scheme stops it.
                annotations = client.CoreV1Api(api).read_node(node).metadata.annotations or {}
                assert "machine.openshift.io/machine" in annotations
                assert not fm.attachments().get(machine), "the fabric attached a GPU: DEVICE_PLUGIN works now"
                assert not [c for c in fm.calls() if c.method in ("PATCH", "DELETE")], fm.calls()
        finally:
            operator.stop()


# --- a node as slow as a real server (harness NodeTimings), with DDS's fabric on it ---

# Longer than DDS's error bound below, as a real driver's minutes are longer than its 120 s default: the operator
# reports the missing driver pod as an error all that time.
DRIVER_DELAY_S = 45.0
PLUGIN_RESTART_S = 8.0
DDS_ERROR_BOUND_S = 15.0
DDS_WAIT_BOUND_S = 300.0


def dds_fabric(dds_api: Any) -> ComposabilityRequestFabric:
    """DDS's backend under its own ServiceAccount, with this module's bounds and one pool of MODEL."""
    return ComposabilityRequestFabric(
        dds_api, ComposabilitySettings(operator_error_bound_seconds=DDS_ERROR_BOUND_S,
                                       operator_wait_bound_seconds=DDS_WAIT_BOUND_S),
        [PoolSpec(name="pool", devices={MODEL: 3})], clock=time.time)


def ended(fabric: ComposabilityRequestFabric, key: str) -> Any:
    op = fabric.operation(key)
    return op if op is not None and op.state.done else None


def test_the_first_gpu_of_a_gpu_less_node_survives_a_slow_driver_and_a_device_plugin_restart(
        plane: ControlPlane, api: Any) -> None:
    """The first GPU of a node with no GPU driver yet: the CM attaches it, the node shows it only once its driver pod
    runs, DRIVER_DELAY_S later; meanwhile the operator reports "nvidia-driver-daemonset pod is not found". DDS waits
    for the node (its wait bound), not its error bound: the attach succeeds with one resize, nothing given back. The
    operator then restarts the device plugin, whose pods really restart: the node's allocatable drops and returns."""
    timings = NodeTimings(driver_delay_s=DRIVER_DELAY_S, plugin_restart_s=PLUGIN_RESTART_S)
    with ClusterManagerEmulator({MODEL: 3}, attach_latency_s=1.0, detach_latency_s=1.0,
                                failed_add_visible_s=FAILED_ADD_VISIBLE_S) as manager, \
            rbac.api_client(rbac.install(plane, rbac.DDS)) as dds_api:
        cluster = DevicePluginCluster(plane, api, manager, timings=timings)
        try:
            cluster.operator.start_when_port_free(PORT_WAIT_S)
            node, machine = cluster.add_node()
            fabric = dds_fabric(dds_api)
            started = fabric.attach(AttachRequest(key="first-gpu", node=node, pool="pool", model=MODEL, count=1))
            allocatable_seen: set[str] = set()

            def allocatable() -> str:
                seen = (cluster.core.read_node(node).status.allocatable or {}).get(GPU_RESOURCE, "0")
                allocatable_seen.add(seen)
                return seen

            done = cluster.wait("DDS's attach ended", lambda: allocatable() and ended(fabric, started.key),
                                timeout=DRIVER_DELAY_S + SETTLE_TIMEOUT_S)
            assert done.state == OperationState.SUCCEEDED, done
            assert cluster.agent.driver_ready(node)
            increases = [c for c in manager.resize_calls() if c.status == 202]
            assert len(increases) == 1, "the GPU was given back and asked for again"
            assert len(manager.attachments()[machine]) == 1
            # the operator restarted the device plugin after the attach: the node's allocatable dropped, then returned
            cluster.wait("the device plugin restarted", lambda: cluster.agent.plugin_restarts >= 1)
            cluster.wait("the node's GPU allocatable dropped and back",
                         lambda: allocatable() == "1" and "0" in allocatable_seen)
            assert fabric.operation(started.key).state == OperationState.SUCCEEDED  # the flap changed nothing
            assert len([c for c in manager.resize_calls() if c.status == 202]) == 1
        finally:
            cluster.close()


def test_a_cluster_manager_that_keeps_a_failed_add_costs_dds_no_device(plane: ControlPlane, api: Any) -> None:
    """FailedAdds.KEEP: the CM lists a failed add for good, so the operator's client fails every add of the model to
    the machine on it. DDS's attach ends past its error bound quoting the CM's reason and gives the size back; nothing
    stays attached and the pool is whole."""
    with ClusterManagerEmulator({MODEL: 3}, attach_latency_s=1.0, detach_latency_s=1.0,
                                failed_adds=FailedAdds.KEEP) as manager, \
            rbac.api_client(rbac.install(plane, rbac.DDS)) as dds_api:
        cluster = DevicePluginCluster(plane, api, manager)
        try:
            cluster.operator.start_when_port_free(PORT_WAIT_S)
            node, machine = cluster.add_node()
            fabric = dds_fabric(dds_api)
            free_before = fabric.pools()[0].free[MODEL]
            manager.fail_next_attaches(1, message="switch port 7 did not come up")
            started = fabric.attach(AttachRequest(key="kept-failure", node=node, pool="pool", model=MODEL, count=1))
            done = cluster.wait("DDS's attach ended", lambda: ended(fabric, started.key))
            assert done.state == OperationState.FAILED and done.error is not None, done
            assert done.error.code == ErrorCode.BACKEND and "switch port 7 did not come up" in done.error.message
            cluster.wait("the given-back resource gone", lambda: not cluster.resources(node))
            assert manager.failed_adds(machine), "the CM still lists the failed add"
            assert not manager.attachments().get(machine) and manager.free_count(MODEL) == 3
            assert all(d.node != node for d in fabric.devices()) and fabric.pools()[0].free[MODEL] == free_before
        finally:
            cluster.close()


# In this mode the operator drains a GPU in the node's driver pod before it asks the cluster manager to remove it:
# `nvidia-smi drain -p <bus> -m 1` must succeed, then `-r` (its failure ignored) (internal/utils/gpus.go DrainGPU,
# "OCP + DEVICE_PLUGIN"). DRA mode with the driver in a container reads the GPUs from /proc/driver/nvidia instead,
# which this machine does not have: there the operator finds nothing to drain, so the drain is tested here.
DRAIN_FAILURE = "In use by another client"
SLOW_DRAIN_S = 5.0  # REALISTIC_NODE's drain; the operator runs two


def resource_error(cluster: DevicePluginCluster, node: str, name: str) -> str:
    return next(((r.get("status") or {}).get("error") or "" for r in cluster.resources(node)
                 if r["metadata"]["name"] == name), "")


def test_a_gpu_drain_that_fails_fails_the_detach_and_a_slow_one_only_delays_it(plane: ControlPlane, api: Any) -> None:
    """A drain that fails is the resource's error, which the operator retries: DDS's detach ends FAILED past its error
    bound quoting nvidia-smi (a DetachFailed Event); the GPU stays attached, on the node's capacity, counted detaching
    and free in no pool; a second detach of it is refused (lowering the size again would take the other GPU). Once
    drains work again, slowly as on a real server, the operator's retry lets it go and a later detach succeeds, with
    no error reported while it drains."""
    with ClusterManagerEmulator({MODEL: 3}, attach_latency_s=1.0, detach_latency_s=1.0,
                                failed_add_visible_s=FAILED_ADD_VISIBLE_S) as manager, \
            rbac.api_client(rbac.install(plane, rbac.DDS)) as dds_api:
        cluster = DevicePluginCluster(plane, api, manager)
        try:
            cluster.operator.start_when_port_free(PORT_WAIT_S)
            node, machine = cluster.add_node()
            fabric = dds_fabric(dds_api)
            free_before = fabric.pools()[0].free[MODEL]
            events = RecordedEvents()
            watcher = OperationWatcher(fabric, events, time.time)
            devices: list[str] = []
            for key in ("first", "second"):  # one at a time: two adds at once are refused by the CM (409) and retried
                started = fabric.attach(AttachRequest(key=key, node=node, pool="pool", model=MODEL, count=1))
                attached = cluster.wait(f"DDS's attach {key} ended", lambda: ended(fabric, started.key))
                assert attached.state == OperationState.SUCCEEDED, attached
                devices += attached.devices
            undrained, other = devices
            serial = {d.id: d.serial for d in fabric.devices(node)}

            cluster.agent.set_timings(NodeTimings(drain_failure=DRAIN_FAILURE))
            cluster.agent.sync(node)
            resizes = len([c for c in manager.resize_calls() if c.status == 202])
            watcher.watch(fabric.detach(DetachRequest(key="undrainable", node=node, device_ids=(undrained,))))
            [failed] = cluster.wait("DDS's detach ended", watcher.poll)
            assert failed.state == OperationState.FAILED and failed.error is not None, failed
            assert failed.error.code == ErrorCode.BACKEND, failed.error
            assert DRAIN_FAILURE in failed.error.message and "(the operator keeps retrying it)" in failed.error.message
            assert (failed.finished_at or 0.0) - failed.started_at >= DDS_ERROR_BOUND_S, failed
            [event] = events.of("DetachFailed")
            assert event[:2] == (f"Node {node}", "Warning") and DRAIN_FAILURE in event[3], event
            # Still attached and counted: on the node's capacity, detaching (no plan counts on it), free in no pool;
            # nothing was asked of the cluster manager.
            assert sorted(manager.attachments()[machine]) == sorted(serial.values()) and cluster.capacity(node) == "2"
            assert {d.id: d.state for d in fabric.devices(node)} == {undrained: DeviceState.DETACHING,
                                                                    other: DeviceState.ONLINE}
            assert fabric.pools()[0].free[MODEL] == free_before - 2
            assert len([c for c in manager.resize_calls() if c.status == 202]) == resizes
            with pytest.raises(FabricError) as again:
                fabric.detach(DetachRequest(key="again", node=node, device_ids=(undrained,)))
            assert again.value.code == ErrorCode.INVALID and "already being detached" in again.value.message

            cluster.agent.set_timings(NodeTimings(drain_delay_s=SLOW_DRAIN_S))  # drains work again, slowly
            cluster.agent.sync(node)
            cluster.wait("the undrained GPU off the machine and its resource gone", lambda: (
                serial[undrained] not in manager.attachments().get(machine, [])
                and undrained not in {r["metadata"]["name"] for r in cluster.resources(node)}))
            assert manager.attachments()[machine] == [serial[other]], "a GPU DDS did not choose was detached"
            assert [(d.id, d.state) for d in fabric.devices(node)] == [(other, DeviceState.ONLINE)]
            assert fabric.pools()[0].free[MODEL] == free_before - 1

            asked = time.time()
            later = fabric.detach(DetachRequest(key="later", node=node, device_ids=(other,)))
            errors: set[str] = set()

            def later_ended() -> Any:
                errors.update(e for e in [resource_error(cluster, node, other)] if e)
                return ended(fabric, later.key)

            done = cluster.wait("the later detach ended", later_ended)
            assert done.state == OperationState.SUCCEEDED and done.devices == (other,), done
            assert not errors, errors
            # The cluster manager was asked to remove the GPU only after both drain steps had taken their time.
            removed_at = min(c.at for c in manager.resize_calls() if c.status == 202 and c.at > asked)
            assert removed_at - asked >= 2 * SLOW_DRAIN_S, removed_at - asked
            assert not manager.attachments().get(machine) and fabric.pools()[0].free[MODEL] == free_before
            stored = fabric.operation("undrainable")  # its outcome stays as reported
            assert stored is not None and stored.state == OperationState.FAILED and stored.error is not None, stored
            assert (stored.error.code, stored.error.message) == (failed.error.code, failed.error.message)
        finally:
            cluster.close()
