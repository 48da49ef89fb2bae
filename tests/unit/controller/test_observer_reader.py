"""The observer (dds/controller/observe.py) driven through a fake `ClusterReader` port, no watch cache and no
apiserver: what it reads becomes the snapshot the planner sees — nodes linked to their MachineSet group through their
Machines, the nodes still on their way, the pods waiting — and without Cluster API no node is DDS's. The same observer
on a real apiserver, cached and listing: tests/integration/kube/test_cache_observer.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from dds.controller.idle import IdleTracker
from dds.controller.observe import ClusterObserver
from dds.fabric.base import FabricDevice, Operation, OperationKind, OperationState, PoolState
from dds.kube.decode import NodeRecord, PodRecord
from dds.model.dra_records import DraState
from dds.model.resources import Resources
from tests.unit.planner.builders import make_group, make_pod

GROUP = "MachineSet/default/workers"
GiB = 1024 ** 3


def machine(name: str, node: Optional[str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": {"cluster.x-k8s.io/set-name": "workers"},
                         "ownerReferences": [{"kind": "MachineSet", "name": "workers"}]},
            "spec": {"providerID": f"kwok://{node}" if node else ""},
            "status": {"nodeRef": {"name": node}} if node else {}}


def node_record(name: str) -> NodeRecord:
    return NodeRecord(name=name, provider_id=f"kwok://{name}", labels={}, taints=(), unschedulable=False, ready=True,
                      allocatable=Resources(milli_cpu=8000, memory=32 * GiB, pods=110), created_at=0.0,
                      marked_for_deletion=False)


@dataclass
class ClusterInMemory:
    """The ClusterReader port over objects held here; counts each read (every one would be a LIST)."""

    machines_: list[dict[str, Any]] = field(default_factory=list)
    machinesets_: list[dict[str, Any]] = field(default_factory=list)
    pods: list[PodRecord] = field(default_factory=list)
    nodes: list[NodeRecord] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)

    def machines(self) -> Sequence[Mapping[str, Any]]:
        self.reads.append("machines")
        return self.machines_

    def machinesets(self) -> Sequence[Mapping[str, Any]]:
        self.reads.append("machinesets")
        return self.machinesets_

    def pod_records(self) -> Sequence[PodRecord]:
        self.reads.append("pods")
        return self.pods

    def node_records(self) -> Sequence[NodeRecord]:
        self.reads.append("nodes")
        return self.nodes

    def dra(self) -> DraState:
        self.reads.append("dra")
        return DraState()


class OneGpuFabric:
    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        attached = (FabricDevice(id="w1-gpu-0", model="A30", pool="pool-a", node="w1", attached_at=1.0),)
        return tuple(d for d in attached if node is None or d.node == node)

    def operations(self) -> tuple[Operation, ...]:
        return ()

    def pools(self) -> tuple[PoolState, ...]:
        return (PoolState("pool-a", {"A30": 4}, {"A30": 3}),)


class AttachEndingAtTheFirstRead(OneGpuFabric):
    """w1 has one GPU online and an attach of one more under way, which ends while the observer reads the fabric:
    whichever of devices and operations it reads first shows the attach under way, the other shows it ended (what a
    service read twice per pass, as the Redfish backend's is, shows under load)."""

    def __init__(self) -> None:
        self.reads = 0

    def _ended(self) -> bool:
        self.reads += 1
        return self.reads > 1

    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        ids = ("w1-gpu-0", "w1-gpu-1") if self._ended() else ("w1-gpu-0",)
        return tuple(FabricDevice(id=i, model="A30", pool="pool-a", node="w1", attached_at=1.0) for i in ids)

    def operations(self) -> tuple[Operation, ...]:
        ended = self._ended()
        return (Operation(key="fast-path/1/0", kind=OperationKind.ATTACH, node="w1", requested=1, model="A30",
                          pool="pool-a", state=OperationState.SUCCEEDED if ended else OperationState.RUNNING,
                          devices=("w1-gpu-1",) if ended else (), started_at=96.0,
                          finished_at=99.0 if ended else None),)


def observer(cluster: ClusterInMemory, fabric: Optional[OneGpuFabric] = None) -> ClusterObserver:
    return ClusterObserver(cluster, fabric or OneGpuFabric(), lambda: (make_group(GROUP),),  # type: ignore[arg-type]
                           lambda: 100.0, IdleTracker(), "nvidia.com/gpu.product")


def test_what_the_reader_gives_becomes_the_snapshot() -> None:
    cluster = ClusterInMemory(
        machines_=[machine("workers-a", "w1"), machine("workers-b", None)],
        machinesets_=[{"metadata": {"name": "workers", "namespace": "default"}, "spec": {"replicas": 3}}],
        pods=[PodRecord(make_pod("train", gpus=1), terminal=False, unschedulable_since=50.0),
              PodRecord(make_pod("web", node="w1"), terminal=False, unschedulable_since=None),
              PodRecord(make_pod("done", node="w1"), terminal=True, unschedulable_since=None)],
        nodes=[node_record("w1"), node_record("elsewhere")])
    observation = observer(cluster).observe()
    snapshot = observation.snapshot
    by_name = {n.name: n for n in snapshot.nodes}
    assert by_name["w1"].group_id == GROUP and [d.id for d in by_name["w1"].devices] == ["w1-gpu-0"]
    assert by_name["elsewhere"].group_id is None
    # A Machine without its Node, and a replica without its Machine: both nodes on their way.
    assert snapshot.upcoming_nodes == {GROUP: 2}
    assert sorted(p.name for p in snapshot.pods) == ["train", "web"]  # a finished pod holds nothing
    assert observation.unschedulable_since == {"default/train": 50.0}
    assert [(m.name, m.node_name) for m in observation.machines] == [("workers-a", "w1"), ("workers-b", None)]
    assert sorted(cluster.reads) == ["dra", "machines", "machinesets", "nodes", "pods"]  # one read of each


def test_an_attach_ending_while_the_fabric_is_read_is_never_left_out_of_the_snapshot() -> None:
    # Left out, the node looked one GPU short and the pod the attach was for got a second GPU (the Redfish demo under
    # CI's load: two attaches for train-0 on one node, 4 s apart).
    cluster = ClusterInMemory(machines_=[machine("workers-a", "w1")], nodes=[node_record("w1")],
                              pods=[PodRecord(make_pod("train", gpus=1), terminal=False, unschedulable_since=50.0)])
    [w1] = observer(cluster, AttachEndingAtTheFirstRead()).observe().snapshot.nodes
    assert len(w1.devices) + w1.attaching >= 2, w1


def test_a_provisioning_requests_pods_that_ended_on_a_node_are_kept_for_its_booking() -> None:
    consumer = replace(make_pod("job-0", node="w1", gpus=1), consumes_provisioning_request="job")
    cluster = ClusterInMemory(machines_=[machine("workers-a", "w1")], nodes=[node_record("w1")],
                              pods=[PodRecord(consumer, terminal=True, unschedulable_since=None),
                                    PodRecord(make_pod("done", node="w1"), terminal=True, unschedulable_since=None)])
    snapshot = observer(cluster).observe().snapshot
    assert snapshot.pods == () and [p.name for p in snapshot.ended_consumers] == ["job-0"]


def test_without_cluster_api_no_node_is_dds_s() -> None:
    cluster = ClusterInMemory(nodes=[node_record("w1")])  # the reader answers no Machines and no MachineSets
    observation = observer(cluster).observe()
    assert [n.group_id for n in observation.snapshot.nodes] == [None]
    assert observation.machines == () and observation.replicas == {}


def test_a_machine_naming_a_nodes_provider_id_without_a_node_ref_does_not_put_the_node_in_its_group() -> None:
    # A Machine of the group whose spec.providerID (written by whoever creates a Machine) is another node's, and whose
    # status.nodeRef Cluster API has not set: the node stays outside the group (it was mapped by providerID before).
    copied = machine("workers-copy", None)
    copied["spec"]["providerID"] = "kwok://elsewhere"
    cluster = ClusterInMemory(machines_=[machine("workers-a", "w1"), copied], nodes=[node_record("w1"),
                                                                                      node_record("elsewhere")])
    by_name = {n.name: n for n in observer(cluster).observe().snapshot.nodes}
    assert by_name["w1"].group_id == GROUP
    assert by_name["elsewhere"].group_id is None
