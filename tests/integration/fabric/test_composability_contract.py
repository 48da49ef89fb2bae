"""The fabric contract on the ComposabilityRequest backend: the real apiserver (CRDs from manifests/crds/composability)
with the stand-in CDI operator reconciling against a simulated fabric on wall time. The contract runs twice: reading
the operator's objects with a LIST per query, and from the watch cache (where DDS must read its own writes at once)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from kubernetes import client

from dds.config import ComposabilitySettings, LatencySpec, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, Fabric, Operation, OperationState
from dds.fabric.composability import GROUP, REQUESTS, RESOURCES, VERSION, ComposabilityRequestFabric, request_name
from dds.fabric.simulated import SimulatedFabric
from dds.kube.cache import ClusterCache
from dds.kube.composability import WATCHED
from dds.kube.requests import instrument
from harness.cro_operator import StandInOperator
from tests.unit.fabric import contract
from tests.unit.fabric.contract import MODEL, NODE_A, NODE_B, NODE_C, POOL
from tests.unit.fabric.harnesses import contract_pools, wait_until_done

pytestmark = pytest.mark.integration


def delete_all(objects: client.CustomObjectsApi) -> None:
    for plural in (REQUESTS, RESOURCES):
        for item in objects.list_cluster_custom_object(GROUP, VERSION, plural).get("items", []):
            try:
                objects.delete_cluster_custom_object(GROUP, VERSION, plural, item["metadata"]["name"])
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


class ComposabilityHarness:
    def __init__(self, api: client.ApiClient, watched: bool = False) -> None:
        self.api = api
        self.cache = ClusterCache.for_cluster(api, capi_version=None, composability=WATCHED) if watched else None
        self.objects = client.CustomObjectsApi(api)
        delete_all(self.objects)
        core = client.CoreV1Api(api)
        existing = {n.metadata.name for n in core.list_node().items}
        for node in (NODE_A, NODE_B, NODE_C):
            if node not in existing:
                core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
        self.visible: dict[str, dict[str, int]] = {}
        self.manager = SimulatedFabric(
            SimulatedFabricSettings(pools=contract_pools(), attach_latency=LatencySpec(min=0.3, max=0.5),
                                    detach_latency=LatencySpec(min=0.1, max=0.2)),
            clock=time.time, on_node_devices_changed=lambda node, counts: self.visible.__setitem__(node, counts))
        self.operator = StandInOperator(api, self.manager, poll_interval_s=0.05).start()
        if self.cache is not None:
            self.cache.start()
            assert self.cache.wait_synced(60)
        self.fabric: Fabric = self._build()

    def _build(self) -> ComposabilityRequestFabric:
        return ComposabilityRequestFabric(self.api, ComposabilitySettings(), contract_pools(), clock=time.time,
                                          cache=self.cache.composability if self.cache else None)

    def settle(self, key: str) -> Operation:
        return wait_until_done(lambda: self.fabric, key)

    def restart(self) -> Fabric:
        self.fabric = self._build()
        return self.fabric

    def mark_in_use(self, device_id: str) -> bool:
        return False  # DDS cannot ask the operator; the operator's own check surfaces as a BackendError

    def close(self) -> None:
        self.operator.stop()
        if self.cache is not None:
            self.cache.stop()
        delete_all(self.objects)


@pytest.fixture(params=["listed", "watched"])
def h(control_plane: Any, request: pytest.FixtureRequest) -> Iterator[ComposabilityHarness]:
    harness = ComposabilityHarness(control_plane.api_client(), watched=request.param == "watched")
    yield harness
    harness.close()


def test_from_the_watch_cache_the_fabric_queries_send_no_list(control_plane: Any) -> None:
    api = control_plane.api_client()
    harness = ComposabilityHarness(api, watched=True)
    try:
        counts = instrument(api)
        op = harness.fabric.attach(AttachRequest(key="k", node=NODE_A, pool=POOL, model=MODEL, count=1))
        harness.settle(op.key)
        lists = counts.snapshot().get("LIST", 0)
        for _ in range(5):  # what every observe asks
            harness.fabric.devices(), harness.fabric.operations(), harness.fabric.pools()
        assert counts.snapshot().get("LIST", 0) == lists
        assert [d.node for d in harness.fabric.devices()] == [NODE_A]
    finally:
        harness.close()


# Whether a device is in use is the operator's to know, read or watched alike: that case runs (and skips) once.
_CASES = [pytest.param(mode, case, id=f"{mode}-{case.__name__.removeprefix('test_')}")
          for mode in ("listed", "watched") for case in contract.CONTRACT
          if mode == "listed" or case is not contract.test_detaching_a_device_in_use_without_force_is_refused]


@pytest.mark.parametrize("mode, case", _CASES)
def test_fabric_contract(control_plane: Any, mode: str, case: Callable[[Any], None]) -> None:
    harness = ComposabilityHarness(control_plane.api_client(), watched=mode == "watched")
    try:
        case(harness)
    finally:
        harness.close()


def test_dds_keeps_one_samenode_request_per_node_and_model_sized_to_the_devices(h: ComposabilityHarness) -> None:
    for index in range(2):
        h.fabric.attach(AttachRequest(key=f"k{index}", node=NODE_A, pool=POOL, model=MODEL, count=1))
        h.settle(f"k{index}")
    name = request_name("dds-", NODE_A, "gpu", MODEL)
    requests = h.objects.list_cluster_custom_object(GROUP, VERSION, REQUESTS)["items"]
    assert [r["metadata"]["name"] for r in requests] == [name]
    resource = requests[0]["spec"]["resource"]
    assert (resource["size"], resource["allocation_policy"], resource["target_node"], resource["type"]) == (
        2, "samenode", NODE_A, "gpu")
    assert requests[0]["status"]["state"] == "Running"
    assert h.visible[NODE_A] == {MODEL: 2}  # the operator's manager made them visible on the node


def test_a_second_samenode_request_for_the_same_node_and_model_is_rejected(h: ComposabilityHarness) -> None:
    op = h.fabric.attach(AttachRequest(key="k", node=NODE_B, pool=POOL, model=MODEL, count=1))
    h.settle(op.key)
    intruder = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest",
                "metadata": {"name": "someone-else"},
                "spec": {"resource": {"type": "gpu", "model": MODEL, "size": 1, "target_node": NODE_B}}}
    h.objects.create_cluster_custom_object(GROUP, VERSION, REQUESTS, intruder)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = h.objects.get_cluster_custom_object(GROUP, VERSION, REQUESTS, "someone-else").get("status") or {}
        if status.get("error"):
            break
        time.sleep(0.05)
    assert "already exists" in status["error"]
    assert len(h.fabric.devices(NODE_B)) == 1


def test_an_operator_side_failure_ends_the_operation_with_its_error(h: ComposabilityHarness) -> None:
    # Take the manager's devices behind DDS's back: the operator cannot serve the next attach.
    for key, node, count in (("outside-1", NODE_C, 3), ("outside-2", NODE_B, 1)):
        taken = h.manager.attach(AttachRequest(key=key, node=node, pool=POOL, model=MODEL, count=count))
        assert taken.state == OperationState.RUNNING
    op = h.fabric.attach(AttachRequest(key="k", node=NODE_A, pool=POOL, model=MODEL, count=1))
    done = h.settle(op.key)
    assert done.state == OperationState.FAILED
    assert "free" in done.error.message
