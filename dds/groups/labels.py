"""The labels and names of a group's nodes, shared by the template CA simulates with (dds/provider/template.py) and
the nodes that really join (the harness's kwok provider shapes its hosts so): the real node must match what CA
simulated."""

from __future__ import annotations

import hashlib
import re

from dds.model.groups import LABEL_ATTACHED_GPU, LABEL_GPU_MODEL, LABEL_NODE_GROUP, NodeGroupSpec

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
        if not group.gpu_api.dra:
            # A DRA group's template shows CA no GPU capacity (its GPUs are ResourceSlice devices): with the GPU label
            # CA would take it for a GPU node whose driver is not ready yet.
            labels[LABEL_ATTACHED_GPU] = model
    return labels
