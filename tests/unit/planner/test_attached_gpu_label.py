"""CA's GPU label on a DDS node is present exactly while the node has a GPU it can use (docs/gpu-label.md)."""

from __future__ import annotations

from dds.model.resources import Resources
from dds.planner.labels import attached_gpu_label
from dds.model.snapshot import Device, NodeInfo

LABEL = "nvidia.com/gpu.product"


def node(gpus_visible: int, devices: int = 0, detaching: int = 0, attaching: int = 0) -> NodeInfo:
    fabric = tuple(Device(f"A30-{i}", "A30", "default") for i in range(devices))
    return NodeInfo(name="w", group_id="g", labels={LABEL: "A30"},
                    allocatable=Resources.parse({"cpu": "16", "nvidia.com/gpu": gpus_visible}),
                    devices=fabric, detaching=tuple(d.id for d in fabric[:detaching]), attaching=attaching)


def test_a_node_with_usable_gpus_carries_its_model():
    assert attached_gpu_label(node(gpus_visible=2, devices=2), None, LABEL) == "A30"


def test_a_node_at_zero_gpus_carries_no_label_even_while_gpus_are_on_their_way():
    # CA would count a labelled node with 0 GPUs as unready (and fail scale-ups over it): the label waits for the GPU.
    assert attached_gpu_label(node(gpus_visible=0), None, LABEL) is None
    assert attached_gpu_label(node(gpus_visible=0, attaching=1), None, LABEL) is None


def test_the_label_goes_when_every_gpu_is_being_detached():
    assert attached_gpu_label(node(gpus_visible=2, devices=2, detaching=2), None, LABEL) is None
    assert attached_gpu_label(node(gpus_visible=2, devices=2, detaching=1), None, LABEL) == "A30"


def test_gpus_the_fabric_did_not_attach_still_count():
    # A node that shows GPUs of its own (no fabric devices) is a GPU node for CA.
    assert attached_gpu_label(node(gpus_visible=1), None, LABEL) == "A30"
