"""The ComposabilityRequest backend: drive the CDI composable-resource-operator (cro.hpsys.ibm.ie.com/v1alpha1).

The operator's API is declarative: a ComposabilityRequest says how many devices of a (type, model) a node should have,
and the operator creates one ComposableResource per device and attaches it through its CDI manager. So DDS keeps exactly
ONE `samenode` request per (node, type, model), named `<prefix><node>-<type>-<model>` (see `request_name`), and:

- attach n  = raise `spec.resource.size` by n;
- detach ids = annotate those ComposableResources `cohdi.io/delete-device: "true"`, then lower `size` by len(ids).
  The operator's removal order (composabilityrequest_controller.go, NodeAllocating): resources `Attaching` without a
  device first, then annotated `Online` ones, then `Attaching` ones with a device, then unannotated `Online` ones
  least recently used first, and last everything else — a resource in state "" (its controller has not taken it up:
  the code tests for a state "None" it never writes) goes after the Online ones. So the devices DDS chose are the
  ones that go only when nothing is on its way on the same request, which is why a detach is refused (retryably)
  until the request's resources are all Online, a size change waits until the operator has applied the last one
  (`_check_operator_caught_up`), and a failed attach's give-back waits while a resource is in state "" (its outcome
  stored at once all the same, with the give-back owed: a device that comes Online meanwhile stays as an ordinary
  one, the rest is given back once the operator has taken it up and is not attaching it without an error (a size
  lowered under an attach under way would cancel it, its device then held by no resource), and no size change is
  made meanwhile; past
  `operator_wait_bound_seconds` after the attach ended it is written anyway when the request holds nothing else, else
  the resource is reported stranded, and the request is released either way: `GiveBackOverdue`). The marks
  (and force flags) come off again when the size write fails, and off the devices a failed detach leaves in place.
  A device already on its way out (its resource being deleted) is not detached again: the size would drop twice.
  `force` is honoured when the detach empties the request (the chosen resources get `spec.force_detach`, and the
  operator skips its in-use check); otherwise it is sent as a normal detach (a resource whose `force_detach` differs
  from its request's is replaced by the operator while the request keeps devices, so forcing a few would replace the
  others).
- a node is held with DDS's finalizer `dds.cdi.dev/fabric-devices` from its first attach: the operator detaches only
  from a node that still exists, so a deleted node waits while DDS reclaims its devices (`deleted_nodes_to_reclaim`).

What the operator does (CoHDI composable-resource-operator, read in its source and checked against the running
operator in tests/integration/fabric and tests/e2e), and what this backend makes of it:
- a size decrease drops the chosen device from `status.resources` at once; its ComposableResource then goes Online
  (with a deletionTimestamp) -> Detaching (in-use check, fabric detach, node check) -> Deleting -> gone. A detach is
  therefore done when the ComposableResource object is *gone*, not when the status entry is; a resource with a
  deletionTimestamp is DETACHING, never counted Online.
- every reconcile error goes into `status.error` (request or resource) and is retried with backoff, cleared on
  success. An error ends an operation only once the operation has lasted `operator_error_bound_seconds` with the error
  still there: FAILED with that error (DeviceInUse when the operator found load on the GPU). A failed attach gives
  back what it could not attach (the size is lowered by the missing devices in the same write that records the
  outcome; the operator removes resources still Attaching before unannotated Online ones), so no device arrives
  later unplanned.
- the operator also waits *without* an error (a GPU the node never shows, one that never leaves it): past
  `operator_wait_bound_seconds` the operation ends FAILED (Timeout) naming each device's state; a device the fabric
  attached that the node never showed cannot be given back (the operator releases it only once it is visible) and is
  reported stranded.
- an Online resource whose `error` names a Critical device is FAILED (to be replaced); other errors on an Online
  resource (a Warning, a fabric read that failed) leave it Online and are logged.

Every change is a read-modify-write carrying the request's resourceVersion (409 Conflict -> read again). Idempotency:
each applied operation is recorded in the request's `dds.cdi.dev/operations` annotation (JSON, the newest
`MAX_RECORDED_OPERATIONS`), written in the same update as the size change, so a retried key or a restarted DDS finds it
and never changes the size twice. The record keeps the request's resource names at the time, which is how progress is
told apart: an attach is done when that many *new* resources are Online, a detach when that many old ones are gone.
A refusal decided before anything is written (too few free devices, no free slot) is remembered in memory only: nothing
was done, so re-deciding it after a restart is harmless.

Pools: the operator has no pool API, so capacity comes from configuration (settings.simulated_fabric.pools describes
what the CDI manager holds; a model is expected in one pool only) minus what requests hold: for each request
max(spec.size, resources in status), plus ComposableResources no request lists (being detached, or orphans).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

from dds import metrics
from dds.config import ComposabilitySettings, PoolSpec
from dds.crashpoints import crashpoint
from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, FabricDevice, FabricError, Operation,
                             OperationKind, OperationState, PoolState)
from dds.kube import ApiClient
from dds.kube.composability import (FIELD_MANAGER, GROUP, NODE_FINALIZER, REQUESTS, RESOURCES, VERSION,
                                    ComposabilityObjects, ObjectCache)
from dds.kube.errors import ApiError
from dds.model.cxl import is_cxl_model
from dds.model.events import NORMAL, WARNING, EventRecorder, ObjectRef

__all__ = ["GROUP", "VERSION", "REQUESTS", "RESOURCES", "ComposabilityRequestFabric", "request_name"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]
ANN_OPERATIONS = "dds.cdi.dev/operations"
# The operator's own names (composabilityrequest_controller.go): which resource a size decrease removes first, and the
# label tying a ComposableResource to its request.
ANN_DELETE_DEVICE = "cohdi.io/delete-device"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NODE = "dds.cdi.dev/node"
MANAGER = "dds"
MAX_RECORDED_OPERATIONS = 32
# A failed attach's record field: the resources it did not get, whose give-back waits (see `_owing_give_back`).
GIVE_BACK_OWED = "give_back_owed"
# Before DDS named its field manager, the kubernetes client's default (from its User-Agent) was recorded for its writes.
_DDS_MANAGERS = frozenset({FIELD_MANAGER, "OpenAPI-Generator"})
_CONFLICT_ATTEMPTS = 5
_MAX_NAME = 253

# ComposableResource status.state -> device state
# What the operator writes when the fabric reports a device broken, and when it finds work on a GPU it was told to detach
# (internal/cdi/fti/fm/client.go CheckResource, internal/utils/gpus.go CheckNoGPULoads).
_CRITICAL = "Critical"
_IN_USE = "found gpu load"
# What the operator writes while the target node has no (ready) GPU driver yet (internal/utils/gpus.go:
# EnsureGPUDriverExists, and getGPUInfoFromNvidiaPod behind nvidia-smi's visibility check and drain).
_NODE_NOT_READY = ("no nvidia driver found on node", "nvidia-driver-daemonset pod is not found on node",
                   "nvidia-driver-daemonset pod is not ready on node",
                   "nvidia-driver-daemonset pod is not running on node")
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


# Why this backend composes no CXL memory, as read in the pinned operator (CoHDI composable-resource-operator 38251b7,
# third_party/): its CRDs accept `type: cxlmemory` (api/v1alpha1/composabilityrequest_types.go:41,
# composableresource_types.go:28), but each of its CDI manager clients keeps GPUs only when it lists a node's devices
# (internal/cdi/fti/cm/client.go:344, internal/cdi/fti/fm/client.go:389 `if ... Type != "gpu" { continue }`;
# internal/cdi/nec/client.go:303 and 704-709 `isTargetTypeGPU`), and its upstream syncer makes every detach resource a
# GPU's (internal/controller/upstreamsyncer_controller.go:141-147: the NVIDIA driver check, "gpu" names). A memory
# request would be accepted and never seen attached: refused here instead, before anything is written.
CXL_MEMORY_REFUSAL = ("the CDI operator (composable-resource-operator 38251b7) attaches GPUs only: its CRDs accept "
                      "cxlmemory, but its fabric-manager clients list and attach GPU devices only; use the simulated "
                      "fabric for CXL memory (docs/cxl-memory.md)")


def refuse_cxl_memory(settings: ComposabilitySettings, pools: Sequence[PoolSpec]) -> None:
    """Raises ValueError naming the setting when the configuration asks this backend for CXL memory."""
    if settings.resource_type != "gpu":
        raise ValueError(f"composability.resource_type {settings.resource_type!r}: {CXL_MEMORY_REFUSAL}")
    for pool in pools:
        memory = sorted(model for model in pool.devices if is_cxl_model(model))
        if memory:
            raise ValueError(f"pool {pool.name!r} lists {', '.join(memory)}: {CXL_MEMORY_REFUSAL}")


class ComposabilityRequestFabric:
    """A `Fabric` on the CDI operator's ComposabilityRequest API; see the module docstring."""

    def __init__(self, api: ApiClient, settings: ComposabilitySettings, pools: Sequence[PoolSpec], *,
                 clock: Clock, name: str = "composability-request", cache: Optional[ObjectCache] = None,
                 events: Optional[EventRecorder] = None) -> None:
        """`cache`: the operator's objects watched (`ClusterCache.composability`); without it each query lists them.
        `events`: where what the operator does beside DDS's operations is reported (a refusal by its webhook, an
        over-attachment); logged only without it."""
        refuse_cxl_memory(settings, pools)
        self.name = name
        self._events = events
        self._objects = ComposabilityObjects(api, cache)
        self._settings = settings
        self._type = settings.resource_type
        self._clock = clock
        self._capacity, self._pool_of_model = _capacity_from(pools)
        self._slots = {p.name: p.max_slots_per_node for p in pools if p.max_slots_per_node is not None}
        self._refused: dict[str, Operation] = {}
        self._unstored: dict[str, dict[str, Any]] = {}  # outcomes reported whose write was refused, by key
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
            state = _device_state(resource)
            model = spec.get("model", "")
            out.append(FabricDevice(resource_name, model, self._pool_of_model.get(model, ""), target, state,
                                    serial=status.get("device_id") or None))
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
                self._check_sole_writer(request.key, name, request.node, request.model, existing)
                existing = self._settle_ended(name, existing)
                _check_operator_caught_up(f"attach {request.key}", name, existing, self._view().resources)
                refusal = self._refusal(request, existing)
                if refusal is not None:
                    self._refused[request.key] = refusal
                    return refusal
                self._hold_node(request.key, request.node)
                record = self._new_record(request.key, OperationKind.ATTACH, request.node, request.model,
                                          request.pool, request.count, existing)
                if self._write_size(name, existing, request.node, request.model, record, +request.count):
                    crashpoint("fabric.attach.accepted")  # the request's size and record written; not followed yet
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
            for _ in range(_CONFLICT_ATTEMPTS):
                existing = self._get_request(name)
                if existing is None:
                    raise FabricError(ErrorCode.NOT_FOUND, f"detach {request.key}: ComposabilityRequest {name} "
                                                           f"does not exist (devices not attached by DDS?)")
                record = _records(existing).get(request.key)
                if record is not None:
                    return self._operation_from(record, existing)
                _check_not_leaving(request.key, request.device_ids, self._view().resources)
                size = int(existing["spec"]["resource"].get("size", 0))
                if len(request.device_ids) > size:
                    raise FabricError(ErrorCode.INVALID, f"detach {request.key}: {len(request.device_ids)} devices "
                                                         f"asked, ComposabilityRequest {name} holds {size}")
                self._check_sole_writer(request.key, name, request.node, model, existing)
                existing = self._settle_ended(name, existing)
                if existing is None:
                    continue
                if request.force and self._cancels_hung_attaches(request, name, existing):
                    return self._follow_reclaimed(request, name, model)
                self._check_nothing_attaching(request.key, name, existing)
                _check_operator_caught_up(f"detach {request.key}", name, existing, self._view().resources)
                force = request.force and len(request.device_ids) == size
                if request.force and not force:
                    log.info("detach %s: forced, but the request keeps devices, so the operator's in-use check "
                             "applies (see _mark_for_removal)", request.key)
                record = self._new_record(request.key, OperationKind.DETACH, request.node, model,
                                          self._pool_of_model.get(model, ""), len(request.device_ids), existing)
                record["asked"] = list(request.device_ids)
                written = False
                try:
                    self._mark_for_removal(request.key, request.device_ids, force)
                    written = self._write_size(name, existing, request.node, model, record, -len(request.device_ids))
                finally:
                    if not written:  # a mark left behind would make a later decrease take these devices
                        self._unmark(request.key, request.device_ids)
                if written:
                    crashpoint("fabric.detach.accepted")
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
        requests = self._our_requests()
        out = [self._operation_from(record, request)
               for request in requests for record in _records(request).values()]
        for request in requests:
            if _over_attached(request):  # read again: the outcomes just stored changed it
                self._correct_over_attachment(self._get_request(request["metadata"]["name"]))
        with self._lock:
            out.extend(self._refused.values())
        return tuple(out)

    def close(self) -> None:
        """Nothing to release: the requests are the state."""

    def deleted_nodes_to_reclaim(self, candidates: Collection[str]) -> set[str]:
        """Of `candidates` (nodes the cluster shows marked for deletion), those being deleted that still hold devices
        DDS asked for: DDS must detach those now. A node being deleted that holds none is let go here (DDS's
        finalizer removed), so its deletion completes.

        Why the finalizer: when a Node is gone the operator deletes its ComposableResources *without* calling the
        fabric (it finds the node's fabric machine through the Node), so the devices would stay attached in the fabric
        with nothing left in the cluster to show them. DDS adds NODE_FINALIZER to a node before its first attach
        there; a deleted node then waits, still a Node, while DDS detaches its devices through the operator as any
        detach (the orphan reclaim), and goes once none is left."""
        if not candidates:
            return set()
        view = self._view()
        ours = {name for name, request in view.requests.items() if _labels(request).get(LABEL_MANAGED_BY) == MANAGER}
        holding: set[str] = set()
        for resource in view.resources.values():  # DDS's devices, to the last one gone (detaching ones too)
            if _labels(resource).get(LABEL_MANAGED_BY) in ours:
                holding.add((resource.get("spec") or {}).get("target_node") or "")
        for name in ours:  # and what DDS asked for that the operator has not created yet
            node, _ = _targets(view.requests[name])
            if node and int(view.requests[name]["spec"]["resource"].get("size", 0)) > 0:
                holding.add(node)
        to_reclaim = set()
        for node in sorted(set(candidates)):
            try:
                hold = self._objects.node_hold(node)
                if hold is None or not hold.held or not hold.deleting:
                    continue
                if node in holding:
                    to_reclaim.add(node)
                    continue
                self._objects.release_node(node)
            except ApiError as exc:
                raise _api_error(f"release node {node} (finalizer {NODE_FINALIZER})", exc) from exc
            log.info("node %s is being deleted and holds no device of DDS's any more: finalizer %s removed", node,
                     NODE_FINALIZER)
        return to_reclaim

    # --- deciding ---
    def _check_sole_writer(self, key: str, name: str, node: str, model: str, existing: Optional[dict[str, Any]]) -> None:
        """Refuse to share a node's devices with another autoscaler. CoHDI's dynamic-device-scaler finds requests by
        (node, model) and resizes whichever it finds: it would adopt DDS's request (and DDS its), each undoing the
        other's decisions. Its own requests are named `composability-*`; a resize of DDS's request by any other field
        manager shows in managedFields."""
        rivals = sorted(n for n, r in self._view().requests.items()
                        if n != name and _targets(r) == (node, model) and _labels(r).get(LABEL_MANAGED_BY) != MANAGER)
        if rivals:
            raise FabricError(ErrorCode.INVALID, (
                f"{key}: {node} already has ComposabilityRequest(s) {', '.join(rivals)} for {self._type} {model} that "
                f"DDS did not create (CoHDI's dynamic-device-scaler, or a person). Two writers would undo each other's "
                f"sizes, so DDS leaves this node's {model} alone: delete those requests or stop the other scaler on "
                f"this node"))
        others = sorted(_size_writers(existing) - _DDS_MANAGERS) if existing else []
        if others:
            raise FabricError(ErrorCode.INVALID, (
                f"{key}: spec.resource.size of ComposabilityRequest {name} was also set by {', '.join(others)} "
                f"(CoHDI's dynamic-device-scaler adopts requests by node and model). Two writers would undo each "
                f"other's sizes, so DDS stops changing it: stop the other writer on {node}, then delete the request's "
                f"managedFields entry for it or recreate the request"))

    def _cancels_hung_attaches(self, request: DetachRequest, name: str, existing: dict[str, Any]) -> bool:
        """A forced detach of devices still attaching (the orphan reclaim of a hung attach): end the attaches running
        on the request now, as their wait bound would, which gives back what they did not get (the operator removes
        resources still Attaching before unmarked Online ones). True when that was done; the detach then only follows
        the devices out (recorded without a size change of its own). False when a device asked is not attaching or
        no attach runs: the ordinary detach rules apply."""
        resources = self._view().resources
        asked = [resources.get(d) for d in request.device_ids]
        if not all(r is not None and _labels(r).get(LABEL_MANAGED_BY) == name
                   and _device_state(r) == DeviceState.ATTACHING for r in asked):
            return False
        running = [r for r in _records(existing).values()
                   if "state" not in r and r.get("kind") == OperationKind.ATTACH.value]
        if not running or _not_picked_up(name, resources):
            return False  # a resource in state "" would go after the Online ones: the ordinary refusal applies
        now = self._clock()
        for record in running:
            outcome = _outcome(record, existing, resources, now, self._settings.operator_error_bound_seconds,
                               wait_bound=self._settings.operator_wait_bound_seconds,
                               ended_by=f"cancelled by the forced detach {request.key} ({request.reason})")
            if outcome is None:
                continue
            current = self._get_request(name)
            if current is None or "state" in _records(current).get(record["key"], {"state": ""}):
                continue
            if not self._remember_result(current, {**record, **outcome, "finished_at": now}):
                raise FabricError(ErrorCode.BACKEND, f"detach {request.key}: could not end the hung attach "
                                                     f"{record['key']} on ComposabilityRequest {name}; try again")
        return True

    def _follow_reclaimed(self, request: DetachRequest, name: str, model: str) -> Operation:
        """The forced detach of a hung attach's devices, once that attach has given them back: recorded without a
        size change of its own, done when they are gone."""
        for _ in range(_CONFLICT_ATTEMPTS):
            current = self._get_request(name)
            if current is None:
                raise FabricError(ErrorCode.NOT_FOUND, f"detach {request.key}: ComposabilityRequest {name} is gone")
            record = _records(current).get(request.key)
            if record is not None:
                return self._operation_from(record, current)
            record = self._new_record(request.key, OperationKind.DETACH, request.node, model,
                                      self._pool_of_model.get(model, ""), len(request.device_ids), current)
            record.update(before=sorted(request.device_ids), asked=list(request.device_ids),
                          target=int(current["spec"]["resource"].get("size", 0)))
            if self._write_size(name, current, request.node, model, record, 0):
                return self._operation_from(record, self._get_request(name))
        raise FabricError(ErrorCode.BACKEND, f"ComposabilityRequest {name} kept changing; detach {request.key} "
                                             f"not recorded (the hung attach it reclaims has ended)")

    def _check_nothing_attaching(self, key: str, name: str, existing: dict[str, Any]) -> None:
        """The operator removes resources still Attaching before the ones marked for removal (and one in state "" only
        after the Online ones): lowering the size while an attach is in flight would cancel that attach, or take a GPU
        in use, instead of releasing the devices asked for."""
        view = self._view()
        attaching = sorted(n for n, r in view.resources.items()
                           if _labels(r).get(LABEL_MANAGED_BY) == name and _device_state(r) == DeviceState.ATTACHING)
        listed = ((existing.get("status") or {}).get("resources") or {})
        attaching += sorted(n for n, r in listed.items() if n not in view.resources and r.get("state") != "Online")
        size = int(existing["spec"]["resource"].get("size", 0))
        if attaching or len(listed) < size:
            waiting = ", ".join(attaching) or f"{size - len(listed)} not created yet"
            raise FabricError(ErrorCode.BACKEND, f"detach {key}: ComposabilityRequest {name} still has devices on "
                                                 f"their way ({waiting}); the operator would cancel those instead "
                                                 f"of the ones asked for, so the detach waits for them")

    def _mark_for_removal(self, key: str, device_ids: Sequence[str], force: bool) -> None:
        """Annotate the chosen devices so the operator removes them first; `force`: every device of the request goes,
        and the operator is to skip its in-use check for them (spec.force_detach). A force is only honoured when the
        whole request is emptied: while the size stays above 0 the operator replaces any resource whose force_detach
        differs from the request's, so forcing a few would also replace others (then it is sent as a normal detach)."""
        for device_id in device_ids:
            try:
                found = self._objects.annotate_resource(device_id, {ANN_DELETE_DEVICE: "true"})
                if found and force:
                    found = self._objects.force_detach_resource(device_id)
            except ApiError as exc:
                raise _api_error(f"detach {key}: mark ComposableResource {device_id} for removal", exc) from exc
            if not found:
                raise FabricError(ErrorCode.NOT_FOUND, f"detach {key}: ComposableResource {device_id} is gone")

    def _unmark(self, key: str, device_ids: Sequence[str]) -> None:
        """Take the removal mark and force flag off devices whose size change did not happen (or failed): left on, a
        later decrease would take them first, and a force flag differing from the request's makes the operator replace
        the resource. Best effort: a device gone meanwhile needs nothing, an error is logged with what is left."""
        for device_id in device_ids:
            try:
                if self._objects.annotate_resource(device_id, {ANN_DELETE_DEVICE: None}):
                    self._objects.force_detach_resource(device_id, False)
            except ApiError as exc:
                log.warning("detach %s: could not clear the removal mark of ComposableResource %s (%s %s); a later "
                            "size decrease would take it first", key, device_id, exc.status, exc.reason)

    def _hold_node(self, key: str, node: str) -> None:
        """DDS's finalizer on the node before any device is asked for it: see `deleted_nodes_to_reclaim`."""
        try:
            hold = self._objects.hold_node(node)
        except ApiError as exc:
            raise _api_error(f"attach {key}: add finalizer {NODE_FINALIZER} to node {node}", exc) from exc
        if hold is None:
            raise FabricError(ErrorCode.NOT_FOUND, f"attach {key}: node {node} does not exist")
        if hold.deleting:
            raise FabricError(ErrorCode.INVALID, f"attach {key}: node {node} is being deleted")

    def _validate_attach(self, request: AttachRequest) -> None:
        if is_cxl_model(request.model):
            raise FabricError(ErrorCode.INVALID, f"attach {request.key}: {request.model}: {CXL_MEMORY_REFUSAL}")
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
            other = self._webhook_refused(exc, name, node, f"{record['kind']} {record['key']}")
            if other:
                raise FabricError(ErrorCode.INVALID, f"{record['kind']} {record['key']}: the operator's webhook "
                                                     f"refused ComposabilityRequest {name} because of {other} "
                                                     f"({exc.message})") from exc
            raise _api_error(f"write ComposabilityRequest {name}", exc) from exc

    def _correct_over_attachment(self, request: Optional[dict[str, Any]]) -> None:
        """A settled request holding more devices than its size (the operator put new resources on top of entries it
        had not created yet: `_check_operator_caught_up` keeps DDS from causing it, another writer or an older DDS may
        not have): the size is raised to what is attached, so the request describes the node again and the extra GPU
        is an ordinary idle one scale-down releases; said in a warning Event on the node."""
        extra = _over_attached(request) if request is not None else 0
        if request is None or not extra or any(_open(r) for r in _records(request).values()):
            return
        name = request["metadata"]["name"]
        node, model = _targets(request)
        size = int(request["spec"]["resource"].get("size", 0))
        body = json.loads(json.dumps(request))
        body["spec"]["resource"]["size"] = size + extra
        try:
            if not self._objects.replace_request(name, body):
                return  # changed meanwhile: judged again on the next read
        except ApiError as exc:
            log.warning("ComposabilityRequest %s holds %d device(s) more than its size %d; raising the size failed: "
                        "%s %s", name, extra, size, exc.status, exc.reason)
            return
        message = (f"ComposabilityRequest {name} holds {size + extra} {model} device(s) where its size said {size} "
                   f"(the operator attached {extra} more than asked); its size is now {size + extra}, so the extra "
                   f"GPU is counted on {node} and released when idle")
        log.warning(message)
        if self._events is not None and node:
            self._events.emit(ObjectRef("Node", node), WARNING, "OverAttached", message)

    def _webhook_refused(self, exc: ApiError, name: str, node: str, what: str) -> str:
        """When the operator's admission webhook refused a write of DDS's request because another writer's request
        holds the same node, type and model: say so (a warning Event on the node, a metric naming the other request,
        a log line) and return the other request's name; "" for any other error."""
        other = _webhook_rival(exc)
        if not other:
            return ""
        message = (f"the CDI operator's webhook refused DDS's write of ComposabilityRequest {name} ({what}): "
                   f"{other} (another writer's) is for the same node, type and model; DDS cannot change {name} "
                   f"while it exists: delete it or stop its writer on {node}")
        log.warning(message)
        metrics.OPERATOR_WEBHOOK_REFUSALS.labels(other).inc()
        if self._events is not None:
            self._events.emit(ObjectRef("Node", node), WARNING, "OperatorWebhookRefused", message)
        return other

    def _settle_ended(self, name: str, existing: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """Store the outcome of every operation on the request that has ended, before a new one is recorded: the new
        one changes what the request shows, and an outcome first read after that would be read from another world
        (an attach counting a device a later attach brought); and give back what failed attaches owe, once it can be.
        Returns the request as it is now."""
        for key, record in sorted(_records(existing).items()):
            if not _open(record):
                continue
            current = self._get_request(name)
            record = _records(current).get(key)
            if current is None or record is None or not _open(record):
                continue
            self._operation_from(record, current)
        return self._get_request(name) if existing is not None else None

    def _remember_result(self, request: dict[str, Any], record: dict[str, Any]) -> bool:
        """Store a finished operation's outcome in the annotation, so it stays stable as the request moves on. True
        when it is stored (by this call or another). A failed detach's marks come off the devices the operator kept."""
        if record.get("kind") == OperationKind.DETACH.value and record.get("state") == OperationState.FAILED.value:
            resources = self._view().resources
            kept = [d for d in record.get("asked", ()) if d in resources
                    and not _deleting(resources[d])]
            self._unmark(record["key"], kept)
        body = self._with_result(request, record)
        # Not stored now (an error, or conflicts throughout): the outcome is computed again on the next read.
        name = request["metadata"]["name"]
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                if self._objects.replace_request(name, body):
                    return True
            except ApiError as exc:
                if not self._webhook_refused(exc, name, record["node"], f"record the outcome of {record['key']}"):
                    log.debug("could not record the outcome of %s: %s", record["key"], exc.status)
                return False
            fresh = self._get_request(name)  # the operator wrote its status meanwhile: apply the record again
            if fresh is None or _stored(_records(fresh).get(record["key"]), record):
                return fresh is not None
            body = self._with_result(fresh, record)
        log.debug("could not record the outcome of %s: 409 on every attempt", record["key"])
        return False

    def _end_if_ended(self, record: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        """The running operation's record with its outcome when it has ended, stored; an outcome whose write is
        refused (the operator's webhook, conflicts throughout) is kept in memory, so what was reported stays so."""
        now = self._clock()
        resources = self._view().resources
        outcome = _outcome(record, request, resources, now, self._settings.operator_error_bound_seconds,
                           wait_bound=self._settings.operator_wait_bound_seconds)
        if outcome is None:
            return record
        record = {**record, **outcome, "finished_at": now}
        unpicked = _not_picked_up(request["metadata"]["name"], resources)
        if _not_attached(record) and unpicked:
            record = _owing_give_back(record, request, resources, unpicked)
        if not self._remember_result(request, record):
            # Stored later, its give-back owed: by then what it did not get may have come Online.
            owed = {GIVE_BACK_OWED: _owed(record, request, resources)} if _not_attached(record) else {}
            self._unstored[record["key"]] = {**record, **owed}
        return record

    def _give_back_owed(self, record: dict[str, Any], request: dict[str, Any]) -> None:
        """A failed attach's give-back, stored as owed while a resource of its request was in state "" (the operator
        would have removed a GPU in use for it), once none is: what came Online meanwhile stays as an ordinary device
        (released when idle; said in a `LateAttach` Event), what did not is marked and the size lowered for it. Its
        outcome stays what was reported. One the operator has taken up and is attaching without an error is waited
        for too: lowered under it, the size would cancel an attach the fabric may be completing, whose device would
        then arrive with no resource to hold it. The wait has an end: `operator_wait_bound_seconds` after the attach
        ended (a hung operator worker never takes the resource up), see `_stranded_by_give_back`."""
        name = request["metadata"]["name"]
        resources = self._view().resources
        unpicked = _not_picked_up(name, resources)
        owed = list(record[GIVE_BACK_OWED])
        attaching = _attaching_without_error(owed, resources)
        overdue = self._clock() - float(record.get("finished_at", record["started_at"])) >= \
            self._settings.operator_wait_bound_seconds
        if (unpicked or attaching) and not overdue:
            log.debug("attach %s on %s: the give-back it owes waits until the operator has taken up %s and "
                      "finished attaching %s", record["key"], record["node"], ", ".join(unpicked) or "all",
                      ", ".join(attaching) or "all")
            return
        arrived = [n for n in owed if n in resources and _device_state(resources[n]) == DeviceState.ONLINE]
        settled = {k: v for k, v in record.items() if k != GIVE_BACK_OWED}
        if arrived:
            settled["arrived_late"] = arrived
        stranded = _stranded_by_give_back(name, owed, arrived, unpicked, resources)
        if stranded:
            settled["stranded"] = stranded
        marked = [n for n in owed if n in resources and n not in arrived and n not in stranded]
        stored = False
        try:  # marked: should one come Online before the operator reads the size, it is still the one removed
            self._mark_for_removal(record["key"], marked, force=False)
            stored = self._remember_result(request, settled)
        finally:
            if not stored:
                self._unmark(record["key"], marked)
        if stored and (unpicked or attaching):
            self._report_overdue_give_back(settled, request, [n for n in owed if n not in arrived], unpicked,
                                           attaching, stranded)
        if stored and arrived:
            message = (f"{', '.join(arrived)} of the failed attach {record['key']} came Online on {record['node']} "
                       f"after the attach had ended (its resource was not taken up by the operator until then): "
                       f"kept as an ordinary {record['model']} GPU of the node, released when idle; the attach "
                       f"stays failed")
            log.info(message)
            if self._events is not None:
                self._events.emit(ObjectRef("Node", record["node"]), NORMAL, "LateAttach", message)

    def _report_overdue_give_back(self, record: dict[str, Any], request: dict[str, Any], owed: Sequence[str],
                                  unpicked: Sequence[str], attaching: Sequence[str], stranded: Sequence[str]) -> None:
        """The owed give-back of a failed attach written past its bound while the operator still had not taken up
        `unpicked` or finished `attaching`: said in a warning Event on the node naming the request, the operator's
        state and what became of each device; the ones left in the request (`stranded`) counted in
        dds_gpus_stranded_total."""
        name = request["metadata"]["name"]
        state = (request.get("status") or {}).get("state") or "with no state"
        if stranded:
            fate = (f"{', '.join(stranded)} stranded: left in the request's size, since lowering it would make the "
                    f"operator remove a device it has taken up (one in state \"\" goes last), maybe a GPU in use; "
                    f"counted as attaching until the operator takes it up (then an ordinary GPU, released when "
                    f"idle)")
        elif unpicked:
            fate = "the request holds nothing else, so the size was lowered for them: given back"
        else:
            fate = "given back (the size lowered; marked for removal)"
        waits = [f"has not taken up {', '.join(unpicked)} (state \"\")"] if unpicked else []
        waits += [f"has not finished attaching {', '.join(attaching)} (no error)"] if attaching else []
        message = (f"the failed attach {record['key']} on {record['node']} owed the give-back of "
                   f"{', '.join(owed) or 'its devices'}; the CDI operator {' and '.join(waits)} of "
                   f"ComposabilityRequest {name} ({state}) "
                   f"{self._settings.operator_wait_bound_seconds:g} s after the attach ended "
                   f"(operator_wait_bound_seconds): {fate}; size changes on {name} are no longer held for it")
        log.warning(message)
        if stranded:
            metrics.GPUS_STRANDED.inc(len(stranded))
        if self._events is not None:
            self._events.emit(ObjectRef("Node", record["node"]), WARNING, "GiveBackOverdue", message)

    @staticmethod
    def _with_result(request: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        """The request with the finished operation's record stored (and what a failed attach did not get given back,
        in the same write: the operator removes resources still Attaching before unannotated Online ones, so nothing
        arrives later that no plan asked for; see `_not_picked_up` for the one state it removes last)."""
        body = json.loads(json.dumps(request))
        records = _records(request)
        records[record["key"]] = record
        body["metadata"].setdefault("annotations", {})[ANN_OPERATIONS] = json.dumps(_bounded(list(records.values())))
        missing = _to_give_back(record)
        if missing:
            resource = body["spec"]["resource"]
            resource["size"] = max(0, int(resource.get("size", 0)) - missing)
            log.warning("attach %s on %s failed (%s); giving back %d device(s) the operator had not attached",
                        record["key"], record["node"], record.get("error", ""), missing)
        return body

    # --- reading ---
    def _operation_from(self, record: dict[str, Any], request: Optional[dict[str, Any]]) -> Operation:
        if "state" not in record and request is not None:
            reported = self._unstored.get(record["key"])
            if reported is not None:  # reported before, its write refused: the same outcome, stored now if it can be
                record = reported
                if self._remember_result(request, record):
                    self._unstored.pop(record["key"], None)
            else:
                record = self._end_if_ended(record, request)
        elif GIVE_BACK_OWED in record and request is not None:
            self._give_back_owed(record, request)
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
    """The newest MAX_RECORDED_OPERATIONS records; running ones, and failed attaches still owing a give-back, are
    never dropped."""
    finished = [r for r in records if not _open(r)]
    still_open = [r for r in records if _open(r)]
    keep = max(0, MAX_RECORDED_OPERATIONS - len(still_open))
    kept = {r["key"] for r in finished[-keep:]} if keep else set()
    return [r for r in records if _open(r) or r["key"] in kept]


def _open(record: dict[str, Any]) -> bool:
    """Whether DDS still has something to write for the operation: it runs, or it failed owing a give-back."""
    return "state" not in record or GIVE_BACK_OWED in record


def _outcome(record: dict[str, Any], request: dict[str, Any], resources: Mapping[str, dict[str, Any]], now: float,
             error_bound: float, *, wait_bound: float, ended_by: str = "") -> Optional[dict[str, Any]]:
    """The end of an operation as the operator's objects show it, or None while it is still running.

    `resources`: the ComposableResources by name. An error ends the operation only past `error_bound` seconds (the
    operator retries every error and clears it on success); an operation still running past `wait_bound` seconds
    without one ends too (Timeout), naming where each of its devices stands: the operator waits without an error for
    a GPU to show on the node or to leave it, and never gives up. An attach's devices are the first `count` resources
    the operator created for the request after it started, less those an earlier attach on the same request takes:
    two attaches started before the operator listed either's resources would otherwise both count the first one.
    `ended_by`: why a running operation ends now whatever the bounds (a forced reclaim of its devices)."""
    status = request.get("status") or {}
    listed: dict[str, dict[str, Any]] = status.get("resources") or {}
    name = (request.get("metadata") or {}).get("name", "")
    before = set(record.get("before", ()))
    count = int(record["count"])
    if record["kind"] == OperationKind.ATTACH.value:
        ours, mine = _claim_of(record, request, resources)
        done = [n for n in mine if n in ours and _device_state(ours[n]) == DeviceState.ONLINE]
        errors = [_error_of(n, ours.get(n), listed.get(n)) for n in mine]
    else:
        # A device is released when its ComposableResource is gone: the status entry goes at once, the device later.
        done = sorted(n for n in before if n not in listed and n not in resources)
        errors = [_error_of(n, resources.get(n), None) for n in sorted(before) if n in resources]
    if len(done) >= count:
        asked = [n for n in record.get("asked", ()) if n in done]
        return _done(OperationState.SUCCEEDED, (asked + [n for n in done if n not in asked])[:count])
    messages = [e for e in errors if e]
    if status.get("error"):
        messages.append(f"{name}: {status['error']}")
    lasted = now - float(record["started_at"])
    # A node that has no GPU driver yet is a wait, not a failure: on a real node the driver comes minutes after the
    # node's first GPU (feature discovery labels the node, the GPU operator installs the driver).
    waits = [m for m in messages if any(w in m for w in _NODE_NOT_READY)]
    messages = [m for m in messages if m not in waits]
    if messages and lasted >= error_bound:
        in_use = record["kind"] == OperationKind.DETACH.value and any(_IN_USE in m for m in messages)
        retrying = " (the operator keeps retrying it)" if record["kind"] == OperationKind.DETACH.value else ""
        return _done(OperationState.FAILED, done, ErrorCode.DEVICE_IN_USE if in_use else ErrorCode.BACKEND,
                     f"still failing after {error_bound:g} s{retrying}: " + "; ".join(messages))
    if lasted >= wait_bound or ended_by:
        if record["kind"] == OperationKind.ATTACH.value:
            waiting = _attach_waits(mine, ours, count - len(done), done)
        else:
            waiting = _detach_waits(sorted(before - set(done)), resources, listed)
        quiet = (f"for the node: {'; '.join(waits)}" if waits else
                 f"(errors it retries: {'; '.join(messages)})" if messages else "without an error")
        why = (f"{ended_by} after {lasted:.0f} s" if ended_by else
               f"the operator has waited {lasted:.0f} s {quiet} (operator_wait_bound_seconds {wait_bound:g})")
        return _done(OperationState.FAILED, done, ErrorCode.TIMEOUT,
                     f"{why}; request {name} {status.get('state') or 'with no state yet'}: {waiting}")
    return None


def _attach_waits(mine: Sequence[str], ours: Mapping[str, dict[str, Any]], missing: int,
                  done: Sequence[str]) -> str:
    """Where an overdue attach's devices stand, and what becomes of them: the ones it did not get are given back (the
    size lowered); one the fabric attached that the node never showed stays attached (the operator detaches a
    resource only once it was Online or failed), so it is reported stranded."""
    parts, stranded = [], []
    for name in mine:
        if name in done:
            continue
        status = (ours.get(name) or {}).get("status") or {}
        state, device = status.get("state") or "", status.get("device_id") or ""
        if name not in ours:
            parts.append(f"{name} listed, not created yet")
        elif state == "Attaching" and device:
            parts.append(f"{name} Attaching: device {device} attached in the fabric, not visible on the node")
            stranded.append(f"{device} ({name})")
        else:
            known = f", device {device}" if device else ""
            parts.append(f"{name} {state or 'not picked up by the operator'}{known}")
    unseen = missing - len(parts)
    if unseen > 0:
        parts.append(f"{unseen} not created yet")
    text = "; ".join(parts) + f"; giving back the {missing} not attached"
    if stranded:
        text += (f"; stranded: {', '.join(stranded)} stays attached to the node until it shows there (the operator "
                 f"releases it only then): check the node's GPU driver")
    return text


def _detach_waits(left: Sequence[str], resources: Mapping[str, dict[str, Any]],
                  listed: Mapping[str, dict[str, Any]]) -> str:
    """Where an overdue detach's devices stand: each one still there stays counted as detaching (stranded) until the
    operator lets it go."""
    parts = []
    for name in left:
        if name in listed and name not in resources:
            parts.append(f"{name} still listed by the request")
            continue
        status = (resources.get(name) or {}).get("status") or {}
        state, device = status.get("state") or "", status.get("device_id") or ""
        if state == "Detaching" and device:
            where = f"device {device} being drained or removed, or still visible on the node"
        elif state == "Deleting":
            where = "off the fabric, its finalizer not yet removed"
        else:
            where = f"device {device or 'unknown'} not yet taken up for detaching"
        parts.append(f"{name} {state or 'with no state'}: {where}")
    return "; ".join(parts) + "; stranded: counted as detaching until the operator lets them go"


def _claim_of(record: dict[str, Any], request: dict[str, Any],
              resources: Mapping[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """An attach's request's ComposableResources by name, and the ones the attach counts as its own."""
    name = (request.get("metadata") or {}).get("name", "")
    ours = {n: r for n, r in resources.items() if _labels(r).get(LABEL_MANAGED_BY) == name}
    return ours, _attach_claim(record, request, ours, _taken_by_earlier(record, request, ours))


def _attach_claim(record: dict[str, Any], request: dict[str, Any], ours: Mapping[str, dict[str, Any]],
                  taken: Collection[str]) -> list[str]:
    """The resources an attach counts as its own: `count` of those the operator listed for the request since the
    attach started, not `taken` by an earlier attach. It takes first the ones a later attach had already seen when it
    started (that attach cannot count them), then the oldest (creation times have whole seconds only: ties go by
    name); entries listed before their object exists come last."""
    listed = ((request.get("status") or {}).get("resources") or {})
    candidates = (set(listed) | set(ours)) - set(record.get("before", ())) - set(taken)
    seen_by_later = set()
    for other in _records(request).values():
        if other.get("kind") == OperationKind.ATTACH.value and _start_order(other) > _start_order(record):
            seen_by_later.update(other.get("before", ()))

    def preference(name: str) -> tuple[int, str, str]:
        created = ((ours.get(name) or {}).get("metadata") or {}).get("creationTimestamp") or "~"
        return (0 if name in seen_by_later else 1), created, name

    return sorted(candidates, key=preference)[:int(record["count"])]


def _start_order(record: dict[str, Any]) -> tuple[float, str]:
    return float(record.get("started_at", 0.0)), str(record.get("key", ""))


def _taken_by_earlier(record: dict[str, Any], request: dict[str, Any],
                      ours: Mapping[str, dict[str, Any]]) -> frozenset[str]:
    """The resources the attaches started before `record` on the same request hold: a finished one its devices, a
    running one its claim (in start order, each after the ones before it)."""
    taken: set[str] = set()
    for other in sorted(_records(request).values(), key=_start_order):
        if _start_order(other) >= _start_order(record):
            break
        if other.get("kind") != OperationKind.ATTACH.value:
            continue
        if "state" in other:  # its devices, and those it did not get that are owed back or came late
            taken.update(other.get("devices", ()), other.get(GIVE_BACK_OWED, ()), other.get("arrived_late", ()),
                         other.get("stranded", ()))
        else:
            taken.update(_attach_claim(other, request, ours, taken))
    return frozenset(taken)


def _check_operator_caught_up(what: str, name: str, existing: Optional[dict[str, Any]],
                              resources: Mapping[str, dict[str, Any]]) -> None:
    """Refuse (retryably) a size change the operator could not take apart from the last one: until it has taken up
    the size last written (status.scalarResource), listed its entries for it (it writes the size taken up when it
    *enters* NodeAllocating, the entries when it leaves it) and created a ComposableResource for every entry it listed,
    a new size is counted against the objects alone, and the entries without one get new ones on top: more devices
    attached than the size says (composabilityrequest_controller.go, NodeAllocating then Updating)."""
    if existing is None:
        return
    owing = sorted(k for k, r in _records(existing).items() if GIVE_BACK_OWED in r)
    if owing:
        raise FabricError(ErrorCode.BACKEND, f"{what}: the failed attach {', '.join(owing)} on ComposabilityRequest "
                                             f"{name} still owes its give-back (written once the operator has taken "
                                             f"up every resource of the request); a size change now could be the one "
                                             f"given back, so it waits")
    status = existing.get("status") or {}
    size = int(existing["spec"]["resource"].get("size", 0))
    taken_up = (status.get("scalarResource") or {}).get("size")
    allocating = status.get("state") == "NodeAllocating"
    uncreated = sorted(n for n in (status.get("resources") or {}) if n not in resources)
    if taken_up is not None and int(taken_up) == size and not allocating and not uncreated:
        return
    if taken_up is None or int(taken_up) != size:
        waiting = f"it has not taken up size {size} yet (it works on {taken_up if taken_up is not None else 'none'})"
    elif allocating:
        waiting = f"it is still listing the devices of size {size} (NodeAllocating)"
    else:
        waiting = f"{', '.join(uncreated)} listed but not created yet"
    raise FabricError(ErrorCode.BACKEND, f"{what}: the operator is still applying the last size change of "
                                         f"ComposabilityRequest {name} ({waiting}); a second one now could attach "
                                         f"more devices than the size says, so it waits")


def _check_not_leaving(key: str, device_ids: Sequence[str], resources: Mapping[str, dict[str, Any]]) -> None:
    """Refuse to detach a device already on its way out (its ComposableResource being deleted: a detach under way, or
    one that failed and the operator keeps retrying, such as a GPU drain that fails): the operator dropped it from the
    request when the size was lowered for it, so lowering the size again would take another device, one DDS did not
    choose. As the simulated fabric does, INVALID: nothing to retry, the first detach's end decides."""
    leaving = sorted(d for d in device_ids if d in resources and _device_state(resources[d]) == DeviceState.DETACHING)
    if leaving:
        raise FabricError(ErrorCode.INVALID, f"detach {key}: {', '.join(leaving)} already being detached (its "
                                             f"ComposableResource is being deleted; the operator finishes that "
                                             f"detach); lowering the size again would take another device")


def _deleting(resource: dict[str, Any]) -> bool:
    return bool((resource.get("metadata") or {}).get("deletionTimestamp"))


def _live_of(name: str, resources: Mapping[str, dict[str, Any]]) -> list[str]:
    """The ComposableResources of request `name` not being deleted, by name."""
    return sorted(n for n, r in resources.items() if _labels(r).get(LABEL_MANAGED_BY) == name and not _deleting(r))


def _not_picked_up(name: str, resources: Mapping[str, dict[str, Any]]) -> list[str]:
    """The request's ComposableResources its resource controller has not taken up yet (state "", no deletion): the
    operator's removal order puts them last, after Online ones."""
    return [n for n in _live_of(name, resources) if not (resources[n].get("status") or {}).get("state")]


def _attaching_without_error(names: Collection[str], resources: Mapping[str, dict[str, Any]]) -> list[str]:
    """Of `names`, the ComposableResources the operator has taken up and is attaching with no error (its fabric call
    or its wait for the node under way), not being deleted."""
    return sorted(n for n in names if n in resources and not _deleting(resources[n])
                  and (resources[n].get("status") or {}).get("state") == "Attaching"
                  and not (resources[n].get("status") or {}).get("error"))


def _stranded_by_give_back(name: str, owed: Sequence[str], arrived: Collection[str], unpicked: Collection[str],
                           resources: Mapping[str, dict[str, Any]]) -> list[str]:
    """Of a failed attach's owed resources, those its give-back cannot take once it is overdue: the ones still in
    state "" (`unpicked`) when the request holds anything else the operator would remove before them (its removal
    order puts state "" last: an Online GPU, maybe in use, would go instead). When the request holds nothing but
    the owed resources not Online, lowering the size removes exactly those: nothing is stranded."""
    if not set(_live_of(name, resources)) - (set(owed) - set(arrived)):
        return []
    return [n for n in owed if n in unpicked]


def _over_attached(request: dict[str, Any]) -> int:
    """How many more devices the operator keeps for a settled request than its size says (0 when none or while it
    still works on the request): it listed more entries than the size it took up."""
    status = request.get("status") or {}
    size = int(((request.get("spec") or {}).get("resource") or {}).get("size", 0))
    taken_up = (status.get("scalarResource") or {}).get("size")
    if status.get("state") != "Running" or taken_up is None or int(taken_up) != size:
        return 0
    return max(0, len(status.get("resources") or {}) - size)


_WEBHOOK_RIVAL = re.compile(r"admission webhook .*denied the request: composabilityRequest resource (\S+) with type")


def _webhook_rival(exc: ApiError) -> str:
    """The other request named by the operator's webhook when it refused a write (its "already exists" check), or ""."""
    found = _WEBHOOK_RIVAL.search(exc.message or exc.body or "")
    return found.group(1) if found else ""


def _error_of(name: str, resource: Optional[dict[str, Any]], listed: Optional[dict[str, Any]]) -> str:
    error = ((resource or {}).get("status") or {}).get("error") or (listed or {}).get("error") or ""
    return f"{name}: {error}" if error else ""


def _not_attached(record: dict[str, Any]) -> int:
    """How many devices a finished attach did not get (0 for anything else)."""
    if record.get("kind") != OperationKind.ATTACH.value or record.get("state") != OperationState.FAILED.value:
        return 0
    return max(0, int(record["count"]) - len(record.get("devices", ())))


def _stored(stored: Optional[dict[str, Any]], record: dict[str, Any]) -> bool:
    """Whether `stored` (the record as the request holds it) already has what writing `record` would store: its
    outcome, and its owed give-back settled when `record` settles it."""
    if stored is None or "state" not in stored:
        return False
    return GIVE_BACK_OWED in record or GIVE_BACK_OWED not in stored


def _to_give_back(record: dict[str, Any]) -> int:
    """How much of its size a finished attach gives back with the write that stores it: what it did not get, less
    what came Online after it ended and what its overdue give-back left stranded; nothing while the give-back is owed
    (see `_owing_give_back`)."""
    if GIVE_BACK_OWED in record:
        return 0
    return max(0, _not_attached(record) - len(record.get("arrived_late", ())) - len(record.get("stranded", ())))


def _owing_give_back(record: dict[str, Any], request: dict[str, Any], resources: Mapping[str, dict[str, Any]],
                     unpicked: Sequence[str]) -> dict[str, Any]:
    """A failed attach whose request has a resource in state "": the operator's removal order puts such a resource
    after the Online ones, so lowering the size now would detach a GPU in use. The outcome is stored now all the same
    (reported once, final), with the resources it did not get as owed: given back once the operator has taken them
    up (`ComposabilityRequestFabric._give_back_owed`)."""
    owed = _owed(record, request, resources)
    log.info("attach %s on %s failed; its give-back of %s waits until the operator has taken up %s", record["key"],
             record["node"], ", ".join(owed) or f"{_not_attached(record)} device(s)", ", ".join(unpicked))
    return {**record, GIVE_BACK_OWED: owed,
            "error": (f"{record.get('error', '')}; the give-back waits until the operator has taken up "
                      f"{', '.join(unpicked)} (a device Online by then stays, as an ordinary one)")}


def _owed(record: dict[str, Any], request: dict[str, Any], resources: Mapping[str, dict[str, Any]]) -> list[str]:
    """The resources a failed attach counted as its own and did not get."""
    _, mine = _claim_of(record, request, resources)
    return [n for n in mine if n not in record.get("devices", ())]


def _targets(request: dict[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(node, model) a samenode request is for: its target_node, else where its devices are."""
    resource = (request.get("spec") or {}).get("resource") or {}
    node = resource.get("target_node") or next(
        (r.get("node_name") for r in ((request.get("status") or {}).get("resources") or {}).values()), None)
    return node, resource.get("model")


def _size_writers(request: dict[str, Any]) -> set[str]:
    """The field managers that set spec.resource.size (status and other subresources aside)."""
    writers = set()
    for entry in (request.get("metadata") or {}).get("managedFields") or ():
        if entry.get("subresource"):
            continue
        fields = (((entry.get("fieldsV1") or {}).get("f:spec") or {}).get("f:resource") or {})
        if "f:size" in fields:
            writers.add(entry.get("manager", ""))
    return writers


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _device_state(resource: dict[str, Any]) -> DeviceState:
    """A ComposableResource's device as DDS counts it: one being deleted is on its way out whatever its state says."""
    status = resource.get("status") or {}
    if _deleting(resource):
        return DeviceState.DETACHING
    state = _RESOURCE_STATES.get(status.get("state", ""), DeviceState.ATTACHING)
    if state == DeviceState.ONLINE and _CRITICAL in (status.get("error") or ""):
        return DeviceState.FAILED
    if state == DeviceState.ONLINE and status.get("error"):
        log.info("ComposableResource %s is Online with an error the operator retries: %s",
                 (resource.get("metadata") or {}).get("name"), status["error"])
    return state


def _done(state: OperationState, devices: list[str], code: Optional[ErrorCode] = None,
          error: str = "") -> dict[str, Any]:
    return {"state": state.value, "devices": devices, "error_code": code.value if code else None, "error": error}


def _api_error(what: str, exc: ApiError) -> FabricError:
    code = ErrorCode.NOT_FOUND if exc.not_found else ErrorCode.BACKEND
    return FabricError(code, f"{what}: {exc.status} {exc.reason}")
