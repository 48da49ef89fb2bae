"""Builders for node-backend unit tests: a group as a MachineSet defines it, MachineSet and Machine dicts."""

from __future__ import annotations

from typing import Any, Optional

from dds.model.groups import NodeGroupSpec, SourceRef, Taint

GiB = 2**30


def make_group(name: str = "gpu-workers", namespace: str = "default", *, max_gpus: int = 4,
               models: tuple[str, ...] = ("A30",),
               labels: Optional[dict[str, str]] = None, taints: tuple[Taint, ...] = (), max_size: int = 5,
               gpu_resource: str = "nvidia.com/gpu") -> NodeGroupSpec:
    return NodeGroupSpec(
        id=f"MachineSet/{namespace}/{name}", min_size=0, max_size=max_size, milli_cpu=16000, memory=64 * GiB,
        ephemeral_storage=100 * GiB, max_pods=110, labels=labels or {}, taints=taints, gpu_resource=gpu_resource,
        gpu_models=models, max_gpus_per_node=max_gpus,
        source=SourceRef(kind="MachineSet", name=name, namespace=namespace, api_version="cluster.x-k8s.io/v1beta2"))


def make_machineset(name: str = "gpu-workers", namespace: str = "default", *, uid: str = "uid-1", generation: int = 1,
                    replicas: Optional[int] = 1, template_labels: Optional[dict[str, str]] = None,
                    version: str = "v1beta2") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterName": "demo",
        "selector": {"matchLabels": {"cluster.x-k8s.io/set-name": name}},
        "template": {"metadata": {"labels": template_labels if template_labels is not None
                                  else {"cluster.x-k8s.io/set-name": name}},
                     "spec": {"clusterName": "demo", "bootstrap": {"dataSecretName": "boot"},
                              "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                    "kind": "KwokMachineTemplate", "name": name}}},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": f"cluster.x-k8s.io/{version}", "kind": "MachineSet",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": generation,
                         "resourceVersion": "7"},
            "spec": spec}


def make_machine(name: str, *, owner: str = "gpu-workers", owner_uid: str = "uid-1", namespace: str = "default",
                 phase: str = "", node: Optional[str] = None, requested_at: Optional[float] = None,
                 marked: bool = False, deleting: bool = False, provider_id: Optional[str] = None,
                 failure: Optional[str] = None, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if requested_at is not None:
        annotations["dds.cdi.dev/kwok-requested-at"] = f"{requested_at:.3f}"
    if marked:
        annotations["cluster.x-k8s.io/delete-machine"] = "yes"
    metadata: dict[str, Any] = {
        "name": name, "namespace": namespace, "annotations": annotations, "creationTimestamp": created,
        "ownerReferences": [{"kind": "MachineSet", "name": owner, "uid": owner_uid,
                             "apiVersion": "cluster.x-k8s.io/v1beta2"}]}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if node:
        status["nodeRef"] = {"name": node}
    if failure:
        status["failureMessage"] = failure
    return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": metadata,
            "spec": {"providerID": provider_id if provider_id is not None else f"kwok://{name}"}, "status": status}
