"""What planning keeps from one decision to the next (`PlannerMemos`): sums and facts derived from the nodes and pods
of a snapshot, reused by the next decision for the objects that did not change. Held by the caller and passed in
(`memos=`), never by a module: the planner keeps no state of its own (tests/unit/planner/test_planner_is_pure.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Optional, Sequence

import numpy as np

from dds.model.resources import Resources
from dds.model.snapshot import NodeInfo, PodInfo, Snapshot
from dds.planner.nodes import GpuFacts, gpu_facts, group_allowed
from dds.planner.requests import LastingRequests


@dataclass(frozen=True)
class NodeLoad:
    """What a node's bound pods add up to, derived from the snapshot's tuple of them (`Snapshot.pods_on`)."""

    pods: tuple[PodInfo, ...]  # what it was derived from, compared by identity
    milli_cpu: int
    memory: int
    ephemeral_storage: int
    scalar: dict[str, int]  # extended resources summed (a node's own GPU resource among them)
    ruled: tuple[PodInfo, ...]  # pods holding host ports or required anti-affinity: the placement filters read them

    @classmethod
    def of(cls, pods: tuple[PodInfo, ...], requests: LastingRequests) -> "NodeLoad":
        lasting = requests.get
        cpu = memory = storage = 0
        scalar: dict[str, int] = {}
        for pod in pods:
            r = lasting(pod)
            cpu += r.milli_cpu
            memory += r.memory
            storage += r.ephemeral_storage
            for name, amount in r.scalar.items():
                scalar[name] = scalar.get(name, 0) + amount
        ruled = tuple(p for p in pods if p.host_ports or p.required_pod_anti_affinity)
        return cls(pods, cpu, memory, storage, scalar, ruled)


class NodeLoads:
    """Each node's load from the last snapshot that showed it, by node name. The observer hands every snapshot the same
    tuple for a node whose pods did not change (dds/controller/observe.py), so a decision sums only the nodes whose
    pods changed: summing tens of thousands of pods per decision is the cost this saves. Entries are compared by
    the identity of the tuple they hold, so a snapshot that differs (another observer, a simulation) is never served
    another's sums, only recomputed."""

    def __init__(self) -> None:
        self._by_node: dict[str, NodeLoad] = {}

    def get(self, name: str, pods: tuple[PodInfo, ...], requests: LastingRequests) -> NodeLoad:
        found = self._by_node.get(name)
        if found is None or found.pods is not pods:
            found = NodeLoad.of(pods, requests)
            self._by_node[name] = found  # one dict write (see PlannerMemos)
        return found

    def forget_others(self, names: Sequence[str]) -> None:
        """Drop the nodes gone from the cluster, once they are many (a few stale entries cost nothing)."""
        if len(self._by_node) > 2 * len(names) + 64:
            keep = set(names)
            self._by_node = {n: load for n, load in list(self._by_node.items()) if n in keep}



class NodeFacts:
    """Each node's GPU facts from the last state built with it, by node name. The observer hands every snapshot the
    same NodeInfo for a node that did not change, so a decision derives facts only for the nodes that did. What the
    facts read beyond the node itself (its group, its pool's limits and models, the pass's groups, the model label)
    is the entry's context, compared too: an entry is served only for the same node in the same context."""

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[NodeInfo, tuple, GpuFacts]] = {}
        self._contexts: dict[Optional[str], tuple] = {}

    def of(self, nodes: Sequence[NodeInfo], snapshot: Snapshot, config_groups: Optional[Sequence[str]]
           ) -> tuple[GpuFacts, ...]:
        contexts: dict[Optional[str], tuple] = {}
        by_node, out = self._by_node, []
        for node in nodes:
            context = contexts.get(node.group_id)
            if context is None:
                context = contexts[node.group_id] = self._context(node.group_id, snapshot, config_groups)
            found = by_node.get(node.name)
            if found is None or found[0] is not node or found[1] is not context:
                found = (node, context, gpu_facts(node, snapshot, config_groups))
                by_node[node.name] = found  # one dict write (see PlannerMemos)
            out.append(found[2])
        if len(by_node) > 2 * len(nodes) + 64:
            keep = {node.name for node in nodes}
            self._by_node = {name: entry for name, entry in list(by_node.items()) if name in keep}
        return tuple(out)

    def _context(self, group_id: Optional[str], snapshot: Snapshot, config_groups: Optional[Sequence[str]]) -> tuple:
        """What gpu_facts reads of the snapshot for a node of this group; the same object while it does not change,
        so an entry is checked by identity."""
        group = snapshot.group(group_id) if group_id else None
        pool = snapshot.pool(group.fabric_pool) if group is not None else None
        pool_key = None if pool is None else (pool.name, pool.max_slots_per_node, tuple(sorted(pool.free)))
        allowed = group is not None and group_allowed(config_groups, group.id)
        context = (group_id, group, snapshot.gpu_model_label, pool_key, allowed)
        last = self._contexts.get(group_id)
        if last is not None and last == context:
            return last
        self._contexts[group_id] = context
        return context



class LastColumns:
    """Arrays with one column per node (`items`: the nodes, or their loads), kept from the last state built with
    everything else they read (`key`). The next state with the same key over as many items copies them and fills
    again only the columns whose item changed (by identity: the observer hands over the same NodeInfo, and NodeLoads
    the same load, for a node that did not change), while those are few; otherwise they are built whole."""

    def __init__(self) -> None:
        self._last: Optional[tuple[tuple, tuple, tuple[np.ndarray, ...]]] = None

    def of(self, key: tuple, items: tuple, build: Callable[[], tuple[np.ndarray, ...]],
           refill: Callable[[tuple[np.ndarray, ...], int], None]) -> tuple[np.ndarray, ...]:
        last = self._last
        changed: Optional[list[int]] = None
        if last is not None and last[0] == key and len(last[1]) == len(items):
            changed = [i for i, (old, new) in enumerate(zip(last[1], items)) if old is not new]
        if changed is not None and len(changed) * 4 < len(items) + 4:
            arrays = tuple(array.copy() for array in last[2])  # type: ignore[index]
            for i in changed:
                refill(arrays, i)
        else:
            arrays = build()
        for array in arrays:
            array.setflags(write=False)  # shared with the next state: read only
        self._last = (key, items, arrays)  # one assignment (see PlannerMemos)
        return arrays


@dataclass
class BoundPods:
    """The pods bound to a snapshot's live nodes, as a ClusterState reads them; shared by the states built on one
    snapshot (a pass plans several times on it), with their request sums per (resource rows, GPU names)."""

    loads: list[NodeLoad]  # per live node, in the state's node order
    unbound_requests: list[Resources]
    sums: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _pods: Optional[tuple[list[PodInfo], list[int]]] = None
    _scalar_names: Optional[frozenset[str]] = None

    def pods_and_nodes(self) -> tuple[list[PodInfo], list[int]]:
        """Every bound pod, and the index of its node."""
        if self._pods is None:
            pods = list(chain.from_iterable(load.pods for load in self.loads))
            counts = np.fromiter((len(load.pods) for load in self.loads), dtype=np.int64, count=len(self.loads))
            self._pods = pods, np.repeat(np.arange(len(self.loads), dtype=np.int64), counts).tolist()
        return self._pods

    def scalar_names(self) -> frozenset[str]:
        """Every extended resource a bound or pending pod asks for."""
        if self._scalar_names is None:
            names: set[str] = set()
            for load in self.loads:
                names.update(load.scalar)
            for requests in self.unbound_requests:
                names.update(requests.scalar)
            self._scalar_names = frozenset(names)
        return self._scalar_names


class BoundPodsMemo:
    """The last few snapshots' bound pods, by snapshot identity (the entry holds the snapshot, so a reused id is never
    mistaken for another). Snapshots are frozen, so an entry never goes stale; CA's calls and the loop plan on
    different snapshots at the same time, hence a few entries. The entries are a tuple replaced whole by one
    assignment (see PlannerMemos)."""

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._entries: tuple[tuple[Snapshot, tuple[str, ...], BoundPods], ...] = ()

    def get(self, snapshot: Snapshot, names: tuple[str, ...]) -> Optional[BoundPods]:
        for held, held_names, bound in self._entries:
            if held is snapshot:
                return bound if held_names == names else None
        return None

    def put(self, snapshot: Snapshot, names: tuple[str, ...], bound: BoundPods) -> None:
        others = tuple(entry for entry in self._entries if entry[0] is not snapshot)
        self._entries = ((snapshot, names, bound),) + others[:self._size - 1]


@dataclass(frozen=True)
class PlannerMemos:
    """What planning keeps from one decision to the next: derived sums and facts of the nodes and pods that did not
    change (by object identity: the observer hands every snapshot the same objects for what did not change), so a
    decision over tens of thousands of pods recomputes only what changed. Every entry is checked against the objects
    it was derived from, so a memo never changes a plan, only its cost; a fresh one (the default of every entry point)
    is correct and merely reuses nothing.

    Whoever decides repeatedly keeps one and passes it in (`memos=`): the Controller one for its loop and CA's calls,
    the Simulation one, `dds plan` one. The loop and CA's calls decide outside the Controller's lock
    (Controller.decide_then_act), so one PlannerMemos can be read and written by two decisions at once. That is safe
    without a lock because every write is one store of a value derived only from the objects it is keyed on (a dict
    item, or an attribute rebound to a new tuple): two decisions racing can lose one another's store, which costs a
    recomputation later, but can never serve a value derived from other objects."""

    requests: LastingRequests = field(default_factory=LastingRequests)  # effective requests of pods, by identity
    node_loads: NodeLoads = field(default_factory=NodeLoads)
    node_facts: NodeFacts = field(default_factory=NodeFacts)
    capacity: LastColumns = field(default_factory=LastColumns)  # allocatable per resource row and node
    # bound pods' requests per resource row and node, and their GPUs per node
    sums: LastColumns = field(default_factory=LastColumns)
    bound_pods: BoundPodsMemo = field(default_factory=BoundPodsMemo)
