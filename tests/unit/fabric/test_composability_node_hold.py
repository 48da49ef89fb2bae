"""The ComposabilityRequest backend's Node finalizer (dds/fabric/composability.py `deleted_nodes_to_reclaim`): which
nodes being deleted DDS must reclaim first, and which it lets go. The operator's objects and the Nodes are in-memory
stand-ins of dds.kube.composability.ComposabilityObjects; the backend against the real apiserver and operator:
tests/e2e/test_cdi_operator.py."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from dds.config import ComposabilitySettings, PoolSpec
from dds.fabric.base import AttachRequest, ErrorCode, FabricError
from dds.fabric.composability import ComposabilityRequestFabric, request_name
from dds.kube.composability import NodeHold


class FakeObjects:
    """Requests, resources and each Node's (held, deleting) as ComposabilityObjects shows them."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}
        self.resources: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, NodeHold] = {}
        self.released: list[str] = []

    def list_requests(self, label_selector: Optional[str] = None) -> list[dict[str, Any]]:
        return list(self.requests.values())

    def list_resources(self) -> list[dict[str, Any]]:
        return list(self.resources.values())

    def get_request(self, name: str) -> Optional[dict[str, Any]]:
        return self.requests.get(name)

    def node_hold(self, name: str) -> Optional[NodeHold]:
        return self.nodes.get(name)

    def hold_node(self, name: str) -> Optional[NodeHold]:
        hold = self.nodes.get(name)
        if hold is not None and not hold.deleting:
            hold = self.nodes[name] = NodeHold(name, held=True, deleting=False)
        return hold

    def release_node(self, name: str) -> None:
        self.released.append(name)
        self.nodes[name] = NodeHold(name, held=False, deleting=self.nodes[name].deleting)


def fabric_with(objects: FakeObjects) -> ComposabilityRequestFabric:
    fabric = ComposabilityRequestFabric(None, ComposabilitySettings(), [PoolSpec(name="default", devices={"A30": 4})],
                                        clock=lambda: 0.0)
    fabric._objects = objects  # type: ignore[assignment]
    return fabric


def our_request(node: str, size: int) -> dict[str, Any]:
    name = request_name("dds-", node, "gpu", "A30")
    return {"metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "dds"}},
            "spec": {"resource": {"type": "gpu", "model": "A30", "size": size, "target_node": node}}}


def resource(name: str, node: str, request: str, state: str = "Online") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": request}},
            "spec": {"type": "gpu", "model": "A30", "target_node": node}, "status": {"state": state}}


def test_a_deleted_node_still_holding_dds_devices_is_reclaimed_and_one_holding_none_is_let_go() -> None:
    objects = FakeObjects()
    for node, size in (("busy", 1), ("empty", 0), ("alive", 1)):
        request = our_request(node, size)
        objects.requests[request["metadata"]["name"]] = request
    objects.resources["gpu-1"] = resource("gpu-1", "busy", request_name("dds-", "busy", "gpu", "A30"))
    objects.resources["gpu-2"] = resource("gpu-2", "alive", request_name("dds-", "alive", "gpu", "A30"))
    objects.nodes = {"busy": NodeHold("busy", True, True), "empty": NodeHold("empty", True, True),
                     "alive": NodeHold("alive", True, False)}  # "alive": CA's ToBeDeleted taint, no deletion
    fabric = fabric_with(objects)
    assert fabric.deleted_nodes_to_reclaim(["busy", "empty", "alive", "gone"]) == {"busy"}
    assert objects.released == ["empty"]
    # Its detach under way (the device going, the size lowered): still held until the device is gone.
    objects.requests[request_name("dds-", "busy", "gpu", "A30")]["spec"]["resource"]["size"] = 0
    objects.resources["gpu-1"]["status"]["state"] = "Detaching"
    assert fabric.deleted_nodes_to_reclaim(["busy"]) == {"busy"}
    del objects.resources["gpu-1"]
    assert fabric.deleted_nodes_to_reclaim(["busy"]) == set()
    assert objects.released == ["empty", "busy"]


def test_another_writers_devices_do_not_keep_dds_finalizer() -> None:
    objects = FakeObjects()
    objects.resources["theirs"] = resource("theirs", "n1", "composability-n1-a30")
    objects.nodes = {"n1": NodeHold("n1", True, True)}
    assert fabric_with(objects).deleted_nodes_to_reclaim(["n1"]) == set()
    assert objects.released == ["n1"]


def test_a_node_dds_never_held_is_left_alone() -> None:
    objects = FakeObjects()
    objects.nodes = {"n1": NodeHold("n1", False, True)}
    assert fabric_with(objects).deleted_nodes_to_reclaim(["n1"]) == set()
    assert objects.released == []


@pytest.mark.parametrize("hold,code", [
    pytest.param(None, ErrorCode.NOT_FOUND, id="no-such-node"),
    pytest.param(NodeHold("n1", False, True), ErrorCode.INVALID, id="being-deleted"),
])
def test_no_attach_to_a_node_that_is_gone_or_going(hold: Optional[NodeHold], code: ErrorCode) -> None:
    objects = FakeObjects()
    if hold is not None:
        objects.nodes["n1"] = hold
    with pytest.raises(FabricError) as raised:
        fabric_with(objects).attach(AttachRequest(key="k1", node="n1", model="A30", count=1, pool="default"))
    assert raised.value.code == code and "n1" in raised.value.message
