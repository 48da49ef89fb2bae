"""Make hot-plugged GPUs visible on their Node, the way a device-plugin restart does: the kubelet re-registers the
plugin and publishes the new device count in the Node's status.capacity and status.allocatable. Without a kubelet
(kwok nodes), DDS writes that count itself; kwok's heartbeats only touch conditions, so the count stays, and the
scheduler and cluster-autoscaler see the GPUs as they would on a real node.

`gpu_capacity_hook` is the fabric's `on_node_devices_changed` callback (dds/fabric/factory.py `build_fabric`): called
with a node and its ONLINE devices by model, it publishes their total as the GPU resource of the node's group.

Also the other Node reads and writes of the layers above: labels and taints the controller sets, the work on a node,
and `NodeObjects` (Nodes as dicts) for the kwok infrastructure provider that makes and deletes them.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Mapping, Optional, Union

from kubernetes import client

from dds.kube.errors import ApiError, api_errors
from dds.model.groups import DEFAULT_GPU_RESOURCE

log = logging.getLogger(__name__)

# (node name, {model: online devices}) -> None: dds.fabric.simulated.VisibilityHook.
DevicesChanged = Callable[[str, dict[str, int]], None]
# The GPU resource to publish for a node (its group's gpu_resource), or None when DDS does not manage the node.
ResourceOfNode = Callable[[str], Optional[str]]
Obj = dict[str, Any]


class NodeNotFound(LookupError):
    """The Node does not exist (not registered yet, or deleted)."""


class NodeUpdateFailed(Exception):
    """The apiserver refused or did not answer the status patch; the message says why. Retrying is safe."""


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
    _patch(what, lambda: client.CoreV1Api(api).patch_node_status(
        node_name, gpu_capacity_patch(resource, count), _request_timeout=request_timeout_seconds))
    log.info("%s (device hot-plug made visible)", what)


def set_node_label(api: client.ApiClient, node_name: str, key: str, value: Optional[str], *,
                   request_timeout_seconds: float = 10.0) -> None:
    """Set label `key` to `value` on the Node, or remove it when `value` is None (a merge patch: other labels stay).
    A missing Node raises `NodeNotFound`; any other failure `NodeUpdateFailed`. Idempotent."""
    what = f"node {node_name}: {'removing label ' + key if value is None else f'setting label {key}={value}'}"
    _patch(what, lambda: client.CoreV1Api(api).patch_node(
        node_name, {"metadata": {"labels": {key: value}}}, _request_timeout=request_timeout_seconds))


def _patch(what: str, call: Callable[[], object]) -> None:
    """Run one Node patch; a missing Node is `NodeNotFound`, any other failure `NodeUpdateFailed` saying `what`."""
    try:
        call()
    except client.ApiException as exc:
        if exc.status == 404:
            raise NodeNotFound(f"{what}: the Node does not exist") from exc
        raise NodeUpdateFailed(f"{what}: {exc.status} {exc.reason}{_message(exc)}") from exc
    except Exception as exc:  # connection refused, TLS, timeouts
        raise NodeUpdateFailed(f"{what}: apiserver unreachable: {exc}") from exc


def label_node(api: client.ApiClient, node_name: str, labels: Mapping[str, str]) -> None:
    """Merge `labels` into the Node's labels (others stay)."""
    client.CoreV1Api(api).patch_node(node_name, {"metadata": {"labels": dict(labels)}})


def add_taint(api: client.ApiClient, node_name: str, key: str, value: str, effect: str) -> None:
    """Add the taint unless the Node has one with that key (re-read first, so a taint added meanwhile stays)."""
    core = client.CoreV1Api(api)
    taints = list(core.read_node(node_name).spec.taints or [])
    if any(t.key == key for t in taints):
        return
    taints.append(client.V1Taint(key=key, value=value, effect=effect))
    core.patch_node(node_name, {"spec": {"taints": [t.to_dict() for t in taints]}})


def remove_taint(api: client.ApiClient, node_name: str, key: str, *, uncordon: bool = False) -> None:
    """Remove every taint with `key` (re-read first); `uncordon` also clears spec.unschedulable (CA's drain sets it)."""
    core = client.CoreV1Api(api)
    kept = [t for t in core.read_node(node_name).spec.taints or [] if t.key != key]
    spec: dict[str, object] = {"taints": [t.to_dict() for t in kept]}
    if uncordon:
        spec["unschedulable"] = False
    core.patch_node(node_name, {"spec": spec})


def read_node_labels(api: client.ApiClient, node_name: str) -> Optional[dict[str, str]]:
    """The Node's labels, None when it does not exist; other failures raise `dds.kube.errors.ApiError`."""
    try:
        node = client.CoreV1Api(api).read_node(node_name)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise ApiError.of(exc) from exc
    return dict(node.metadata.labels or {})


class NodeObjects:
    """Nodes as plain dicts, for code that makes and deletes them (the kwok infrastructure provider, dds/nodes/kwok.py).
    Errors are raised as `dds.kube.errors.ApiError`; connection errors as they come."""

    def __init__(self, api: client.ApiClient, *, request_timeout_seconds: float = 10.0) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._timeout = request_timeout_seconds

    def list(self, label_selector: str) -> list[Obj]:
        with api_errors():
            listed = self._core.list_node(label_selector=label_selector, _request_timeout=self._timeout)
        return [self._api.sanitize_for_serialization(n) for n in listed.items]

    def get(self, name: str) -> Obj:
        with api_errors():
            return self._api.sanitize_for_serialization(self._core.read_node(name, _request_timeout=self._timeout))

    def create(self, body: Obj) -> Obj:
        """The Node as created; a Node of that name existing already is an `ApiError` with `conflict`."""
        with api_errors():
            return self._api.sanitize_for_serialization(self._core.create_node(body, _request_timeout=self._timeout))

    def delete(self, name: str) -> bool:
        """Delete; False when it was already gone."""
        try:
            self._core.delete_node(name, _request_timeout=self._timeout)
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise ApiError.of(exc) from exc
        return True


def work_on_node(api: client.ApiClient, node_name: str) -> list[str]:
    """Names of the pods on the node that count as work: not finished, not DaemonSet-owned, not mirror pods. Read
    fresh from the apiserver (not a cache): it decides whether a node may go."""
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}").items
    return [p.metadata.name for p in pods if p.status.phase not in ("Succeeded", "Failed")
            and not any(o.kind == "DaemonSet" and o.controller for o in p.metadata.owner_references or ())
            and "kubernetes.io/config.mirror" not in (p.metadata.annotations or {})]


def gpu_capacity_hook(api: client.ApiClient,
                      resource: Union[str, ResourceOfNode] = DEFAULT_GPU_RESOURCE, *,
                      request_timeout_seconds: float = 10.0) -> DevicesChanged:
    """An `on_node_devices_changed` callback that publishes a node's online device count as its GPU capacity.

    `resource` is the GPU resource name, or a function giving it per node (its group's `gpu_resource`; None skips a
    node DDS does not manage). Errors propagate, so the fabric retries on its next tick — except a missing Node with
    no devices left, which has nothing to show.
    """

    def publish(node_name: str, online: Mapping[str, int]) -> None:
        name = resource(node_name) if callable(resource) else resource
        if name is None:
            log.debug("node %s has no DDS GPU resource: not publishing its %s", node_name, dict(online))
            return
        count = sum(online.values())
        try:
            set_gpu_capacity(api, node_name, name, count, request_timeout_seconds=request_timeout_seconds)
        except NodeNotFound:
            if count == 0:
                log.debug("node %s is gone and holds no devices: nothing to publish", node_name)
                return
            raise

    return publish


def _message(exc: client.ApiException) -> str:
    try:
        text = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        text = ""
    return f": {text}" if text else ""
