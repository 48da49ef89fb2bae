"""The Cluster API node backend (as DDS's ServiceAccount) against Cluster API's own manager and the kwok infrastructure
provider on the real apiserver: MachineSet replicas become Machines and Ready kwok Nodes shaped like the group's
template; a removal takes exactly the node asked for; requests are idempotent by key; failures are typed and leave
nothing half-done."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dds.kube.capi import NODE_ANN_MACHINE
from dds.model.groups import ANN_CAPI_DELETE_MACHINE, LABEL_GPU_MODEL, LABEL_NODE_GROUP
from dds.model.quantity import to_int, to_milli
from dds.nodes.base import MachinePhase
from dds.nodes.errors import MachineSetNotFound, NodeNotInGroup, ScaleRefused
from dds.nodes.machineset import ANN_SCALE_REQUESTS, read_history
from tests.integration.nodes.harness import GPU_LABEL, GROUP, NodeGroupHarness, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def h(control_plane: Any, namespace: str, dds_api: Any) -> Iterator[NodeGroupHarness]:
    """Hosts come up at once unless a test's MachineSet says otherwise."""
    harness = NodeGroupHarness(control_plane, namespace, dds_api=dds_api)
    yield harness
    harness.close()


def gone(h: NodeGroupHarness, node: str) -> bool:
    """The node's Node and Machine are both gone (Cluster API deletes the Machine, the host, then the Node)."""
    return node not in h.nodes() and node not in {((m.get("status") or {}).get("nodeRef") or {}).get("name")
                                                   for m in h.machines()}


def created(obj: dict[str, Any]) -> str:
    return obj["metadata"]["creationTimestamp"]


def test_scale_up_turns_replicas_into_ready_kwok_nodes_shaped_like_the_group(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers", taints="dedicated=gpu:NoSchedule")

    h.provisioner.add_nodes(group, 2, key="scale-up-1")

    assert h.replicas("gpu-workers") == 2
    nodes = h.wait_ready_nodes(2)
    for name, node in nodes.items():
        labels = node.metadata.labels
        assert labels["kubernetes.io/hostname"] == name
        assert labels[LABEL_NODE_GROUP] == f"MachineSet.{h.namespace}.gpu-workers"
        assert labels[GPU_LABEL] == labels[LABEL_GPU_MODEL] == "A30"
        assert labels["node.kubernetes.io/instance-type"] == "cdi-16c64g"
        assert node.spec.provider_id == f"kwok://{name}"
        assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert node.metadata.annotations[NODE_ANN_MACHINE].startswith("gpu-workers-")
        assert node.metadata.annotations["cluster.x-k8s.io/owner-name"] == "gpu-workers"
        assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [("dedicated", "gpu", "NoSchedule")]
        for resources in (node.status.capacity, node.status.allocatable):
            assert to_milli(resources["cpu"]) == 16000
            assert to_int(resources["memory"]) == 64 * 2**30
            assert resources["pods"] == "110"
            assert resources["nvidia.com/gpu"] == "0"  # GPUs come from the fabric
    machines = wait_for("both Machines running", lambda: (
        ms if len(ms := h.provisioner.machines(group)) == 2 and all(m.phase == MachinePhase.RUNNING for m in ms)
        else None))
    assert {m.node_name for m in machines} == set(nodes)
    assert {m.provider_id for m in machines} == {f"kwok://{name}" for name in nodes}
    assert {m.name for m in machines} == {n.metadata.annotations[NODE_ANN_MACHINE] for n in nodes.values()}
    for raw in h.machines():
        assert raw["metadata"]["ownerReferences"][0]["kind"] == "MachineSet"
        assert raw["metadata"]["labels"]["cluster.x-k8s.io/set-name"] == "gpu-workers"
    status = wait_for("MachineSet status with 2 ready replicas",
                      lambda: (s if (s := h.machineset("gpu-workers").get("status") or {}).get("readyReplicas") == 2
                               else None))
    assert status["replicas"] == 2
    assert len(h.machines()) == 2 and len(h.nodes()) == 2  # converged: nothing more made


def test_a_machine_whose_host_is_still_coming_up_is_provisioning_without_a_node(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers", provisioning_delay_seconds=5.0)
    h.provisioner.add_nodes(group, 1, key="scale-up-1")

    [machine] = wait_for("Cluster API's Machine", lambda: h.provisioner.machines(group))
    assert machine.phase == MachinePhase.PROVISIONING and machine.node_name is None
    assert h.nodes() == {}

    [node] = h.wait_ready_nodes(1)
    [machine] = wait_for("the Machine running", lambda: [m for m in h.provisioner.machines(group)
                                                         if m.phase == MachinePhase.RUNNING])
    assert machine.node_name == node
    wait_for("1 ready replica", lambda: (h.machineset("gpu-workers").get("status") or {}).get("readyReplicas") == 1)


def test_add_nodes_is_idempotent_by_key(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers")

    h.provisioner.add_nodes(group, 1, key="ca-increase-1")
    h.provisioner.add_nodes(group, 1, key="ca-increase-1")  # CA's retry
    assert h.replicas("gpu-workers") == 1
    h.provisioner.add_nodes(group, 2, key="ca-increase-2")
    assert h.replicas("gpu-workers") == 3

    history = read_history(h.machineset("gpu-workers")["metadata"]["annotations"])
    assert [(e.key, e.count, e.replicas) for e in history] == [("ca-increase-1", 1, 1), ("ca-increase-2", 2, 3)]


def test_concurrent_requests_all_apply_once(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers", max_size=6)
    errors: list[BaseException] = []

    def add(key: str) -> None:
        try:
            h.provisioner.add_nodes(group, 1, key=key)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(f"request-{i % 3}-{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert h.replicas("gpu-workers") == 6  # every conflict was re-read and retried, none lost or doubled


def test_scaling_beyond_the_maximum_is_refused_and_changes_nothing(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers", replicas=1, max_size=2)
    with pytest.raises(ScaleRefused, match="gpu-workers.*1 \\+ 2 exceeds the maximum size 2"):
        h.provisioner.add_nodes(group, 2, key="too-many")
    assert h.replicas("gpu-workers") == 1
    assert ANN_SCALE_REQUESTS not in h.machineset("gpu-workers")["metadata"].get("annotations", {})


def test_remove_node_removes_exactly_that_node(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers")
    h.provisioner.add_nodes(group, 3, key="scale-up-1")
    nodes = h.wait_ready_nodes(3)
    # The node of the Machine whose name sorts last: the one Cluster API's default deletion order ("Random", by name)
    # would never pick on its own.
    machine = max(h.machines(), key=lambda m: m["metadata"]["name"])
    victim = machine["status"]["nodeRef"]["name"]
    assert victim in nodes

    h.provisioner.remove_node(group, victim, key="scale-down-1")

    assert h.replicas("gpu-workers") == 2
    wait_for(f"node {victim} and its Machine gone", lambda: gone(h, victim))
    assert set(h.wait_ready_nodes(2)) == set(nodes) - {victim}
    h.provisioner.remove_node(group, victim, key="scale-down-1")  # a retry of the same request: nothing more
    assert h.replicas("gpu-workers") == 2
    assert set(h.nodes()) == set(nodes) - {victim}


def test_a_second_removal_of_the_same_node_does_not_take_another(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers")
    h.provisioner.add_nodes(group, 2, key="scale-up-1")
    nodes = h.wait_ready_nodes(2)
    victim = sorted(nodes)[0]

    h.provisioner.remove_node(group, victim, key="ca-delete-1")
    h.provisioner.remove_node(group, victim, key="dds-scale-down-7")  # another owner's request for the same node
    assert h.replicas("gpu-workers") == 1
    wait_for(f"node {victim} gone", lambda: gone(h, victim))
    assert set(h.wait_ready_nodes(1)) == set(nodes) - {victim}


def test_remove_refuses_a_node_that_is_not_in_the_group(h: NodeGroupHarness) -> None:
    group_a = h.create_machineset("pool-a")
    group_b = h.create_machineset("pool-b")
    h.provisioner.add_nodes(group_a, 1, key="a-1")
    h.provisioner.add_nodes(group_b, 1, key="b-1")
    nodes = h.wait_ready_nodes(2)
    node_b = next(name for name in nodes if name.startswith("pool-b-"))

    with pytest.raises(NodeNotInGroup, match=f"pool-a.*{node_b}.*nothing changed"):
        h.provisioner.remove_node(group_a, node_b, key="wrong-group")
    with pytest.raises(NodeNotInGroup, match="no-such-node"):
        h.provisioner.remove_node(group_a, "no-such-node", key="unknown-node")

    assert (h.replicas("pool-a"), h.replicas("pool-b")) == (1, 1)
    assert set(h.wait_ready_nodes(2)) == set(nodes)
    assert not any(ANN_CAPI_DELETE_MACHINE in (m["metadata"].get("annotations") or {}) for m in h.machines())


def test_an_interrupted_removal_is_completed_by_its_retry(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers")
    h.provisioner.add_nodes(group, 2, key="scale-up-1")
    nodes = h.wait_ready_nodes(2)
    machine = min(h.machines(), key=created)
    name, victim = machine["metadata"]["name"], machine["status"]["nodeRef"]["name"]
    # The first write of a removal landed (the Machine is marked), the second did not (DDS died in between).
    h.objects.patch_namespaced_custom_object(GROUP, "v1beta2", h.namespace, "machines", name,
                                             {"metadata": {"annotations": {ANN_CAPI_DELETE_MACHINE: "dds"}}})
    assert h.replicas("gpu-workers") == 2
    assert set(h.wait_ready_nodes(2)) == set(nodes), "a marked Machine alone is not removed"

    h.provisioner.remove_node(group, victim, key="scale-down-1")
    h.provisioner.remove_node(group, victim, key="scale-down-1")

    assert h.replicas("gpu-workers") == 1
    wait_for(f"node {victim} and Machine {name} gone", lambda: gone(h, victim) and
             name not in {m["metadata"]["name"] for m in h.machines()})
    assert set(h.wait_ready_nodes(1)) == set(nodes) - {victim}


def test_a_deleted_machineset_is_a_clear_error_and_its_machines_and_nodes_go(h: NodeGroupHarness) -> None:
    group = h.create_machineset("gpu-workers")
    h.provisioner.add_nodes(group, 1, key="scale-up-1")
    [node] = h.wait_ready_nodes(1)
    h.objects.delete_namespaced_custom_object(GROUP, "v1beta2", h.namespace, "machinesets", "gpu-workers")

    # Cluster API holds the MachineSet (its finalizer) while it deletes the Machines: being deleted or gone, DDS adds
    # nothing to it.
    with pytest.raises(MachineSetNotFound, match=f"MachineSet/{h.namespace}/gpu-workers.*(being deleted|404)"):
        h.provisioner.add_nodes(group, 1, key="scale-up-2")
    # Cluster API deletes a deleted MachineSet's Machines, their hosts and their Nodes.
    wait_for("the MachineSet's Machine and Node gone", lambda: not h.machines() and not h.nodes())
