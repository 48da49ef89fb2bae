"""The template node of a group, as cluster-autoscaler decodes it: a core/v1 Node in protobuf (no `k8s\\0` envelope).

The template advertises the node with every GPU slot filled (`NodeGroupSpec.template_allocatable()`), whatever the
live nodes have attached now: that is what lets CA's simulation place a pod asking for up to `max_gpus_per_node` GPUs
on "a new node of this group", and DDS then decides whether GPUs or a node really arrive.
"""

from __future__ import annotations

import hashlib
import re

from dds.model.groups import LABEL_ATTACHED_GPU, LABEL_GPU_MODEL, LABEL_NODE_GROUP, NodeGroupSpec
from dds.provider.gen.k8s import core_v1_pb2

LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
DEFAULT_ARCH = "amd64"
_MAX_LABEL_VALUE = 63
_MAX_NAME = 253


def _fit(text: str, limit: int) -> str:
    """Shorten to `limit` keeping it unique: a cut name ends with a hash of the whole."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return text[: limit - 9].rstrip("-.") + "-" + digest


def sanitize_name(group_id: str) -> str:
    """A group id as part of a DNS subdomain name (lowercase, [a-z0-9-.])."""
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", group_id.lower()).strip("-.")
    return re.sub(r"-{2,}", "-", cleaned) or "group"


def node_group_label_value(group_id: str) -> str:
    """The `dds.cdi.dev/node-group` label value of a group: label values allow no '/', so
    `MachineSet/default/gpu-workers` becomes `MachineSet.default.gpu-workers` (63 characters at most)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", group_id.replace("/", ".")).strip("-_.")
    return _fit(cleaned or "group", _MAX_LABEL_VALUE).strip("-_.")


def template_node_name(group: NodeGroupSpec, index: int) -> str:
    suffix = f"-{index}"
    return _fit(f"template-{sanitize_name(group.id)}", _MAX_NAME - len(suffix)) + suffix


def template_labels(group: NodeGroupSpec, name: str, gpu_label: str) -> dict[str, str]:
    labels = dict(group.labels)
    labels.setdefault(LABEL_OS, "linux")
    labels.setdefault(LABEL_ARCH, DEFAULT_ARCH)
    labels[LABEL_HOSTNAME] = name
    labels[LABEL_NODE_GROUP] = node_group_label_value(group.id)
    model = group.default_gpu_model
    if group.max_gpus_per_node > 0 and model:
        # Pods select a GPU model with `gpu_label`; CA's GPU logic keys on LABEL_ATTACHED_GPU, which a template (a node
        # with its GPUs) carries and a live node carries only while it has GPUs (dds/controller/gpu_label.py).
        labels[gpu_label] = model
        labels[LABEL_GPU_MODEL] = model
        labels[LABEL_ATTACHED_GPU] = model
    return labels


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
