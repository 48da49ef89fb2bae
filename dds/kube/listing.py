"""Pods and Nodes read with one LIST each, as the records the watch cache keeps (dds/kube/decode.py): the observer's
path when there is no cache, or while the cache relists after a lost watch (dds/controller/observe.py).

Errors are raised as `dds.kube.errors.ApiError`; connection errors as they come.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from dds.kube import convert
from dds.kube.decode import NodeRecord, PodRecord, noted_unreadable, unreadable_pod_record
from dds.kube.errors import api_errors


def list_pod_records(api: client.ApiClient) -> tuple[PodRecord, ...]:
    """Every pod of every namespace, finished ones included (the record says which)."""
    with api_errors():
        pods = client.CoreV1Api(api).list_pod_for_all_namespaces().items
    return tuple(_guarded_pod_record(p) for p in pods)


def _guarded_pod_record(pod: Any) -> PodRecord:
    """`pod_record`, or for a pod it cannot read the stand-in the watch cache keeps for one (refused with the error):
    one pod never fails the whole list."""
    try:
        return pod_record(pod)
    except Exception as exc:  # any error reading this one pod
        meta, spec, status = pod.metadata, pod.spec, pod.status
        error = noted_unreadable("pods", f"{getattr(meta, 'namespace', '')}/{getattr(meta, 'name', '')}", exc,
                                 "refused with the error")
        return unreadable_pod_record({
            "metadata": {"namespace": getattr(meta, "namespace", None), "name": getattr(meta, "name", None),
                         "uid": getattr(meta, "uid", None), "resourceVersion": getattr(meta, "resource_version", None)},
            "spec": {"nodeName": getattr(spec, "node_name", None)},
            "status": {"phase": getattr(status, "phase", None)}}, error)


def list_node_records(api: client.ApiClient) -> tuple[NodeRecord, ...]:
    with api_errors():
        nodes = client.CoreV1Api(api).list_node().items
    return tuple(node_record(n) for n in nodes)


def pod_record(pod: Any) -> PodRecord:
    """A kubernetes.client V1Pod as the record the cache keeps."""
    return PodRecord(info=convert.pod_info(pod), terminal=convert.pod_is_terminal(pod),
                     unschedulable_since=convert.pod_unschedulable_since(pod),
                     resource_version=pod.metadata.resource_version or "")


def node_record(node: Any) -> NodeRecord:
    """A kubernetes.client V1Node as the record the cache keeps."""
    meta = node.metadata
    return NodeRecord(
        name=meta.name, provider_id=node.spec.provider_id or "", labels=convert.labels_of(node),
        taints=convert.node_taints(node), unschedulable=bool(node.spec.unschedulable), ready=convert.node_ready(node),
        allocatable=convert.node_allocatable(node),
        created_at=meta.creation_timestamp.timestamp() if meta.creation_timestamp else 0.0,
        marked_for_deletion=convert.node_marked_for_deletion(node), resource_version=meta.resource_version or "")
