"""A GPU being detached is tainted first, and a pod arriving during the detach is not given it (KEP-5055; issue 27,
part 4), on the real kube-scheduler.

One dra-node-local worker boots with one A30 (the simulated fabric: DDS publishes the node's ResourceSlice). Nothing
uses it, so after the 5 s idle cooldown DDS detaches it: first the device gets the taint dds.cdi.dev/detaching
(NoSchedule) in the slice (a watch on ResourceSlices sees that version), then the detach (10 s) takes it off the node.
A pod created while the detach runs is not allocated the leaving device: DDS attaches another A30 and the pod runs on
that one. 1.36: `DRADeviceTaints` is beta and on; 1.35: it is alpha, enabled here on kube-apiserver and kube-scheduler.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client, watch

from dds.model.groups import ANN_GPU_API, GpuApi
from dds.model.dra_devices import device_name
from harness.stack import ROOT, WORKLOAD_NAMESPACE, Stack, StackOptions, is_ready, start_stack
from harness.versions import KubernetesProfile, active_profile
from tests.e2e.cluster_facts import dds_events, describe, fabric_facts, pods_running
from tests.e2e.test_dra_node_local import DRIVER, allocated, claim_template, dra_pod, slice_devices

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
TAINT = "dds.cdi.dev/detaching"


def device_taint_gates(profile: KubernetesProfile) -> dict[str, bool]:
    return {} if profile.at_least(1, 36) else {"DRADeviceTaints": True}


class SliceTaints:
    """Every tainted device any version of DDS's slices showed, from a watch started before the detach."""

    def __init__(self, stack: Stack) -> None:
        self.seen: set[tuple[str, str]] = set()  # (device, taint key)
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(client.ResourceV1Api(stack.api),), daemon=True)
        self._thread.start()

    def _run(self, api: client.ResourceV1Api) -> None:
        try:
            for event in self._watch.stream(api.list_resource_slice, timeout_seconds=int(TIMEOUT)):
                item = event["object"]
                if item.spec.driver != DRIVER:
                    continue
                for device in item.spec.devices or ():
                    self.seen |= {(device.name, t.key) for t in device.taints or ()}
        except Exception:  # noqa: BLE001 - the stack stopping ends the stream; a taint never seen fails the test
            return

    def stop(self) -> None:
        self._watch.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(workers=1, pool_size=3, attach_latency=(1.0, 2.0), detach_latency=(10.0, 10.0),
                           autoscaler=False, controller_manager=True, gpu_idle_cooldown_seconds=5.0,
                           node_idle_cooldown_seconds=600.0, feature_gates=device_taint_gates(active_profile()),
                           machineset_annotations={ANN_GPU_API: GpuApi.DRA_NODE_LOCAL.value})
    with start_stack(tmp_path_factory.mktemp("dra-detach-taint"), options) as stack:
        resource = client.ResourceV1Api(stack.api)
        resource.create_device_class(yaml.safe_load((ROOT / "manifests" / "dra" / "deviceclass.yaml").read_text()))
        resource.create_namespaced_resource_claim_template(WORKLOAD_NAMESPACE, claim_template("one-gpu"))
        yield stack


def test_a_pod_arriving_during_a_detach_is_not_given_the_leaving_device(stack: Stack) -> None:
    taints = SliceTaints(stack)
    try:
        stack.wait_for("the Ready worker's idle boot GPU being detached",
                       lambda: [n for n in stack.nodes() if is_ready(n)]
                       and [e for e in dds_events(stack) if e.reason == "DetachingGPU"], TIMEOUT,
                       lambda: f"{describe(stack)} | slices: {slice_devices(stack)}")
        (detaching,) = [e for e in dds_events(stack) if e.reason == "DetachingGPU"]
        (leaving,) = [d for devices in fabric_facts(stack).attached().values() for d in devices]
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("train-0", "one-gpu"))
        stack.wait_for("train-0 Running", lambda: pods_running(stack, ["train-0"]), TIMEOUT,
                       lambda: f"{describe(stack)} | slices: {slice_devices(stack)} | "
                               f"{[e.line() for e in dds_events(stack)]}")
        ((_, device),) = allocated(stack, "train-0")
        leaving_device = device_name(leaving)
        assert device != leaving_device, f"train-0 was given {device}, the GPU {detaching.message}"
        assert [e for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved == "pod/train-0"]
        assert (leaving_device, TAINT) in taints.seen, f"tainted devices seen: {sorted(taints.seen)}"
    finally:
        taints.stop()
