"""Which GPU label a node should carry for cluster-autoscaler: the pure decision behind `LABEL_ATTACHED_GPU`.

CA reads its GPULabel to tell GPU nodes apart. A node carrying it with no allocatable GPU looks to CA like a GPU node
whose driver is still starting: CA counts it unready and, when the node maps to no autoscaled group (spec-fixed groups
answer NodeGroupForNode with ""), fails every scale-up of the cluster. So the label is present exactly while the node
has GPUs it can use and keeps at least one of them: gone before the last GPU is detached, back once an attached GPU is
allocatable.
"""

from __future__ import annotations

from typing import Optional

from dds.model.groups import NodeGroupSpec
from dds.planner.nodes import node_model
from dds.model.snapshot import NodeInfo


def attached_gpu_label(node: NodeInfo, group: Optional[NodeGroupSpec], model_label: str) -> Optional[str]:
    """The label's value (the GPU model) the node should carry now, or None for no label."""
    visible = node.allocatable.get(node.gpu_resource)
    if visible <= 0:
        return None
    if node.devices and len(node.detaching) >= len(node.devices):
        return None  # every fabric GPU it has is on its way out
    return node_model(node, group, model_label, visible) or (group.default_gpu_model if group else None) or "gpu"

