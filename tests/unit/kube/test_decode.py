"""The lean decoder (raw JSON dicts, the watch cache's path) and listing.py with convert.py (kubernetes.client models,
the LIST path) must give the planner the same pod and node: the cache changes how DDS reads, never what it decides."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from dds.kube import decode, listing

_API = client.ApiClient()


def as_model(obj: dict[str, Any], kind: str) -> Any:
    return _API._ApiClient__deserialize(copy.deepcopy(obj), kind)  # the client's own decoding of a response body


def make_pod(**spec: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1", "resourceVersion": "42",
                     "creationTimestamp": "2026-11-23T23:53:46Z", "labels": {"app": "train"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j-1",
                                          "controller": True}]},
        "spec": {"containers": [{"name": "c", "image": "x",
                                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"},
    }
    pod["spec"].update(spec)
    return pod


SELECTOR = {"matchLabels": {"app": "db"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}

PODS = {
    "plain": make_pod(),
    "bound": make_pod(nodeName="worker-1", priority=100),
    "affinities": make_pod(
        nodeSelector={"pool": "gpu"},
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1", "z2"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["worker-2"]}]}]}},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": SELECTOR, "topologyKey": "kubernetes.io/hostname", "namespaces": ["ml"]},
                {"labelSelector": SELECTOR, "topologyKey": "topology.kubernetes.io/zone"}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": SELECTOR, "topologyKey": "kubernetes.io/hostname",
                 "namespaceSelector": {"matchLabels": {"team": "a"}}},
                {"labelSelector": SELECTOR, "topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["app"]}]}},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists"}]),
    "ports-and-sidecars": make_pod(
        initContainers=[{"name": "init", "image": "x", "resources": {"requests": {"cpu": "2"}}},
                        {"name": "proxy", "image": "x", "restartPolicy": "Always",
                         "resources": {"requests": {"memory": "64Mi"}},
                         "ports": [{"containerPort": 9000, "hostPort": 9000, "protocol": "UDP", "hostIP": "10.0.0.1"}]}],
        overhead={"cpu": "100m"}),
    "storage": make_pod(volumes=[{"name": "scratch", "emptyDir": {}},
                                 {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
                        topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone",
                                                    "whenUnsatisfiable": "DoNotSchedule",
                                                    "labelSelector": SELECTOR}]),
    "in-memory-emptydir": make_pod(volumes=[{"name": "shm", "emptyDir": {"medium": "Memory"}}]),
}


def _variant(base: dict[str, Any], **meta: Any) -> dict[str, Any]:
    pod = copy.deepcopy(base)
    pod["metadata"].update(meta)
    return pod


PODS["bare"] = _variant(PODS["plain"], ownerReferences=None)
PODS["mirror"] = _variant(PODS["plain"], annotations={"kubernetes.io/config.mirror": "abc"})
PODS["safe-to-evict-false"] = _variant(PODS["plain"],
                                       annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"})
PODS["unschedulable"] = copy.deepcopy(PODS["plain"])
PODS["unschedulable"]["status"] = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "lastTransitionTime": "2026-11-23T23:54:00Z"}]}
PODS["succeeded"] = copy.deepcopy(PODS["bound"])
PODS["succeeded"]["status"] = {"phase": "Succeeded"}


@pytest.mark.parametrize("name", sorted(PODS))
def test_a_pod_decodes_as_the_client_models_convert(name: str) -> None:
    raw = PODS[name]
    assert decode.pod_record(raw) == listing.pod_record(as_model(raw, "V1Pod"))


def test_an_unschedulable_pod_carries_when_the_scheduler_gave_up() -> None:
    record = decode.pod_record(PODS["unschedulable"])
    assert record.unschedulable_since == decode.timestamp("2026-11-23T23:54:00Z") > 0
    assert not record.terminal and decode.pod_record(PODS["succeeded"]).terminal


def make_node(**changes: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker-1", "resourceVersion": "7", "creationTimestamp": "2026-11-23T23:00:00Z",
                     "labels": {"kubernetes.io/hostname": "worker-1"}},
        "spec": {"providerID": "kwok://worker-1"},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"},
                   "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "4"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }
    for path, value in changes.items():
        section, key = path.split("__")
        node[section][key] = value
    return node


NODES = {
    "ready": make_node(),
    "not-ready": make_node(status__conditions=[{"type": "Ready", "status": "False"}]),
    "no-conditions": make_node(status__conditions=None),
    "cordoned-tainted": make_node(spec__unschedulable=True,
                                  spec__taints=[{"key": "gpu", "value": "a30", "effect": "NoSchedule"}]),
    "to-be-deleted": make_node(spec__taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]),
    "deleting": make_node(metadata__deletionTimestamp="2026-11-24T00:00:00Z"),
    "capacity-only": make_node(status__allocatable=None),
}


@pytest.mark.parametrize("name", sorted(NODES))
def test_a_node_decodes_as_the_client_models_convert(name: str) -> None:
    raw = NODES[name]
    assert decode.node_record(raw) == listing.node_record(as_model(raw, "V1Node"))


def test_object_keys_are_namespace_slash_name_or_the_name_alone() -> None:
    assert decode.object_key(PODS["plain"]) == "ml/train-0"
    assert decode.object_key(NODES["ready"]) == "worker-1"


def test_lean_objects_drop_managed_fields_and_keep_the_rest() -> None:
    machine = {"metadata": {"name": "m", "managedFields": [{"manager": "x"}],
                            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "a": "b"}},
               "spec": {"providerID": "p"}}
    lean = decode.lean_object(machine)
    assert lean == {"metadata": {"name": "m", "annotations": {"a": "b"}}, "spec": {"providerID": "p"}}
    assert "managedFields" in machine["metadata"]  # the input is not changed
