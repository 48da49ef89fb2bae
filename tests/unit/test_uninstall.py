"""`dds uninstall` finds exactly DDS's marks on a Node (everything under dds.cdi.dev/, nothing else). Removing them
from a real apiserver: tests/integration/kube/test_uninstall.py."""

from __future__ import annotations

from kubernetes import client

from dds.cli import main
from dds.kube.uninstall import NodeFootprint, footprint_of


def test_the_footprint_is_ddss_finalizer_taints_labels_and_annotations_only() -> None:
    node = client.V1Node(
        metadata=client.V1ObjectMeta(name="w1", finalizers=["dds.cdi.dev/fabric-devices", "example.com/x"],
                                     labels={"dds.cdi.dev/node-group": "g", "nvidia.com/gpu.product": "A30"},
                                     annotations={"dds.cdi.dev/initial-gpus-attached": "true", "other": "1"}),
        spec=client.V1NodeSpec(taints=[client.V1Taint(key="dds.cdi.dev/removing", effect="NoSchedule"),
                                       client.V1Taint(key="dds.cdi.dev/removing", effect="NoExecute"),
                                       client.V1Taint(key="ToBeDeletedByClusterAutoscaler", effect="NoSchedule")]))
    found = footprint_of(node)
    assert found == NodeFootprint("w1", ("dds.cdi.dev/fabric-devices",), ("dds.cdi.dev/removing",),
                                  ("dds.cdi.dev/node-group",), ("dds.cdi.dev/initial-gpus-attached",))
    assert found.describe() == ("node w1: finalizer dds.cdi.dev/fabric-devices; taints dds.cdi.dev/removing; labels "
                                "dds.cdi.dev/node-group; annotations dds.cdi.dev/initial-gpus-attached")
    clean = client.V1Node(metadata=client.V1ObjectMeta(name="w2", labels={"team": "ml"}), spec=client.V1NodeSpec())
    assert footprint_of(clean).empty


def test_uninstall_needs_a_cluster(capsys) -> None:
    assert main(["uninstall"]) == 2
    assert capsys.readouterr().err.strip() == \
        "dds uninstall: no cluster given — to fix: pass --kubeconfig FILE or --in-cluster"
