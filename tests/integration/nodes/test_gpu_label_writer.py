"""cluster-autoscaler's GPU label written by the controller's label thread, on a real apiserver: each offered snapshot
is written, a newer one replaces one not yet written, and a detach that takes a node's last GPU removes the label
before the thread could re-add it from an older snapshot."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, Optional

import pytest
from kubernetes import client

from dds.config import SimulatedFabricSettings
from dds.controller.gpu_label import GpuLabelKeeper
from dds.fabric.simulated import SimulatedFabric
from dds.kube.nodes import KubeNodeWriter
from dds.model.groups import LABEL_ATTACHED_GPU
from dds.model.plan import Detach
from tests.integration.nodes.harness import wait_for
from tests.unit.planner.builders import make_node, make_snapshot

pytestmark = pytest.mark.integration


@pytest.fixture
def node(control_plane: Any) -> Iterator[tuple[client.CoreV1Api, str]]:
    core = client.CoreV1Api(control_plane.api_client())
    name = f"label-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": name}})
    yield core, name
    core.delete_node(name)


@pytest.fixture
def keeper(dds_api: Any) -> Iterator[GpuLabelKeeper]:
    keeper = GpuLabelKeeper(KubeNodeWriter(dds_api), SimulatedFabric(SimulatedFabricSettings(), clock=time.monotonic))
    keeper.start()
    yield keeper
    keeper.stop()


def label(core: client.CoreV1Api, name: str) -> Optional[str]:
    return (core.read_node(name).metadata.labels or {}).get(LABEL_ATTACHED_GPU)


def test_the_label_thread_writes_what_each_offered_snapshot_says(node: tuple[client.CoreV1Api, str],
                                                                  keeper: GpuLabelKeeper) -> None:
    core, name = node
    keeper.offer(make_snapshot([make_node(name, gpus=1)]), since=keeper.mark())
    wait_for("the label set by the thread", lambda: label(core, name) == "A30", timeout=10)
    keeper.offer(make_snapshot([make_node(name, gpus=0, labels={LABEL_ATTACHED_GPU: "A30"})]), since=keeper.mark())
    wait_for("the label removed by the thread", lambda: label(core, name) is None, timeout=10)


def test_a_snapshot_older_than_a_detach_of_the_last_gpu_does_not_bring_the_label_back(
        node: tuple[client.CoreV1Api, str], keeper: GpuLabelKeeper) -> None:
    core, name = node
    keeper.offer(make_snapshot([make_node(name, gpus=1)]), since=keeper.mark())
    wait_for("the label set", lambda: label(core, name) == "A30", timeout=10)
    before_detach = keeper.mark()
    keeper.before_detach(Detach(name, (f"{name}-gpu-0",), reason="idle"))  # the fabric shows no other GPU there
    assert label(core, name) is None
    # Taken before the detach, when the GPU had just become allocatable and the label was not written yet.
    keeper.offer(make_snapshot([make_node(name, gpus=1)]), since=before_detach)
    keeper.offer(make_snapshot([make_node(name, gpus=0)]), since=keeper.mark())
    wait_for("the newest snapshot written", lambda: keeper.idle(), timeout=10)
    assert label(core, name) is None
