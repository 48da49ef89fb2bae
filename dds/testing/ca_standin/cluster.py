"""The stand-in's view of, and actions on, the Kubernetes cluster (the real apiserver in e2e tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, Union

from kubernetes import client
from kubernetes.client.rest import ApiException

from dds.kube.client import api_client

from .views import TAINT_TO_BE_DELETED, NodeView, PodView, node_from_manifest, pod_from_manifest


class ClusterAccess(Protocol):
    """What cluster-autoscaler reads from and does to the cluster."""

    def list_nodes(self) -> list[NodeView]: ...

    def list_pods(self) -> list[PodView]: ...

    def add_to_be_deleted_taint(self, node_name: str, now: float) -> None: ...

    def remove_to_be_deleted_taint(self, node_name: str) -> None: ...

    def evict_pod(self, namespace: str, name: str) -> None: ...


class KubeCluster:
    """ClusterAccess over the Kubernetes API (JSON lists, so the views read exactly what the apiserver stored)."""

    def __init__(self, api: client.ApiClient, request_timeout: float = 10.0) -> None:
        self.core = client.CoreV1Api(api)
        self.request_timeout = request_timeout

    def _list(self, call: Any) -> list[dict[str, Any]]:
        response = call(_preload_content=False, _request_timeout=self.request_timeout)
        return json.loads(response.data).get("items") or []

    def list_nodes(self) -> list[NodeView]:
        return [node_from_manifest(item) for item in self._list(self.core.list_node)]

    def list_pods(self) -> list[PodView]:
        return [pod_from_manifest(item) for item in self._list(self.core.list_pod_for_all_namespaces)]

    def _set_taints(self, node_name: str, change: Any) -> None:
        node = self.core.read_node(node_name, _request_timeout=self.request_timeout)
        taints = [t.to_dict() for t in node.spec.taints or ()]
        new_taints = change(taints)
        if new_taints == taints:
            return
        # The resourceVersion makes this a compare-and-swap: a concurrent taint change fails instead of being lost.
        body = {"metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": [{k: v for k, v in (("key", t["key"]), ("value", t.get("value")),
                                                         ("effect", t["effect"]), ("timeAdded", t.get("time_added")))
                                     if v is not None} for t in new_taints]}}
        self.core.patch_node(node_name, body, _request_timeout=self.request_timeout)

    def add_to_be_deleted_taint(self, node_name: str, now: float) -> None:
        def add(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if any(t["key"] == TAINT_TO_BE_DELETED for t in taints):
                return taints
            # CA stores the taint time (unix seconds) as the value.
            return taints + [{"key": TAINT_TO_BE_DELETED, "value": str(int(now)), "effect": "NoSchedule"}]

        self._set_taints(node_name, add)

    def remove_to_be_deleted_taint(self, node_name: str) -> None:
        try:
            self._set_taints(node_name, lambda taints: [t for t in taints if t["key"] != TAINT_TO_BE_DELETED])
        except ApiException as exc:
            if exc.status != 404:
                raise

    def evict_pod(self, namespace: str, name: str) -> None:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status != 404:  # already gone: what draining wants
                raise


ClusterSource = Union[Path, str, client.ApiClient, ClusterAccess]


def cluster_access(source: ClusterSource) -> ClusterAccess:
    """A kubeconfig path, an ApiClient, or anything implementing ClusterAccess (tests pass an in-memory cluster)."""
    if isinstance(source, (str, Path)):
        return KubeCluster(api_client(Path(source)))
    if isinstance(source, client.ApiClient):
        return KubeCluster(source)
    if all(hasattr(source, name) for name in ("list_nodes", "list_pods", "add_to_be_deleted_taint", "evict_pod")):
        return source
    raise TypeError(f"expected a kubeconfig path, a kubernetes ApiClient or a ClusterAccess, got {type(source).__name__}")
