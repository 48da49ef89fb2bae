"""DRA objects on the real apiserver (resource.k8s.io/v1): the ResourceSlice DDS writes for a node as its GPUs change
(only for nodes of dra-node-local groups), and the claims, templates, slices and classes read back through the watch cache as the planner's records."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client

from dds.kube.cache import cluster_cache
from dds.kube.dra import DraReader
from dds.kube.resourceslices import ResourceSlicePublisher, slice_name
from dds.model.dra_devices import DEVICE_CLASS, DRIVER, gpu_device
from harness.stack import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture
def resource(control_plane: Any) -> client.ResourceV1Api:
    return client.ResourceV1Api(control_plane.api_client())


@pytest.fixture
def device_class(resource: client.ResourceV1Api) -> Iterator[None]:
    resource.create_device_class(yaml.safe_load((ROOT / "manifests" / "dra" / "deviceclass.yaml").read_text()))
    yield
    resource.delete_device_class(DEVICE_CLASS)


def test_a_nodes_slice_follows_its_gpus(dds_api: Any, resource: client.ResourceV1Api) -> None:
    online: dict[str, list[tuple[str, str]]] = {"slice-node": [("default/A30-000", "A30")]}
    publisher = ResourceSlicePublisher(dds_api, lambda node: online[node])
    name = slice_name("slice-node")

    publisher.publish("slice-node")
    first = resource.read_resource_slice(name)
    assert (first.spec.node_name, first.spec.pool.name, first.spec.pool.generation) == ("slice-node", "slice-node", 1)
    assert [d.name for d in first.spec.devices] == ["default-a30-000"]

    publisher.publish("slice-node")  # nothing changed: no write
    assert resource.read_resource_slice(name).metadata.resource_version == first.metadata.resource_version

    online["slice-node"].append(("default/A30-001", "A30"))
    publisher.publish("slice-node")
    second = resource.read_resource_slice(name)
    assert second.spec.pool.generation == 2 and len(second.spec.devices) == 2

    online["slice-node"] = []
    publisher.publish("slice-node")
    with pytest.raises(client.ApiException) as gone:
        resource.read_resource_slice(name)
    assert gone.value.status == 404


def test_only_dra_node_local_nodes_have_a_slice(dds_api: Any, resource: client.ResourceV1Api) -> None:
    # The group's gpu-api decides (`lists`): an extended-resource node never gets one, and a node whose group stops
    # being dra-node-local loses the slice it had.
    node_local = {"listed-node": True, "extended-node": False}
    publisher = ResourceSlicePublisher(dds_api, lambda node: [("default/A30-000", "A30")],
                                       lists=lambda node: node_local[node])
    publisher.publish("extended-node")
    publisher.publish("listed-node")
    names = {s.metadata.name for s in resource.list_resource_slice().items}
    assert slice_name("listed-node") in names and slice_name("extended-node") not in names

    node_local["listed-node"] = False
    publisher.publish("listed-node")
    assert slice_name("listed-node") not in {s.metadata.name for s in resource.list_resource_slice().items}


def test_the_cache_reads_dra_objects_as_the_planner_records(dds_api: Any, namespace: str,
                                                           resource: client.ResourceV1Api, device_class: None) -> None:
    api = dds_api  # DDS's publisher, cache and reader, as its ServiceAccount; the test's claim is made as admin
    ResourceSlicePublisher(api, lambda node: [("default/A100-000", "A100")]).publish("cache-node")
    resource.create_namespaced_resource_claim(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "two"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": 2}}]}}})
    cache = cluster_cache(api, [namespace])
    assert cache.dra is not None, "resource.k8s.io/v1 is served by 1.35"
    cache.start()
    try:
        assert cache.wait_synced(60)
        deadline = time.monotonic() + 10
        state = DraReader(api, cache).read()
        while not any(c.name == "two" for c in state.claims) and time.monotonic() < deadline:
            time.sleep(0.2)
            state = DraReader(api, cache).read()
    finally:
        cache.stop()
        ResourceSlicePublisher(api, lambda node: []).publish("cache-node")
    claim = next(c for c in state.claims if c.key == f"{namespace}/two")
    assert (claim.requests[0].count, claim.requests[0].device_class, claim.allocated) == (2, DEVICE_CLASS, None)
    node_slice = next(s for s in state.slices if s.node_name == "cache-node")
    assert node_slice.devices == (gpu_device("A100", "default/A100-000", "cache-node"),)
    assert any(c.name == DEVICE_CLASS and c.selectors == (f'device.driver == "{DRIVER}"',) for c in state.classes)
