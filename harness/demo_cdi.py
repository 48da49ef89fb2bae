"""`python -m harness.demo --fabric composability`: the talk's demo through the real CDI operator.

The stack is harness/cdi_stack.py's: DDS writes ComposabilityRequests (`fabric: composability-request`), CoHDI's
composable-resource-operator (built from the pinned source, DRA mode) attaches and detaches through the fabric-manager
emulator, and each node's GPUs are published by NVIDIA's DRA driver (played by harness/gpu_node_agent.py: driver
`gpu.nvidia.com`, `productName`, `uuid`, capacity `memory`). The scenario is the DRA demo's (harness/demo_dra.py), every
GPU asked for through a ResourceClaim selecting a `gpu.nvidia.com` device by its productName:
1. two workers, one A30 each (attached through the operator once the node is Ready), both taken;
2. one more GPU: DDS's fast path raises a worker's request, the operator attaches, the slice shows it -> Running;
3. memory-heavy pods: DDS's loop adds a node (CA cannot see DRA devices on its templates) -> Running;
4. pods gone: idle GPUs detached through the operator after the cooldown, the empty node removed.

The operator requeues its waiting states every 30 s, so steps take longer than with the simulated fabric.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from harness.cdi_stack import PRODUCT_NAME, cdi_options, fabric_side, operator_version
from harness.demo import ClusterWatcher, DemoOptions, cluster_api_step
from harness.demo_dra import DraDemo, claim_template
from harness.gpu_node_agent import NVIDIA_DRA_DRIVER
from harness.stack import start_stack

# The operator requeues waiting states every 30 s (an attach waits for the node's driver to publish the device).
STEP_TIMEOUT_SECONDS = 300.0


def cdi_demo_options(options: DemoOptions) -> DemoOptions:
    return replace(options, stack=cdi_options(options.stack),
                   step_timeout_seconds=max(options.step_timeout_seconds, STEP_TIMEOUT_SECONDS))


class CdiDemo(DraDemo):
    driver = NVIDIA_DRA_DRIVER

    def device_class(self) -> Optional[dict[str, Any]]:
        return None  # NVIDIA's, installed by the stack with the driver (harness/cdi_stack.py)

    def claim_template(self) -> dict[str, Any]:
        return claim_template(NVIDIA_DRA_DRIVER,
                              f"device.attributes['{NVIDIA_DRA_DRIVER}'].productName == '{PRODUCT_NAME}'")

    def start(self) -> None:
        options = self.options.stack
        self.step(f"starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok and Cluster API's "
                  f"manager; the fabric-manager emulator ({options.pool_size} x A30, attach {options.attach_latency[0]:g}-"
                  f"{options.attach_latency[1]:g}s) and the CDI operator (DRA mode); MachineSet default/gpu-workers "
                  f"(2 workers, 1 A30 each at boot, up to 4 attachable); DDS (mutual TLS, fabric composability-request); "
                  f"logs in {self.options.workdir}")
        self.stack = start_stack(self.options.workdir, options)
        self.core = self.stack.core
        self.dds = self.stack.dds
        side = fabric_side(self.stack)
        assert side.operator is not None
        self.step(cluster_api_step(self.stack))
        self.step(f"CDI operator: {operator_version(self.stack.control_plane.bin_dir)}, pid {side.operator.pid}, "
                  f"log {side.operator.log_path}")
        self.step(f"autoscaler: {self.stack.autoscaler.kind} (--cloud-provider=externalgrpc, "
                  f"log {self.stack.autoscaler.log_path})")
        self.watcher = ClusterWatcher(self.stack.control_plane.api_client(), self.timeline,
                                      pool_free=self.pool_free).start()
