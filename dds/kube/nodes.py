"""Make hot-plugged GPUs visible on their Node, the way a device-plugin restart does: the kubelet re-registers the
plugin and publishes the new device count in the Node's status.capacity and status.allocatable. Without a kubelet
(kwok nodes), DDS writes that count itself; kwok's heartbeats only touch conditions, so the count stays, and the
scheduler and cluster-autoscaler see the GPUs as they would on a real node.

`gpu_capacity_hook` is the fabric's `on_node_devices_changed` callback (dds/fabric/factory.py `build_fabric`): called
with a node and its ONLINE devices by model, it publishes their total as the GPU resource of the node's group.

Also the other Node reads and writes of the layers above: labels and taints the controller sets, the work on a node.
Those writes keep what other writers do to the same Node: taints (one list, replaced whole) go under the
resourceVersion they were computed from and are redone on a conflict, labels are patched key by key, and
`spec.unschedulable` is never cleared on a node someone else cordoned.

With the simulated fabric the capacity writer only touches kwok nodes (`gpu_capacity_hook(kwok_only=...)`,
`non_kwok_nodes`): on a real machine's Node it would announce GPUs that do not exist.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Mapping, Optional, Union

from kubernetes import client

from dds.kube.errors import api_errors
from dds.model.cxl import cxl_memory_of, gpus_of
from dds.model.groups import DEFAULT_GPU_RESOURCE

log = logging.getLogger(__name__)

# (node name, {model: online devices}) -> None: dds.fabric.simulated.VisibilityHook.
DevicesChanged = Callable[[str, dict[str, int]], None]
# The GPU resource to publish for a node (its group's gpu_resource), or None when DDS does not manage the node.
ResourceOfNode = Callable[[str], Optional[str]]
# A node's own memory in bytes (its group's, without CXL memory), or None when its group takes no CXL memory.
OwnMemoryOfNode = Callable[[str], Optional[int]]
Obj = dict[str, Any]


class NodeNotFound(LookupError):
    """The Node does not exist (not registered yet, or deleted)."""


class NodeUpdateFailed(Exception):
    """The apiserver refused or did not answer the status patch; the message says why. Retrying is safe."""


# kwok manages the Nodes annotated so (harness/controlplane.py, harness/kwok_provider.py): no kubelet, no devices, so
# GPU capacity written by DDS is all they ever show.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"


class NotAKwokNode(NodeUpdateFailed):
    """Simulated GPUs were about to be written into a Node that kwok does not manage (a real machine)."""


def is_kwok_node(annotations: Optional[Mapping[str, str]]) -> bool:
    return (annotations or {}).get(KWOK_NODE_ANNOTATION) == KWOK_NODE_VALUE


def non_kwok_nodes(api: client.ApiClient, label_selector: str) -> list[str]:
    """Names of the Nodes matching `label_selector` that kwok does not manage; failures raise `ApiError`."""
    with api_errors():
        listed = client.CoreV1Api(api).list_node(label_selector=label_selector)
    return sorted(n.metadata.name for n in listed.items if not is_kwok_node(n.metadata.annotations))


def gpu_capacity_patch(resource: str, count: int) -> dict[str, object]:
    quantity = str(count)
    return {"status": {"capacity": {resource: quantity}, "allocatable": {resource: quantity}}}


def set_gpu_capacity(api: client.ApiClient, node_name: str, resource: str, count: int, *,
                     request_timeout_seconds: float = 10.0) -> None:
    """Set `resource` to `count` in the Node's status.capacity and status.allocatable. Idempotent: the same call again
    writes the same values. A missing Node raises `NodeNotFound`; any other failure `NodeUpdateFailed`."""
    if count < 0:
        raise ValueError(f"node {node_name}: GPU count must be >= 0, got {count}")
    if not resource:
        raise ValueError(f"node {node_name}: no GPU resource name given")
    what = f"node {node_name}: setting {resource} capacity and allocatable to {count}"
    # A dict body is sent as a strategic merge patch: only this resource's entries change.
    _node_call(what, lambda: client.CoreV1Api(api).patch_node_status(
        node_name, gpu_capacity_patch(resource, count), _request_timeout=request_timeout_seconds))
    log.info("%s (device hot-plug made visible)", what)


def set_memory_capacity(api: client.ApiClient, node_name: str, memory: int, *,
                        request_timeout_seconds: float = 10.0) -> None:
    """Set the Node's memory capacity and allocatable to `memory` bytes (its own plus the CXL memory online): what a
    kubelet reports once hot-added memory is online. Idempotent; errors as `set_gpu_capacity`."""
    if memory <= 0:
        raise ValueError(f"node {node_name}: memory must be > 0, got {memory}")
    what = f"node {node_name}: setting memory capacity and allocatable to {memory}"
    patch = {"status": {"capacity": {"memory": str(memory)}, "allocatable": {"memory": str(memory)}}}
    _node_call(what, lambda: client.CoreV1Api(api).patch_node_status(node_name, patch,
                                                                     _request_timeout=request_timeout_seconds))
    log.info("%s (CXL memory hot-plug made visible)", what)


def set_node_label(api: client.ApiClient, node_name: str, key: str, value: Optional[str], *,
                   request_timeout_seconds: float = 10.0) -> None:
    """Set label `key` to `value` on the Node, or remove it when `value` is None (a merge patch: other labels stay).
    A missing Node raises `NodeNotFound`; any other failure `NodeUpdateFailed`. Idempotent."""
    what = f"node {node_name}: {'removing label ' + key if value is None else f'setting label {key}={value}'}"
    _node_call(what, lambda: client.CoreV1Api(api).patch_node(
        node_name, {"metadata": {"labels": {key: value}}}, _request_timeout=request_timeout_seconds))


def _node_call(what: str, call: Callable[[], Any]) -> Any:
    """Run one Node request; a missing Node is `NodeNotFound`, any other failure `NodeUpdateFailed` saying `what`."""
    try:
        return call()
    except client.ApiException as exc:
        if exc.status == 404:
            raise NodeNotFound(f"{what}: the Node does not exist") from exc
        raise NodeUpdateFailed(f"{what}: {exc.status} {exc.reason}{_message(exc)}") from exc
    except Exception as exc:  # connection refused, TLS, timeouts
        raise NodeUpdateFailed(f"{what}: apiserver unreachable: {exc}") from exc


def label_node(api: client.ApiClient, node_name: str, labels: Mapping[str, str]) -> None:
    """Merge `labels` into the Node's labels. A merge patch names only these keys and reads nothing first, so a label
    another writer sets at the same time is kept (no read-modify-write, nothing to lose)."""
    client.CoreV1Api(api).patch_node(node_name, {"metadata": {"labels": dict(labels)}})


def add_taint(api: client.ApiClient, node_name: str, key: str, value: str, effect: str) -> None:
    """Add the taint unless the Node has one with that key. `spec.taints` is one list that a patch replaces whole, so
    the write carries the resourceVersion it was computed from: a taint another writer adds in between makes it a 409,
    and it is computed again from a fresh read (`_rewrite_node`). Other failures raise `client.ApiException`."""

    def with_taint(node: client.V1Node) -> Optional[Obj]:
        taints = node.spec.taints or []
        if any(t.key == key for t in taints):
            return None
        added = {"key": key, "value": value, "effect": effect}
        return {"spec": {"taints": [*(_taint_body(api, t) for t in taints), added]}}

    _rewrite_node(api, node_name, f"adding taint {key}", with_taint)


def remove_taint(api: client.ApiClient, node_name: str, key: str, *, uncordon_if_cordoned_with_it: bool = False) -> None:
    """Remove every taint with `key`, under the read's resourceVersion as `add_taint` does (others' taints stay).

    `uncordon_if_cordoned_with_it`: also set `spec.unschedulable: false`, but only when the write that added this taint
    is the one that cordoned the node (cluster-autoscaler's --cordon-node-before-terminating taints and cordons in one
    update): the apiserver's managedFields name who set `spec.unschedulable`. A cordon anyone else made — an
    administrator's `kubectl cordon` before or after — is never undone. DDS itself never cordons."""

    def without_taint(node: client.V1Node) -> Optional[Obj]:
        taints = node.spec.taints or []
        kept = [t for t in taints if t.key != key]
        spec: Obj = {}
        if len(kept) != len(taints):
            spec["taints"] = [_taint_body(api, t) for t in kept]
        if uncordon_if_cordoned_with_it and node.spec.unschedulable and _cordoned_with_taint(node, key):
            spec["unschedulable"] = False
        return {"spec": spec} if spec else None

    _rewrite_node(api, node_name, f"removing taint {key}", without_taint)


# Enough for a burst of writers on one node (the kubelet does not write spec; CA, DDS and an administrator might).
_CONFLICT_ATTEMPTS = 5


def _rewrite_node(api: client.ApiClient, node_name: str, what: str,
                  change: Callable[[client.V1Node], Optional[Obj]]) -> None:
    """Read the Node, compute a patch from it (`change`; None: nothing to do) and send it with the read's
    resourceVersion as a precondition; on 409 Conflict (someone wrote the Node in between) start again from a fresh
    read. Raises the apiserver's `client.ApiException` (404, 403, a 409 that outlasted every attempt)."""
    core = client.CoreV1Api(api)
    for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
        node = core.read_node(node_name)
        patch = change(node)
        if patch is None:
            return
        patch.setdefault("metadata", {})["resourceVersion"] = node.metadata.resource_version
        try:
            core.patch_node(node_name, patch)
            return
        except client.ApiException as exc:
            if exc.status != 409 or attempt == _CONFLICT_ATTEMPTS:
                raise
            log.debug("node %s: %s: the Node changed since it was read (attempt %d), reading it again",
                      node_name, what, attempt)


def _taint_body(api: client.ApiClient, taint: client.V1Taint) -> Obj:
    # The API's own field names (timeAdded, not the model's time_added), so a taint is written back as it was read.
    return api.sanitize_for_serialization(taint)


def _cordoned_with_taint(node: client.V1Node, taint_key: str) -> bool:
    """Whether the writer that owns `spec.unschedulable` also wrote the taint `taint_key` (so cordoned along with it).

    A field is owned by the last manager that changed it. An administrator's cordon is owned by kubectl (or whatever
    they used) and stays theirs when cluster-autoscaler later sets the same value again; only a cordon made in the
    same update as the taint shares its owner. When in doubt (no managedFields), the answer is no: the node stays
    cordoned, which an operator can see and undo, rather than an administrator's cordon lifted behind their back."""
    owners = [e for e in node.metadata.managed_fields or () if "f:unschedulable" in _spec_fields(e)]
    return len(owners) == 1 and _owns_taint(_spec_fields(owners[0]).get("f:taints"), taint_key)


def _spec_fields(entry: client.V1ManagedFieldsEntry) -> dict[str, Any]:
    fields = entry.fields_v1 if isinstance(entry.fields_v1, dict) else {}
    spec = fields.get("f:spec")
    return spec if isinstance(spec, dict) else {}


def _owns_taint(taints_fields: Any, taint_key: str) -> bool:
    if taints_fields == {}:  # an atomic list: the owner wrote every taint in it
        return True
    return isinstance(taints_fields, dict) and any(json.dumps(taint_key) in item for item in taints_fields)


def read_node_labels(api: client.ApiClient, node_name: str) -> Optional[dict[str, str]]:
    """The Node's labels, None when it does not exist; other failures raise `dds.kube.errors.ApiError`."""
    try:
        node = client.CoreV1Api(api).read_node(node_name)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise ApiError.of(exc) from exc
    return dict(node.metadata.labels or {})


def work_on_node(api: client.ApiClient, node_name: str) -> list[str]:
    """Names of the pods on the node that count as work: not finished, not DaemonSet-owned, not mirror pods. Read
    fresh from the apiserver (not a cache): it decides whether a node may go."""
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}").items
    return [p.metadata.name for p in pods if p.status.phase not in ("Succeeded", "Failed")
            and not any(o.kind == "DaemonSet" and o.controller for o in p.metadata.owner_references or ())
            and "kubernetes.io/config.mirror" not in (p.metadata.annotations or {})]


def gpu_capacity_hook(api: client.ApiClient,
                      resource: Union[str, ResourceOfNode] = DEFAULT_GPU_RESOURCE, *,
                      request_timeout_seconds: float = 10.0, kwok_only: Optional[str] = None,
                      own_memory: Optional[OwnMemoryOfNode] = None) -> DevicesChanged:
    """An `on_node_devices_changed` callback that publishes a node's online device count as its GPU capacity.

    `resource` is the GPU resource name, or a function giving it per node (its group's `gpu_resource`; None skips a
    node DDS does not manage). Errors propagate, so the fabric retries on its next tick — except a missing Node with
    no devices left, which has nothing to show.

    `kwok_only`: publish on kwok nodes only (simulated GPUs); any other node raises `NotAKwokNode`, whose message ends
    with this text (what to change to allow it).

    `own_memory`: the node's memory without CXL memory (its group's), or None for a node whose group takes no CXL
    memory. For the others, the node's memory is published as that plus the CXL memory chunks online
    (dds/model/cxl.py), as a kubelet reports hot-added memory (docs/cxl-memory.md); chunks are never counted as GPUs.
    """

    def publish(node_name: str, online: Mapping[str, int]) -> None:
        name = resource(node_name) if callable(resource) else resource
        base = own_memory(node_name) if own_memory is not None else None
        if name is None and base is None:
            log.debug("node %s has no DDS GPU resource: not publishing its %s", node_name, dict(online))
            return
        count = gpus_of(online)
        try:
            if kwok_only is not None:
                _require_kwok_node(api, node_name, kwok_only, request_timeout_seconds)
            if name is not None:
                set_gpu_capacity(api, node_name, name, count, request_timeout_seconds=request_timeout_seconds)
            if base is not None:
                set_memory_capacity(api, node_name, base + cxl_memory_of(online),
                                    request_timeout_seconds=request_timeout_seconds)
        except NodeNotFound:
            if sum(online.values()) == 0:
                log.debug("node %s is gone and holds no devices: nothing to publish", node_name)
                return
            raise

    return publish


def _require_kwok_node(api: client.ApiClient, node_name: str, advice: str, request_timeout_seconds: float) -> None:
    what = f"node {node_name}: checking it is a kwok node"
    node = _node_call(what, lambda: client.CoreV1Api(api).read_node(node_name, _request_timeout=request_timeout_seconds))
    if not is_kwok_node(node.metadata.annotations):
        raise NotAKwokNode(f"node {node_name} is not a kwok node (no annotation {KWOK_NODE_ANNOTATION}: "
                           f"{KWOK_NODE_VALUE}): refusing to write simulated GPUs into a real Node; {advice}")


def _message(exc: client.ApiException) -> str:
    try:
        text = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        text = ""
    return f": {text}" if text else ""


class KubeNodeWriter:
    """The controller's node writes (taints, labels) and the fresh read of a node's work, over the apiserver: the
    `NodeWriter` port of the controller's applier (dds/controller/apply.py) and the `NodeLabelSetter` port of its GPU
    label keeper (dds/controller/gpu_label.py), so the raw client stays in dds.kube."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    def taint(self, node: str, key: str, value: str, effect: str) -> None:
        add_taint(self._api, node, key, value, effect)

    def untaint(self, node: str, key: str, *, uncordon_if_cordoned_with_it: bool = False) -> None:
        remove_taint(self._api, node, key, uncordon_if_cordoned_with_it=uncordon_if_cordoned_with_it)

    def label(self, node: str, labels: Mapping[str, str]) -> None:
        label_node(self._api, node, labels)

    def set_label(self, node: str, key: str, value: Optional[str]) -> None:
        """Set one label, or remove it when `value` is None: the GPU label keeper's port
        (dds/controller/gpu_label.py). Raises `NodeNotFound` or `NodeUpdateFailed`."""
        set_node_label(self._api, node, key, value)

    def work_on(self, node: str) -> list[str]:
        return work_on_node(self._api, node)
