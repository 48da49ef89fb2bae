"""What a simulation runs on: the cluster (groups, pools, starting nodes), the timings, and the jobs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Optional

from dds.config import PoolSpec
from dds.model.cxl import gpus_of, is_cxl_model
from dds.model.groups import NodeGroupSpec, SourceRef
from dds.sim.kueue import KueueQueue
from dds.sim.trace import Job

SIM_SOURCE = SourceRef(kind="File", name="dds-simulate")


@dataclass(frozen=True)
class Timing:
    """Latencies of the outside world and of the control loop, in seconds of virtual time."""

    attach_s: float = 30.0  # the talk: "it will take tens of seconds"
    detach_s: float = 10.0
    node_provision_s: float = 600.0  # the talk: scaling out a node "will take tens of minutes"; 10 min is kind
    loop_interval_s: float = 10.0  # DDS loop / CA scan interval: how often scale decisions are taken

    def __post_init__(self) -> None:
        for name in ("attach_s", "detach_s", "node_provision_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"timing: {name} must be >= 0, got {getattr(self, name)}")
        if self.loop_interval_s <= 0:
            raise ValueError(f"timing: loop_interval_s must be > 0, got {self.loop_interval_s}")


@dataclass(frozen=True)
class ClusterSpec:
    """Node groups, their fabric pools and the nodes that exist at time 0.

    `preconfigured` is the GPUs each starting node holds (per group, one entry per node): the static baseline's fixed
    layout, and where the composable policies start from (as fabric devices they may later detach).
    """

    groups: tuple[NodeGroupSpec, ...]
    pools: tuple[PoolSpec, ...]
    initial_nodes: Mapping[str, int]
    preconfigured: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    gpu_model_label: str = "nvidia.com/gpu.product"

    def __post_init__(self) -> None:
        groups = {g.id for g in self.groups}
        pools = {p.name: p for p in self.pools}
        for group in self.groups:
            if group.fabric_pool not in pools:
                raise ValueError(f"group {group.id}: fabric_pool {group.fabric_pool!r} is not one of the pools "
                                 f"({', '.join(sorted(pools)) or 'none'})")
        for group_id, count in self.initial_nodes.items():
            if group_id not in groups:
                raise ValueError(f"initial_nodes: unknown group {group_id!r}")
            if count < 0:
                raise ValueError(f"initial_nodes[{group_id}]: must be >= 0, got {count}")
        for group_id, layout in self.preconfigured.items():
            if group_id not in groups:
                raise ValueError(f"preconfigured: unknown group {group_id!r}")
            if len(layout) != self.initial_nodes.get(group_id, 0):
                raise ValueError(f"preconfigured[{group_id}]: {len(layout)} entries for "
                                 f"{self.initial_nodes.get(group_id, 0)} starting node(s)")
            group = self.group(group_id)
            if any(g < 0 or g > self.slots(group) for g in layout):
                raise ValueError(f"preconfigured[{group_id}]: each node holds 0..{self.slots(group)} GPUs, "
                                 f"got {list(layout)}")
        for pool in self.pools:
            wanted = sum(sum(self.preconfigured.get(g.id, ())) for g in self.groups if g.fabric_pool == pool.name)
            if wanted > gpus_of(pool.devices):
                raise ValueError(f"preconfigured: {wanted} GPU(s) placed on nodes of pool {pool.name}, "
                                 f"which holds {gpus_of(pool.devices)}")

    def group(self, group_id: str) -> NodeGroupSpec:
        for group in self.groups:
            if group.id == group_id:
                return group
        raise KeyError(group_id)

    def pool(self, name: str) -> PoolSpec:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def slots(self, group: NodeGroupSpec) -> int:
        """GPU slots of a node of `group`: the group's maximum, capped by its pool's per-node limit."""
        limit = self.pool(group.fabric_pool).max_slots_per_node
        return group.max_gpus_per_node if limit is None else min(group.max_gpus_per_node, limit)

    def layout(self, group_id: str) -> tuple[int, ...]:
        """GPUs per starting node of a group (no entry: the pool's GPUs spread evenly over the group's nodes)."""
        if group_id in self.preconfigured:
            return tuple(self.preconfigured[group_id])
        return even_layout(self, group_id)

    def total_gpus(self) -> int:
        """The pools' GPUs (CXL memory chunks are devices too, but not GPUs: dds/model/cxl.py)."""
        return sum(gpus_of(p.devices) for p in self.pools)

    def takes_cxl_memory(self) -> bool:
        """Whether some group takes CXL memory from a pool that holds some (docs/cxl-memory.md)."""
        pools = {p.name for p in self.pools if any(is_cxl_model(m) for m in p.devices)}
        return any(g.max_cxl_memory and g.fabric_pool in pools for g in self.groups)


def even_layout(cluster: ClusterSpec, group_id: str) -> tuple[int, ...]:
    """A pool's GPUs dealt round-robin over the starting nodes of the groups in that pool (KubeComp's "even")."""
    return _deal(cluster, group_id, concentrated=False)


def concentrated_layout(cluster: ClusterSpec, group_id: str) -> tuple[int, ...]:
    """A pool's GPUs packed onto as few starting nodes as slots allow (KubeComp's "concentrated" baseline)."""
    return _deal(cluster, group_id, concentrated=True)


def _deal(cluster: ClusterSpec, group_id: str, concentrated: bool) -> tuple[int, ...]:
    target = cluster.group(group_id)
    pool = cluster.pool(target.fabric_pool)
    # Every starting node attached to the pool, in a fixed order, with its slot limit.
    nodes = [(g.id, index, cluster.slots(g)) for g in cluster.groups if g.fabric_pool == pool.name
             for index in range(cluster.initial_nodes.get(g.id, 0))]
    counts = {(gid, index): 0 for gid, index, _ in nodes}
    left = gpus_of(pool.devices)
    if concentrated:
        for gid, index, slots in nodes:
            take = min(slots, left)
            counts[(gid, index)] = take
            left -= take
    else:
        while left > 0 and any(counts[(gid, i)] < slots for gid, i, slots in nodes):
            for gid, index, slots in nodes:
                if left > 0 and counts[(gid, index)] < slots:
                    counts[(gid, index)] += 1
                    left -= 1
    return tuple(counts[(group_id, index)] for index in range(cluster.initial_nodes.get(group_id, 0)))


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    cluster: ClusterSpec
    jobs: tuple[Job, ...]
    timing: Timing = Timing()
    # Where the numbers come from, shown in the report ("KubeComp Table I/II, 50 jobs, Poisson mean 60 s").
    notes: tuple[str, ...] = ()
    seed: Optional[int] = None
    # The policy the others' mean wait is compared with (the paper's reference for its scenario).
    baseline: str = "static"
    # Every job admitted by Kueue through a ProvisioningRequest, queued on this ClusterQueue (dds/sim/kueue.py).
    kueue: Optional[KueueQueue] = None


GPU_ONLY_SUFFIX = "/gpu-only"


def without_cxl_memory(group: NodeGroupSpec) -> NodeGroupSpec:
    """`group` taking no CXL memory: a node is its own memory."""
    if not group.max_cxl_memory:
        return group
    return group.model_copy(update={"max_cxl_memory": 0, "cxl_memory_chunk": 0})


def gpu_only(scenario: Scenario) -> Scenario:
    """The same jobs on the same cluster with no CXL memory: the pools' memory chunks taken out and no group taking
    any, so a pod short of memory on every live node gets a new node (what `dds simulate` compares a memory run with)."""
    cluster = scenario.cluster
    pools = tuple(p.model_copy(update={"devices": {m: c for m, c in p.devices.items() if not is_cxl_model(m)}})
                  for p in cluster.pools)
    groups = tuple(without_cxl_memory(g) for g in cluster.groups)
    return replace(scenario, name=scenario.name + GPU_ONLY_SUFFIX, cluster=replace(cluster, groups=groups, pools=pools),
                   description=f"{scenario.description}; GPU-only: no CXL memory in the pools")
