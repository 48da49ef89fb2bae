"""The CDI composable-resource-operator's objects (cro.hpsys.ibm.ie.com/v1alpha1) as plain dicts: the I/O of the
ComposabilityRequest fabric backend (dds/fabric/composability.py), which keeps every decision.

Both kinds are cluster-scoped custom objects. Transient failures (429, 5xx, connection errors) are retried with
backoff here; a conditional write that loses a race answers False (409 Conflict: read again and re-apply); every other
error is raised as `dds.kube.errors.ApiError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from kubernetes import client

from dds.kube.cache import Collection
from dds.kube.errors import ApiError, api_errors, retrying

GROUP = "cro.hpsys.ibm.ie.com"
VERSION = "v1alpha1"
REQUESTS = "composabilityrequests"
RESOURCES = "composableresources"
# DDS's writes carry this field manager, so the requests' managedFields tell DDS's changes from another writer's.
FIELD_MANAGER = "dds"

Obj = dict[str, Any]
ObjectCache = Mapping[str, Collection[Obj]]  # watched collections by plural: ClusterCache.composability
WATCHED = ((GROUP, VERSION, REQUESTS), (GROUP, VERSION, RESOURCES))  # what ClusterCache watches for this backend
# Held on every Node DDS attaches to, from its first attach: the operator can only detach from a node that still
# exists (it finds the node's fabric machine through the Node), so a deleted node waits until DDS has detached its
# devices; DDS removes it then (dds/fabric/composability.py deleted_nodes_to_reclaim).
NODE_FINALIZER = "dds.cdi.dev/fabric-devices"


@dataclass(frozen=True)
class NodeHold:
    """A Node as the finalizer sees it."""

    name: str
    held: bool  # carries NODE_FINALIZER
    deleting: bool  # has a deletionTimestamp: it goes once its finalizers are removed


_with_retries = retrying(4)
_NODE_ATTEMPTS = 5


def _hold_of(node: Obj) -> NodeHold:
    meta = node.get("metadata") or {}
    return NodeHold(meta["name"], held=NODE_FINALIZER in (meta.get("finalizers") or ()),
                    deleting=bool(meta.get("deletionTimestamp")))


class ComposabilityObjects:
    """ComposabilityRequests and ComposableResources through the custom-objects API."""

    def __init__(self, api: client.ApiClient, cache: Optional[ObjectCache] = None) -> None:
        """`cache`: the watched collections by plural (`ClusterCache.composability`). Reads come from it once synced
        (no LIST per fabric query: the observer asks for devices, operations and pools on every decision), and every
        write is assumed into it, so the fabric reads its own writes at once."""
        self._objects = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._cache = cache or {}

    # --- ComposabilityRequests ---
    def get_request(self, name: str) -> Optional[Obj]:
        """The request, or None when it does not exist."""
        try:
            return _with_retries(self._objects.get_cluster_custom_object)(GROUP, VERSION, REQUESTS, name)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise ApiError.of(exc) from exc

    def create_request(self, body: Obj) -> bool:
        """Create; False when a request of that name appeared meanwhile (409)."""
        return self._write(REQUESTS, lambda: _with_retries(self._objects.create_cluster_custom_object)(
            GROUP, VERSION, REQUESTS, body, field_manager=FIELD_MANAGER))

    def replace_request(self, name: str, body: Obj) -> bool:
        """Replace (PUT) with the resourceVersion in `body`; False when another writer came first (409)."""
        return self._write(REQUESTS, lambda: _with_retries(self._objects.replace_cluster_custom_object)(
            GROUP, VERSION, REQUESTS, name, body, field_manager=FIELD_MANAGER))

    def list_requests(self, label_selector: Optional[str] = None) -> list[Obj]:
        cached = self._cached(REQUESTS, label_selector)
        if cached is not None:
            return cached
        options = {"label_selector": label_selector} if label_selector else {}
        with api_errors():
            listed = _with_retries(self._objects.list_cluster_custom_object)(GROUP, VERSION, REQUESTS, **options)
        return list(listed.get("items", []))

    # --- ComposableResources ---
    def annotate_resource(self, name: str, annotations: Mapping[str, Optional[str]]) -> bool:
        """Merge-patch annotations onto a ComposableResource (None removes one); False when it no longer exists."""
        body = {"metadata": {"annotations": dict(annotations)}}
        return self._write(RESOURCES, lambda: _with_retries(self._objects.patch_cluster_custom_object)(
            GROUP, VERSION, RESOURCES, name, body, field_manager=FIELD_MANAGER), refused=404)

    def list_resources(self) -> list[Obj]:
        cached = self._cached(RESOURCES, None)
        if cached is not None:
            return cached
        with api_errors():
            listed = _with_retries(self._objects.list_cluster_custom_object)(GROUP, VERSION, RESOURCES)
        return list(listed.get("items", []))

    def force_detach_resource(self, name: str, force: bool = True) -> bool:
        """Set `spec.force_detach` on a ComposableResource (the operator then skips its in-use check when it detaches
        it; False clears it again); False when it no longer exists."""
        body = {"spec": {"force_detach": force}}
        return self._write(RESOURCES, lambda: _with_retries(self._objects.patch_cluster_custom_object)(
            GROUP, VERSION, RESOURCES, name, body, field_manager=FIELD_MANAGER), refused=404)

    # --- the Node finalizer ---
    def node_hold(self, name: str) -> Optional[NodeHold]:
        """The Node's finalizer and deletion, or None when the Node does not exist."""
        node = self._read_node(name)
        return None if node is None else _hold_of(node)

    def hold_node(self, name: str) -> Optional[NodeHold]:
        """Add NODE_FINALIZER to the Node (a no-op when it is there). Not added to a Node already being deleted (the
        apiserver refuses new finalizers then): the answer says so. None when the Node does not exist."""
        for _ in range(_NODE_ATTEMPTS):
            node = self._read_node(name)
            if node is None:
                return None
            hold = _hold_of(node)
            if hold.held or hold.deleting:
                return hold
            meta = node["metadata"]
            patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}]
            patch += ([{"op": "add", "path": "/metadata/finalizers/-", "value": NODE_FINALIZER}] if meta.get(
                "finalizers") else [{"op": "add", "path": "/metadata/finalizers", "value": [NODE_FINALIZER]}])
            if self._patch_node(name, patch):
                return NodeHold(name, held=True, deleting=False)
        raise ApiError(409, f"Node {name} kept changing while DDS added its finalizer {NODE_FINALIZER}")

    def release_node(self, name: str) -> None:
        """Remove NODE_FINALIZER from the Node (nothing when it is absent or the Node is gone)."""
        for _ in range(_NODE_ATTEMPTS):
            node = self._read_node(name)
            finalizers = list((node or {}).get("metadata", {}).get("finalizers") or [])
            if NODE_FINALIZER not in finalizers:
                return
            index = finalizers.index(NODE_FINALIZER)
            # The test pins the entry removed: another controller's finalizer may have moved meanwhile.
            patch = [{"op": "test", "path": f"/metadata/finalizers/{index}", "value": NODE_FINALIZER},
                     {"op": "remove", "path": f"/metadata/finalizers/{index}"}]
            if self._patch_node(name, patch):
                return
        raise ApiError(409, f"Node {name} kept changing while DDS removed its finalizer {NODE_FINALIZER}")

    def _read_node(self, name: str) -> Optional[Obj]:
        try:
            node = _with_retries(self._core.read_node)(name)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise ApiError.of(exc) from exc
        return self._core.api_client.sanitize_for_serialization(node)

    def _patch_node(self, name: str, patch: list[Obj]) -> bool:
        """A JSON patch; False when its test failed (422/409: the Node changed meanwhile) or the Node is gone."""
        try:
            _with_retries(self._core.patch_node)(name, patch)
        except client.ApiException as exc:
            if exc.status in (404, 409, 422):
                return False
            raise ApiError.of(exc) from exc
        return True

    def _cached(self, plural: str, label_selector: Optional[str]) -> Optional[list[Obj]]:
        """The watched objects (equality selectors applied here), or None when not watched or not synced now."""
        collection = self._cache.get(plural)
        if collection is None or not collection.synced:
            return None
        wanted: dict[str, str] = {}
        for term in (label_selector or "").split(","):
            if not term:
                continue
            key, sep, value = term.partition("=")
            if not sep or key.endswith("!") or value.startswith("="):
                return None  # only key=value terms are applied here; anything else asks the apiserver
            wanted[key.strip()] = value.strip()
        return [obj for obj in collection.values()
                if all(((obj.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())]

    def _write(self, plural: str, call: Callable[[], object], refused: int = 409) -> bool:
        """Run a write and assume its answer into the cache; False when the apiserver answers `refused` (409: another
        writer came first; 404: the object is gone)."""
        try:
            written = call()
        except client.ApiException as exc:
            if exc.status == refused:
                return False
            raise ApiError.of(exc) from exc
        collection = self._cache.get(plural)
        if collection is not None and isinstance(written, dict):
            collection.assume(written)
        return True
