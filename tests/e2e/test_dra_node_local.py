"""Dynamic Resource Allocation, node-local mode (hot-plug), on the real kube-scheduler with the real autoscaler present,
in a mixed cluster.

Two groups: gpu-workers (dds.cdi.dev/gpu-api: dra-node-local), whose nodes' attached GPUs the simulated fabric publishes
in a ResourceSlice (driver gpu.dds.cdi.dev) and never as nvidia.com/gpu capacity, and ext-workers (extended-resource),
whose node shows its GPUs as nvidia.com/gpu and has no slice. Pods ask for GPUs through ResourceClaims made from
templates by kube-controller-manager's resourceclaim controller; the real kube-scheduler allocates them. The two DRA
workers boot with one A30 each, taken by two DRA pods first, so:
- a third DRA pod is Pending until DDS attaches an A30, then the scheduler allocates the new device and it runs;
- a claim whose selector asks for a model no pool holds gets nothing attached, and an Event saying which selector
  failed on which device;
- once a DRA pod ends, its claim is released and the idle device is detached after the cooldown, never the device a
  running pod's claim holds;
- an extended-resource pod and a DRA pod pending together each get a GPU attached on a node of their own group, and no
  node ever shows a GPU both as capacity and as a slice device;
- a DRA pod no live node can hold gets a new node from DDS's loop (cluster-autoscaler's templates carry no DRA devices,
  so CA cannot see that a new node would serve it), and runs on the GPU the node boots with.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.model.groups import ANN_CAPI_MIN, ANN_GPU_API, ANN_GPU_IDLE_COOLDOWN, GpuApi
from harness.stack import (ROOT, WORKLOAD_NAMESPACE, Stack, StackOptions, gpus_allocatable, is_ready, machineset, pod,
                           start_stack)
from tests.e2e.cluster_facts import dds_events, describe, fabric_facts, pods_running

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
DRIVER = "gpu.dds.cdi.dev"
DEVICE_CLASS_FILE = ROOT / "manifests" / "dra" / "deviceclass.yaml"


def claim_template(name: str, selector: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def dra_pod(name: str, template: str, memory: str = "2Gi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "1", "memory": memory},
                                                   "claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}}


def slice_devices(stack: Stack) -> dict[str, list[str]]:
    """node -> device names of its DDS ResourceSlice."""
    out: dict[str, list[str]] = {}
    for item in client.ResourceV1Api(stack.api).list_resource_slice().items:
        if item.spec.driver == DRIVER:
            out[item.spec.node_name] = sorted(d.name for d in item.spec.devices or ())
    return out


def allocated(stack: Stack, pod_name: str) -> list[tuple[str, str]]:
    """(pool, device) of the claims the pod's resourceClaimStatuses name."""
    pod = stack.core.read_namespaced_pod(pod_name, WORKLOAD_NAMESPACE)
    out = []
    for status in pod.status.resource_claim_statuses or ():
        claim = client.ResourceV1Api(stack.api).read_namespaced_resource_claim(status.resource_claim_name,
                                                                              WORKLOAD_NAMESPACE)
        if claim.status and claim.status.allocation:
            out += [(r.pool, r.device) for r in claim.status.allocation.devices.results]
    return out


def extended_machineset(options: StackOptions, name: str = "ext-workers", workers: int = 1) -> dict[str, Any]:
    """A second group beside the stack's, of `workers` nodes whose GPUs are the nvidia.com/gpu extended resource."""
    obj = copy.deepcopy(machineset(replace(options, workers=workers, machineset_annotations={})))
    obj["metadata"]["name"] = name
    # A long GPU cooldown: its boot GPU stays attached while idle, so a pod asking for two needs exactly one attach.
    obj["metadata"]["annotations"].update({ANN_GPU_API: GpuApi.EXTENDED_RESOURCE.value, ANN_CAPI_MIN: str(workers),
                                           ANN_GPU_IDLE_COOLDOWN: "10m"})
    obj["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/set-name"] = name
    obj["spec"]["template"]["metadata"]["labels"]["cluster.x-k8s.io/set-name"] = name
    return obj


def shown_both_ways(stack: Stack) -> list[str]:
    """Nodes showing GPUs both as nvidia.com/gpu capacity and as ResourceSlice devices: must stay empty."""
    devices = slice_devices(stack)
    return [n.metadata.name for n in stack.nodes() if gpus_allocatable(n) and devices.get(n.metadata.name)]


def node_of(stack: Stack, pod_name: str) -> str:
    return stack.core.read_namespaced_pod(pod_name, WORKLOAD_NAMESPACE).spec.node_name


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=7, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0),
                           gpu_idle_cooldown_seconds=15.0, node_idle_cooldown_seconds=600.0, controller_manager=True,
                           machineset_annotations={ANN_GPU_API: GpuApi.DRA_NODE_LOCAL.value})
    with start_stack(tmp_path_factory.mktemp("dra-node-local"), options) as stack:
        stack.add_node_group(extended_machineset(options))
        resource = client.ResourceV1Api(stack.api)
        resource.create_device_class(yaml.safe_load(DEVICE_CLASS_FILE.read_text()))
        for template in (claim_template("one-gpu"),
                         claim_template("one-h100", f'device.attributes["{DRIVER}"].model == "H100"')):
            resource.create_namespaced_resource_claim_template(WORKLOAD_NAMESPACE, template)
        stack.wait_for("two Ready DRA workers, each with its boot GPU in a ResourceSlice, and an extended-resource "
                       "worker with its boot GPU as nvidia.com/gpu",
                       lambda: len([n for n in stack.nodes() if is_ready(n)]) == 3
                       and sorted(len(d) for d in slice_devices(stack).values()) == [1, 1]
                       and sorted(gpus_allocatable(n) for n in stack.nodes()) == [0, 0, 1],
                       TIMEOUT, lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
        assert shown_both_ways(stack) == []
        for name in ("hold-0", "hold-1"):
            stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod(name, "one-gpu"))
        stack.wait_for("the boot GPUs allocated to hold-0 and hold-1",
                       lambda: pods_running(stack, ["hold-0", "hold-1"]), TIMEOUT, lambda: describe(stack))
        yield stack


def test_a_dra_pod_runs_on_a_gpu_attached_for_it(stack: Stack) -> None:
    before = fabric_facts(stack).attached_count()
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("train-0", "one-gpu"))
    stack.wait_for("train-0 Running", lambda: pods_running(stack, ["train-0"]), TIMEOUT,
                   lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
    assert fabric_facts(stack).attached_count() == before + 1
    attaching = [e for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved == "pod/train-0"]
    assert len(attaching) == 1, [e.line() for e in dds_events(stack)]
    (pool, device), = allocated(stack, "train-0")
    node = stack.core.read_namespaced_pod("train-0", WORKLOAD_NAMESPACE).spec.node_name
    assert pool == node and device in slice_devices(stack)[node] and len(slice_devices(stack)[node]) == 2


def test_a_claim_no_pool_device_satisfies_attaches_nothing_and_says_why(stack: Stack) -> None:
    before = fabric_facts(stack).attached_count()
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("wants-h100", "one-h100"))
    events = stack.wait_for("DDS's Event on wants-h100", lambda: [
        e for e in dds_events(stack) if e.involved == "pod/wants-h100" and e.reason == "NoMatchingDevice"],
        60.0, lambda: "; ".join(e.line() for e in dds_events(stack)))
    assert "H100" in events[0].message and "is false for an attachable A30" in events[0].message, events[0].line()
    time.sleep(5.0)  # a few more loop passes: still nothing attached for it
    assert fabric_facts(stack).attached_count() == before
    assert stack.core.read_namespaced_pod("wants-h100", WORKLOAD_NAMESPACE).status.phase == "Pending"


def test_an_idle_dra_device_is_detached_after_the_cooldown_and_a_held_one_never(stack: Stack) -> None:
    node = stack.core.read_namespaced_pod("train-0", WORKLOAD_NAMESPACE).spec.node_name
    held = {device for pool, device in allocated(stack, "hold-0") + allocated(stack, "hold-1") if pool == node}
    stack.core.delete_namespaced_pod("train-0", WORKLOAD_NAMESPACE, grace_period_seconds=0)
    released = time.monotonic()
    stack.wait_for(f"{node}'s idle GPU detached and gone from its ResourceSlice",
                   lambda: len(slice_devices(stack).get(node, [])) == 1, 90.0,
                   lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
    assert time.monotonic() - released >= 15.0 - 2.0  # the group's GPU cooldown, not at once
    assert set(slice_devices(stack)[node]) == held  # the device hold-N's claim holds stayed
    assert pods_running(stack, ["hold-0", "hold-1"])


def test_an_extended_resource_pod_and_a_dra_pod_each_get_a_gpu_on_their_own_groups_node(stack: Stack) -> None:
    # Every DRA worker's device is held by hold-N; the extended-resource worker has one free nvidia.com/gpu. ext-0 asks
    # for two (one attach), mixed-0 for one device: neither can be served by the other group's node.
    ext_worker = next(n.metadata.name for n in stack.nodes() if gpus_allocatable(n))
    dra_workers = set(slice_devices(stack))
    nodes_before = len(stack.nodes())
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("ext-0", memory_gib=2, gpus=2))
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("mixed-0", "one-gpu"))
    stack.wait_for("ext-0 and mixed-0 Running", lambda: pods_running(stack, ["ext-0", "mixed-0"]), TIMEOUT,
                   lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
    assert node_of(stack, "ext-0") == ext_worker and node_of(stack, "mixed-0") in dra_workers
    attaching = {e.involved: e.message for e in dds_events(stack) if e.reason == "AttachingGPU"}
    assert ext_worker in attaching["pod/ext-0"] and node_of(stack, "mixed-0") in attaching["pod/mixed-0"], attaching
    (pool, device), = allocated(stack, "mixed-0")
    assert pool == node_of(stack, "mixed-0") and device in slice_devices(stack)[pool]
    assert gpus_allocatable(stack.core.read_node(ext_worker)) == 2 and ext_worker not in slice_devices(stack)
    assert shown_both_ways(stack) == [] and len(stack.nodes()) == nodes_before


def test_a_dra_pod_no_live_node_holds_gets_a_node_from_dds(stack: Stack) -> None:
    workers = {n.metadata.name for n in stack.nodes()}
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("big-0", "one-gpu", memory="63Gi"))
    stack.wait_for("big-0 Running", lambda: pods_running(stack, ["big-0"]), TIMEOUT,
                   lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
    node = stack.core.read_namespaced_pod("big-0", WORKLOAD_NAMESPACE).spec.node_name
    assert node not in workers and len(stack.nodes()) == len(workers) + 1
    adding = [e for e in dds_events(stack) if e.reason == "AddingNode" and e.involved == "pod/big-0"]
    assert len(adding) == 1, [e.line() for e in dds_events(stack)]
    (pool, _device), = allocated(stack, "big-0")
    assert pool == node
