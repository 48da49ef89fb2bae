"""Extended resources from DRA (KEP-5004; issue 27, part 4) on the real kube-scheduler.

One dra-node-local group of two workers, each booting with one A30 that the simulated fabric publishes in the node's
ResourceSlice (no nvidia.com/gpu capacity anywhere). DDS's DeviceClass gets `extendedResourceName: nvidia.com/gpu`, so
plain pods asking `nvidia.com/gpu: 1` are scheduled on those devices (kube-scheduler makes a claim for each). Two such
pods take the boot GPUs; a third is Pending until DDS attaches one more A30 (it plans the pod as a claim of the
class), then the scheduler allocates the new device and the pod runs. 1.36: `DRAExtendedResource` is beta and on;
1.35: it is alpha, enabled here on kube-apiserver and kube-scheduler.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from dds.model.groups import ANN_GPU_API, GpuApi
from harness.stack import ROOT, WORKLOAD_NAMESPACE, Stack, StackOptions, is_ready, pod, start_stack
from harness.versions import KubernetesProfile, active_profile
from tests.e2e.cluster_facts import dds_events, describe, fabric_facts, pods_running
from tests.e2e.test_dra_node_local import slice_devices

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
GPU = "nvidia.com/gpu"


def extended_resource_gates(profile: KubernetesProfile) -> dict[str, bool]:
    return {} if profile.at_least(1, 36) else {"DRAExtendedResource": True}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=4, attach_latency=(1.0, 2.0), detach_latency=(1.0, 2.0), autoscaler=False,
                           gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
                           feature_gates=extended_resource_gates(active_profile()),
                           machineset_annotations={ANN_GPU_API: GpuApi.DRA_NODE_LOCAL.value})
    with start_stack(tmp_path_factory.mktemp("dra-extended-resource"), options) as stack:
        device_class = yaml.safe_load((ROOT / "manifests" / "dra" / "deviceclass.yaml").read_text())
        device_class["spec"]["extendedResourceName"] = GPU
        client.ResourceV1Api(stack.api).create_device_class(device_class)
        stack.wait_for("two Ready DRA workers, each with its boot GPU in a ResourceSlice",
                       lambda: len([n for n in stack.nodes() if is_ready(n)]) == 2
                       and sorted(len(d) for d in slice_devices(stack).values()) == [1, 1],
                       TIMEOUT, lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
        yield stack


def test_a_pod_asking_nvidia_gpu_gets_a_gpu_attached_and_runs_on_a_dra_device(stack: Stack) -> None:
    for name in ("hold-0", "hold-1"):
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod(name, memory_gib=1, gpus=1))
    stack.wait_for("hold-0 and hold-1 Running on the boot GPUs", lambda: pods_running(stack, ["hold-0", "hold-1"]),
                   TIMEOUT, lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
    assert fabric_facts(stack).attached_count() == 2  # the boot GPUs served them: nothing attached

    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("train-0", memory_gib=1, gpus=1))
    stack.wait_for("train-0 Running", lambda: pods_running(stack, ["train-0"]), TIMEOUT,
                   lambda: f"{describe(stack)} | slices: {slice_devices(stack)} | "
                           f"{[e.line() for e in dds_events(stack)]}")
    assert fabric_facts(stack).attached_count() == 3
    assert [e for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved == "pod/train-0"]
    status = stack.core.read_namespaced_pod("train-0", WORKLOAD_NAMESPACE).status
    assert status.extended_resource_claim_status.resource_claim_name  # the scheduler's claim: a DRA device
