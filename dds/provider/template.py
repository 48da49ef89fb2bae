"""The template node of a group, as cluster-autoscaler decodes it: a core/v1 Node in protobuf (no `k8s\\0` envelope).

The template advertises the node with every GPU slot filled (`NodeGroupSpec.template_allocatable()`), whatever the
live nodes have attached now: that is what lets CA's simulation place a pod asking for up to `max_gpus_per_node` GPUs
on "a new node of this group", and DDS then decides whether GPUs or a node really arrive.
"""

from __future__ import annotations

from dds.groups.labels import LABEL_ARCH, LABEL_OS, template_labels, template_node_name
from dds.model.groups import NodeGroupSpec
from dds.provider.gen.k8s import core_v1_pb2

def build_template_node(group: NodeGroupSpec, gpu_label: str, index: int = 0) -> core_v1_pb2.Node:
    node = core_v1_pb2.Node()
    name = template_node_name(group, index)
    node.metadata.name = name
    node.metadata.labels.update(template_labels(group, name, gpu_label))
    node.spec.SetInParent()
    for taint in group.taints:
        node.spec.taints.add(key=taint.key, value=taint.value, effect=taint.effect)
    for resource, quantity in group.template_allocatable().to_kubernetes().items():
        node.status.capacity[resource].string = quantity
        node.status.allocatable[resource].string = quantity
    node.status.phase = "Running"
    node.status.conditions.add(type="Ready", status="True", reason="KubeletReady",
                               message="template node of a DDS node group")
    for pressure in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"):
        node.status.conditions.add(type=pressure, status="False")
    node.status.nodeInfo.operatingSystem = node.metadata.labels[LABEL_OS]
    node.status.nodeInfo.architecture = node.metadata.labels[LABEL_ARCH]
    return node


def template_node_bytes(group: NodeGroupSpec, gpu_label: str, index: int = 0) -> bytes:
    """The template Node, protobuf-encoded; never empty (CA dereferences a nil template and panics)."""
    encoded = build_template_node(group, gpu_label, index).SerializeToString(deterministic=True)
    if not encoded:
        raise RuntimeError(f"template node of {group.id} encoded to zero bytes")
    return encoded
