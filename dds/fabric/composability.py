"""The ComposabilityRequest backend: drive the CDI composable-resource-operator (cro.hpsys.ibm.ie.com/v1alpha1).

The operator's API is declarative: a ComposabilityRequest says how many devices of a (type, model) a node should have,
and the operator creates one ComposableResource per device and attaches it through its CDI manager. So DDS keeps exactly
ONE `samenode` request per (node, type, model), named `<prefix><node>-<type>-<model>` (see `request_name`), and:

- attach n  = raise `spec.resource.size` by n;
- detach ids = lower `size` by len(ids). **The operator picks which devices go**: this API has no way to name a device,
  so the devices released may differ from the ids asked for; the finished operation lists the ones actually released.
  `force` cannot be expressed per detach (changing `force_detach` on a live request makes the operator detach *all* its
  devices and attach new ones), so a forced detach is sent as a normal size decrease and the operator's in-use check
  applies. Because of that, this backend cannot refuse a detach of an in-use device itself.

Every change is a read-modify-write carrying the request's resourceVersion (409 Conflict -> read again). Idempotency:
each applied operation is recorded in the request's `dds.cdi.dev/operations` annotation (JSON, the newest
`MAX_RECORDED_OPERATIONS`), written in the same update as the size change, so a retried key or a restarted DDS finds it
and never changes the size twice. The record keeps the request's resource names at the time, which is how progress is
told apart: an attach is done when that many *new* resources are Online, a detach when that many old ones are gone.
A refusal decided before anything is written (too few free devices, no free slot) is remembered in memory only: nothing
was done, so re-deciding it after a restart is harmless.

Pools: the operator has no pool API, so capacity comes from configuration (settings.simulated_fabric.pools describes
what the CDI manager holds; a model is expected in one pool only) minus what requests hold: for each request
max(spec.size, resources in status), plus ComposableResources no request lists. Errors: `status.error` of the request
and `error` of its resources end the operation as FAILED with that message (BackendError).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Optional, Sequence

from dds.config import ComposabilitySettings, PoolSpec
from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, FabricDevice, FabricError, Operation,
                             OperationKind, OperationState, PoolState)
from dds.kube import ApiClient
from dds.kube.composability import GROUP, REQUESTS, RESOURCES, VERSION, ComposabilityObjects, ObjectCache
from dds.kube.errors import ApiError

__all__ = ["GROUP", "VERSION", "REQUESTS", "RESOURCES", "ComposabilityRequestFabric", "request_name"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]
ANN_OPERATIONS = "dds.cdi.dev/operations"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NODE = "dds.cdi.dev/node"
MANAGER = "dds"
MAX_RECORDED_OPERATIONS = 32
_CONFLICT_ATTEMPTS = 5
_MAX_NAME = 253

# ComposableResource status.state -> device state
_RESOURCE_STATES = {"": DeviceState.ATTACHING, "Attaching": DeviceState.ATTACHING, "Online": DeviceState.ONLINE,
                    "Detaching": DeviceState.DETACHING, "Deleting": DeviceState.DETACHING}


def request_name(prefix: str, node: str, resource_type: str, model: str) -> str:
    """`<prefix><node>-<type>-<model>`, lowercased to a valid object name; too long -> shortened with a hash."""
    sanitized = re.sub(r"[^a-z0-9.-]+", "-", model.lower()).strip("-.") or "model"
    name = f"{prefix}{node}-{resource_type}-{sanitized}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:_MAX_NAME - 11].rstrip('-.')}-{digest}"


@dataclass(frozen=True)
class _View:
    """One read of the operator's objects."""

    requests: dict[str, dict[str, Any]]  # by name, all ComposabilityRequests of our type
    resources: dict[str, dict[str, Any]]  # by name, all ComposableResources of our type


class ComposabilityRequestFabric:
    """A `Fabric` on the CDI operator's ComposabilityRequest API; see the module docstring."""

    def __init__(self, api: ApiClient, settings: ComposabilitySettings, pools: Sequence[PoolSpec], *,
                 clock: Clock, name: str = "composability-request", cache: Optional[ObjectCache] = None) -> None:
        """`cache`: the operator's objects watched (`ClusterCache.composability`); without it each query lists them."""
        self.name = name
        self._objects = ComposabilityObjects(api, cache)
        self._settings = settings
        self._type = settings.resource_type
        self._clock = clock
        self._capacity, self._pool_of_model = _capacity_from(pools)
        self._slots = {p.name: p.max_slots_per_node for p in pools if p.max_slots_per_node is not None}
        self._refused: dict[str, Operation] = {}
        self._lock = threading.RLock()

    # --- the Fabric protocol ---
    def pools(self) -> tuple[PoolState, ...]:
        view = self._view()
        used = _used_by_model(view)
        out = []
        for pool, models in sorted(self._capacity.items()):
            free = {model: max(0, total - used.get(model, 0)) for model, total in models.items()}
            out.append(PoolState(pool, MappingProxyType(dict(models)), MappingProxyType(free)))
        return tuple(out)

    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        view = self._view()
        out = []
        for resource_name, resource in sorted(view.resources.items()):
            spec, status = resource.get("spec", {}), resource.get("status") or {}
            target = spec.get("target_node")
            if not target or (node is not None and target != node):
                continue
            state = _RESOURCE_STATES.get(status.get("state", ""), DeviceState.ATTACHING)
            if status.get("error") and state == DeviceState.ONLINE:
                state = DeviceState.FAILED
            model = spec.get("model", "")
            out.append(FabricDevice(resource_name, model, self._pool_of_model.get(model, ""), target, state))
        return tuple(out)

    def attach(self, request: AttachRequest) -> Operation:
        self._validate_attach(request)
        with self._lock:
            if request.key in self._refused:
                return self._refused[request.key]
            name = request_name(self._settings.request_name_prefix, request.node, self._type, request.model)
            for _ in range(_CONFLICT_ATTEMPTS):
                existing = self._get_request(name)
                record = _records(existing).get(request.key)
                if record is not None:
                    return self._operation_from(record, existing)
                refusal = self._refusal(request, existing)
                if refusal is not None:
                    self._refused[request.key] = refusal
                    return refusal
                record = self._new_record(request.key, OperationKind.ATTACH, request.node, request.model,
                                          request.pool, request.count, existing)
                if self._write_size(name, existing, request.node, request.model, record, +request.count):
                    return self._operation_from(record, self._get_request(name))
            raise FabricError(ErrorCode.BACKEND, f"ComposabilityRequest {name} kept changing; attach {request.key} "
                                                 f"not applied")

    def detach(self, request: DetachRequest) -> Operation:
        if not request.key or not request.node or not request.device_ids:
            raise FabricError(ErrorCode.INVALID, f"detach {request.key or '<no key>'}: key, node and device_ids "
                                                 f"are required")
        with self._lock:
            model = self._model_of_devices(request)
            name = request_name(self._settings.request_name_prefix, request.node, self._type, model)
            if request.force:
                log.info("detach %s: force cannot be set per detach on a ComposabilityRequest; the operator's "
                         "in-use check applies", request.key)
            for _ in range(_CONFLICT_ATTEMPTS):
                existing = self._get_request(name)
                if existing is None:
                    raise FabricError(ErrorCode.NOT_FOUND, f"detach {request.key}: ComposabilityRequest {name} "
                                                           f"does not exist (devices not attached by DDS?)")
                record = _records(existing).get(request.key)
                if record is not None:
                    return self._operation_from(record, existing)
                size = int(existing["spec"]["resource"].get("size", 0))
                if len(request.device_ids) > size:
                    raise FabricError(ErrorCode.INVALID, f"detach {request.key}: {len(request.device_ids)} devices "
                                                         f"asked, ComposabilityRequest {name} holds {size}")
                record = self._new_record(request.key, OperationKind.DETACH, request.node, model,
                                          self._pool_of_model.get(model, ""), len(request.device_ids), existing)
                record["asked"] = list(request.device_ids)
                if self._write_size(name, existing, request.node, model, record, -len(request.device_ids)):
                    return self._operation_from(record, self._get_request(name))
            raise FabricError(ErrorCode.BACKEND, f"ComposabilityRequest {name} kept changing; detach {request.key} "
                                                 f"not applied")

    def operation(self, key: str) -> Optional[Operation]:
        with self._lock:
            if key in self._refused:
                return self._refused[key]
        for request in self._our_requests():
            record = _records(request).get(key)
            if record is not None:
                return self._operation_from(record, request)
        return None

    def operations(self) -> tuple[Operation, ...]:
        out = [self._operation_from(record, request)
               for request in self._our_requests() for record in _records(request).values()]
        with self._lock:
            out.extend(self._refused.values())
        return tuple(out)

    def close(self) -> None:
        """Nothing to release: the requests are the state."""

    # --- deciding ---
    def _validate_attach(self, request: AttachRequest) -> None:
        if not request.key or not request.node or request.count <= 0:
            raise FabricError(ErrorCode.INVALID, f"attach {request.key or '<no key>'}: key, node and a positive "
                                                 f"count are required (count {request.count})")
        if self._capacity.get(request.pool, {}).get(request.model) is None:
            raise FabricError(ErrorCode.NOT_FOUND, f"attach {request.key}: pool {request.pool!r} has no "
                                                   f"{request.model} in the configured pools")

    def _refusal(self, request: AttachRequest, existing: Optional[dict[str, Any]]) -> Optional[Operation]:
        now = self._clock()
        total = self._capacity[request.pool][request.model]
        free = total - _used_by_model(self._view()).get(request.model, 0)
        code, message = None, ""
        if free < request.count:
            code, message = ErrorCode.OUT_OF_RESOURCES, (f"pool {request.pool} has {max(0, free)} free "
                                                         f"{request.model}, {request.count} asked for {request.node}")
        limit = self._slots.get(request.pool)
        size = int(existing["spec"]["resource"].get("size", 0)) if existing else 0
        if code is None and limit is not None and size + request.count > limit:
            code, message = ErrorCode.SLOTS_FULL, (f"{request.node} holds {size} of {limit} slot(s) for pool "
                                                   f"{request.pool}; {request.count} more asked")
        if code is None:
            return None
        return Operation(key=request.key, kind=OperationKind.ATTACH, node=request.node, state=OperationState.FAILED,
                         requested=request.count, model=request.model, pool=request.pool,
                         error=FabricError(code, message), started_at=now, finished_at=now)

    def _model_of_devices(self, request: DetachRequest) -> str:
        view = self._view()
        models = set()
        for device_id in request.device_ids:
            resource = view.resources.get(device_id)
            if resource is None or resource.get("spec", {}).get("target_node") != request.node:
                raise FabricError(ErrorCode.NOT_FOUND, f"detach {request.key}: ComposableResource {device_id} is "
                                                       f"not attached to {request.node}")
            models.add(resource["spec"]["model"])
        if len(models) != 1:
            raise FabricError(ErrorCode.INVALID, f"detach {request.key}: devices of several models "
                                                 f"({', '.join(sorted(models))}); detach each model separately")
        return models.pop()

    def _new_record(self, key: str, kind: OperationKind, node: str, model: str, pool: str, count: int,
                    existing: Optional[dict[str, Any]]) -> dict[str, Any]:
        size = int(existing["spec"]["resource"].get("size", 0)) if existing else 0
        before = sorted(((existing or {}).get("status") or {}).get("resources") or {})
        return {"key": key, "kind": kind.value, "node": node, "model": model, "pool": pool, "count": count,
                "before": before, "target": size + (count if kind == OperationKind.ATTACH else -count),
                "started_at": self._clock()}

    # --- writing ---
    def _write_size(self, name: str, existing: Optional[dict[str, Any]], node: str, model: str,
                    record: dict[str, Any], delta: int) -> bool:
        """Apply the size change and the operation record in one write; False on a conflict (read again)."""
        try:
            if existing is None:
                body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest",
                        "metadata": {"name": name, "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_NODE: node},
                                     "annotations": {ANN_OPERATIONS: json.dumps([record])}},
                        "spec": {"resource": {"type": self._type, "model": model, "size": max(0, delta),
                                              "allocation_policy": "samenode", "target_node": node,
                                              "force_detach": False}}}
                return self._objects.create_request(body)
            body = json.loads(json.dumps(existing))
            body["spec"]["resource"]["size"] = max(0, int(body["spec"]["resource"].get("size", 0)) + delta)
            annotations = body["metadata"].setdefault("annotations", {}) or {}
            annotations[ANN_OPERATIONS] = json.dumps(_bounded([*_records(existing).values(), record]))
            body["metadata"]["annotations"] = annotations
            # replace (PUT) carries metadata.resourceVersion: a conflict when the operator or another writer came first.
            return self._objects.replace_request(name, body)
        except ApiError as exc:
            raise _api_error(f"write ComposabilityRequest {name}", exc) from exc

    def _remember_result(self, request: dict[str, Any], record: dict[str, Any]) -> None:
        """Store a finished operation's outcome in the annotation, so it stays stable as the request moves on."""
        body = json.loads(json.dumps(request))
        records = _records(request)
        records[record["key"]] = record
        body["metadata"]["annotations"][ANN_OPERATIONS] = json.dumps(_bounded(list(records.values())))
        # Not stored now (a conflict, or an error): the outcome is recomputed (identically) on the next read and
        # stored then.
        try:
            stored = self._objects.replace_request(request["metadata"]["name"], body)
        except ApiError as exc:
            log.debug("could not record the outcome of %s: %s", record["key"], exc.status)
            return
        if not stored:
            log.debug("could not record the outcome of %s: 409", record["key"])

    # --- reading ---
    def _operation_from(self, record: dict[str, Any], request: Optional[dict[str, Any]]) -> Operation:
        if "state" not in record and request is not None:
            outcome = _outcome(record, request)
            if outcome is not None:
                record = {**record, **outcome, "finished_at": self._clock()}
                self._remember_result(request, record)
        elif "state" not in record:
            record = {**record, "state": OperationState.FAILED.value, "error_code": ErrorCode.NOT_FOUND.value,
                      "error": "the ComposabilityRequest was deleted", "devices": [], "finished_at": self._clock()}
        error = FabricError(ErrorCode(record["error_code"]), record.get("error", "")) \
            if record.get("error_code") else None
        return Operation(key=record["key"], kind=OperationKind(record["kind"]), node=record["node"],
                         state=OperationState(record.get("state", OperationState.RUNNING.value)),
                         requested=int(record["count"]), model=record["model"], pool=record.get("pool", ""),
                         devices=tuple(record.get("devices", ())), error=error,
                         started_at=float(record["started_at"]), finished_at=record.get("finished_at"))

    def _get_request(self, name: str) -> Optional[dict[str, Any]]:
        try:
            return self._objects.get_request(name)
        except ApiError as exc:
            raise _api_error(f"read ComposabilityRequest {name}", exc) from exc

    def _our_requests(self) -> list[dict[str, Any]]:
        try:
            return self._objects.list_requests(label_selector=f"{LABEL_MANAGED_BY}={MANAGER}")
        except ApiError as exc:
            raise _api_error("list ComposabilityRequests", exc) from exc

    def _view(self) -> _View:
        try:
            requests = self._objects.list_requests()
            resources = self._objects.list_resources()
        except ApiError as exc:
            raise _api_error("list the operator's objects", exc) from exc
        return _View({r["metadata"]["name"]: r for r in requests
                      if r.get("spec", {}).get("resource", {}).get("type") == self._type},
                     {r["metadata"]["name"]: r for r in resources
                      if r.get("spec", {}).get("type") == self._type})


# --- pure helpers ---
def _capacity_from(pools: Sequence[PoolSpec]) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    capacity: dict[str, dict[str, int]] = {}
    pool_of_model: dict[str, str] = {}
    for index, pool in enumerate(pools):
        capacity[pool.name] = dict(pool.devices)
        for model in pool.devices:
            if model in pool_of_model:
                raise ValueError(f"simulated_fabric.pools[{index}] ({pool.name!r}): model {model} is already in pool "
                                 f"{pool_of_model[model]!r}; the ComposabilityRequest API cannot tell pools apart, "
                                 f"so a model must be in one pool only")
            pool_of_model[model] = pool.name
    return capacity, pool_of_model


def _used_by_model(view: _View) -> dict[str, int]:
    used: dict[str, int] = {}
    listed: set[str] = set()
    for request in view.requests.values():
        resource = request["spec"]["resource"]
        in_status = (request.get("status") or {}).get("resources") or {}
        listed.update(in_status)
        model = resource.get("model", "")
        used[model] = used.get(model, 0) + max(int(resource.get("size", 0)), len(in_status))
    for resource_name, resource in view.resources.items():
        if resource_name not in listed:
            model = resource.get("spec", {}).get("model", "")
            used[model] = used.get(model, 0) + 1
    return used


def _records(request: Optional[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if request is None:
        return {}
    raw = ((request.get("metadata") or {}).get("annotations") or {}).get(ANN_OPERATIONS)
    if not raw:
        return {}
    try:
        records = json.loads(raw)
    except json.JSONDecodeError:
        log.warning("ComposabilityRequest %s: annotation %s is not JSON; ignoring it",
                    request["metadata"]["name"], ANN_OPERATIONS)
        return {}
    return {r["key"]: r for r in records if isinstance(r, dict) and "key" in r}


def _bounded(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest MAX_RECORDED_OPERATIONS records; running ones are never dropped."""
    finished = [r for r in records if "state" in r]
    running = [r for r in records if "state" not in r]
    keep = max(0, MAX_RECORDED_OPERATIONS - len(running))
    kept = {r["key"] for r in finished[-keep:]} if keep else set()
    return [r for r in records if "state" not in r or r["key"] in kept]


def _outcome(record: dict[str, Any], request: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The end of an operation as the request's status shows it, or None while it is still running."""
    status = request.get("status") or {}
    resources: dict[str, dict[str, Any]] = status.get("resources") or {}
    before = set(record.get("before", ()))
    count = int(record["count"])
    size = int(request["spec"]["resource"].get("size", 0))
    settled = status.get("state") == "Running" and len(resources) == size and \
        all(r.get("state") == "Online" for r in resources.values())
    if record["kind"] == OperationKind.ATTACH.value:
        new = {n: r for n, r in resources.items() if n not in before}
        online = sorted(n for n, r in new.items() if r.get("state") == "Online" and not r.get("error"))
        errors = [r["error"] for r in new.values() if r.get("error")]
        if len(online) >= count:
            return _done(OperationState.SUCCEEDED, online[:count])
    else:
        online = sorted(n for n in before if n not in resources)  # released
        errors = [r["error"] for n, r in resources.items() if n in before and r.get("error")]
        if len(online) >= count:
            return _done(OperationState.SUCCEEDED, online[:count])
    if errors or status.get("error"):
        return _done(OperationState.FAILED, online, ErrorCode.BACKEND, "; ".join(errors or [status["error"]]))
    if settled:
        return _done(OperationState.FAILED, online, ErrorCode.BACKEND,
                     f"the operator settled with {len(online)} of {count} device(s) {record['kind']}ed")
    return None


def _done(state: OperationState, devices: list[str], code: Optional[ErrorCode] = None,
          error: str = "") -> dict[str, Any]:
    return {"state": state.value, "devices": devices, "error_code": code.value if code else None, "error": error}


def _api_error(what: str, exc: ApiError) -> FabricError:
    code = ErrorCode.NOT_FOUND if exc.not_found else ErrorCode.BACKEND
    return FabricError(code, f"{what}: {exc.status} {exc.reason}")
