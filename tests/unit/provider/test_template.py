"""The template node CA decodes: the group's shape with every GPU slot filled."""

from __future__ import annotations

import pytest

from dds.provider.gen.k8s import core_v1_pb2
from dds.scaling.requests import LiveNode
from dds.groups.labels import node_group_label_value
from dds.provider.template import template_node_bytes

from .conftest import make_group


def decode(group, index=0) -> core_v1_pb2.Node:
    return core_v1_pb2.Node.FromString(template_node_bytes(group, "nvidia.com/gpu.product", index))


def test_group_with_max_8_gpus_advertises_8_while_its_live_nodes_have_1(provider_factory):
    from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb

    group = make_group(max="8", max_gpus="8")
    provider = provider_factory([group], [LiveNode("gpu-1", "kwok://gpu-1", group.id, True,
                                                   {"nvidia.com/gpu.product": "A30"})])
    answer = provider.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group.id), timeout=5)
    node = core_v1_pb2.Node.FromString(answer.nodeBytes)
    assert node.status.capacity["nvidia.com/gpu"].string == "8"
    assert node.status.allocatable["nvidia.com/gpu"].string == "8"


def test_template_shape_labels_and_conditions():
    node = decode(make_group(taints="dedicated=gpu:NoSchedule", labels="tier=gpu"), index=3)
    assert node.metadata.name == "template-machineset-default-gpu-workers-3"
    labels = dict(node.metadata.labels)
    assert labels == {"tier": "gpu", "kubernetes.io/hostname": node.metadata.name, "kubernetes.io/os": "linux",
                      "kubernetes.io/arch": "amd64", "dds.cdi.dev/node-group": "MachineSet.default.gpu-workers",
                      "nvidia.com/gpu.product": "A30", "dds.cdi.dev/gpu-model": "A30",
                      "dds.cdi.dev/attached-gpu": "A30"}
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [("dedicated", "gpu", "NoSchedule")]
    capacity = {k: v.string for k, v in node.status.capacity.items()}
    assert capacity == {k: v.string for k, v in node.status.allocatable.items()}
    assert capacity == {"cpu": "16", "memory": str(64 * 2**30), "ephemeral-storage": str(100 * 2**30),
                        "pods": "110", "nvidia.com/gpu": "4"}
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [(c.status) for c in ready] == ["True"]


def test_group_without_gpus_has_no_gpu_label_or_resource():
    node = decode(make_group(max_gpus="0", gpu_count="0", models=""))
    assert "nvidia.com/gpu.product" not in node.metadata.labels
    assert "nvidia.com/gpu" not in node.status.allocatable


@pytest.mark.parametrize("group_id, expected", [
    ("MachineSet/default/gpu-workers", "MachineSet.default.gpu-workers"),
    ("MachineSet/ns/" + "x" * 80, None),
], ids=["short", "long-is-cut-with-a-hash"])
def test_node_group_label_value_is_a_valid_label_value(group_id, expected):
    value = node_group_label_value(group_id)
    assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum() and "/" not in value
    if expected:
        assert value == expected
