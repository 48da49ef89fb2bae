"""What DDS tells cluster-autoscaler about its node groups: membership, sizes and in-flight instances.

DDS node groups are normally *spec-fixed*: CA must always simulate a new node with the template (max GPUs), never
with the shape of a live node (which has only the GPUs attached now). CA takes the first ready live node it maps to a
group as that group's template, so a spec-fixed group G never has a live node mapped to it: its live nodes are mapped
to G's *companion* `G#live` instead (dds/provider/membership.py `CompanionGroup`), a group held at exactly its live
nodes that CA never scales. CA caches a non-empty NodeGroupForNode answer for its whole scan, where an empty one ("not
autoscaled") cost a round trip at each of its 6-8 lookups per node (docs/scale.md, "CA's calls per scan"). DDS owns
those nodes' scale-down; G's size as CA sees it is only the work still in flight.

Node membership (`group_for_node`):

| node CA asks about                                                      | answer                 |
|-------------------------------------------------------------------------|------------------------|
| name or providerID is an instance DDS lists                             | that instance's group  |
| CA placeholder (fake-node-reason annotation, or an instance-id name) of a served group, instance already gone | that group |
| live node of a spec-fixed group G (cluster view)                        | `G#live`               |
| live node of an observed group                                          | the group              |
| node labelled with an observed group's node-group label, not yet in the cluster view | that group |
| anything else                                                           | "" (not autoscaled)    |

Sizes (what CA's arithmetic needs: target + delta <= max, and every unit of target is listed):

| group            | TargetSize                    | minSize             | maxSize                                    |
|------------------|-------------------------------|---------------------|--------------------------------------------|
| spec-fixed G     | listed instances              | 0                   | max(0, max_size - live nodes of the group) |
| `G#live`         | live nodes of G               | live nodes of G     | live nodes of G                            |
| observed         | live nodes + listed instances | configured min      | configured max                             |

NodeGroups lists `G#live` only while G has live nodes; its id is answered whenever G is a served spec-fixed group (a
node leaving between CA's NodeGroups and TargetSize must not turn into an error, which would abort CA's loop).
NodeGroupNodes lists the in-flight instances (state creating, errorInfo when failed) and, for observed groups and
companions, the live nodes (running, id = the node's providerID).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from dds.model.groups import LABEL_NODE_GROUP, NodeGroupSpec, TemplateMode
from dds.scaling.instances import InstanceRecord, InstanceTracker, group_of_instance_id
from dds.scaling.requests import DeleteTarget, LiveNode, Placeholder, RequestNode
from dds.groups.catalog import NodeGroupCatalog
from dds.provider.membership import CompanionGroup, MembershipIndex, companion_parent

log = logging.getLogger(__name__)


# --- errors the servicer maps to gRPC status codes ---

class RegistryError(Exception):
    """A request the registry refuses; the message says what was wrong and is shown to CA."""


class UnknownGroup(RegistryError):
    pass


class InvalidRequest(RegistryError):
    pass


class PreconditionFailed(RegistryError):
    pass


class ClusterView(Protocol):
    """Live nodes, with the DDS group each belongs to (the cluster one maps them through Cluster API Machines)."""

    def nodes(self) -> Sequence[LiveNode]: ...


class StaticClusterView:
    """A fixed set of nodes (no cluster; tests). Empty by default."""

    def __init__(self, nodes: Sequence[LiveNode] = ()) -> None:
        self._nodes = tuple(nodes)
        self._lock = threading.Lock()

    def set_nodes(self, nodes: Sequence[LiveNode]) -> None:
        with self._lock:
            self._nodes = tuple(nodes)

    def nodes(self) -> Sequence[LiveNode]:
        with self._lock:
            return self._nodes


@dataclass(frozen=True)
class GroupView:
    spec: NodeGroupSpec
    min_size: int
    max_size: int
    target_size: int
    live_nodes: int

    @property
    def id(self) -> str:
        return self.spec.id

    def debug(self) -> str:
        spec = self.spec
        gpus = f"{spec.initial_gpus}..{spec.max_gpus_per_node} {spec.gpu_resource}"
        models = ",".join(spec.gpu_models) or "any model"
        return (f"{spec.template_mode.value} group from {spec.source.describe()}: {self.live_nodes} live node(s) of "
                f"{spec.min_size}..{spec.max_size}, {gpus} per node ({models}) from pool {spec.fabric_pool}")


Reconciler = Callable[[Sequence[NodeGroupSpec]], None]


def companion_refusal(companion: CompanionGroup, action: str) -> PreconditionFailed:
    """Why CA may not change a companion: it is always at its max (and its min), and its nodes are DDS's to remove."""
    group = companion.group.id
    return PreconditionFailed(
        f"{action} {companion.id} refused: it is the {companion.size} live node(s) of spec-fixed group {group}, held at "
        f"min = max = target = {companion.size}; cluster-autoscaler adds capacity through {group}, and DDS scales "
        f"{group}'s live nodes down itself (idle GPUs detached, empty nodes removed: case 4)")


class Registry:
    def __init__(self, catalog: NodeGroupCatalog, cluster: ClusterView, tracker: InstanceTracker,
                 reconcilers: Sequence[Reconciler] = ()) -> None:
        self.catalog = catalog
        self.cluster = cluster
        self.tracker = tracker
        self.reconcilers = list(reconcilers)
        # Node and group lookups CA makes thousands of times a scan: answered from an index rebuilt only when the
        # live nodes or the groups change (dds/provider/membership.py).
        self.membership = MembershipIndex(cluster, catalog)
        # Held from IncreaseSize's size check to the decider's instances being recorded, so two concurrent
        # increases cannot both pass the max-size check.
        self.scale_lock = threading.RLock()

    # --- groups ---
    def refresh(self) -> None:
        """Re-read the groups and let in-flight work report progress. Never raises: CA aborts its loop on an error."""
        self.catalog.refresh()
        groups = self.catalog.groups()
        for reconcile in self.reconcilers:
            try:
                reconcile(groups)
            except Exception:
                log.exception("reconciling in-flight instances failed; retried on the next Refresh")
        self.tracker.flush()

    def groups(self) -> tuple[NodeGroupSpec, ...]:
        return self.catalog.groups()

    def require(self, group_id: str) -> NodeGroupSpec:
        if not group_id:
            raise InvalidRequest("node group id is empty")
        group = self.catalog.group(group_id)  # a few groups: no need to read the live nodes for this
        if group is None:
            known = ", ".join(s.id for s in self.catalog.groups()) or "none"
            raise UnknownGroup(f"node group {group_id!r} is not served by DDS (served: {known})")
        return group

    def view(self, group: NodeGroupSpec, live: Optional[int] = None) -> GroupView:
        live_count = self.membership.current().live_count(group.id) if live is None else live
        in_flight = self.tracker.count(group.id)
        if group.template_mode == TemplateMode.SPEC_FIXED:
            return GroupView(group, 0, max(0, group.max_size - live_count), in_flight, live_count)
        return GroupView(group, group.min_size, group.max_size, live_count + in_flight, live_count)

    def views(self) -> list[GroupView | CompanionGroup]:
        """What NodeGroups lists: every served group, each spec-fixed group with live nodes followed by its companion."""
        membership = self.membership.current()
        listed: list[GroupView | CompanionGroup] = []
        for group in self.groups():
            listed.append(self.view(group, membership.live_count(group.id)))
            companion = membership.companions.get(group.id)
            if companion is not None:
                listed.append(companion)
        return listed

    def companion(self, node_group_id: str) -> Optional[CompanionGroup]:
        """The companion `node_group_id` names (empty while its group has no live node), or None when it names none.
        Raises UnknownGroup for a companion id whose group is not a served spec-fixed group."""
        parent_id = companion_parent(node_group_id)
        if parent_id is None:
            return None
        membership = self.membership.current()
        parent = membership.groups_by_id.get(parent_id)
        if parent is None or parent.template_mode != TemplateMode.SPEC_FIXED:
            what = "not served by DDS" if parent is None else f"in {parent.template_mode.value} mode"
            raise UnknownGroup(f"node group {node_group_id!r} is not served by DDS: a '#live' group stands for the "
                               f"live nodes of a spec-fixed group, and {parent_id!r} is {what}")
        return membership.companions.get(parent_id) or CompanionGroup(parent, ())

    def live_nodes(self, group: NodeGroupSpec) -> list[LiveNode]:
        return list(self.membership.current().nodes_of_group.get(group.id, ()))

    def instances(self, group: NodeGroupSpec) -> tuple[InstanceRecord, ...]:
        return self.tracker.list(group.id)

    # --- membership ---
    def group_for_node(self, node: RequestNode) -> Optional[NodeGroupSpec | CompanionGroup]:
        if not node.name and not node.provider_id:
            raise InvalidRequest("node has neither a name nor a providerID")
        membership = self.membership.current()
        instance = self._instance_of(node)
        if instance is not None:
            return membership.groups_by_id.get(instance.group_id)
        placeholder_group = self._placeholder_group_id(node)
        if placeholder_group is not None:
            return membership.groups_by_id.get(placeholder_group)
        live = membership.live(node.name, node.provider_id)
        if live is not None:
            group = membership.groups_by_id.get(live.group_id) if live.group_id else None
            if group is not None and group.template_mode == TemplateMode.SPEC_FIXED:
                return membership.companions.get(group.id)
            return group
        label = node.labels.get(LABEL_NODE_GROUP)
        group = membership.groups_by_label.get(label) if label else None
        # A spec-fixed node the cluster view does not show yet is in no companion (its target counts the view's nodes
        # only, and every unit of a target must be listed): "" until the view catches up.
        if group is None or group.template_mode == TemplateMode.SPEC_FIXED:
            return None
        return group

    def _instance_of(self, node: RequestNode) -> Optional[InstanceRecord]:
        return (self.tracker.get(node.provider_id) if node.provider_id else None) or \
            (self.tracker.get(node.name) if node.name else None)

    @staticmethod
    def _placeholder_group_id(node: RequestNode) -> Optional[str]:
        # CA keeps sending a placeholder after DDS dropped its instance (once per loop while it was listed, and from
        # its caches): the group is still encoded in the instance id it was made from.
        for candidate in (node.provider_id, node.name):
            group_id = group_of_instance_id(candidate) if candidate else None
            if group_id is not None:
                return group_id
        return None

    def _live(self, node: RequestNode) -> Optional[LiveNode]:
        return self.membership.current().live(node.name, node.provider_id)

    # --- scaling checks ---
    def check_increase(self, group: NodeGroupSpec, delta: int) -> GroupView:
        if delta <= 0:
            raise InvalidRequest(f"size increase of {group.id} must be positive, got delta {delta}")
        view = self.view(group)
        if view.target_size + delta > view.max_size:
            detail = (f" (max size {group.max_size} minus {view.live_nodes} live node(s) DDS manages itself)"
                      if group.template_mode == TemplateMode.SPEC_FIXED else "")
            raise InvalidRequest(f"size increase of {group.id} too large: target size {view.target_size} + delta "
                                 f"{delta} = {view.target_size + delta} exceeds max size {view.max_size}{detail}")
        return view

    def resolve_deletions(self, group: NodeGroupSpec, nodes: Sequence[RequestNode]) -> list[DeleteTarget]:
        """Check every node belongs to `group` (else nothing is changed), then drop the instances of placeholders."""
        if not nodes:
            raise InvalidRequest(f"delete nodes of {group.id}: no nodes given")
        targets = [self._deletion_target(group, node) for node in nodes]
        resolved: list[DeleteTarget] = []
        for target in targets:
            if isinstance(target, Placeholder) and target.instance is not None:
                dropped = self.tracker.remove(target.instance.id)
                log.info("dropping instance %s of %s: cluster-autoscaler deleted its placeholder (%s)",
                         target.instance.id, group.id, target.reason or "no reason given")
                target = Placeholder(target.name, target.provider_id, target.reason, dropped)
            resolved.append(target)
        return resolved

    def _deletion_target(self, group: NodeGroupSpec, node: RequestNode) -> DeleteTarget:
        if not node.name and not node.provider_id:
            raise InvalidRequest(f"delete nodes of {group.id}: a node has neither a name nor a providerID")
        instance = self._instance_of(node)
        if instance is not None:
            if instance.group_id != group.id:
                raise PreconditionFailed(f"node {node.describe()} is an instance of node group {instance.group_id}, "
                                         f"not of {group.id}")
            return Placeholder(node.name, node.provider_id, node.placeholder_reason or "", instance)
        placeholder_group = self._placeholder_group_id(node)
        if placeholder_group is not None:
            if placeholder_group != group.id:
                raise PreconditionFailed(f"node {node.describe()} is a placeholder of node group {placeholder_group}, "
                                         f"not of {group.id}")
            return Placeholder(node.name, node.provider_id, node.placeholder_reason or "", None)
        live = self._live(node)
        if live is None or live.group_id != group.id:
            owner = f"node group {live.group_id}" if live is not None and live.group_id else "no DDS node group"
            raise PreconditionFailed(f"node {node.describe()} belongs to {owner}, not to {group.id}")
        if group.template_mode == TemplateMode.SPEC_FIXED:
            raise PreconditionFailed(f"node {node.describe()} is in spec-fixed group {group.id}, whose nodes DDS "
                                     "scales down itself (they are not autoscaled by cluster-autoscaler)")
        return live

    def decrease_target(self, group: NodeGroupSpec, delta: int) -> list[InstanceRecord]:
        """Forget `-delta` requested instances that have no node yet (newest first); never touches live nodes."""
        if delta >= 0:
            raise InvalidRequest(f"size decrease of {group.id} must be negative, got delta {delta}")
        instances = list(self.tracker.list(group.id))
        if -delta > len(instances):
            view = self.view(group)
            raise PreconditionFailed(
                f"cannot decrease target size of {group.id} by {-delta}: only {len(instances)} requested instance(s) "
                f"have no node yet (target size {view.target_size}, {view.live_nodes} live node(s)); "
                "delete registered nodes with DeleteNodes")
        removed = []
        for record in sorted(instances, key=lambda r: (r.created_at, r.id), reverse=True)[:-delta]:
            if self.tracker.remove(record.id) is not None:
                removed.append(record)
        return removed
