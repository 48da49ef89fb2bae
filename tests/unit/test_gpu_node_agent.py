"""The node side's bookkeeping (harness/gpu_node_agent.py) without an apiserver: which minor a GPU gets on its node,
and which GPU a pod asking for nvidia.com/gpu holds (the answer to the CDI operator's in-use check)."""

from __future__ import annotations

import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness.fabric_manager import Device
from harness.gpu_node_agent import GpuNodeAgent, NodeGpu, _NodeRecord


def device(serial: str, model: str = "A100") -> Device:
    return Device(res_uuid=f"res-{serial}", model=model, serial=serial, index=0)


def pod(uid: str, gpus: int, minute: int) -> Any:
    resources = SimpleNamespace(limits={"nvidia.com/gpu": str(gpus)} if gpus else {}, requests={})
    created = datetime.datetime(2026, 1, 1, 0, minute, tzinfo=datetime.timezone.utc)
    return SimpleNamespace(metadata=SimpleNamespace(uid=uid, name=uid, namespace="ns", creation_timestamp=created),
                           spec=SimpleNamespace(containers=[SimpleNamespace(resources=resources)]))


def record() -> _NodeRecord:
    return _NodeRecord("node-1", "machine-1", Path("/nonexistent/node-1.json"))


def test_a_gpu_keeps_its_minor_while_attached_and_a_new_one_takes_the_lowest_free() -> None:
    node = record()
    assert [g.minor for g in GpuNodeAgent._node_gpus(node, [device("a"), device("b"), device("c")])] == [0, 1, 2]
    gpus = GpuNodeAgent._node_gpus(node, [device("a"), device("c")])
    assert [(g.serial, g.minor) for g in gpus] == [("a", 0), ("c", 2)]
    gpus = GpuNodeAgent._node_gpus(node, [device("a"), device("c"), device("d")])
    assert [(g.serial, g.minor) for g in gpus] == [("a", 0), ("d", 1), ("c", 2)]


def test_each_gpu_pod_holds_gpus_nobody_else_holds_until_it_ends() -> None:
    node = record()
    gpus = [NodeGpu("a", "A100", 0), NodeGpu("b", "A100", 1), NodeGpu("c", "A100", 2)]
    first, second, cpu_only = pod("p1", 2, 1), pod("p2", 1, 2), pod("p3", 0, 3)
    users = GpuNodeAgent._device_plugin_users(node, [first, second, cpu_only], gpus)
    assert [(p.metadata.uid, serial) for p, serial in users] == [("p1", "a"), ("p1", "b"), ("p2", "c")]
    # p1 ended: its GPUs are free; p2 keeps the one it had
    users = GpuNodeAgent._device_plugin_users(node, [second], gpus)
    assert [(p.metadata.uid, serial) for p, serial in users] == [("p2", "c")]


def test_a_gpu_that_left_the_node_is_no_longer_held() -> None:
    node = record()
    only = pod("p1", 1, 1)
    GpuNodeAgent._device_plugin_users(node, [only], [NodeGpu("a", "A100", 0)])
    # the device plugin allocates when a pod starts: a running pod is not handed the GPU that came next
    assert GpuNodeAgent._device_plugin_users(node, [only], [NodeGpu("b", "A100", 1)]) == []


def test_slice_device_in_the_nvidia_drivers_shape() -> None:
    entry = NodeGpu("GPU-1234", "A100", 3).as_slice_device()
    assert entry["name"] == "gpu-3"
    assert entry["attributes"]["uuid"] == {"string": "GPU-1234"}
    assert entry["attributes"]["type"] == {"string": "gpu"}
    assert entry["attributes"]["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert entry["capacity"] == {"memory": {"value": "81920Mi"}}
