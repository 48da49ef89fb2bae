"""The fast planner's private scratch: every live node's free resources, GPUs and slots in arrays, changed in place
under an undo journal (`fork` / `revert`), so a what-if costs the few entries it touches, never a rebuilt world.

Vector checks only *pre-screen* candidates; the scalar filters (dds/planner/filters.py) have the last word on the node
finally chosen (`verify`), so the two cannot silently disagree, and the reference planner cross-checks the rest.

Static filter verdicts (labels, taints, flags) are cached per (pod shape, node shape, GPU model): pods with equal
`PodRequest.static_key` share one table; nodes that look alike to that shape (same values of the label keys it reads,
same taints and flags) share one row.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np

from dds.model.resources import CPU, EPHEMERAL_STORAGE, MEMORY, PODS, STANDARD
from dds.planner.filters import (AFFINITY_UNMET, ANTI_AFFINITY_UNMET, EXISTING_ANTI_AFFINITY, FILTERS, PORTS_TAKEN,
                                 STATIC_FILTERS, first_reject, ports_conflict, term_matches_pod)
from dds.planner.memos import BoundPods, NodeLoad, PlannerMemos
from dds.planner.nodes import effective_labels
from dds.model.plan import Reject
from dds.planner.requests import PodRequest, RequestCache
from dds.model.snapshot import HostPort, NodeInfo, PodAffinityTerm, PodInfo, Snapshot

UNLIMITED = np.int64(2**62)  # free amount of a resource a filter never checks on that node


@dataclass(frozen=True)
class StaticTable:
    """Static verdicts for one pod shape: ok[row, model column] with the first reject, per node row."""

    row: np.ndarray  # node index -> row
    ok: np.ndarray  # rows x (models + 1); the last column = "as labelled now" (no model overlay)
    rejects: tuple[tuple[Optional[Reject], ...], ...]


@dataclass(frozen=True)
class Choice:
    """Where a pod goes on a live node, and what that takes."""

    node: int
    attach: int
    model: Optional[str]
    score: float
    # The next best candidates that were not chosen, as rejected options ("lower score", "lost the tie-break").
    alternatives: tuple[Reject, ...] = ()


class FastNodeView:
    """A live node of the scratch, read by the scalar filters (optionally as if it held `model`)."""

    def __init__(self, state: "ClusterState", index: int, model: Optional[str] = None) -> None:
        node = state.nodes[index]
        self._state, self._i = state, index
        self.name = node.name
        held = state.model_name(index)
        self.labels = effective_labels(node.labels, model or held, state.label)
        self.taints = node.taints
        self.unschedulable = node.unschedulable
        self.ready = node.ready
        self.being_deleted = node.being_deleted
        self.gpu_resource = node.gpu_resource

    def free(self, resource: str) -> int:
        if resource == self.gpu_resource:
            return int(self._state.gpu_free[self._i])
        row = self._state.resource_row.get(resource)
        return 0 if row is None else int(self._state.free[row, self._i])

    def capacity(self, resource: str) -> int:
        if resource == self.gpu_resource:
            return int(self._state.gpu_capacity[self._i])
        row = self._state.resource_row.get(resource)
        return 0 if row is None else int(self._state.capacity[row, self._i])

    def host_ports(self) -> Iterable[HostPort]:
        return self._state.ports[self._i]

    def pods(self) -> Iterable[PodInfo]:
        return self._state.pods_on(self._i)


class ClusterState:
    """Live nodes of a snapshot as mutable arrays. Node i is the i-th node in name order."""

    def __init__(self, snapshot: Snapshot, cache: RequestCache, config_groups: Optional[Sequence[str]],
                 extra_pods: Sequence[PodInfo] = (), *, memos: Optional[PlannerMemos] = None) -> None:
        self.snapshot = snapshot
        self.memos = memos if memos is not None else PlannerMemos()
        self.cache = cache
        self.label = snapshot.gpu_model_label
        self.nodes: tuple[NodeInfo, ...] = tuple(sorted(snapshot.nodes, key=lambda n: n.name))
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.facts = self.memos.node_facts.of(self.nodes, snapshot, config_groups)
        self._init_models_and_pools()
        self._init_resources(extra_pods)
        self._init_gpus()
        self._init_pods()
        self._init_coming()
        self._undo: list[tuple[np.ndarray, object, object] | list] = []  # see _set and _append
        self._version = 0  # bumped by every change: keys caches of derived data
        # Nodes whose arrays changed, in order, reverts included, and a count of changes to the placement rules (host
        # ports, anti-affinity) the pre-screens read: a screen kept per pod shape is brought up to date from these.
        self.touched: list[int] = []
        self._rules_version = 0
        self._masks_key: tuple[int, int] = (0, -1)
        self._masks: list[tuple[str, np.ndarray]] = []
        self._tables: dict[tuple, StaticTable] = {}
        self._accepted: dict[int, np.ndarray] = {}
        self._label_codes: dict[str, np.ndarray] = {}
        # Node shape for the static filters apart from labels: taints and flags, as a small integer per node.
        shapes: dict[tuple, int] = {}
        self._flags = np.array([shapes.setdefault((n.taints, n.unschedulable, n.ready, n.being_deleted), len(shapes))
                                for n in self.nodes], dtype=np.int64)

    # --- construction ------------------------------------------------------------------------------------------------
    def _init_models_and_pools(self) -> None:
        snapshot = self.snapshot
        models = {m for f in self.facts for m in f.allowed_models} | {m for p in snapshot.pools for m in p.free}
        models |= {m for g in snapshot.groups for m in g.gpu_models}
        self.models: tuple[str, ...] = tuple(sorted(m for m in models if m))
        self.model_index = {m: i for i, m in enumerate(self.models)}
        self.no_model = len(self.models)
        self.pool_index = {p: i for i, p in enumerate(sorted({p.name for p in snapshot.pools}))}
        self.pool_free = np.zeros((len(self.pool_index), max(1, len(self.models))), dtype=np.int64)
        for p in snapshot.pools:
            for model, count in p.free.items():
                if model in self.model_index:
                    self.pool_free[self.pool_index[p.name], self.model_index[model]] = max(0, int(count))

    def _init_resources(self, extra_pods: Sequence[PodInfo]) -> None:
        """The standard four resources and every extended resource any node or pod mentions, one row each."""
        scalars: set[str] = set()
        for node in self.nodes:
            scalars.update(node.allocatable.scalar)
        self._collect_bound_pods()
        scalars.update(self._bound.scalar_names())
        for pod in extra_pods:
            scalars.update(self.cache.requests(pod).scalar)
        self.resource_names: tuple[str, ...] = STANDARD + tuple(sorted(scalars - set(STANDARD)))
        self.resource_row = {r: i for i, r in enumerate(self.resource_names)}
        self.capacity = self.memos.capacity.of((self.resource_names,), self.nodes, self._all_capacity,
                                              lambda arrays, i: self._capacity_column(arrays[0], i))[0]
        self.free = self.capacity.copy()
        self.gpu_names = tuple(sorted({node.gpu_resource for node in self.nodes}))
        gpu_name_index = {g: i for i, g in enumerate(self.gpu_names)}
        self.gpu_name_of = np.array([gpu_name_index[node.gpu_resource] for node in self.nodes], dtype=np.int64)

    def _init_gpus(self) -> None:
        facts, n = self.facts, len(self.nodes)
        self.gpu_capacity = np.array([f.capacity for f in facts], dtype=np.int64)
        self.gpu_free = self.gpu_capacity.copy()
        self.free_slots = np.array([f.free_slots for f in facts], dtype=np.int64)
        self.attachable = np.array([f.attachable for f in facts], dtype=bool)
        self.target = np.array([node.ready and not node.being_deleted for node in self.nodes], dtype=bool)
        self.model = np.array([self.model_index.get(f.model, self.no_model) if f.model else self.no_model
                               for f in facts], dtype=np.int64)
        self.pool = np.array([self.pool_index.get(f.pool, -1) if f.pool else -1 for f in facts], dtype=np.int64)
        # allowed[i, m]: node i may take model m (its group's models; or its own once it holds one).
        self.allowed = np.zeros((n, max(1, len(self.models))), dtype=bool)
        self.preferred = np.full(n, -1, dtype=np.int64)  # the group's default model, tried first
        for i, f in enumerate(facts):
            for m in f.allowed_models:
                if m in self.model_index:
                    self.allowed[i, self.model_index[m]] = True
            if f.allowed_models and f.allowed_models[0] in self.model_index:
                self.preferred[i] = self.model_index[f.allowed_models[0]]

    def _collect_bound_pods(self) -> None:
        """The pods bound to live nodes, summed per node (`PlannerMemos.node_loads` keeps the sums of nodes whose pods did not
        change since an earlier snapshot), and the requests of the pending pods (any of them may be planned).
        Everything else about bound pods is built from these with vector steps, or lazily when a pod's rules need it:
        a pass touches tens of thousands of them."""
        snapshot = self.snapshot
        names = tuple(node.name for node in self.nodes)
        memos = self.memos
        found = memos.bound_pods.get(snapshot, names)
        if found is None:
            loads = [memos.node_loads.get(name, snapshot.pods_on(name), memos.requests) for name in names]
            memos.node_loads.forget_others(names)
            lasting = memos.requests.get
            found = BoundPods(loads, [lasting(pod) for pod in snapshot.pending_pods()])
            memos.bound_pods.put(snapshot, names, found)
        self._bound = found

    def _init_pods(self) -> None:
        loads = self._bound.loads
        bound, where = self._bound.pods_and_nodes()
        # never changed after construction
        self._bound_on: list[Sequence[PodInfo]] = [load.pods for load in loads]
        # Pods this plan puts on each node (journaled), and host ports in use per node: lists made on first use, as
        # most nodes get neither (thousands of empty lists per decision are garbage-collector work).
        self.placed: defaultdict[int, list[PodInfo]] = defaultdict(list)
        self.ports: defaultdict[int, list[HostPort]] = defaultdict(list)
        self.port_holders: list[int] = []  # nodes with host ports in use (repeats allowed)
        # Required anti-affinity terms of pods on live nodes, indexed by the (namespace, key, value) of their first
        # matchLabels entry (a pod can only be matched by terms its own labels appear in); the rest unindexed.
        self.guards_by_label: dict[tuple[str, str, str], list[tuple[int, PodInfo, PodAffinityTerm]]] = {}
        self.guards_unindexed: list[tuple[int, PodInfo, PodAffinityTerm]] = []
        self.all_pods: list[PodInfo] = list(bound)  # every pod on a live node (bound or placed by the plan)...
        self.pod_node: list[int] = list(where)  # ...and that node
        # (namespace, key, value) -> positions in all_pods: of bound pods built on first use (few plans ask), of placed
        # pods kept as they are placed.
        self._bound_by_label: Optional[dict[tuple[str, str, str], list[int]]] = None
        self.by_label: dict[tuple[str, str, str], list[int]] = {}
        self.elsewhere: list[PodInfo] = []  # pods the plan puts on nodes that are not live (shared by the driver)
        for i, load in enumerate(loads):
            for pod in load.ruled:
                self._record_rules(i, pod, journal=False)
        if not where:
            return
        # Plans on one snapshot (the loop's fast path and scale-down, CA's scale-up and its equip check) share the sums.
        key = (self.resource_names, self.gpu_names, self.gpu_name_of.tobytes())
        sums = self._bound.sums.get(key)
        if sums is None:
            sums = self._bound.sums[key] = self._bound_request_sums(loads, key)
        used, gpus_used = sums
        self.free -= used
        self.gpu_free -= gpus_used

    def _all_capacity(self) -> tuple[np.ndarray]:
        capacity = np.zeros((len(self.resource_names), len(self.nodes)), dtype=np.int64)
        for i in range(len(self.nodes)):
            self._capacity_column(capacity, i)
        return (capacity,)

    def _capacity_column(self, capacity: np.ndarray, i: int) -> None:
        node = self.nodes[i]
        a = node.allocatable
        capacity[:, i] = 0
        capacity[0:4, i] = (a.milli_cpu, a.memory, a.ephemeral_storage, a.pods)
        for name, amount in a.scalar.items():
            capacity[self.resource_row[name], i] = amount
        gpu_row = self.resource_row.get(node.gpu_resource)
        if gpu_row is not None:
            # The node's GPU resource is judged by the GPU arrays (attaches change it), never by this row.
            capacity[gpu_row, i] = UNLIMITED

    def _bound_request_sums(self, loads: Sequence[NodeLoad], key: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Bound pods' requests summed per node (resource rows x nodes, and GPUs per node) from the nodes' loads;
        from the last state's sums when only a few loads changed (LastColumns)."""
        used, gpus_used = self.memos.sums.of(key, tuple(loads), lambda: self._all_sums(loads),
                                             lambda arrays, i: self._refill_load(arrays, i, loads[i]))
        return used, gpus_used

    def _all_sums(self, loads: Sequence[NodeLoad]) -> tuple[np.ndarray, np.ndarray]:
        n, row = len(loads), self.resource_row
        used = np.zeros_like(self.free)
        gpus_used = np.zeros(n, dtype=np.int64)
        used[row[CPU]] = np.fromiter((load.milli_cpu for load in loads), dtype=np.int64, count=n)
        used[row[MEMORY]] = np.fromiter((load.memory for load in loads), dtype=np.int64, count=n)
        used[row[EPHEMERAL_STORAGE]] = np.fromiter((load.ephemeral_storage for load in loads), dtype=np.int64, count=n)
        used[row[PODS]] = np.fromiter((len(load.pods) for load in loads), dtype=np.int64, count=n)
        for i, load in enumerate(loads):
            if load.scalar:
                self._add_scalars(used, gpus_used, i, load)
        return used, gpus_used

    def _refill_load(self, arrays: tuple[np.ndarray, ...], i: int, load: NodeLoad) -> None:
        used, gpus_used = arrays
        row = self.resource_row
        used[:, i] = 0
        gpus_used[i] = 0
        used[row[CPU], i] = load.milli_cpu
        used[row[MEMORY], i] = load.memory
        used[row[EPHEMERAL_STORAGE], i] = load.ephemeral_storage
        used[row[PODS], i] = len(load.pods)
        self._add_scalars(used, gpus_used, i, load)

    def _add_scalars(self, used: np.ndarray, gpus_used: np.ndarray, i: int, load: NodeLoad) -> None:
        own_gpu = self.nodes[i].gpu_resource
        for name, amount in load.scalar.items():
            if name == own_gpu:  # a node's own GPU resource is judged by the GPU arrays, never by its row
                gpus_used[i] += amount
            else:
                used[self.resource_row[name], i] += amount

    def pods_on(self, i: int) -> Sequence[PodInfo]:
        """Pods on live node i: bound, then placed by this plan."""
        placed = self.placed[i]
        return (*self._bound_on[i], *placed) if placed else self._bound_on[i]

    def has_pods(self, i: int) -> bool:
        return bool(self._bound_on[i] or self.placed[i])

    def bound_by_label(self) -> dict[tuple[str, str, str], list[int]]:
        if self._bound_by_label is None:
            by_label: dict[tuple[str, str, str], list[int]] = {}
            for position, pod in enumerate(self._bound.pods_and_nodes()[0]):
                namespace = pod.namespace
                for key, value in pod.labels.items():
                    by_label.setdefault((namespace, key, value), []).append(position)
            self._bound_by_label = by_label
        return self._bound_by_label

    def _init_coming(self) -> None:
        """GPUs on their way (in-flight attaches) that no pod counts on yet. They are part of `gpu_free` (capacity
        promised); a pod placed on a node takes its visible free GPUs first, so a node's unclaimed GPUs on their way
        are never more than its free GPUs."""
        attaching = np.array([node.attaching for node in self.nodes], dtype=np.int64)
        self.gpu_coming = np.minimum(np.maximum(attaching, 0), np.maximum(self.gpu_free, 0))

    def _record_pod(self, i: int, pod: PodInfo) -> None:
        """A pod the plan places on live node i (journaled: a revert takes it off again)."""
        self._append(self.placed[i], pod)
        self._record_rules(i, pod, journal=True)
        position = len(self.all_pods)
        self._append(self.all_pods, pod)
        self._append(self.pod_node, i)
        for key, value in pod.labels.items():
            self._append(self.by_label.setdefault((pod.namespace, key, value), []), position)

    def _record_rules(self, i: int, pod: PodInfo, journal: bool) -> None:
        """The pod's host ports and required anti-affinity terms, which the placement masks read."""
        if journal and (pod.host_ports or pod.required_pod_anti_affinity):
            self._rules_version += 1
        add = self._append if journal else (lambda items, value: items.append(value))
        for port in pod.host_ports:
            if port.port > 0:
                add(self.ports[i], port)
                add(self.port_holders, i)
        for term in pod.required_pod_anti_affinity:
            labels = term.label_selector.match_labels
            if labels:
                key, value = next(iter(labels.items()))
                for ns in term.namespaces or (pod.namespace,):
                    add(self.guards_by_label.setdefault((ns, key, value), []), (i, pod, term))
            else:
                add(self.guards_unindexed, (i, pod, term))

    # --- journal ---------------------------------------------------------------------------------------------------
    def fork(self) -> int:
        return len(self._undo)

    def revert(self, mark: int) -> None:
        self._version += 1
        while len(self._undo) > mark:
            entry = self._undo.pop()
            if isinstance(entry, list):
                entry.pop()  # an _append: a placed pod taken off, its rules among what goes
                self._rules_version += 1
            else:
                array, key, old = entry  # a _set
                array[key] = old
                self._touch(array, key)

    # Journal entries are plain data, not closures: (array, key, old value) holds nothing the garbage collector tracks,
    # so the thousands of entries a large plan keeps cost it no passes (with closures the collector took about a tenth
    # of a 5,000-node plan); an appended-to list is its own entry.
    def _set(self, array: np.ndarray, key: object, value: object) -> None:
        self._version += 1
        old = array[key]
        array[key] = value
        self._undo.append((array, key, old))
        self._touch(array, key)

    def _touch(self, array: np.ndarray, key: object) -> None:
        """Log the node a change of `array[key]` is about (pool counts are about no node: screens never read them)."""
        if array is self.free:
            self.touched.append(key[1])  # type: ignore[index]
        elif array is not self.pool_free:
            self.touched.append(key)  # type: ignore[arg-type]

    def _append(self, items: list, value: object) -> None:
        self._version += 1
        items.append(value)
        self._undo.append(items)

    # --- reading -----------------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Changes whenever the scratch does (caches of derived data key on it)."""
        return self._version

    @property
    def rules_version(self) -> int:
        """Changes whenever the placement rules of the pods on live nodes may have (placed or taken off)."""
        return self._rules_version

    def model_name(self, i: int) -> Optional[str]:
        m = int(self.model[i])
        return None if m == self.no_model else self.models[m]

    def view(self, i: int, model: Optional[str] = None) -> FastNodeView:
        return FastNodeView(self, i, model)

    def matching_positions(self, term: PodAffinityTerm, namespace: str) -> list[int]:
        """Positions in all_pods of the live pods an affinity term matches (label index first, then the full rule)."""
        namespaces = term.namespaces or (namespace,)
        selector = term.label_selector
        if not selector.match_labels:
            return [p for p in range(len(self.all_pods)) if term_matches_pod(term, namespace, self.all_pods[p])]
        found: list[int] = []
        for ns in namespaces:
            hits: Optional[set[int]] = None
            bound = self.bound_by_label()
            for key, value in selector.match_labels.items():
                positions = set(bound.get((ns, key, value), ())) | set(self.by_label.get((ns, key, value), ()))
                hits = positions if hits is None else hits & positions
            found.extend(sorted(hits or ()))
        if selector.match_expressions:  # the index covers matchLabels exactly; expressions still need the full rule
            found = [p for p in found if term_matches_pod(term, namespace, self.all_pods[p])]
        return found

    def any_pod_matches(self, term: PodAffinityTerm, namespace: str) -> bool:
        return bool(self.matching_positions(term, namespace)) or any(
            term_matches_pod(term, namespace, pod) for pod in self.elsewhere)

    def request_vector(self, req: PodRequest) -> list[tuple[int, int]]:
        """(resource row, amount) for every resource the pod requests, the pod count included."""
        r = req.requests
        rows = [(self.resource_row[PODS], 1)]
        for name, amount in ((CPU, r.milli_cpu), (MEMORY, r.memory), (EPHEMERAL_STORAGE, r.ephemeral_storage)):
            if amount:
                rows.append((self.resource_row[name], amount))
        rows += [(self.resource_row[name], amount) for name, amount in r.scalar.items() if amount > 0]
        return rows

    def gpu_request(self, req: PodRequest) -> np.ndarray:
        """GPUs the pod requests on each node (nodes may name their GPU resource differently)."""
        per_name = np.array([req.gpus(name) for name in self.gpu_names] or [0], dtype=np.int64)
        if len(per_name) == 1:
            return np.full(len(self.nodes), per_name[0], dtype=np.int64)
        return per_name[self.gpu_name_of]

    def fits_other_resources(self, rows: list[tuple[int, int]], nodes: Optional[np.ndarray] = None) -> np.ndarray:
        """Per node (or per node of `nodes`, an index array): room for every amount of `rows`."""
        free = self.free if nodes is None else self.free[:, nodes]
        ok = np.ones(free.shape[1], dtype=bool)
        for row, amount in rows:
            ok &= free[row] >= amount
        return ok

    def placement_masks(self, req: PodRequest) -> list[tuple[str, np.ndarray]]:
        """Pre-screen of the placement filters, in their order: (reason, nodes passing). Computed from the pods (few
        hold ports or anti-affinity), not node by node; `verify` still runs the scalar filters on the chosen node.
        Cached until the scratch changes (a pod is judged for fitting and explained against the same state)."""
        key = (id(req.pod), self._version)
        if self._masks_key != key:
            self._masks = self._placement_masks(req)
            self._masks_key = key
        return self._masks

    def _placement_masks(self, req: PodRequest) -> list[tuple[str, np.ndarray]]:
        n, pod, out = len(self.nodes), req.pod, []
        wanted = [p for p in pod.host_ports if p.port > 0]
        if wanted:
            ok = np.ones(n, dtype=bool)
            for i in set(self.port_holders):
                if any(ports_conflict(used, w) for used in self.ports[i] for w in wanted):
                    ok[i] = False
            out.append((PORTS_TAKEN, ok))
        if pod.required_pod_affinity:
            ok = np.ones(n, dtype=bool)
            for term in pod.required_pod_affinity:
                hosts = [self.pod_node[p] for p in self.matching_positions(term, pod.namespace)]
                if hosts:
                    on = np.zeros(n, dtype=bool)
                    on[hosts] = True
                    ok &= on
                elif self.any_pod_matches(term, pod.namespace) or not term_matches_pod(term, pod.namespace, pod):
                    ok[:] = False  # matching pods exist only off the live nodes, or the pod does not match itself
            out.append((AFFINITY_UNMET, ok))
        if pod.required_pod_anti_affinity:
            ok = np.ones(n, dtype=bool)
            for term in pod.required_pod_anti_affinity:
                for p in self.matching_positions(term, pod.namespace):
                    ok[self.pod_node[p]] = False
            out.append((ANTI_AFFINITY_UNMET, ok))
        guards = list(self.guards_unindexed)
        for key, value in pod.labels.items():
            guards += self.guards_by_label.get((pod.namespace, key, value), ())
        if guards:
            ok = np.ones(n, dtype=bool)
            for i, other, term in guards:
                if term_matches_pod(term, other.namespace, pod):
                    ok[i] = False
            out.append((EXISTING_ANTI_AFFINITY, ok))
        return out

    def placement_ok(self, req: PodRequest) -> np.ndarray:
        ok = np.ones(len(self.nodes), dtype=bool)
        for _, mask in self.placement_masks(req):
            ok &= mask
        return ok

    # --- static verdicts ---------------------------------------------------------------------------------------------
    def static_table(self, req: PodRequest) -> StaticTable:
        key = req.static_key
        table = self._tables.get(key)
        if table is None:
            table = self._build_static_table(req)
            self._tables[key] = table
        return table

    def _codes(self, key: str) -> np.ndarray:
        """Per node, a small integer for its value of label `key` (-1 = no such label)."""
        codes = self._label_codes.get(key)
        if codes is None:
            values: dict[str, int] = {}
            codes = np.array([values.setdefault(n.labels[key], len(values)) if key in n.labels else -1
                              for n in self.nodes], dtype=np.int64)
            self._label_codes[key] = codes
        return codes

    def _build_static_table(self, req: PodRequest) -> StaticTable:
        """Nodes alike to this pod shape (same values of the labels it reads, same taints and flags, and the same name
        if it selects by name) get one row, judged once per GPU model column by the scalar static filters."""
        n = len(self.nodes)
        model_sensitive = self.label in req.label_keys  # only then does a model overlay change a verdict
        columns = [self._flags] + [self._codes(k) for k in sorted(req.label_keys)]
        if req.uses_node_name:
            columns.append(np.arange(n, dtype=np.int64))
        if n:
            first, row_of = _unique_rows(columns)
        else:
            first, row_of = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        width = len(self.models) + 1
        ok_rows, reject_rows = [], []
        for representative in first:
            node = self.nodes[int(representative)]
            if model_sensitive:
                verdicts = [first_reject(STATIC_FILTERS, req, _static_view(node, model, self.label), self)
                            for model in self.models + (None,)]
            else:
                verdicts = [first_reject(STATIC_FILTERS, req, _static_view(node, None, self.label), self)] * width
            ok_rows.append([v is None for v in verdicts])
            reject_rows.append(tuple(verdicts))
        return StaticTable(row_of.astype(np.int64), np.array(ok_rows, dtype=bool).reshape(len(ok_rows), width),
                           tuple(reject_rows))

    def accepted_models(self, table: StaticTable) -> np.ndarray:
        """[node, model]: the static filters accept the node for this pod shape once it holds the model."""
        key = id(table)  # tables live as long as the scratch (cached in _tables), so their ids stay unique
        found = self._accepted.get(key)
        if found is None:
            found = self._accepted[key] = table.ok[table.row, :len(self.models)]
        return found

    def static_ok_now(self, table: StaticTable, nodes: Optional[np.ndarray] = None) -> np.ndarray:
        """Static verdict per node (or per node of `nodes`) as it is (its own model if it holds one)."""
        if nodes is None:
            return table.ok[table.row, self.model]
        return table.ok[table.row[nodes], self.model[nodes]]

    def static_reject(self, table: StaticTable, i: int, model_column: Optional[int] = None) -> Optional[Reject]:
        column = int(self.model[i]) if model_column is None else model_column
        found = table.rejects[int(table.row[i])][column]
        if found is None:
            return None
        return Reject(self.nodes[i].name, found.reason, found.resource, found.requested, found.free, found.capacity)

    # --- changes -----------------------------------------------------------------------------------------------------
    def attach(self, i: int, count: int, model: Optional[str]) -> None:
        """Virtually attach `count` GPUs of `model` to node i, taking them from its pool."""
        if count <= 0:
            return
        m = self.model_index[model] if model is not None else None
        if m is not None and int(self.model[i]) == self.no_model:
            self._set(self.model, i, m)
        self._set(self.gpu_capacity, i, self.gpu_capacity[i] + count)
        self._set(self.gpu_free, i, self.gpu_free[i] + count)
        self._set(self.free_slots, i, self.free_slots[i] - count)
        if m is not None and self.pool[i] >= 0:
            key = (int(self.pool[i]), m)
            self._set(self.pool_free, key, self.pool_free[key] - count)

    def hold_model(self, i: int, model: Optional[str]) -> None:
        """A GPU pod on a node with GPUs but no known model fixes the model it is judged by."""
        if model is not None and int(self.model[i]) == self.no_model:
            self._set(self.model, i, self.model_index[model])

    def place(self, i: int, req: PodRequest) -> None:
        for row, amount in self.request_vector(req):
            self._set(self.free, (row, i), self.free[row, i] - amount)
        free = self.gpu_free[i] - req.gpus(self.nodes[i].gpu_resource)
        self._set(self.gpu_free, i, free)
        if self.gpu_coming[i] > max(free, 0):  # the visible GPUs are used up: the pod counts on some on their way
            self._set(self.gpu_coming, i, max(free, 0))
        self._record_pod(i, req.pod)

    def disable(self, i: int) -> None:
        """Node i takes nothing more (it is being removed in this what-if)."""
        self._set(self.target, i, False)
        self._set(self.attachable, i, False)

    # --- verification by the scalar filters ---------------------------------------------------------------------------
    def verify(self, req: PodRequest, i: int, model: Optional[str]) -> Optional[Reject]:
        """The scalar filters' verdict on node i as it stands (after any virtual attach)."""
        return first_reject(FILTERS, req, self.view(i, model), self)


def _unique_rows(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """np.unique over the rows of the stacked columns (small integers >= -1): (first index of each distinct row, row
    number of each node), rows numbered in lexicographic order. Packed into one integer per node when the columns'
    ranges allow it: sorting one key is many times faster than sorting rows, and the order is the same."""
    spans = [int(c.max()) + 2 for c in columns]  # values -1..max, shifted to 0..max+1
    if math.prod(spans) < 2**62:
        key = np.zeros(len(columns[0]), dtype=np.int64)
        for column, span in zip(columns, spans):  # the first column is the most significant digit
            key = key * span + (column + 1)
        _, first, row_of = np.unique(key, return_index=True, return_inverse=True)
    else:
        _, first, row_of = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
    return first, row_of.reshape(-1)


def _static_view(node: NodeInfo, model: Optional[str], label: str) -> FastNodeView:
    """A node as the static filters see it, optionally as if it held `model` (no resources needed)."""
    view = FastNodeView.__new__(FastNodeView)
    view.name, view.taints = node.name, node.taints
    view.labels = effective_labels(node.labels, model, label)
    view.unschedulable, view.ready, view.being_deleted = node.unschedulable, node.ready, node.being_deleted
    view.gpu_resource = node.gpu_resource
    return view
