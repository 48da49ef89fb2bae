"""The node side's bookkeeping (harness/gpu_node_agent.py) without an apiserver: which minor a GPU gets on its node,
and which GPU a pod asking for nvidia.com/gpu holds (the answer to the CDI operator's in-use check)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness.fabric_manager import Device
from harness.gpu_node_agent import NVIDIA_SMI, STATE_ENV, GpuNodeAgent, NodeGpu, NodeTimings, _NodeRecord


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


def test_a_node_shows_no_gpu_until_its_driver_comes_after_the_first_one() -> None:
    slow = SimpleNamespace(timings=NodeTimings(driver_delay_s=3600.0))
    node = record()
    assert not GpuNodeAgent._driver_ready(slow, node, [])  # type: ignore[arg-type]
    assert node.first_gpu_at is None  # the clock starts with the first GPU, not with the node
    assert not GpuNodeAgent._driver_ready(slow, node, [device("GPU-1")])  # type: ignore[arg-type]
    assert node.first_gpu_at is not None
    node.first_gpu_at -= 3600.0
    assert GpuNodeAgent._driver_ready(slow, node, [])  # type: ignore[arg-type]  # and stays up without a GPU


def test_without_a_delay_the_driver_is_there_at_once() -> None:
    instant = SimpleNamespace(timings=NodeTimings())
    assert GpuNodeAgent._driver_ready(instant, record(), [])  # type: ignore[arg-type]


def _state_with_one_gpu(tmp_path: Path, **drain: Any) -> Path:
    state = tmp_path / "node.json"
    state.write_text(json.dumps({"gpus": [{"uuid": "GPU-1", "index": 0, "product_name": "NVIDIA A30",
                                           "pci_bus_id": "00000000:41:00.0", "minor": 0, "memory_mib": 24576}],
                                 "processes": [], **drain}))
    return state


def test_nvidia_smi_drain_fails_with_the_message_the_node_agent_sets(tmp_path: Path) -> None:
    state = _state_with_one_gpu(tmp_path, drain_failure="the GPU is in use by the display server")
    run = subprocess.run([sys.executable, str(NVIDIA_SMI), "drain", "-p", "00000000:41:00.0", "-m", "1"],
                         env={**os.environ, STATE_ENV: str(state)}, capture_output=True, text=True, check=False)
    assert run.returncode == 255 and "the GPU is in use by the display server" in run.stderr
    query = subprocess.run([sys.executable, str(NVIDIA_SMI), "drain", "-p", "00000000:41:00.0", "-q"],
                           env={**os.environ, STATE_ENV: str(state)}, capture_output=True, text=True, check=False)
    assert query.returncode == 0  # a query still answers


def test_nvidia_smi_drain_succeeds_without_a_failure_set(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(NVIDIA_SMI), "drain", "-p", "00000000:41:00.0", "-r"],
                         env={**os.environ, STATE_ENV: str(_state_with_one_gpu(tmp_path))}, capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0 and "Successfully removed GPU" in run.stdout
