"""The GPU label keeper (dds/controller/gpu_label.py) driven through a fake `NodeLabelSetter` port, labels kept in
memory: what it writes for each node of a snapshot, the label a detach of a node's last GPU removes first, and a
refused write that neither raises nor blocks the others. The same keeper on a real apiserver:
tests/integration/nodes/test_gpu_label_writer.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dds.fabric.base import FabricDevice
from dds.kube.nodes import NodeNotFound, NodeUpdateFailed
from dds.controller.gpu_label import GpuLabelKeeper
from dds.model.groups import LABEL_ATTACHED_GPU
from dds.model.plan import Detach
from tests.unit.planner.builders import make_node, make_snapshot


@dataclass
class LabelsInMemory:
    """Each node's labels as the apiserver would keep them; `missing` nodes do not exist, `refusing` ones refuse."""

    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    writes: list[tuple[str, Optional[str]]] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)
    refusing: set[str] = field(default_factory=set)

    def set_label(self, node: str, key: str, value: Optional[str]) -> None:
        if node in self.missing:
            raise NodeNotFound(f"node {node}: the Node does not exist")
        if node in self.refusing:
            raise NodeUpdateFailed(f"node {node}: 503 Service Unavailable")
        self.writes.append((node, value))
        on_node = self.labels.setdefault(node, {})
        if value is None:
            on_node.pop(key, None)
        else:
            on_node[key] = value


@dataclass
class FabricOf:
    """The devices attached to each node: all the keeper asks of the fabric."""

    attached: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        return tuple(FabricDevice(id=d, model="A30", pool="pool-a", node=node)
                     for d in self.attached.get(node or "", ()))


def test_each_dds_node_gets_the_label_its_gpus_call_for() -> None:
    labels = LabelsInMemory()
    keeper = GpuLabelKeeper(labels, FabricOf())  # type: ignore[arg-type]
    keeper.reconcile(make_snapshot([make_node("with-gpu", gpus=1),
                                    make_node("emptied", gpus=0, labels={LABEL_ATTACHED_GPU: "A30"}),
                                    make_node("right-already", gpus=2, labels={LABEL_ATTACHED_GPU: "A30"}),
                                    make_node("not-dds", gpus=0, group=None, labels={LABEL_ATTACHED_GPU: "A30"})]))
    assert sorted(labels.writes, key=lambda w: w[0]) == [("emptied", None), ("with-gpu", "A30")]


def test_a_detach_of_the_last_gpu_removes_the_label_and_an_older_snapshot_does_not_bring_it_back() -> None:
    labels = LabelsInMemory()
    keeper = GpuLabelKeeper(labels, FabricOf({"w1": ("w1-gpu-0",)}))  # type: ignore[arg-type]
    before = keeper.mark()
    keeper.before_detach(Detach(node="w1", device_ids=("w1-gpu-0",), reason="idle"))
    assert labels.writes == [("w1", None)]
    keeper.reconcile(make_snapshot([make_node("w1", gpus=1)]), since=before)  # taken before the detach
    assert labels.writes == [("w1", None)]
    keeper.reconcile(make_snapshot([make_node("w1", gpus=1)]), since=keeper.mark())  # one that shows it: judged
    assert labels.writes == [("w1", None), ("w1", "A30")]


def test_a_detach_that_leaves_a_gpu_keeps_the_label() -> None:
    labels = LabelsInMemory()
    keeper = GpuLabelKeeper(labels, FabricOf({"w1": ("w1-gpu-0", "w1-gpu-1")}))  # type: ignore[arg-type]
    keeper.before_detach(Detach(node="w1", device_ids=("w1-gpu-0",), reason="idle"))
    assert labels.writes == []


def test_a_missing_or_refusing_node_is_skipped_and_the_others_are_written() -> None:
    labels = LabelsInMemory(missing={"gone"}, refusing={"busy"})
    keeper = GpuLabelKeeper(labels, FabricOf())  # type: ignore[arg-type]
    keeper.reconcile(make_snapshot([make_node("gone", gpus=1), make_node("busy", gpus=1),
                                    make_node("fine", gpus=1)]))
    assert labels.writes == [("fine", "A30")]
