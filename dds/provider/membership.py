"""Precomputed answers to "which group is this node in?", built once per change of the live nodes or the groups.

cluster-autoscaler asks NodeGroupForNode at least once per node per scan (its externalgrpc provider drops its cache at
every Refresh, and never caches an empty answer), and TargetSize/NodeGroups need each group's live-node count. Walking
every live node for each of those calls made one answer cost O(nodes): 0.06 ms at 1,000 nodes, 0.17 ms at 5,000, so
thousands of calls a scan added seconds of DDS's Python to CA's loop (docs/scale.md, "CA's calls per scan").

`MembershipIndex.current()` hands out a `Membership` built from the cluster view's node tuple and the catalog's groups.
It is rebuilt only when either changes: the cluster view returns the same tuple object until the watch cache shows a
change (ObservedClusterView, StaticClusterView.set_nodes), and the groups are compared by value (the catalog builds a
new tuple on every Refresh even when nothing changed). Every lookup is then a dict read, whatever the cluster's size.

It also holds each spec-fixed group's *companion* (`CompanionGroup`, id `<group id>#live`): the node group CA is told a
spec-fixed group's live nodes belong to, so that CA caches the answer for them (docs/scale.md, "The companion group").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Sequence

from dds.groups.labels import node_group_label_value
from dds.model.groups import NodeGroupSpec, TemplateMode
from dds.scaling.requests import LiveNode

# Why '#': a group id is a MachineSet's `MachineSet/<namespace>/<name>` (no Kubernetes name holds '#') or a file
# entry's id (which the group parser refuses with '#'), so `<id>#live` can never be a served group's id. CA itself
# treats node-group ids as opaque strings: map keys, Prometheus label values, YAML in its status ConfigMap, the
# priority expander's regexps; nothing in 1.35.2 or 1.36.1 splits or validates them.
COMPANION_SEPARATOR = "#"
COMPANION_SUFFIX = f"{COMPANION_SEPARATOR}live"


def companion_id(group_id: str) -> str:
    return f"{group_id}{COMPANION_SUFFIX}"


def companion_parent(node_group_id: str) -> Optional[str]:
    """The spec-fixed group a companion id names, or None when `node_group_id` is not a companion id."""
    if not node_group_id.endswith(COMPANION_SUFFIX):
        return None
    parent = node_group_id[:-len(COMPANION_SUFFIX)]
    return parent or None


@dataclass(frozen=True)
class CompanionGroup:
    """`G#live`: the live nodes of spec-fixed group G, as one node group cluster-autoscaler caches and never scales.

    min = max = target = its live nodes: CA's scale-up skips it ("max node group size reached"), its scale-down
    pre-filter skips its nodes ("min size reached") before asking anything per node, and G keeps no live node, so G's
    template stays its TemplateNodeInfo with every GPU slot filled."""

    group: NodeGroupSpec
    nodes: tuple[LiveNode, ...]

    @property
    def id(self) -> str:
        return companion_id(self.group.id)

    @property
    def size(self) -> int:
        return len(self.nodes)

    # The names GroupView uses: min = max = target = its live nodes.
    min_size = max_size = target_size = size

    def provider_ids(self) -> list[str]:
        return [node.provider_id for node in self.nodes if node.provider_id]

    def debug(self) -> str:
        return (f"the {self.size} live node(s) of spec-fixed group {self.group.id}, held at their number: "
                f"cluster-autoscaler adds capacity through {self.group.id} (template with "
                f"{self.group.max_gpus_per_node} GPU(s)) and DDS removes these nodes itself")


class NodeSource(Protocol):
    def nodes(self) -> Sequence[LiveNode]: ...


class GroupSource(Protocol):
    def groups(self) -> tuple[NodeGroupSpec, ...]: ...


@dataclass(frozen=True)
class Membership:
    """One consistent reading: live nodes by providerID and by name, groups by id and by node-group label value, and
    each group's live nodes (in the cluster view's order), and the companion of every spec-fixed group with live nodes
    (by the group's id)."""

    by_provider_id: Mapping[str, LiveNode]
    by_name: Mapping[str, LiveNode]
    groups_by_id: Mapping[str, NodeGroupSpec]
    groups_by_label: Mapping[str, NodeGroupSpec]
    nodes_of_group: Mapping[str, tuple[LiveNode, ...]]
    companions: Mapping[str, CompanionGroup]

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
        nodes_of_group = {group_id: tuple(found) for group_id, found in members.items()}
        companions = {group.id: CompanionGroup(group, nodes_of_group[group.id]) for group in groups_by_id.values()
                      if group.template_mode == TemplateMode.SPEC_FIXED and nodes_of_group.get(group.id)}
        return cls(by_provider_id, by_name, groups_by_id, groups_by_label, nodes_of_group, companions)

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
        self._built: Optional[tuple[Sequence[LiveNode], tuple[NodeGroupSpec, ...], Membership]] = None
        self.builds = 0  # how many times it was rebuilt: the unit tests' measure of "not per call"

    def current(self) -> Membership:
        nodes, groups = self._nodes.nodes(), self._groups.groups()
        # CA asks thousands of times a scan: when nothing changed, one read of an attribute holding the inputs and
        # their membership together (consistent without the lock) answers it.
        built = self._built
        if built is not None and built[0] is nodes and built[1] is groups:
            return built[2]
        with self._lock:
            built = self._built
            if built is None or built[0] is not nodes or built[1] != groups:
                membership = Membership.build(nodes, groups)
                self.builds += 1
            else:
                membership = built[2]
            # Keep the tuple just compared: the next call finds it by identity instead of comparing every spec's fields
            # again (the catalog hands out a new tuple of equal specs after each Refresh).
            self._built = (nodes, groups, membership)
            return membership
