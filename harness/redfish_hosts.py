"""The servers behind kwok nodes, as a Redfish composition service sees them (tests and the e2e demo variant).

In production two things come with every server, and neither is DDS:
- its BMC registers a ComputerSystem in the composition service when the server is racked, long before Cluster API
  provisions it into a Node (RedfishFabric finds a node's system by HostName = node name);
- the GPU device plugin running on it publishes the GPUs the host sees on its PCIe bus — the blocks composed into its
  system — as the Node's `status.capacity` / `status.allocatable` (after a hot-plug, a device-plugin restart does it).

kwok nodes have neither, so `RedfishHosts` plays both, in the test process:
- for every Cluster API Machine (and every Node) it registers a ComputerSystem named after it in the emulator, as soon
  as the Machine exists — before the Node registers, so the node's boot-time GPUs can be composed when it is Ready;
- it publishes, for every Node with a system, the number of GPU blocks in state Composed linked to that system, read
  from the emulator's own composition state (the hardware truth), never from DDS. A block still Composing, or Failed,
  is not published: the device plugin would not see a usable GPU either.

Systems are never removed: a deprovisioned server stays in the inventory, as it would in a rack.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from kubernetes import client

from harness.reconcile_loop import ReconcileLoop
from dds.kube.nodes import NodeNotFound, set_gpu_capacity
from dds.model.groups import DEFAULT_GPU_RESOURCE
from harness.redfish_emulator import EmulatedSystem, RedfishEmulator

log = logging.getLogger(__name__)

CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSION = "v1beta1"
_VISIBLE_STATES = ("Composed", "ComposedAndAvailable")


def composed_gpus(block_states: dict[str, tuple[str, Optional[str]]]) -> dict[str, int]:
    """System id -> GPU blocks composed into it and usable (pure: the emulator's block states in, counts out)."""
    counts: dict[str, int] = {}
    for state, system in block_states.values():
        if system is not None and state in _VISIBLE_STATES:
            counts[system] = counts.get(system, 0) + 1
    return counts


class RedfishHosts(ReconcileLoop):
    """Registers a ComputerSystem per Machine/Node and publishes each Node's composed GPUs; see the module docstring."""

    def __init__(self, api: client.ApiClient, emulator: RedfishEmulator, *, resource: str = DEFAULT_GPU_RESOURCE,
                 poll_interval_s: float = 0.2) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._emulator = emulator
        self._resource = resource
        super().__init__("redfish-hosts", poll_interval_s)
        self.published: list[tuple[str, int]] = []  # (node, GPUs) each time a count was written, for tests

    def reconcile_once(self) -> None:
        machines = self._custom.list_cluster_custom_object(CAPI_GROUP, CAPI_VERSION, "machines").get("items", [])
        nodes = self._core.list_node().items
        known = self._emulator.system_ids()
        for name in sorted({m["metadata"]["name"] for m in machines} | {n.metadata.name for n in nodes}):
            if name not in known and self._emulator.add_system(EmulatedSystem(id=name, name=name, host_name=name)):
                log.info("server %s racked: ComputerSystem %s registered in the composition service", name, name)
        composed = composed_gpus(self._emulator.block_states())
        for node in nodes:
            self._publish(node, composed.get(node.metadata.name, 0))

    def _publish(self, node: Any, count: int) -> None:
        shown = (node.status.allocatable or {}).get(self._resource)
        if shown == str(count):
            return
        try:
            set_gpu_capacity(self._core.api_client, node.metadata.name, self._resource, count)
        except NodeNotFound:
            return  # deleted since the list: nothing to show
        self.published.append((node.metadata.name, count))
