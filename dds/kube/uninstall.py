"""What DDS leaves on Nodes, found and removed for `dds uninstall`.

DDS marks the Nodes it manages under its own prefix `dds.cdi.dev/`: the finalizer `dds.cdi.dev/fabric-devices`
(fabric composability-request: a deleted Node waits until DDS has detached its devices), taints (`removing`,
`reserved-for`, `gpus-claimed-by`), labels and annotations. Once DDS no longer runs nobody removes them: a deleted Node
would wait forever on the finalizer, and the taints would keep pods off nodes. Everything else on the Node (the GPU
label a device plugin or DDS keeps, other controllers' taints) stays.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Optional

from kubernetes import client

from dds.model.groups import ANNOTATION_PREFIX

_CONFLICT_ATTEMPTS = 5


@dataclass(frozen=True)
class NodeFootprint:
    node: str
    finalizers: tuple[str, ...] = ()
    taints: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.finalizers or self.taints or self.labels or self.annotations)

    def describe(self) -> str:
        parts = [f"{what} {', '.join(keys)}" for what, keys in (
            ("finalizer", self.finalizers), ("taints", self.taints), ("labels", self.labels),
            ("annotations", self.annotations)) if keys]
        return f"node {self.node}: " + "; ".join(parts)


def _ours(key: Optional[str]) -> bool:
    return bool(key) and str(key).startswith(ANNOTATION_PREFIX)


def footprint_of(node: client.V1Node) -> NodeFootprint:
    meta, spec = node.metadata, node.spec
    return NodeFootprint(
        node=meta.name,
        finalizers=tuple(f for f in meta.finalizers or () if _ours(f)),
        taints=tuple(dict.fromkeys(t.key for t in (spec.taints or ()) if _ours(t.key))),
        labels=tuple(sorted(k for k in (meta.labels or {}) if _ours(k))),
        annotations=tuple(sorted(k for k in (meta.annotations or {}) if _ours(k))))


def footprints(api: client.ApiClient) -> list[NodeFootprint]:
    """Every Node that carries something of DDS's, by name."""
    nodes = client.CoreV1Api(api).list_node(_request_timeout=60).items
    found = (footprint_of(n) for n in nodes)
    return sorted((f for f in found if not f.empty), key=lambda f: f.node)


def remove_footprint(api: client.ApiClient, node_name: str) -> Optional[NodeFootprint]:
    """Remove DDS's finalizer, taints, labels and annotations from the Node, as read (a concurrent write makes it read
    again). Returns what was removed; None when the Node no longer exists."""
    core = client.CoreV1Api(api)
    for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
        try:
            node = core.read_node(node_name, _request_timeout=30)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        found = footprint_of(node)
        if found.empty:
            return found
        try:
            core.patch_node(node_name, _json_patch(node, found), _request_timeout=30)
            return found
        except client.ApiException as exc:
            # 422: a `test` failed, the Node changed since it was read (409 would be the same from an update)
            if exc.status not in (409, 422) or attempt == _CONFLICT_ATTEMPTS:
                raise
    return None


def _json_patch(node: client.V1Node, found: NodeFootprint) -> list[dict[str, Any]]:
    """A JSON patch removing `found` from `node`. List entries are removed by index, last first, each after a `test`
    that the entry there is still the one read: a concurrent writer makes the patch fail (and be redone), never lose
    its entry. (A strategic merge patch would merge the finalizers back instead of replacing the list.)"""
    ops: list[dict[str, Any]] = []
    finalizers = list(node.metadata.finalizers or ())
    for index in reversed([i for i, f in enumerate(finalizers) if _ours(f)]):
        path = f"/metadata/finalizers/{index}"
        ops += [{"op": "test", "path": path, "value": finalizers[index]}, {"op": "remove", "path": path}]
    taints = list(node.spec.taints or ())
    for index in reversed([i for i, t in enumerate(taints) if _ours(t.key)]):
        path = f"/spec/taints/{index}"
        ops += [{"op": "test", "path": f"{path}/key", "value": taints[index].key}, {"op": "remove", "path": path}]
    ops += [{"op": "remove", "path": f"/metadata/labels/{_pointer(k)}"} for k in found.labels]
    ops += [{"op": "remove", "path": f"/metadata/annotations/{_pointer(k)}"} for k in found.annotations]
    return ops


def _pointer(key: str) -> str:
    """A map key as one JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def lease_holder(api: client.ApiClient, namespace: str, name: str, now: datetime.datetime) -> Optional[str]:
    """The holder of DDS's leader Lease when it renewed it recently (DDS still runs), else None."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(name, namespace, _request_timeout=30)
    except client.ApiException as exc:
        if exc.status in (403, 404):  # no Lease, or not ours to read: nothing says DDS runs
            return None
        raise
    spec = lease.spec
    if not spec or not spec.holder_identity or spec.renew_time is None:
        return None
    fresh_for = datetime.timedelta(seconds=2 * (spec.lease_duration_seconds or 15))
    return spec.holder_identity if now - spec.renew_time < fresh_for else None
