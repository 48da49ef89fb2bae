"""`python -m harness.demo --cxl-memory` (`make demo-cxl`): the talk's demo with CXL memory in the pool.

The same stack and scenario as `make demo`, with two changes: the MachineSet's nodes take up to 64 GiB of CXL memory in
16 GiB chunks (dds.cdi.dev/max-cxl-memory-per-node, cxl-memory-chunk), and the simulated fabric's pool holds eight
16 GiB chunks beside its A30s (docs/cxl-memory.md). Step 3's memory-heavy pods (24Gi each, 16 GiB free on a worker)
then fit a worker once memory is attached: DDS attaches a chunk to a worker for each, and no node is added. Step 4's
end is the workers back at their own memory and one A30 each. `make demo`, whose pool has no memory, takes the node
path for the same pods.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dds.model.cxl import cxl_model
from dds.model.groups import ANN_CXL_MEMORY_CHUNK, ANN_MAX_CXL_MEMORY
from harness.demo import Demo, DemoOptions, memory_counted

GiB = 2**30
CHUNK_GIB = 16
POOL_CHUNKS = 8
WORKER_MEMORY_GIB = 64  # the example MachineSet's capacity.cluster-autoscaler.kubernetes.io/memory


def cxl_options(options: DemoOptions) -> DemoOptions:
    stack = options.stack
    annotations = {**stack.machineset_annotations, ANN_MAX_CXL_MEMORY: "64Gi", ANN_CXL_MEMORY_CHUNK: f"{CHUNK_GIB}Gi"}
    pools = [{"name": "default", "devices": {"A30": stack.pool_size, cxl_model(CHUNK_GIB * GiB): POOL_CHUNKS}}]
    settings = {**stack.dds_settings, "simulated_fabric": {**stack.dds_settings.get("simulated_fabric", {}),
                                                           "pools": pools}}
    return replace(options, stack=replace(stack, machineset_annotations=annotations, dds_settings=settings))


class CxlDemo(Demo):
    memory_step = ("two memory-heavy pods (24Gi each) no worker can hold even with all 4 GPU slots; the pool has CXL "
                   f"memory ({POOL_CHUNKS} x {CHUNK_GIB}Gi): expect DDS to attach memory to the workers, and no new node")
    memory_path = "memory path"

    def memory_served(self, seconds: float, added: set[str]) -> str:
        grown = ", ".join(f"{n.metadata.name} {int(n.status.allocatable['memory']) // GiB}Gi"
                          for n in self.nodes())
        where = f"new node(s) {', '.join(sorted(added))}" if added else "the workers, no node added"
        return f"mem-0 and mem-1 Running {seconds:.1f}s after creation, on {where} (memory now: {grown})"

    def memory_settled(self, node: Any) -> bool:
        """The node at its own memory again, and every chunk back in the pool: a node stops showing a chunk when its
        detach starts (memory goes offline before it is unplugged), the fabric has it back only when the detach ends."""
        if int(node.status.allocatable["memory"]) != WORKER_MEMORY_GIB * GiB:
            return False
        metrics = self.dds.metrics()
        return memory_counted(metrics, "dds_cxl_memory_chunks_detached_total") \
            >= memory_counted(metrics, "dds_cxl_memory_chunks_attached_total")
