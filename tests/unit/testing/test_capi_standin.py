"""harness/capi_standin.py, the integration tests' stand-in for Cluster API's MachineSet controller and a kwok provider:
names, the Node it makes, the Machine it makes, which Machines a scale-down removes, the MachineSet status it reports,
and a pass that fails before it changes anything."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dds.model.groups import LABEL_GPU_MODEL, LABEL_NODE_GROUP, Taint
from dds.nodes.errors import NodeBackendUnavailable
from harness.kwok_provider import node_capacity
from harness.capi_standin import (ANN_KWOK_NODE, ANN_REQUESTED_AT, KwokInfrastructure, build_machine, build_node,
                                  choose_for_deletion, machine_name, machineset_status, node_labels,
                                  requested_at)
from tests.unit.nodes.builders import make_group, make_machine, make_machineset
from tests.unit.nodes.test_unreachable_apiserver import dead_api  # noqa: F401 (a fixture)

GPU_LABEL = "nvidia.com/gpu.product"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def test_machine_names_are_deterministic_and_distinct() -> None:
    first = machine_name("gpu-workers", "uid-1", 3, 0)
    assert first == machine_name("gpu-workers", "uid-1", 3, 0)
    assert first.startswith("gpu-workers-") and len(first) == len("gpu-workers-") + 5
    others = {machine_name("gpu-workers", "uid-1", 3, i) for i in range(1, 50)} | {
        machine_name("gpu-workers", "uid-1", 4, 0), machine_name("gpu-workers", "uid-2", 3, 0)}
    assert first not in others and len(others) == 51


def test_a_long_machineset_name_still_gives_a_valid_hostname() -> None:
    name = machine_name("a" * 60 + "-." + "b" * 100, "uid", 1, 0)
    assert len(name) <= 63 and DNS_LABEL.match(name)


def test_node_labels_match_the_template_node_ca_simulates() -> None:
    group = make_group("gpu-workers", labels={"node.kubernetes.io/instance-type": "cdi-16c64g"})
    machineset = make_machineset(template_labels={"cluster.x-k8s.io/set-name": "gpu-workers", "tier": "gpu"})
    labels = node_labels(group, machineset, "gpu-workers-bcd23", GPU_LABEL)
    assert labels == {
        "cluster.x-k8s.io/set-name": "gpu-workers", "tier": "gpu",
        "node.kubernetes.io/instance-type": "cdi-16c64g",
        "kubernetes.io/hostname": "gpu-workers-bcd23", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        LABEL_NODE_GROUP: "MachineSet.default.gpu-workers", GPU_LABEL: "A30", LABEL_GPU_MODEL: "A30",
    }


def test_a_group_without_gpus_gets_no_gpu_labels_nor_resource() -> None:
    group = make_group(max_gpus=0, models=())
    assert GPU_LABEL not in node_labels(group, make_machineset(), "n", GPU_LABEL)
    assert "nvidia.com/gpu" not in node_capacity(group)


def test_node_capacity_is_the_group_shape_with_zero_gpus() -> None:
    assert node_capacity(make_group(gpu_resource="example.com/gpu")) == {
        "cpu": "16", "memory": str(64 * 2**30), "ephemeral-storage": str(100 * 2**30), "pods": "110",
        "example.com/gpu": "0"}


def test_the_node_is_a_kwok_node_linked_to_its_machine() -> None:
    group = make_group(taints=(Taint(key="dedicated", value="gpu", effect="NoSchedule"),))
    machine = make_machine("gpu-workers-bcd23", namespace="team-a")
    node = build_node(group, make_machineset(namespace="team-a"), machine, GPU_LABEL)
    assert node["metadata"]["name"] == "gpu-workers-bcd23"
    assert node["metadata"]["annotations"][ANN_KWOK_NODE] == "fake"
    assert node["metadata"]["annotations"]["cluster.x-k8s.io/machine"] == "gpu-workers-bcd23"
    assert node["metadata"]["annotations"]["cluster.x-k8s.io/cluster-namespace"] == "team-a"
    assert node["metadata"]["annotations"]["cluster.x-k8s.io/owner-name"] == "gpu-workers"
    assert node["spec"] == {"providerID": "kwok://gpu-workers-bcd23",
                            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}
    assert node["status"]["capacity"] == node["status"]["allocatable"] == node_capacity(group)


def test_the_machine_is_made_from_the_template_and_owned_by_the_machineset() -> None:
    machineset = make_machineset(uid="uid-9", template_labels={"cluster.x-k8s.io/set-name": "gpu-workers",
                                                                "tier": "gpu"})
    machine = build_machine(machineset, "gpu-workers-bcd23", requested_at=100.25)
    assert machine["apiVersion"] == "cluster.x-k8s.io/v1beta2" and machine["kind"] == "Machine"
    assert machine["metadata"]["ownerReferences"] == [{
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": "gpu-workers", "uid": "uid-9",
        "controller": True, "blockOwnerDeletion": True}]
    assert machine["metadata"]["labels"] == {"cluster.x-k8s.io/set-name": "gpu-workers", "tier": "gpu",
                                             "cluster.x-k8s.io/cluster-name": "demo"}
    assert machine["metadata"]["annotations"] == {ANN_REQUESTED_AT: "100.250"}
    assert machine["spec"]["providerID"] == "kwok://gpu-workers-bcd23"
    assert machine["spec"]["clusterName"] == "demo"
    assert machine["spec"]["bootstrap"] == {"dataSecretName": "boot"}
    assert requested_at(machine) == 100.25
    assert "providerID" not in machineset["spec"]["template"]["spec"]  # the template is not modified


def test_scale_down_removes_marked_machines_first_then_the_newest() -> None:
    old = make_machine("old", requested_at=10.0)
    newer = make_machine("newer", requested_at=20.0)
    newest = make_machine("newest", requested_at=30.0)
    marked_old = make_machine("marked", requested_at=5.0, marked=True)
    machines = [old, newer, newest, marked_old]
    assert [m["metadata"]["name"] for m in choose_for_deletion(machines, 1)] == ["marked"]
    assert [m["metadata"]["name"] for m in choose_for_deletion(machines, 3)] == ["marked", "newest", "newer"]
    assert choose_for_deletion(machines, 0) == []


def test_a_machine_made_elsewhere_is_as_old_as_its_creation() -> None:
    assert requested_at(make_machine("m", created="2026-01-01T00:00:10Z")) == 1767225610.0


@pytest.mark.parametrize(("version", "extra"), [("v1beta2", {}), ("v1beta1", {"fullyLabeledReplicas": 3})])
def test_machineset_status(version: str, extra: dict) -> None:
    machineset = make_machineset(generation=4, version=version)
    assert machineset_status(machineset, replicas=3, ready=2) == {
        "replicas": 3, "readyReplicas": 2, "availableReplicas": 2, "observedGeneration": 4,
        "selector": "cluster.x-k8s.io/set-name=gpu-workers", **extra}


def test_a_kwok_pass_fails_before_it_changes_anything(dead_api: Any) -> None:
    infrastructure = KwokInfrastructure(dead_api, clock=lambda: 0.0, provisioning_delay_seconds=0.0,
                                        namespaces=("team-a",), request_timeout_seconds=2.0)
    with pytest.raises(NodeBackendUnavailable,
                       match=r"kwok infrastructure \(team-a\): listing MachineSets: apiserver unreachable"):
        infrastructure.reconcile_once()
