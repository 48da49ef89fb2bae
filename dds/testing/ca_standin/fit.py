"""A small, independent scheduling check: does a pod fit a node, as kube-scheduler's filters would say?

Written from the scheduler's documented rules, deliberately not sharing code with dds/planner, so the stand-in does not
trust DDS's own simulation. Covered: resource requests (cpu, memory, ephemeral-storage, pod count, any extended
resource), `nodeSelector`, required node affinity, `spec.unschedulable`, and NoSchedule/NoExecute taints against
tolerations. Not covered: inter-pod (anti-)affinity, topology spread, host ports, volumes and DRA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from .views import PODS, NodeSelectorTerm, NodeView, PodView, SelectorRequirement, Taint

UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


def _requirement_matches(requirement: SelectorRequirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    value = labels.get(requirement.key, "")
    op = requirement.operator
    if op == "In":
        return present and value in requirement.values
    if op == "NotIn":
        return not present or value not in requirement.values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(requirement.values) == 1:
        try:
            left, right = int(value), int(requirement.values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _term_matches(term: NodeSelectorTerm, node: NodeView) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False  # an empty term matches nothing (scheduler semantics)
    fields = {"metadata.name": node.name}
    return (all(_requirement_matches(r, node.labels) for r in term.match_expressions)
            and all(_requirement_matches(r, fields) for r in term.match_fields))


def selector_mismatch(pod: PodView, node: NodeView) -> Optional[str]:
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return "node(s) didn't match Pod's node affinity/selector"
    if pod.required_node_affinity is not None and not any(_term_matches(t, node) for t in pod.required_node_affinity):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def untolerated_taint(pod: PodView, node: NodeView) -> Optional[Taint]:
    taints = list(node.taints)
    if node.unschedulable:
        taints.append(UNSCHEDULABLE_TAINT)
    for taint in taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(t.tolerates(taint) for t in pod.tolerations):
            return taint
    return None


@dataclass
class NodeUsage:
    """What the pods placed on a node request, summed (milli-units), and how many pods there are."""

    requested: dict[str, int] = field(default_factory=dict)
    pods: int = 0

    def add(self, pod: PodView) -> None:
        for name, value in pod.requests.items():
            self.requested[name] = self.requested.get(name, 0) + value
        self.pods += 1

    def copy(self) -> "NodeUsage":
        return NodeUsage(dict(self.requested), self.pods)


def insufficient_resources(pod: PodView, node: NodeView, usage: NodeUsage) -> list[str]:
    """The resources the pod asks for that the node no longer has (empty: it fits)."""
    missing = []
    if usage.pods + 1 > node.allocatable.get(PODS, 0) // 1000:
        missing.append("Too many pods")
    for name, value in sorted(pod.requests.items()):
        if value <= 0 or name == PODS:
            continue
        if value > node.allocatable.get(name, 0) - usage.requested.get(name, 0):
            missing.append(f"Insufficient {name}")
    return missing


def why_not(pod: PodView, node: NodeView, usage: NodeUsage) -> Optional[str]:
    """None when the pod fits the node now; otherwise the scheduler-style reason."""
    mismatch = selector_mismatch(pod, node)
    if mismatch:
        return mismatch
    taint = untolerated_taint(pod, node)
    if taint is not None:
        if taint is UNSCHEDULABLE_TAINT:
            return "node(s) were unschedulable"
        return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    missing = insufficient_resources(pod, node, usage)
    return ", ".join(missing) if missing else None


def fits(pod: PodView, node: NodeView, usage: Optional[NodeUsage] = None) -> bool:
    return why_not(pod, node, usage or NodeUsage()) is None


class Snapshot:
    """Nodes and what is placed on them, for "would these pods fit somewhere" questions (mutated as pods are placed)."""

    def __init__(self, nodes: Iterable[NodeView], pods: Iterable[PodView] = ()) -> None:
        self.nodes: dict[str, NodeView] = {}
        self.usage: dict[str, NodeUsage] = {}
        for node in nodes:
            self.add_node(node)
        for pod in pods:
            if pod.node_name in self.usage and not pod.terminal:
                self.usage[pod.node_name].add(pod)

    def add_node(self, node: NodeView, usage: Optional[NodeUsage] = None) -> None:
        self.nodes[node.name] = node
        self.usage[node.name] = usage or NodeUsage()

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.usage.pop(name, None)

    def place(self, pod: PodView, exclude: frozenset[str] = frozenset()) -> Optional[str]:
        """Put the pod on the first node (in name order) it fits; the node's name, or None."""
        for name in sorted(self.nodes):
            if name in exclude:
                continue
            if why_not(pod, self.nodes[name], self.usage[name]) is None:
                self.usage[name].add(pod)
                return name
        return None


def _pod_size(pod: PodView, template: NodeView) -> float:
    """The pod's share of a template node's cpu plus memory: the first-fit-decreasing sort key."""
    share = 0.0
    for resource in ("cpu", "memory"):
        allocatable = template.allocatable.get(resource, 0)
        if allocatable > 0:
            share += pod.requests.get(resource, 0) / allocatable
    return share


@dataclass(frozen=True)
class Estimate:
    node_count: int
    pods: tuple[PodView, ...]  # the pods the new nodes would take


def binpack(pods: Sequence[PodView], template: NodeView, max_nodes: int) -> Estimate:
    """How many new template nodes the pods need, first-fit decreasing, at most `max_nodes` nodes.

    Pods that do not fit even an empty template node are left out, as CA's estimator leaves them out of an option.
    """
    candidates = [p for p in pods if fits(p, template)]
    candidates.sort(key=lambda p: (-_pod_size(p, template), p.key))
    usages: list[NodeUsage] = []
    placed: list[PodView] = []
    for pod in candidates:
        for usage in usages:
            if why_not(pod, template, usage) is None:
                usage.add(pod)
                placed.append(pod)
                break
        else:
            if len(usages) < max_nodes:
                usage = NodeUsage()
                usage.add(pod)
                usages.append(usage)
                placed.append(pod)
    return Estimate(len(usages), tuple(placed))


def waste_score(template: NodeView, estimate: Estimate) -> float:
    """The least-waste expander's score: unused cpu fraction + unused memory fraction over the new nodes' capacity."""
    score = 0.0
    for resource in ("cpu", "memory"):
        available = template.capacity.get(resource, 0) * estimate.node_count
        requested = sum(p.requests.get(resource, 0) for p in estimate.pods)
        score += (available - requested) / available if available > 0 else 0.0
    return score


def utilization(node: NodeView, pods: Iterable[PodView], gpu_resource: str) -> float:
    """CA's scale-down utilization: for a GPU node the GPU share only, else the larger of cpu and memory shares."""
    requested: dict[str, int] = {}
    for pod in pods:
        for name, value in pod.requests.items():
            requested[name] = requested.get(name, 0) + value
    if gpu_resource:
        allocatable = node.allocatable.get(gpu_resource, 0)
        return requested.get(gpu_resource, 0) / allocatable if allocatable > 0 else 0.0
    shares = [requested.get(r, 0) / node.allocatable[r] for r in ("cpu", "memory") if node.allocatable.get(r, 0) > 0]
    return max(shares, default=0.0)
