"""A GPU vendor's DRA driver on the real apiserver: a ResourceSlice in NVIDIA's shape (driver gpu.nvidia.com, the
node's pool, devices with uuid, productName, type, driverVersion, architecture, brand and a memory capacity), NVIDIA's
DeviceClass and a claim selecting by productName, read through DDS's watch cache (as its ServiceAccount) into the
planner: the claim's pod is planned onto the vendor-driver group's node with one attach of the model the published
device showed, and the published GPU counts as the node's."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Iterator

import pytest
from kubernetes import client

from dds.kube.cache import cluster_cache
from dds.kube.decode import pod_info
from dds.kube.dra import DraReader
from dds.model.groups import DraDriverConfig, GpuApi, NodeGroupSpec, SourceRef, dra_gpu_resource
from dds.planner import plan_scale_up
from dds.planner.dra import lower_claims
from dds.model.dra_records import DraState
from dds.model.plan import PlannerConfig, Verdict
from dds.model.snapshot import Device, NodeInfo, PoolInfo, Snapshot
from dds.model.resources import Resources

pytestmark = pytest.mark.integration

NVIDIA = "gpu.nvidia.com"
PRODUCT = "NVIDIA A100-SXM4-80GB"
UUID = "GPU-5d0c3a1e-8b7f-4c2e-9a61-0f3e2b7c1d44"  # the fabric device's id: the operator's device_id is the GPU UUID
# NVIDIA's DeviceClass as its chart installs it (k8s-dra-driver-gpu, templates/deviceclass-gpu.yaml).
NVIDIA_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NVIDIA},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA}' && "
                                                              f"device.attributes['{NVIDIA}'].type == 'gpu'"}}]}}


def nvidia_slice(node: str) -> dict[str, Any]:
    """What NVIDIA's kubelet plugin publishes for a node with one whole GPU (cmd/gpu-kubelet-plugin/deviceinfo.go)."""
    attributes = {"type": {"string": "gpu"}, "uuid": {"string": UUID}, "productName": {"string": PRODUCT},
                  "brand": {"string": "Nvidia"}, "architecture": {"string": "Ampere"}, "index": {"int": 0},
                  "driverVersion": {"version": "550.54.15"}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{NVIDIA}-x1"},
            "spec": {"driver": NVIDIA, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": attributes,
                                  "capacity": {"memory": {"value": "80Gi"}}}]}}


@pytest.fixture
def resource(control_plane: Any) -> client.ResourceV1Api:
    return client.ResourceV1Api(control_plane.api_client())


@pytest.fixture
def vendor_objects(resource: client.ResourceV1Api, namespace: str) -> Iterator[str]:
    """The vendor's side, written as the cluster admin (the vendor's driver and chart would): the class, if no other
    test made it, and a node's slice. Yields the node's name."""
    node = f"nv-{namespace}"
    created_class = False
    try:
        resource.create_device_class(NVIDIA_CLASS)
        created_class = True
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    resource.create_resource_slice(nvidia_slice(node))
    try:
        yield node
    finally:
        resource.delete_resource_slice(f"{node}-{NVIDIA}-x1")
        if created_class:
            resource.delete_device_class(NVIDIA)


def read_until(api: Any, cache: Any, done) -> DraState:
    deadline = time.monotonic() + 10
    state = DraReader(api, cache).read()
    while not done(state) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = DraReader(api, cache).read()
    return state


def test_a_vendor_slice_read_through_the_cache_plans_a_claim_by_product_name(
        control_plane: Any, dds_api: Any, namespace: str, vendor_objects: str) -> None:
    node = vendor_objects
    admin = control_plane.api_client()
    selector = f"device.attributes['{NVIDIA}'].productName == '{PRODUCT}'"
    resource = client.ResourceV1Api(admin)
    for name in ("running", "pending"):
        resource.create_namespaced_resource_claim(namespace, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": NVIDIA, "count": 1, "selectors": [{"cel": {"expression": selector}}]}}]}}})
    # The running pod's claim holds the node's one GPU (what kube-scheduler would have written).
    claim = resource.read_namespaced_resource_claim("running", namespace)
    claim.status = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": NVIDIA, "pool": node, "device": "gpu-0"}]}, "nodeSelector": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": []}
    resource.replace_namespaced_resource_claim_status("running", namespace, claim)

    cache = cluster_cache(dds_api, [namespace])
    assert cache.dra is not None, "resource.k8s.io/v1 is served by 1.35"
    cache.start()
    try:
        assert cache.wait_synced(60)
        state = read_until(dds_api, cache, lambda s: {c.name for c in s.claims} >= {"running", "pending"} and any(
            c.allocated for c in s.claims) and any(s.node_name == node for s in s.slices)
            and any(c.name == NVIDIA for c in s.classes))
    finally:
        cache.stop()

    (published,) = [s for s in state.slices if s.node_name == node]
    assert (published.driver, published.pool, published.devices[0].attributes[f"{NVIDIA}/productName"],
            published.devices[0].capacity[f"{NVIDIA}/memory"]) == (NVIDIA, node, PRODUCT, 80 * 2**30)

    group = NodeGroupSpec(id="nv", min_size=0, max_size=2, milli_cpu=8000, memory=32 * 2**30, max_gpus_per_node=4,
                          gpu_api=GpuApi.DRA_NODE_LOCAL, dra=DraDriverConfig(driver=NVIDIA,
                                                                            device_attributes={"type": "gpu"}),
                          fabric_pool="pool-a", source=SourceRef(kind="File", name="test"))
    live = NodeInfo(name=node, group_id="nv", allocatable=Resources(8000, 32 * 2**30, 0, 110),
                    gpu_resource=dra_gpu_resource(NVIDIA), labels={"kubernetes.io/hostname": node},
                    devices=(Device(id=UUID, model="A100", pool="pool-a"),))
    pods = tuple(replace(pod_info(pod_object(name, namespace)), node_name=bound)
                 for name, bound in (("running", node), ("pending", None)))
    snapshot = Snapshot(now=1000.0, nodes=(live,), pods=pods, groups=(group,),
                        pools=(PoolInfo("pool-a", {"A100": 2, "A30": 2}),), dra=state)
    lowered = lower_claims(snapshot)
    assert [d.in_claim for d in lowered.nodes[0].devices] == [True]  # allocated: a detach never takes it
    plan = plan_scale_up(lowered, PlannerConfig(batch_solver="greedy"))
    pending = next(d for d in plan.decisions if d.pod == f"{namespace}/pending")
    assert pending.verdict == Verdict.FITS_AFTER_GPUS and pending.node == node
    assert [(a.node, a.model, a.count) for a in plan.attaches] == [(node, "A100", 1)]


def pod_object(claim: str, namespace: str) -> dict[str, Any]:
    return {"metadata": {"name": claim, "namespace": namespace, "uid": f"uid-{claim}"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}
