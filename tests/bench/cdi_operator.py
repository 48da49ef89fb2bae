"""The GPU path through the real CDI operator: `python -m tests.bench.cdi_operator [--runs N]` (`make bench-cdi`).

What a pending GPU pod waits for once DDS has decided to attach (DDS's own decision is `make bench`'s): DDS raises a
ComposabilityRequest's size, CoHDI's composable-resource-operator (the pinned build, DRA mode) creates a
ComposableResource and attaches a device through the fabric manager (harness/fabric_manager.py, with a fixed attach
latency standing for the hardware), the node's DRA driver publishes the GPU (harness/gpu_node_agent.py), and
kube-scheduler allocates the pod's claim and binds it. Each run creates a pod whose claim no free device satisfies,
waits until kube-scheduler has found it unschedulable, then resizes the request as DDS would, and timestamps each step
from the objects (polled every POLL_S):

    decided -> NodeAllocating -> Updating -> resource created -> Attaching -> Online -> request Running
                                                                  (fabric attach)
            -> device in the node's ResourceSlice -> pod bound -> pod Running

Baseline, measured in the same run: a pod whose claim a free published device satisfies (kube-scheduler and kwok
alone). Output: one line per step with p50/p99 seconds from `decided`, then the ratios of the whole path to the
fabric's own latency and to the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

from kubernetes import client

from harness.cdi_operator import (DRA_FEATURE_GATES, DRA_RUNTIME_CONFIG, CdiOperator, DeviceResourceType,
                                  FabricManagerAccess)
from harness.controlplane import KWOK_NODE_ANNOTATION, ensure_binaries, start_control_plane
from harness.fabric_manager import FabricManagerEmulator
from harness.gpu_node_agent import GPU_SPECS, DeviceMode, GpuNodeAgent

GROUP, VERSION = "cro.hpsys.ibm.ie.com", "v1alpha1"
MODEL = "A100"
DRIVER = "gpu.nvidia.com"
NAMESPACE = "bench"
POLL_S = 0.05
STEP_TIMEOUT_S = 180.0
STEPS = ("NodeAllocating", "Updating", "resource created", "Attaching", "Online", "request Running",
         "in ResourceSlice", "pod bound", "pod Running")


def _pod_and_claim(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    product = GPU_SPECS[MODEL].product_name
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": DRIVER,
                 "selectors": [{"cel": {"expression":
                                        f'device.attributes["{DRIVER}"].productName == "{product}"'}}]}}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "tolerations": [{"key": KWOK_NODE_ANNOTATION[0], "operator": "Exists"}]}}
    return pod, claim


class Bench:
    def __init__(self, api: client.ApiClient, node: str, request: str, agent: GpuNodeAgent) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.resource_api = client.ResourceV1Api(api)
        self.node, self.request, self.agent = node, request, agent

    def pod_phase(self, name: str) -> tuple[Optional[str], str, bool]:
        pod = self.core.read_namespaced_pod(name, NAMESPACE)
        unschedulable = any(c.type == "PodScheduled" and c.status == "False"
                            for c in (pod.status.conditions or []))
        return pod.spec.node_name, pod.status.phase, unschedulable

    def create(self, name: str) -> None:
        pod, claim = _pod_and_claim(name)
        self.resource_api.create_namespaced_resource_claim(NAMESPACE, claim)
        self.core.create_namespaced_pod(NAMESPACE, pod)

    def published(self) -> int:
        slices = self.resource_api.list_resource_slice(field_selector=f"spec.nodeName={self.node}").items
        return sum(len(s.spec.devices or []) for s in slices if s.spec.driver == DRIVER)

    def size(self) -> int:
        request = self.custom.get_cluster_custom_object(GROUP, VERSION, "composabilityrequests", self.request)
        return int(request["spec"]["resource"]["size"])

    def attach_one(self, name: str) -> dict[str, float]:
        """One pending pod served by one attach; the seconds from DDS's decision to each step."""
        self.create(name)
        _wait(f"{name} unschedulable", lambda: self.pod_phase(name)[2])
        published_before = self.published()
        resources_before = set(self._resources())
        decided = time.monotonic()
        self.custom.patch_cluster_custom_object(GROUP, VERSION, "composabilityrequests", self.request,
                                                {"spec": {"resource": {"size": self.size() + 1}}})
        seen: dict[str, float] = {}
        deadline = decided + STEP_TIMEOUT_S
        while "pod Running" not in seen or "request Running" not in seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: steps seen {sorted(seen)} in {STEP_TIMEOUT_S:.0f} s")
            now = time.monotonic() - decided
            state = (self.custom.get_cluster_custom_object(GROUP, VERSION, "composabilityrequests", self.request)
                     .get("status") or {}).get("state")
            if state in ("NodeAllocating", "Updating"):
                seen.setdefault(state, now)
            new = {n: r for n, r in self._resources().items() if n not in resources_before}
            if new:
                seen.setdefault("resource created", now)
                states = {((r.get("status") or {}).get("state")) for r in new.values()}
                if states & {"Attaching", "Online"}:
                    seen.setdefault("Attaching", now)
                if "Online" in states:
                    seen.setdefault("Online", now)
                    if state == "Running":
                        seen.setdefault("request Running", now)
            if self.published() > published_before:
                seen.setdefault("in ResourceSlice", now)
            node, phase, _ = self.pod_phase(name)
            if node:
                seen.setdefault("pod bound", now)
            if phase == "Running":
                seen.setdefault("pod Running", now)
            time.sleep(POLL_S)
        return seen

    def baseline(self, name: str) -> float:
        """A pod whose claim a free published device satisfies: creation to Running."""
        start = time.monotonic()
        self.create(name)
        _wait(f"{name} Running", lambda: self.pod_phase(name)[1] == "Running")
        return time.monotonic() - start

    def _resources(self) -> dict[str, dict[str, Any]]:
        listed = self.custom.list_cluster_custom_object(
            GROUP, VERSION, "composableresources", label_selector=f"app.kubernetes.io/managed-by={self.request}")
        return {r["metadata"]["name"]: r for r in listed.get("items", [])}


def _wait(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {STEP_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(runs: int, attach_latency_s: float, workdir: Path) -> int:
    with ExitStack() as stack:
        plane = stack.enter_context(start_control_plane(workdir, bin_dir=ensure_binaries(),
                                                        feature_gates=DRA_FEATURE_GATES,
                                                        runtime_config=DRA_RUNTIME_CONFIG))
        fabric = stack.enter_context(FabricManagerEmulator({MODEL: runs + 1}, attach_latency_s=attach_latency_s,
                                                           detach_latency_s=1.0))
        api = stack.enter_context(plane.api_client())
        operator = stack.enter_context(CdiOperator(plane, FabricManagerAccess.of(fabric),
                                                   device_resource_type=DeviceResourceType.DRA))
        agent = stack.enter_context(GpuNodeAgent(api, fabric, mode=DeviceMode.DRA))
        node = "bench-gpu-node"
        core = client.CoreV1Api(api)
        core.create_node({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": node, "annotations": dict([KWOK_NODE_ANNOTATION])},
                          "spec": {"providerID": f"fsas-cdi://{uuid.uuid4()}"}})
        agent.add_node(node)
        plane.create_namespace(NAMESPACE)
        client.ResourceV1Api(api).create_device_class({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
        request = "bench-gpus"
        client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "composabilityrequests", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest", "metadata": {"name": request},
            "spec": {"resource": {"type": "gpu", "model": MODEL, "size": 0, "allocation_policy": "samenode",
                                  "target_node": node}}})
        bench = Bench(api, node, request, agent)
        version = operator.release.binary.parent.name.removeprefix("cro-manager-")
        print(f"bench cdi-operator: composable-resource-operator {version} (DRA mode), "
              f"fabric attach latency {attach_latency_s:g} s, {runs} run(s)", flush=True)
        results = []
        for index in range(runs):
            steps = bench.attach_one(f"gpu-pod-{index}")
            results.append(steps)
            print(f"run {index}: " + " ".join(f"{step}={steps[step]:.2f}" for step in STEPS if step in steps),
                  flush=True)
        # The baseline: one more device attached ahead of time, then a pod that finds it free.
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            GROUP, VERSION, "composabilityrequests", request, {"spec": {"resource": {"size": bench.size() + 1}}})
        _wait("a free device published", lambda: bench.published() > runs)
        baseline = bench.baseline("baseline-pod")
        for step in STEPS:
            values = [r[step] for r in results if step in r]
            if values:
                print(f"bench cdi-operator step={step.replace(' ', '_')} p50_s={statistics.median(values):.2f} "
                      f"p99_s={_percentile(values, 0.99):.2f} n={len(values)}")
        total = statistics.median([r["pod Running"] for r in results])
        print(f"bench cdi-operator pending_to_running p50_s={total:.2f} fabric_latency_s={attach_latency_s:g} "
              f"ratio_to_fabric={total / attach_latency_s:.2f} baseline_free_device_s={baseline:.2f} "
              f"ratio_to_baseline={total / max(baseline, 1e-3):.1f}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--attach-latency", type=float, default=5.0, help="the fabric manager's attach, seconds")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dds-bench-cdi-") as workdir:
        return run(args.runs, args.attach_latency, Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
