"""The per-pass gauges of GPUs on nodes: `dds_node_gpus` and `dds_gpus_idle_past_cooldown` (dds/metrics.py).

Both are read off what a control loop pass already has — its snapshot and its scale-down plan — so they cost no
apiserver or fabric call and say exactly what the pass decided on:

- `dds_node_gpus{node,group,model}`: the fabric devices attached to each node (those being detached included: they
  are still on the node). Every node of a DDS group has a series, 0 before its first GPU (model: the group's default
  GPU model); a node outside any group only while it holds devices. A (node, model) series stays, at 0, while its
  node lives, so a panel shows a GPU going rather than a line ending; all of a node's series go when the node does.
- `dds_gpus_idle_past_cooldown{group}`: the plan's `idle_past_cooldown`, summed per group, for every group served (0
  when none), a group's series gone with the group. A healthy loop detaches those GPUs in the same pass, so the value
  falls back to 0 at the next pass; one that stays up means DDS decided to release GPUs and did not.

One instance per controller: it removes only the series it set.
"""

from __future__ import annotations

from typing import Mapping, MutableMapping

from prometheus_client import Gauge

from dds import metrics
from dds.model.plan import ScaleDownPlan
from dds.model.snapshot import Snapshot

Labels = tuple[str, ...]  # a series' label values: (node, group ("" for none), model), or (group,)


class GpuGauges:
    def __init__(self) -> None:
        self._nodes: dict[Labels, int] = {}
        self._groups: dict[Labels, int] = {}

    def record(self, snapshot: Snapshot, scale_down: ScaleDownPlan) -> None:
        self._set(metrics.NODE_GPUS, self._nodes, node_gpus(snapshot, self._nodes))
        idle = idle_past_cooldown(snapshot, scale_down)
        self._set(metrics.GPUS_IDLE_PAST_COOLDOWN, self._groups, {(group,): count for group, count in idle.items()})

    @staticmethod
    def _set(gauge: Gauge, reported: MutableMapping[Labels, int], values: Mapping[Labels, int]) -> None:
        """Set what changed, remove what is no longer there: a pass at thousands of nodes touches only the few
        series that moved."""
        for labels in [labels for labels in reported if labels not in values]:
            gauge.remove(*labels)
            del reported[labels]
        for labels, value in values.items():
            if reported.get(labels) != value:
                gauge.labels(*labels).set(value)
                reported[labels] = value


def node_gpus(snapshot: Snapshot, reported: Mapping[Labels, int]) -> dict[Labels, int]:
    """Attached fabric GPUs per (node, group, model); `reported`: the series set before, kept at 0 while their node
    lives in the same group. One walk over the nodes, with nothing but dict work per node: it runs every pass."""
    default_model = {group.id: group.default_gpu_model or "" for group in snapshot.groups}
    values: dict[Labels, int] = {}
    live: dict[str, str] = {}  # node -> its group label
    for node in snapshot.nodes:
        if not node.devices:
            if node.group_id is None:
                continue  # not a DDS node and no GPU of the fabric: nothing DDS does there
            live[node.name] = node.group_id
            values[(node.name, node.group_id, default_model.get(node.group_id, ""))] = 0
            continue
        group_id = node.group_id or ""
        live[node.name] = group_id
        for device in node.devices:
            series = (node.name, group_id, device.model)
            values[series] = values.get(series, 0) + 1
    for series in reported:
        if series not in values and live.get(series[0]) == series[1]:
            values[series] = 0
    return values


def idle_past_cooldown(snapshot: Snapshot, scale_down: ScaleDownPlan) -> dict[str, int]:
    """Per group served: the idle GPUs the plan releases for being idle past the cooldown (warm headroom and reserved
    nodes already left out by the plan)."""
    values = {group.id: 0 for group in snapshot.groups}
    for idle in scale_down.idle_past_cooldown:
        values[idle.group] = values.get(idle.group, 0) + idle.count
    return values
