"""A stand-in for the CDI composable-resource-operator, for tests and the e2e variant without the real operator.

It reconciles ComposabilityRequests on a real apiserver the way the operator does, with a `SimulatedFabric` as its CDI
manager (attach/detach latencies and faults come from that fabric; so does the visibility hook, which the fabric calls when
a node's online devices change):

- validating-webhook rules, enforced in code (it cannot reject a write, so the losing request gets `status.error` and is
  left alone): at most one `samenode` request per (node, type, model) — the oldest wins —, no `target_node` with
  `differentnode`. `differentnode` requests are not served by the stand-in (error "not supported by the stand-in").
- a request whose `target_node` names no Node is deleted, as the operator does.
- size up: a ComposableResource `<type>-<uuid>` per missing device (spec type/model/target_node/force_detach), whose
  status goes "" -> Attaching (fabric attach started) -> Online (device_id = a GPU UUID, cdi_device_id = the fabric's id).
- size down: the stand-in picks the devices to remove (not-yet-online first, then the newest), status Detaching (fabric
  detach) -> Deleting -> object deleted. A device the in-use callback reports busy is not detached unless force_detach is
  set; its resource carries the error instead (what the real operator does).
- request status: `NodeAllocating` (nothing yet), `Updating` (in progress), `Running` (size devices Online), `resources`,
  `scalarResource` (= spec.resource) and `error` (the first resource error).
A failed attach leaves its resource with `error` set and the request in error until its size changes (no automatic
retry: tests see the failure deterministically). Resources are tied to their request by the label `REQUEST_LABEL`, a
detail of this stand-in that DDS does not rely on.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Optional

from kubernetes import client

from harness.reconcile_loop import ReconcileLoop
from dds.fabric.base import AttachRequest, DetachRequest, DeviceState, FabricError, OperationState
from dds.fabric.composability import GROUP, REQUESTS, RESOURCES, VERSION
from dds.fabric.simulated import SimulatedFabric

log = logging.getLogger(__name__)

REQUEST_LABEL = "cro-standin.dds.cdi.dev/request"
_ALIVE = ("", "Attaching", "Online")


class StandInOperator(ReconcileLoop):
    def __init__(self, api: client.ApiClient, fabric: SimulatedFabric, *, poll_interval_s: float = 0.1,
                 device_in_use: Optional[Callable[[str], bool]] = None, check_nodes: bool = True) -> None:
        self._objects = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self.fabric = fabric
        super().__init__("cro-standin", poll_interval_s)
        self._in_use = device_in_use  # ComposableResource name -> busy?
        self._check_nodes = check_nodes

    # --- one pass ---
    def reconcile_once(self) -> None:
        self.fabric.tick()
        requests = self._list(REQUESTS)
        resources = self._list(RESOURCES)
        valid = self._enforce_webhook_rules(requests)
        for request in valid:
            if self._check_nodes and not self._node_exists(request["spec"]["resource"].get("target_node", "")):
                self._delete(REQUESTS, request["metadata"]["name"])
                continue
            mine = [r for r in resources if r["metadata"].get("labels", {}).get(REQUEST_LABEL)
                    == request["metadata"]["name"]]
            self._scale(request, mine)
            self._progress(request, mine)
            self._write_request_status(request, self._mine(request))
        names = {r["metadata"]["name"] for r in requests}
        for orphan in (r for r in resources if r["metadata"].get("labels", {}).get(REQUEST_LABEL) not in names):
            self._mark_detaching(orphan)
            self._progress_one(orphan, force=True)

    def _enforce_webhook_rules(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        valid, seen = [], set()
        for request in sorted(requests, key=lambda r: (r["metadata"]["creationTimestamp"], r["metadata"]["name"])):
            resource = request["spec"]["resource"]
            policy = resource.get("allocation_policy", "samenode")
            error = ""
            if policy == "differentnode":
                error = ("target_node cannot be set with allocation_policy differentnode" if resource.get("target_node")
                         else "allocation_policy differentnode is not supported by the stand-in operator")
            else:
                key = (resource.get("target_node", ""), resource["type"], resource["model"])
                if not key[0]:
                    error = "the stand-in operator needs target_node for samenode requests"
                elif key in seen:
                    error = (f"a samenode ComposabilityRequest for node {key[0]}, {key[1]} {key[2]} already exists")
                seen.add(key)
            if error:
                self._patch_status(REQUESTS, request, {"state": "", "error": error})
            else:
                valid.append(request)
        return valid

    def _scale(self, request: dict[str, Any], mine: list[dict[str, Any]]) -> None:
        resource = request["spec"]["resource"]
        alive = [r for r in mine if _state(r) in _ALIVE]
        missing = int(resource["size"]) - len(alive)
        for _ in range(max(0, missing)):
            self._create_resource(request)
        if missing < 0:
            # Not-yet-online (or failed) devices first, then the newest: the fewest workloads disturbed.
            healthy = [r for r in alive if _state(r) == "Online" and not _error(r)]
            unhealthy = [r for r in alive if r not in healthy]
            newest_first = sorted(healthy, key=lambda r: (r["metadata"]["creationTimestamp"], r["metadata"]["name"]),
                                  reverse=True)
            for victim in (unhealthy + newest_first)[:-missing]:
                self._mark_detaching(victim)

    def _progress(self, request: dict[str, Any], mine: list[dict[str, Any]]) -> None:
        force = bool(request["spec"]["resource"].get("force_detach"))
        for resource in mine:
            self._progress_one(resource, force)

    def _progress_one(self, resource: dict[str, Any], force: bool) -> None:
        name, spec, state = resource["metadata"]["name"], resource["spec"], _state(resource)
        status = dict(resource.get("status") or {"state": ""})
        if state == "" and not _error(resource):
            pool = self._pool_of(spec["model"])
            try:
                self.fabric.attach(AttachRequest(key=name, node=spec["target_node"], pool=pool, model=spec["model"],
                                                 count=1, reason=f"ComposableResource {name}"))
                status.update(state="Attaching")
            except FabricError as exc:
                status.update(state="Attaching", error=exc.message)
        elif state == "Attaching" and not _error(resource):
            op = self.fabric.operation(name)
            if op is not None and op.state == OperationState.SUCCEEDED:
                status.update(state="Online", device_id=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, name)}",
                              cdi_device_id=op.devices[0])
            elif op is not None and op.state == OperationState.FAILED:
                status.update(error=op.error.message if op.error else "attach failed")
        elif state == "Online":
            device = next((d for d in self.fabric.devices(spec["target_node"]) if d.id == status.get("cdi_device_id")),
                          None)
            if device is not None and device.state == DeviceState.FAILED and not status.get("error"):
                status.update(error=f"device {device.id} failed")
        elif state == "Detaching":
            status = self._detach_step(resource, status, force)
        elif state == "Deleting":
            self._delete(RESOURCES, name)
            return
        if status != (resource.get("status") or {"state": ""}):
            self._patch_status(RESOURCES, resource, status)

    def _detach_step(self, resource: dict[str, Any], status: dict[str, Any], force: bool) -> dict[str, Any]:
        name, node = resource["metadata"]["name"], resource["spec"]["target_node"]
        device_id = status.get("cdi_device_id")
        key = f"{name}/detach"
        if not device_id:
            attach = self.fabric.operation(name)
            if attach is not None and not attach.state.done:
                return status  # let the attach end first; then it is detached like any device
            if attach is not None and attach.devices:
                device_id = attach.devices[0]
            else:
                return {**status, "state": "Deleting", "error": ""}
        op = self.fabric.operation(key)
        if op is None:
            if not force and self._in_use is not None and self._in_use(name):
                return {**status, "error": f"device {device_id} is in use; set force_detach to detach it"}
            try:
                op = self.fabric.detach(DetachRequest(key=key, node=node, device_ids=(device_id,), force=force,
                                                      reason=f"ComposableResource {name} removed"))
            except FabricError as exc:
                return {**status, "error": exc.message}
        if op.state == OperationState.SUCCEEDED:
            return {**status, "state": "Deleting", "error": ""}
        if op.state == OperationState.FAILED:
            return {**status, "error": op.error.message if op.error else "detach failed"}
        return {**status, "error": ""}

    def _write_request_status(self, request: dict[str, Any], mine: list[dict[str, Any]]) -> None:
        size = int(request["spec"]["resource"]["size"])
        resources = {r["metadata"]["name"]: _resource_summary(r) for r in mine}
        errors = [v["error"] for v in resources.values() if v["error"]]
        if not resources and size > 0:
            state = "NodeAllocating"
        elif len(resources) == size and all(v["state"] == "Online" for v in resources.values()):
            state = "Running"
        else:
            state = "Updating"
        status = {"state": state, "error": errors[0] if errors else "", "resources": resources,
                  "scalarResource": dict(request["spec"]["resource"])}
        if status != request.get("status"):
            # A merge patch merges maps: resources that are gone must be sent as null to leave the map.
            gone = set(((request.get("status") or {}).get("resources") or {})) - set(resources)
            patch = {**status, "resources": {**resources, **{name: None for name in gone}}}
            self._patch_status(REQUESTS, request, patch)

    # --- API helpers ---
    def _create_resource(self, request: dict[str, Any]) -> None:
        resource = request["spec"]["resource"]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposableResource",
                "metadata": {"name": f"{resource['type']}-{uuid.uuid4()}",
                             "labels": {REQUEST_LABEL: request["metadata"]["name"]}},
                "spec": {"type": resource["type"], "model": resource["model"], "target_node": resource["target_node"],
                         "force_detach": bool(resource.get("force_detach", False))}}
        self._objects.create_cluster_custom_object(GROUP, VERSION, RESOURCES, body)

    def _mark_detaching(self, resource: dict[str, Any]) -> None:
        if _state(resource) in ("Detaching", "Deleting"):
            return
        status = {**(resource.get("status") or {}), "state": "Detaching", "error": ""}
        resource["status"] = self._patch_status(RESOURCES, resource, status).get("status", status)

    def _mine(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        selector = f"{REQUEST_LABEL}={request['metadata']['name']}"
        return list(self._objects.list_cluster_custom_object(GROUP, VERSION, RESOURCES,
                                                             label_selector=selector).get("items", []))

    def _list(self, plural: str) -> list[dict[str, Any]]:
        return list(self._objects.list_cluster_custom_object(GROUP, VERSION, plural).get("items", []))

    def _patch_status(self, plural: str, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._objects.patch_cluster_custom_object_status(GROUP, VERSION, plural, obj["metadata"]["name"],
                                                                    {"status": status})
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            return obj

    def _delete(self, plural: str, name: str) -> None:
        try:
            self._objects.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def _node_exists(self, name: str) -> bool:
        try:
            self._core.read_node(name)
            return True
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def _pool_of(self, model: str) -> str:
        for pool in self.fabric.pools():
            if model in pool.total:
                return pool.name
        return ""


def _resource_summary(resource: dict[str, Any]) -> dict[str, str]:
    status = resource.get("status") or {}
    return {"state": _state(resource), "device_id": status.get("device_id", ""),
            "cdi_device_id": status.get("cdi_device_id", ""), "node_name": resource["spec"]["target_node"],
            "error": _error(resource)}


def _state(resource: dict[str, Any]) -> str:
    return str((resource.get("status") or {}).get("state", ""))


def _error(resource: dict[str, Any]) -> str:
    return str((resource.get("status") or {}).get("error", "") or "")

