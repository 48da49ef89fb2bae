"""The CDI composable-resource-operator's objects (cro.hpsys.ibm.ie.com/v1alpha1) as plain dicts: the I/O of the
ComposabilityRequest fabric backend (dds/fabric/composability.py), which keeps every decision.

Both kinds are cluster-scoped custom objects. Transient failures (429, 5xx, connection errors) are retried with
backoff here; a conditional write that loses a race answers False (409 Conflict: read again and re-apply); every other
error is raised as `dds.kube.errors.ApiError`.
"""

from __future__ import annotations

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



_with_retries = retrying(4)


class ComposabilityObjects:
    """ComposabilityRequests and ComposableResources through the custom-objects API."""

    def __init__(self, api: client.ApiClient, cache: Optional[ObjectCache] = None) -> None:
        """`cache`: the watched collections by plural (`ClusterCache.composability`). Reads come from it once synced
        (no LIST per fabric query: the observer asks for devices, operations and pools on every decision), and every
        write is assumed into it, so the fabric reads its own writes at once."""
        self._objects = client.CustomObjectsApi(api)
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
