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
- with `own_memory` (the server's own memory, by node), it publishes the Node's memory as a kubelet following
  hot-added memory would (docs/cxl-memory.md): its own plus the CXL memory chunks that Enabled Connections of the
  emulator's CXL fabric bind to its ComputerSystem's initiator endpoint (a Connection still Starting binds nothing
  yet). Both are written by DDS's own visibility hook for the simulated fabric (dds/kube/nodes.py
  `gpu_capacity_hook`), given what the emulator says the server holds.

Systems are never removed: a deprovisioned server stays in the inventory, as it would in a rack.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from kubernetes import client

from harness.reconcile_loop import ReconcileLoop
from dds.kube.nodes import NodeNotFound, OwnMemoryOfNode, gpu_capacity_hook
from dds.model.cxl import cxl_memory_of, cxl_model, gpus_of
from dds.model.groups import DEFAULT_GPU_RESOURCE
from dds.model.quantity import to_int
from harness.redfish_emulator import EmulatedSystem, RedfishEmulator

log = logging.getLogger(__name__)

CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSION = "v1beta2"
_VISIBLE_STATES = ("Composed", "ComposedAndAvailable")
_GPU = "GPU"  # the composed GPU blocks, as a model of the devices a server shows (anything but CXL memory is a GPU)
MiB = 2**20


def composed_gpus(block_states: dict[str, tuple[str, Optional[str]]]) -> dict[str, int]:
    """System id -> GPU blocks composed into it and usable (pure: the emulator's block states in, counts out)."""
    counts: dict[str, int] = {}
    for state, system in block_states.values():
        if system is not None and state in _VISIBLE_STATES:
            counts[system] = counts.get(system, 0) + 1
    return counts


def devices_shown(gpus: int, chunks_mib: Sequence[int]) -> dict[str, int]:
    """What a server shows of the devices composed into it, as DDS's visibility hook reads devices (model -> count):
    its usable GPUs, and the CXL memory chunks bound to it by their model, which names their size (dds/model/cxl.py)."""
    shown = {_GPU: gpus}
    for mib in chunks_mib:
        model = cxl_model(mib * MiB)
        shown[model] = shown.get(model, 0) + 1
    return shown


class RedfishHosts(ReconcileLoop):
    """Registers a ComputerSystem per Machine/Node and publishes each Node's composed GPUs (and, with `own_memory`, its
    memory with the CXL memory bound to it); see the module docstring."""

    def __init__(self, api: client.ApiClient, emulator: RedfishEmulator, *, resource: str = DEFAULT_GPU_RESOURCE,
                 own_memory: Optional[OwnMemoryOfNode] = None, poll_interval_s: float = 0.2) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._emulator = emulator
        self._resource = resource
        self._own_memory = own_memory
        self._show = gpu_capacity_hook(api, resource, own_memory=own_memory)
        super().__init__("redfish-hosts", poll_interval_s)
        self.published: list[tuple[str, int]] = []  # (node, GPUs) each time a count was written, for tests
        self.memory_published: list[tuple[str, int]] = []  # (node, bytes) each time its memory was written

    def reconcile_once(self) -> None:
        machines = self._custom.list_cluster_custom_object(CAPI_GROUP, CAPI_VERSION, "machines").get("items", [])
        nodes = self._core.list_node().items
        known = self._emulator.system_ids()
        for name in sorted({m["metadata"]["name"] for m in machines} | {n.metadata.name for n in nodes}):
            if name not in known and self._emulator.add_system(EmulatedSystem(id=name, name=name, host_name=name)):
                log.info("server %s racked: ComputerSystem %s registered in the composition service", name, name)
        composed = composed_gpus(self._emulator.block_states())
        bound = self._emulator.bound_chunks_mib()
        for node in nodes:
            name = node.metadata.name
            self._publish(node, devices_shown(composed.get(name, 0), bound.get(name, ())))

    def _publish(self, node: Any, shown: dict[str, int]) -> None:
        name, allocatable = node.metadata.name, node.status.allocatable or {}
        own = self._own_memory(name) if self._own_memory is not None else None
        memory = None if own is None else own + cxl_memory_of(shown)
        if allocatable.get(self._resource) == str(gpus_of(shown)) and (
                memory is None or to_int(allocatable.get("memory", "0")) == memory):
            return
        try:
            self._show(name, shown)
        except NodeNotFound:
            return  # deleted since the list: nothing to show
        self.published.append((name, gpus_of(shown)))
        if memory is not None:
            self.memory_published.append((name, memory))
