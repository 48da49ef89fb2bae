"""`python -m harness.demo --dra`: the talk's demo with every GPU asked for through a ResourceClaim (node-local DRA).

The same stack as `make demo`, plus kube-controller-manager's resourceclaim controller (claims made from templates)
and the MachineSet annotated dds.cdi.dev/gpu-api: dra-node-local, so the simulated fabric publishes each node's attached
GPUs in a ResourceSlice and never as nvidia.com/gpu capacity (docs/dra.md). The scenario:
1. Two workers of MachineSet gpu-workers, one A30 each (a device in each node's ResourceSlice), both taken by DRA pods.
2. A DRA pod asks for one more GPU: Pending -> DDS's fast path attaches an A30 to a worker -> the new device shows in
   the worker's ResourceSlice -> kube-scheduler allocates it -> Running.
3. Two memory-heavy DRA pods no worker can hold: cluster-autoscaler cannot see that a new node would serve them (its
   externalgrpc templates carry no ResourceSlices), so DDS's loop adds the node -> it boots with one A30, DDS attaches
   the second -> Running.
4. Those pods go away -> their claims are released, the idle GPUs detached after the cooldown, the empty node removed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Optional

import yaml
from kubernetes import client

from harness.demo import Demo, DemoOptions, DemoResult
from dds.model.groups import ANN_GPU_API, GpuApi
from harness.stack import ROOT, WORKLOAD_NAMESPACE as DEMO_NAMESPACE, gpus_allocatable

DRIVER = "gpu.dds.cdi.dev"
DEVICE_CLASS_FILE = ROOT / "manifests" / "dra" / "deviceclass.yaml"
TEMPLATE = "one-a30"


def dra_options(options: DemoOptions) -> DemoOptions:
    """The demo's stack with the resourceclaim controller, and its MachineSet's GPUs exposed through node-local
    ResourceSlices only (dds.cdi.dev/gpu-api: dra-node-local: no nvidia.com/gpu capacity on its nodes)."""
    annotations = {**options.stack.machineset_annotations, ANN_GPU_API: GpuApi.DRA_NODE_LOCAL.value}
    stack = replace(options.stack, controller_manager=True, machineset_annotations=annotations)
    return replace(options, stack=stack)


def claim_template(driver: str = DRIVER, selector: str = f'device.attributes["{DRIVER}"].model == "A30"'
                   ) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": DEMO_NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": driver, "selectors": [{"cel": {"expression": selector}}]}}]}}}}


def dra_pod(name: str, memory_gib: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": DEMO_NAMESPACE, "labels": {"app.kubernetes.io/part-of": "dds-demo"}},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "1", "memory": f"{memory_gib}Gi"},
                                                   "claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}}


class DraDemo(Demo):
    # The driver the demo's GPUs come under, and what a claim for one A30 selects (harness/demo_cdi.py: NVIDIA's).
    driver = DRIVER

    def device_class(self) -> Optional[dict[str, Any]]:
        """The DeviceClass the demo creates; None when the stack installs it with the driver."""
        return yaml.safe_load(DEVICE_CLASS_FILE.read_text())

    def claim_template(self) -> dict[str, Any]:
        return claim_template()

    def devices_by_node(self) -> dict[str, int]:
        items = client.ResourceV1Api(self.stack.api).list_resource_slice().items
        return {s.spec.node_name: len(s.spec.devices or ()) for s in items if s.spec.driver == self.driver}

    def slices(self) -> str:
        return "; ".join(f"{node}: {count} device(s)" for node, count in sorted(self.devices_by_node().items())) \
            or "no ResourceSlice"

    def nodes_describe(self) -> str:
        devices = self.devices_by_node()
        return "; ".join(f"{n.metadata.name}: {devices.get(n.metadata.name, 0)} device(s), "
                         f"{gpus_allocatable(n)} nvidia.com/gpu" for n in self.stack.nodes())

    def run(self) -> DemoResult:
        resource = client.ResourceV1Api(self.stack.api)
        template = self.claim_template()
        [request] = template["spec"]["spec"]["devices"]["requests"]
        self.step(f"DRA: DeviceClass {self.driver}, ResourceClaimTemplate {TEMPLATE} (1 GPU: "
                  f"{request['exactly']['selectors'][0]['cel']['expression']}); each node's GPUs are devices of its "
                  f"ResourceSlice")
        device_class = self.device_class()
        if device_class is not None:
            resource.create_device_class(device_class)
        resource.create_namespaced_resource_claim_template(DEMO_NAMESPACE, template)
        self.wait_for("two Ready workers, each with its boot-time A30 in its ResourceSlice",
                      lambda: len(self.ready_workers()) == 2 and self.slices().count("1 device(s)") == 2,
                      describe=lambda: f"{self.nodes_describe()} | {self.slices()}")
        workers = {n.metadata.name for n in self.nodes()}

        self.step("two DRA pods take both GPUs (48Gi each, so the workers are also short of memory)")
        for name in ("busy-0", "busy-1"):
            self.core.create_namespaced_pod(DEMO_NAMESPACE, dra_pod(name, 48))
        self.wait_for("busy-0 and busy-1 Running", lambda: self.pods_running(["busy-0", "busy-1"]),
                      describe=self.pods_describe)

        self.step("a DRA pod asks for one more GPU: expect DDS's fast path to attach one to a worker, the scheduler to "
                  "allocate the new device, and no new node")
        self.core.create_namespaced_pod(DEMO_NAMESPACE, dra_pod("train-0", 8))
        gpu_started = time.monotonic()
        self.wait_for("train-0 Running", lambda: self.pods_running(["train-0"]),
                      describe=lambda: f"{self.pods_describe()} | {self.slices()}")
        gpu_path = time.monotonic() - gpu_started
        self.step(f"train-0 Running {gpu_path:.1f}s after it was created; ResourceSlices: {self.slices()}")

        self.step("two memory-heavy DRA pods (24Gi and a GPU each) no worker can hold: CA cannot see DRA devices on "
                  "its templates, so expect DDS's loop to add the node and attach its second GPU")
        for name in ("mem-0", "mem-1"):
            self.core.create_namespaced_pod(DEMO_NAMESPACE, dra_pod(name, 24))
        node_started = time.monotonic()
        self.wait_for("mem-0 and mem-1 Running", lambda: self.pods_running(["mem-0", "mem-1"]),
                      describe=lambda: f"{self.pods_describe()} | {self.nodes_describe()} | {self.slices()}")
        node_path = time.monotonic() - node_started
        added = {n.metadata.name for n in self.nodes()} - workers
        self.step(f"mem-0 and mem-1 Running {node_path:.1f}s after creation, on new node(s) {', '.join(sorted(added))}")

        self.step("train-0, mem-0 and mem-1 finish: expect their claims released, idle GPUs detached after the "
                  "cooldown, the empty node removed")
        for name in ("train-0", "mem-0", "mem-1"):
            self.core.delete_namespaced_pod(name, DEMO_NAMESPACE, grace_period_seconds=0)

        def settled() -> bool:
            nodes, devices = self.nodes(), self.devices_by_node()
            # Each worker back to its one device; the GPUs are never node capacity in this group.
            return {n.metadata.name for n in nodes} == workers and all(
                devices.get(n.metadata.name) == 1 and gpus_allocatable(n) == 0 for n in nodes)

        self.wait_for("the added node removed and each worker back to 1 GPU", settled,
                      timeout=self.options.step_timeout_seconds + self.options.stack.gpu_idle_cooldown_seconds
                      + self.options.stack.node_idle_cooldown_seconds,
                      describe=lambda: f"{self.nodes_describe()} | {self.slices()}")
        self.step(f"back to two workers with one busy A30 each; ResourceSlices: {self.slices()}")
        return self.result(gpu_path, node_path, workers, added)
