"""Precomputed answers to "which group is this node in?", built once per change of the live nodes or the groups.

cluster-autoscaler asks NodeGroupForNode at least once per node per scan (its externalgrpc provider drops its cache at
every Refresh, and never caches an empty answer), and TargetSize/NodeGroups need each group's live-node count. Walking
every live node for each of those calls made one answer cost O(nodes): 0.06 ms at 1,000 nodes, 0.17 ms at 5,000, so
thousands of calls a scan added seconds of DDS's Python to CA's loop (docs/scale.md, "CA's calls per scan").

`MembershipIndex.current()` hands out a `Membership` built from the cluster view's node tuple and the catalog's groups.
It is rebuilt only when either changes: the cluster view returns the same tuple object until the watch cache shows a
change (ObservedClusterView, StaticClusterView.set_nodes), and the groups are compared by value (the catalog builds a
new tuple on every Refresh even when nothing changed). Every lookup is then a dict read, whatever the cluster's size.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Sequence

from dds.groups.labels import node_group_label_value
from dds.model.groups import NodeGroupSpec
from dds.scaling.requests import LiveNode


class NodeSource(Protocol):
    def nodes(self) -> Sequence[LiveNode]: ...


class GroupSource(Protocol):
    def groups(self) -> tuple[NodeGroupSpec, ...]: ...


@dataclass(frozen=True)
class Membership:
    """One consistent reading: live nodes by providerID and by name, groups by id and by node-group label value, and
    each group's live nodes (in the cluster view's order)."""

    by_provider_id: Mapping[str, LiveNode]
    by_name: Mapping[str, LiveNode]
    groups_by_id: Mapping[str, NodeGroupSpec]
    groups_by_label: Mapping[str, NodeGroupSpec]
    nodes_of_group: Mapping[str, tuple[LiveNode, ...]]

    @classmethod
    def build(cls, nodes: Sequence[LiveNode], groups: Sequence[NodeGroupSpec]) -> "Membership":
        by_provider_id: dict[str, LiveNode] = {}
        by_name: dict[str, LiveNode] = {}
        members: dict[str, list[LiveNode]] = {}
        for node in nodes:
            # The first node wins on a duplicate key, as the linear search this replaces did.
            if node.provider_id:
                by_provider_id.setdefault(node.provider_id, node)
            if node.name:
                by_name.setdefault(node.name, node)
            if node.group_id:
                members.setdefault(node.group_id, []).append(node)
        groups_by_label: dict[str, NodeGroupSpec] = {}
        for group in groups:
            groups_by_label.setdefault(node_group_label_value(group.id), group)
        groups_by_id: dict[str, NodeGroupSpec] = {}
        for group in groups:
            groups_by_id.setdefault(group.id, group)
        return cls(by_provider_id, by_name, groups_by_id, groups_by_label,
                   {group_id: tuple(found) for group_id, found in members.items()})

    def live(self, name: str, provider_id: str) -> Optional[LiveNode]:
        """The live node with this providerID, else with this name."""
        found = self.by_provider_id.get(provider_id) if provider_id else None
        if found is None and name:
            found = self.by_name.get(name)
        return found

    def live_count(self, group_id: str) -> int:
        return len(self.nodes_of_group.get(group_id, ()))


class MembershipIndex:
    """The current `Membership`, rebuilt when the node view or the groups change (never per call)."""

    def __init__(self, nodes: NodeSource, groups: GroupSource) -> None:
        self._nodes = nodes
        self._groups = groups
        self._lock = threading.Lock()
        self._built_from: Optional[tuple[Sequence[LiveNode], tuple[NodeGroupSpec, ...]]] = None
        self._membership = Membership.build((), ())
        self.builds = 0  # how many times it was rebuilt: the unit tests' measure of "not per call"

    def current(self) -> Membership:
        nodes, groups = self._nodes.nodes(), self._groups.groups()
        with self._lock:
            built = self._built_from
            if built is None or built[0] is not nodes or built[1] != groups:
                self._membership = Membership.build(nodes, groups)
                self._built_from = (nodes, groups)
                self.builds += 1
            return self._membership
