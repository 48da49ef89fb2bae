"""When a GPU can leave its node, as the CDI operator's device mode decides (docs/composability.md, "Device modes").

CoHDI's composable-resource-operator checks for GPU load before it detaches. In DRA mode it checks the GPU being
detached; in DEVICE_PLUGIN mode it checks *every* GPU of the node (`CheckNoGPULoads` without a target GPU) and
retries with backoff until none is busy. A detach the planner asks for on a busy device-plugin node would only sit
in the operator's retries, the GPU counted as leaving and in no pool, until DDS gives up on it. So the planner
releases idle GPUs of such a node only once none of its GPUs is in use, and keeps them with a reason meanwhile.

Which mode serves a group needs no setting of its own: the operator serves an extended-resource group (pods ask for
`nvidia.com/gpu`, the device plugin's node capacity) in DEVICE_PLUGIN mode and a DRA group in DRA mode; with any
other fabric (simulated, Redfish) no such check exists. A forced detach (a node removed with force-detach on, a
deleted node's reclaim) skips the operator's check and is not affected.
"""

from __future__ import annotations

from typing import Optional

from dds.model.groups import GpuApi, NodeGroupSpec
from dds.model.plan import PlannerConfig
from dds.model.snapshot import Snapshot
from dds.planner.requests import RequestCache

# Why the idle GPUs of a busy device-plugin node stay (in the scale-down's `kept` and the detach notes).
IDLE_NODE_ONLY = "device-plugin node: the operator detaches only from an idle node"


def detaches_only_from_idle_node(config: PlannerConfig, group: Optional[NodeGroupSpec]) -> bool:
    """The group's GPUs are served by the CDI operator in DEVICE_PLUGIN mode: one of them leaves a node only while
    no GPU of that node is in use."""
    return config.cdi_operator and group is not None and group.gpu_api is GpuApi.EXTENDED_RESOURCE


def held_by_node_load(config: PlannerConfig, group: Optional[NodeGroupSpec], gpus_in_use: int) -> bool:
    """An idle GPU of a node whose `gpus_in_use` GPUs are busy cannot be detached (unforced) now."""
    return gpus_in_use > 0 and detaches_only_from_idle_node(config, group)


def held_reason(gpus_in_use: int, idle: int) -> str:
    """The keep's text: what stays, and until when."""
    gpus, go = ("GPU stays", "goes") if idle == 1 else ("GPUs stay", "go")
    busy = "GPU is" if gpus_in_use == 1 else "GPUs are"
    return (f"{IDLE_NODE_ONLY}: its {idle} idle {gpus} attached while {gpus_in_use} {busy} in use on the node, "
            f"and {go} once its GPU pods are gone")


def nodes_held_by_load(snapshot: Snapshot, config: PlannerConfig, cache: RequestCache) -> frozenset[str]:
    """The device-plugin nodes where a bound pod uses a GPU: none of their GPUs can be detached (unforced) now."""
    if not config.cdi_operator:
        return frozenset()  # no operator, no node-wide check: and no walk over every pod
    held = set()
    for node in snapshot.nodes:
        group = snapshot.group(node.group_id) if node.group_id else None
        if detaches_only_from_idle_node(config, group) and any(
                cache.requests(p).get(node.gpu_resource) > 0 for p in snapshot.pods_on(node.name)):
            held.add(node.name)
    return frozenset(held)
