"""The Redfish backend: compose GPU resource blocks into a node's ComputerSystem through a DMTF CompositionService, and
bind pooled CXL memory to it through a CXL fabric's Connections.

Discovery (every query reads the service; what never changes — a block's model and zone — is cached):
- ServiceRoot -> `CompositionService` -> `ResourceBlocks`. A block is a GPU when one of its `Processors` has
  `ProcessorType: GPU`; the device model is that Processor's `Model`. The device id is the block's `Id`.
- Pool: the `Id` of the first Zone in the block's `Links.Zones` (a ResourceZone of the CompositionService), or
  "default" when the block names no zone. Node groups name it in their fabric-pool annotation.
- Node -> system: the ComputerSystem whose `HostName` equals the Kubernetes node name, else the one whose `Name` does
  (a node's name is normally its host name). A system reports its devices under its HostName, or its Name when HostName
  is empty.
- Device state from the block's `CompositionStatus.CompositionState`: Composing -> attaching, Composed /
  ComposedAndAvailable -> online, Failed -> failed; Unused and linked to no system -> free in the pool.

Changes, by what the service advertises (DSP0268): the CompositionService's `#CompositionService.Compose` action (a
`ComposeSystem` stanza naming the system by `@odata.id` with its desired `Links.ResourceBlocks`), else the system's
`#ComputerSystem.AddResourceBlock` / `#ComputerSystem.RemoveResourceBlock` actions (ComputerSystem v1_6_0+), else a
PATCH of the system's whole `Links.ResourceBlocks` with `If-Match` set to the system's ETag, read again and retried on
412 (another writer changed the system in between; `MAX_PRECONDITION_RETRIES`). A change the service answers `202
Accepted` is followed through its task monitor (`Location`): its URI is stored with the block, polled once per call
(never blocking the caller), and the block is done when the monitor answers the request's outcome — an error there
fails the block with the service's message. Sessions: login through `Links.Sessions` (basic authentication when the
service has no session service); a 401 later (the session expired, the BMC restarted) logs in again and retries the
request once, with exponential backoff between failed logins (`LOGIN_BACKOFF_*`). Redfish has no per-node slot count:
the configured pools' `max_slots_per_node` is enforced here, and a service's own refusal (Base ResourceExhaustion) also
reads as SlotsFull. A refusal's Base registry message (`@Message.ExtendedInfo`) is the operation's error message, which
the controller puts in the node's AttachFailed/DetachFailed Event. Redfish has no notion of a device being in use
either, so `force` on detach has nothing to override.

The service is an untrusted peer: its answers choose URIs and sizes, and DDS sends a password and a session token.
Every request goes to the configured endpoint's origin (scheme, host, port) only: a link (`Links.Sessions`, an
`@odata.id`, an action target, a task monitor) or a redirect to another origin is refused with an error naming it, never
followed, so the password, basic credentials and `X-Auth-Token` reach no one else. Same-origin redirects of a GET are
followed (at most `MAX_REDIRECTS`). One request, its body included, ends within `timeout_seconds` and an answer larger
than `max_response_bytes` is refused; every message of the service DDS stores or shows (an operation's error, an Event)
is cut to `MAX_MESSAGE_CHARS`, so a refusal of megabytes cannot overflow the operation log's ConfigMap.

CXL memory (DMTF's `public-cxl` model; docs/cxl-memory.md): a `Fabrics` member with `FabricType: CXL`. Pooled memory is
the `MemoryChunks` its target Endpoints name (`ConnectedEntities` with `EntityRole: Target`, `EntityType: MemoryChunk`)
where the endpoint's logical device is a Type 3 device (`SemanticsSupported` has `CXLmem` and not `CXLcache`); the
model is the chunk's size (`MemoryChunkSizeMiB` -> `cxl-memory-16Gi`, dds/model/cxl.py), the pool the `Id` of the
target endpoint's first zone. A host's endpoint is an initiator Endpoint whose `EntityLink` lies under its
ComputerSystem. A chunk is bound to a host by a Connection (`ConnectionType: Memory`, `MemoryChunkInfo` naming the
chunk, `Links.InitiatorEndpoints` the host's endpoint, `Links.TargetEndpoints` the chunk's): attaching POSTs one to the
fabric's Connections collection, detaching DELETEs it. Connection `Status.State` `Enabled` -> online, `Starting` (or
any other) -> attaching, `Health: Critical` or `UnavailableOffline` -> failed; a chunk no Connection names is free.
A chunk of a host's own device (its memory domain under a ComputerSystem, or under a chassis contained in one holding a
ComputerSystem: DMTF's `Chassis/CXLType3` in `CXL-Chassis`) is that host's memory, never the pool's.
`MemoryRegionInfo` is never sent: DSP0268 (Connection v1_3_3) allows no memory regions in a CXL fabric's Connections.
A change the service accepted must show within `connection_wait_seconds` (the Connection listed and Enabled, or gone),
else the chunk fails naming what is missing. Chunks take no GPU slot (`max_slots_per_node`).

Read-only (`read_only=True`, what `dds plan` builds): queries read the service and the operation log and never drive
an operation; attach and detach are refused. Nothing but GETs (and the session's login/logout) reaches the service.

Crash safety: an operation is written to the `FabricStateStore` with the blocks it will touch (each `planned`) *before*
any request to the service and before `attach`/`detach` return; each block moves to `requested` once the service
accepted the change. Every later call drives unfinished operations: a `planned` block already linked to the system is
taken as done (the request went through before a crash), an untouched one is requested again. So each block is composed
exactly once or not at all, whichever process finishes the operation. A 5xx or connection error leaves the block
`planned` for the next call (at most `MAX_ATTEMPTS` tries); a 4xx fails that block with the service's message.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Optional, Sequence
from urllib.parse import urljoin, urlsplit

import requests
import urllib3
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from dds import metrics
from dds.config import PoolSpec, RedfishSettings
from dds.fabric.base import (AttachRequest, DetachRequest, DeviceState, ErrorCode, FabricDevice, FabricError, Operation,
                             OperationKind, OperationState, PoolState)
from dds.fabric.state import Document, FabricStateStore, StateConflict, StateStoreError
from dds.model.cxl import cxl_model, is_cxl_model
from dds.model.text import bounded_text

log = logging.getLogger(__name__)

Clock = Callable[[], float]
STATE_SCHEMA = 1
MAX_ATTEMPTS = 3
FINISHED_RETENTION_SECONDS = 3600.0
DEFAULT_POOL = "default"
ADD_ACTION = "#ComputerSystem.AddResourceBlock"
REMOVE_ACTION = "#ComputerSystem.RemoveResourceBlock"
COMPOSE_ACTION = "#CompositionService.Compose"
MAX_PRECONDITION_RETRIES = 3  # PATCHes refused 412 (a concurrent writer) before the block fails
LOGIN_BACKOFF_BASE_SECONDS = 1.0  # after a failed re-login, the next waits 1, 2, 4, ... s
LOGIN_BACKOFF_MAX_SECONDS = 60.0
_ONLINE_STATES = {"Composed", "ComposedAndAvailable"}
CXL_FABRIC_TYPE = "CXL"
MEMORY_ACCESS = ["Read", "Write"]  # what a bound chunk is to the host: its memory
_CONNECTION_FAILED_STATES = {"UnavailableOffline", "Absent", "Disabled"}
MAX_REDIRECTS = 3  # same-origin redirects of one GET
MAX_MESSAGE_CHARS = 1024  # a service's message as DDS stores it (operation log) or shows it (Events, log lines)
MAX_LINK_CHARS = 2048  # a URI the service names: it may be stored in the operation log
_READ_CHUNK_BYTES = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}

# Per-block progress inside an operation.
PLANNED, REQUESTED, REJECTED = "planned", "requested", "rejected"


class RedfishHTTPError(Exception):
    def __init__(self, status: int, message_id: str, message: str):
        message_id, message = bounded_text(message_id, 128), bounded_text(message, MAX_MESSAGE_CHARS)
        super().__init__(f"HTTP {status} {message_id}: {message}")
        self.status = status
        self.message_id = message_id
        self.message = message


class ForeignOrigin(requests.RequestException):
    """The service named, or redirected to, a URI outside the configured endpoint's origin: not followed."""


class ResponseTooLarge(requests.RequestException):
    """An answer over `max_response_bytes`: refused, the rest left unread."""


class ResponseTooSlow(requests.Timeout):
    """An answer not complete within `timeout_seconds` (a body dripped slowly): cut off."""


@dataclass(frozen=True)
class _Block:
    """A device: a GPU resource block, or a CXL memory chunk (`target` set) in the composition vocabulary."""
    id: str
    uri: str
    model: str
    pool: str
    state: str  # CompositionState; a chunk's from its Connection (Unused: none)
    system_uri: Optional[str]  # a chunk bound to an endpoint of no known system: that endpoint's uri
    target: Optional[str] = None  # a chunk's target Endpoint
    connections: Optional[str] = None  # a chunk's fabric's Connections collection
    connection: Optional[str] = None  # the Connection binding the chunk
    bound_with: tuple[str, ...] = ()  # the chunks that Connection binds (this one included)


@dataclass(frozen=True)
class _Endpoint:
    """What DDS reads of a CXL fabric Endpoint (cached: none of it changes while the service runs)."""
    uri: str
    zones: tuple[str, ...]  # zone uris
    initiator_of: tuple[str, ...] = ()  # EntityLinks of its Initiator entities
    chunks: tuple[str, ...] = ()  # MemoryChunks of its Target entities, when its logical device is Type 3


@dataclass(frozen=True)
class _System:
    uri: str
    node: str
    names: tuple[str, ...]  # HostName and Name: what a node name may match
    blocks: tuple[str, ...]  # uris in Links.ResourceBlocks
    actions: dict[str, str]  # action name -> target
    initiators: tuple[_Endpoint, ...] = ()  # its CXL initiator endpoints


@dataclass(frozen=True)
class _Inventory:
    blocks: dict[str, _Block]  # by uri: GPU blocks and CXL memory chunks
    systems: dict[str, _System]  # by uri
    compose_target: Optional[str] = None  # the CompositionService's Compose action, when it advertises one
    endpoints: tuple[_Endpoint, ...] = ()  # of the CXL fabrics

    def initiator_for(self, system: _System, chunk: _Block) -> Optional[str]:
        """The system's initiator endpoint to bind `chunk` through: one in a zone of the chunk's target, else any."""
        target = next((e for e in self.endpoints if e.uri == chunk.target), None)
        zones = set(target.zones) if target else set()
        shared = [e.uri for e in system.initiators if zones & set(e.zones)]
        return (shared or [e.uri for e in system.initiators] or [None])[0]

    def system_for(self, node: str) -> Optional[_System]:
        by_host = [s for s in self.systems.values() if s.names[0] == node]
        by_name = [s for s in self.systems.values() if node in s.names[1:]]
        found = by_host or by_name
        return found[0] if found else None


def read_password(settings: RedfishSettings) -> str:
    if settings.password_file is None:
        return ""
    try:
        return Path(settings.password_file).read_text().strip()
    except OSError as exc:
        raise ValueError(f"redfish.password_file: cannot read {settings.password_file}: {exc}") from exc


class RedfishFabric:
    """A `Fabric` on a Redfish CompositionService; see the module docstring for the mapping."""

    def __init__(self, settings: RedfishSettings, *, clock: Clock, store: FabricStateStore,
                 password: Optional[str] = None, pools: Sequence[PoolSpec] = (),
                 session: Optional[requests.Session] = None, name: str = "redfish", read_only: bool = False) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._store = store
        self._slots = {p.name: p.max_slots_per_node for p in pools if p.max_slots_per_node is not None}
        self._base = settings.endpoint.rstrip("/")
        self._origin = _origin_of(self._base)
        self._http = session or requests.Session()
        self._http.verify = str(settings.ca_file) if settings.ca_file else settings.verify_tls
        _warn_if_unverified(settings, self._origin)
        self._http.headers.update({"Accept": "application/json", "OData-Version": "4.0"})
        self._password = read_password(settings) if password is None else password
        self._session_uri: Optional[str] = None
        self._session_auth = False  # the service has a session service: a 401 means log in again
        self._login_failures = 0
        self._next_login_at = 0.0
        self._read_only = read_only
        self._lock = threading.RLock()
        self._static: dict[str, tuple[Optional[str], str]] = {}  # block/chunk uri -> (model or None, pool)
        self._endpoints: dict[str, _Endpoint] = {}  # CXL fabric endpoints by uri
        self._fabrics: dict[str, Optional[tuple[str, str]]] = {}  # Fabrics member -> its collections if CXL
        self._log, self._version = self._load_log()
        self._login()

    # --- the Fabric protocol ---
    def pools(self) -> tuple[PoolState, ...]:
        with self._lock:
            self._drive()
            inventory = self._inventory()
        totals: dict[str, dict[str, int]] = {}
        free: dict[str, dict[str, int]] = {}
        for block in inventory.blocks.values():
            totals.setdefault(block.pool, {}).setdefault(block.model, 0)
            free.setdefault(block.pool, {}).setdefault(block.model, 0)
            totals[block.pool][block.model] += 1
            if self._is_free(block):
                free[block.pool][block.model] += 1
        return tuple(PoolState(p, MappingProxyType(totals[p]), MappingProxyType(free[p])) for p in sorted(totals))

    def devices(self, node: Optional[str] = None) -> tuple[FabricDevice, ...]:
        with self._lock:
            self._drive()
            inventory = self._inventory()
            detaching = {b for op in self._log.values() if op["kind"] == OperationKind.DETACH.value
                         and op["state"] == OperationState.RUNNING.value for b in op["blocks"]}
        out = []
        for block in sorted(inventory.blocks.values(), key=lambda b: b.id):
            system = inventory.systems.get(block.system_uri or "")
            if system is None or (node is not None and node not in system.names):
                continue
            out.append(FabricDevice(block.id, block.model, block.pool, node or system.node,
                                    _device_state(block, block.uri in detaching)))
        return tuple(out)

    def attach(self, request: AttachRequest) -> Operation:
        self._refuse_if_read_only(request.key)
        if not request.key or not request.node or request.count <= 0:
            raise FabricError(ErrorCode.INVALID, f"attach {request.key or '<no key>'}: key, node and a positive "
                                                 f"count are required (count {request.count})")
        with self._lock:
            if request.key not in self._log:
                inventory = self._inventory()
                system = self._system_or_raise(inventory, request.node, request.key)
                self._record(request.key, self._plan_attach(request, inventory, system))
            self._drive(only=request.key)
            return self._public(request.key)

    def detach(self, request: DetachRequest) -> Operation:
        self._refuse_if_read_only(request.key)
        if not request.key or not request.node or not request.device_ids:
            raise FabricError(ErrorCode.INVALID, f"detach {request.key or '<no key>'}: key, node and device_ids "
                                                 f"are required")
        with self._lock:
            if request.key not in self._log:
                inventory = self._inventory()
                system = self._system_or_raise(inventory, request.node, request.key)
                self._record(request.key, self._plan_detach(request, inventory, system))
            self._drive(only=request.key)
            return self._public(request.key)

    def operation(self, key: str) -> Optional[Operation]:
        with self._lock:
            if key not in self._log:
                return None
            self._drive(only=key)
            return self._public(key)

    def operations(self) -> tuple[Operation, ...]:
        with self._lock:
            self._drive()
            return tuple(self._public(key) for key in self._log)

    def tick(self) -> None:
        with self._lock:
            self._drive()

    def close(self) -> None:
        if self._session_uri is not None:
            try:
                self._exchange("DELETE", self._session_uri)
            except requests.RequestException as exc:
                log.info("could not end the Redfish session %s: %s", self._session_uri, exc)
            self._session_uri = None
        self._http.close()

    def _refuse_if_read_only(self, key: str) -> None:
        if self._read_only:
            raise FabricError(ErrorCode.INVALID, f"{key}: this Redfish fabric is read-only (dds plan): it changes "
                                                 f"nothing on the service")

    # --- planning (nothing sent to the service yet) ---
    def _plan_attach(self, request: AttachRequest, inventory: _Inventory, system: _System) -> dict[str, Any]:
        now = self._clock()
        op = _new_op(request.key, OperationKind.ATTACH, request.node, system.uri, request.pool, request.model,
                     request.count, now)
        candidates = sorted((b for b in inventory.blocks.values() if b.pool == request.pool
                             and b.model == request.model and self._is_free(b)), key=lambda b: b.id)
        memory = is_cxl_model(request.model)
        if not any(b.pool == request.pool and (b.target is not None) == memory for b in inventory.blocks.values()):
            what = "CXL memory chunks (Type 3 targets of a CXL fabric)" if memory else "GPU resource blocks"
            raise FabricError(ErrorCode.NOT_FOUND, f"attach {request.key}: the Redfish service has no {what} in zone "
                                                   f"{request.pool!r}")
        if memory and not system.initiators:
            raise FabricError(ErrorCode.NOT_FOUND, f"attach {request.key}: ComputerSystem {system.uri} "
                                                   f"({request.node}) has no initiator Endpoint in a CXL fabric to "
                                                   f"bind memory to")
        limit = None if memory else self._slots.get(request.pool)  # chunks take no GPU slot
        used = sum(1 for uri in system.blocks if uri in inventory.blocks and inventory.blocks[uri].pool == request.pool)
        if len(candidates) < request.count:
            return _failed(op, now, ErrorCode.OUT_OF_RESOURCES, f"zone {request.pool} has {len(candidates)} free "
                                                                f"{request.model}, {request.count} asked")
        if limit is not None and used + request.count > limit:
            return _failed(op, now, ErrorCode.SLOTS_FULL, f"{request.node} uses {used} of {limit} slot(s) for "
                                                          f"zone {request.pool}; {request.count} more asked")
        op["blocks"] = {b.uri: {"step": PLANNED, "attempts": 0, "error": ""} for b in candidates[:request.count]}
        return op

    def _plan_detach(self, request: DetachRequest, inventory: _Inventory, system: _System) -> dict[str, Any]:
        by_id = {b.id: b for b in inventory.blocks.values()}
        blocks = []
        for device_id in request.device_ids:
            block = by_id.get(device_id)
            if block is None or block.system_uri != system.uri:
                raise FabricError(ErrorCode.NOT_FOUND, f"detach {request.key}: device {device_id} is not composed "
                                                       f"into {request.node} ({system.uri})")
            blocks.append(block)
        asked = {b.uri for b in blocks}
        for block in blocks:
            others = [_chunk_id(c) for c in block.bound_with if c not in asked]
            if others:
                raise FabricError(ErrorCode.INVALID, f"detach {request.key}: chunk {block.id} is bound by Connection "
                                                     f"{block.connection}, which also binds {', '.join(others)}; DDS "
                                                     f"deletes a Connection whole: detach them together")
        op = _new_op(request.key, OperationKind.DETACH, request.node, system.uri, blocks[0].pool, blocks[0].model,
                     len(blocks), self._clock())
        op["blocks"] = {b.uri: {"step": PLANNED, "attempts": 0, "error": ""} for b in blocks}
        return op

    # --- driving operations forward ---
    def _drive(self, only: Optional[str] = None) -> None:
        if self._read_only:
            return  # dds plan: what the log and the service say now, nothing sent
        running = [k for k, op in self._log.items() if op["state"] == OperationState.RUNNING.value
                   and (only is None or k == only)]
        if not running:
            self._prune()
            return
        inventory = self._inventory()
        for key in running:
            op = self._log[key]
            before = repr(op)
            for uri, progress in op["blocks"].items():
                if progress["step"] == PLANNED:
                    self._request_block(op, uri, progress, inventory)
                    if progress["step"] == REQUESTED:
                        inventory = self._inventory()  # the service changed: see it before the next block
                elif progress["step"] == REQUESTED and progress.get("monitor"):
                    if self._follow_task(uri, progress):
                        inventory = self._inventory()  # the task ended: see the blocks as it left them
            self._settle(op, inventory)
            if repr(op) != before:
                self._record(key, op)
        self._prune()

    def _request_block(self, op: dict[str, Any], uri: str, progress: dict[str, Any], inventory: _Inventory) -> None:
        block = inventory.blocks.get(uri)
        system = inventory.systems.get(op["system"])
        attach = op["kind"] == OperationKind.ATTACH.value
        if block is None or system is None:
            progress.update(step=REJECTED, error=f"{uri if block is None else op['system']} no longer exists")
            return
        if attach and block.system_uri == system.uri or not attach and block.system_uri is None:
            progress["step"] = REQUESTED  # done before a restart: never send it twice
            return
        if attach and not self._is_free(block):
            what = "memory chunk" if block.target is not None else "resource block"
            progress.update(step=REJECTED, error=f"{what} {block.id} was taken ({block.state})")
            return
        # Count the attempt durably before sending: a crash mid-request must not buy unlimited retries.
        progress["attempts"] += 1
        self._record(op["key"], op)
        try:
            monitor = self._compose(system, block, inventory, add=attach)
        except RedfishHTTPError as exc:
            if exc.status >= 500 and progress["attempts"] < MAX_ATTEMPTS:
                log.warning("Redfish %s of %s: %s; will retry", op["kind"], block.id, exc)
                return
            progress.update(step=REJECTED, error=exc.message, message_id=exc.message_id)
            return
        except (requests.RequestException, FabricError) as exc:  # unreachable, or the system could not be read
            if progress["attempts"] < MAX_ATTEMPTS:
                log.warning("Redfish %s of %s: %s; will retry", op["kind"], block.id, exc)
                return
            progress.update(step=REJECTED, error=bounded_text(str(exc), MAX_MESSAGE_CHARS))
            return
        progress.update(step=REQUESTED, requested_at=self._clock())
        if monitor:
            progress["monitor"] = monitor  # stored with the block: whichever process drives it next follows it

    def _compose(self, system: _System, block: _Block, inventory: _Inventory, *, add: bool) -> Optional[str]:
        """Ask the service to add or remove `block`; the task monitor's URI when it answered 202 Accepted."""
        if block.target is not None:
            return self._connect(system, block, inventory) if add else self._disconnect(block)
        if inventory.compose_target:
            # The Compose action states the system's desired end state and has no precondition: build it on the latest
            # links, less the blocks DDS is removing (a removal that ends between this read and the POST would
            # otherwise be undone by the very list that still names the block).
            current, _ = self._get_resource(system.uri)
            links = _desired_links([uri for uri in _linked_blocks(current) if uri not in self._removing()], block.uri,
                                   add)
            manifest = {"Description": f"DDS: {'add' if add else 'remove'} {block.id}",
                        "Stanzas": [{"StanzaType": "ComposeSystem", "StanzaId": block.id,
                                     "Request": {"@odata.id": system.uri, "Links": {"ResourceBlocks": links}}}]}
            return self._send("POST", inventory.compose_target, {"RequestFormat": "Manifest",
                                                                  "RequestType": "Apply", "Manifest": manifest})
        action = system.actions.get(ADD_ACTION if add else REMOVE_ACTION)
        if action:
            return self._send("POST", action, {"ResourceBlock": {"@odata.id": block.uri}})
        return self._patch_links(system.uri, block.uri, add)

    def _connect(self, system: _System, chunk: _Block, inventory: _Inventory) -> Optional[str]:
        """POST a Connection binding `chunk` to `system`'s initiator endpoint to the chunk's fabric."""
        initiator = inventory.initiator_for(system, chunk)
        if initiator is None or chunk.connections is None:
            raise RedfishHTTPError(400, "", f"{system.uri} has no CXL initiator endpoint to bind {chunk.id} to")
        body = connection_request(chunk.uri, initiator, chunk.target, f"DDS: {chunk.id} to {system.node}")
        return self._send("POST", chunk.connections, body)

    def _disconnect(self, chunk: _Block) -> Optional[str]:
        """DELETE the Connection binding `chunk`; one already gone is what was asked."""
        if chunk.connection is None:
            return None
        try:
            return self._send("DELETE", chunk.connection, None)
        except RedfishHTTPError as exc:
            if exc.status == 404:
                return None
            raise

    def _removing(self) -> set[str]:
        """Blocks whose removal DDS has requested and not yet seen end."""
        return {uri for op in self._log.values() if op["kind"] == OperationKind.DETACH.value
                and op["state"] == OperationState.RUNNING.value
                for uri, progress in op["blocks"].items() if progress["step"] == REQUESTED}

    def _patch_links(self, system_uri: str, block_uri: str, add: bool) -> Optional[str]:
        """Read-modify-write of the system's Links.ResourceBlocks under If-Match: a 412 means another writer changed
        the system since it was read, so read it again and redo the change on what that writer left."""
        for attempt in range(1, MAX_PRECONDITION_RETRIES + 1):
            current, etag = self._get_resource(system_uri)
            links = _desired_links(_linked_blocks(current), block_uri, add)
            try:
                return self._send("PATCH", system_uri, {"Links": {"ResourceBlocks": links}},
                                  headers={"If-Match": etag} if etag else None)
            except RedfishHTTPError as exc:
                if exc.status != 412 or attempt == MAX_PRECONDITION_RETRIES:
                    raise
                log.info("Redfish PATCH of %s: ETag %s is stale (%s); reading it again", system_uri, etag, exc)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _follow_task(self, uri: str, progress: dict[str, Any]) -> bool:
        """Poll a block's task monitor once; True when the task has ended (the block's progress is updated)."""
        monitor = progress["monitor"]
        try:
            response = self._request("GET", monitor)
        except ForeignOrigin as exc:
            del progress["monitor"]
            log.warning("Redfish task monitor of %s not followed (%s); the block's state tells the outcome", uri, exc)
            return True
        except requests.RequestException as exc:
            log.warning("Redfish task monitor %s of %s: %s; will poll again", monitor, uri, exc)
            return False
        if response.status_code == 202:
            return False
        del progress["monitor"]
        if response.status_code == 404:
            log.info("Redfish task monitor %s of %s is gone; the block's state tells the outcome", monitor, uri)
            return True
        failure = _task_failure(response)
        if failure is not None:
            progress.update(step=REJECTED, error=failure.message, message_id=failure.message_id)
        return True

    def _settle(self, op: dict[str, Any], inventory: _Inventory) -> None:
        """Finish the operation when every block has reached an end state."""
        attach = op["kind"] == OperationKind.ATTACH.value
        done, failed, errors = [], [], []
        for uri, progress in op["blocks"].items():
            block = inventory.blocks.get(uri)
            if progress["step"] == REJECTED:
                failed.append(uri)
                errors.append(progress)
            elif progress["step"] == PLANNED or block is None:
                return  # not requested yet
            elif block.target is not None and self._overdue(op, block, progress):
                failed.append(uri)
                errors.append(progress)
            elif progress.get("monitor"):
                return  # its task still runs
            elif attach:
                if block.system_uri == op["system"] and block.state in _ONLINE_STATES:
                    done.append(block.id)
                elif block.target is not None and block.system_uri is None and block.state == "Unused":
                    return  # accepted, its Connection not listed yet (bounded by _overdue)
                elif block.state == "Failed" or block.system_uri != op["system"]:
                    failed.append(uri)
                    errors.append({"error": _end_of(block, op["system"])})
                else:
                    return  # Composing
            elif block.system_uri is None:
                done.append(block.id)
            else:
                return  # still being removed
        now = self._clock()
        op.update(devices=sorted(done), finished_at=now,
                  state=(OperationState.FAILED if failed else OperationState.SUCCEEDED).value)
        if failed:
            code = ErrorCode.SLOTS_FULL if any(e.get("message_id", "").endswith("ResourceExhaustion")
                                               for e in errors) else ErrorCode.BACKEND
            op.update(error_code=code.value,
                      error_message=bounded_text("; ".join(e["error"] for e in errors), MAX_MESSAGE_CHARS))

    def _overdue(self, op: dict[str, Any], chunk: _Block, progress: dict[str, Any]) -> bool:
        """A chunk whose requested Connection change has not shown within `connection_wait_seconds`: its progress is
        marked rejected with what is missing. The service's own monitor, if any, is given up with it."""
        attach = op["kind"] == OperationKind.ATTACH.value
        if attach and chunk.system_uri == op["system"] and chunk.state in _ONLINE_STATES \
                or not attach and chunk.system_uri is None:
            return False
        bound = self._settings.connection_wait_seconds
        if self._clock() - float(progress.get("requested_at", op["started_at"])) <= bound:
            return False
        waited = f"within redfish.connection_wait_seconds ({bound:g} s)"
        if not attach:
            error = f"Connection {chunk.connection} binding memory chunk {chunk.id} still listed, not removed {waited}"
        elif chunk.connection is None:
            error = (f"the service accepted a Connection binding memory chunk {chunk.id} to {op['node']} but listed "
                     f"none {waited}")
        else:
            error = f"Connection {chunk.connection} binding memory chunk {chunk.id} not Enabled {waited}"
        progress.pop("monitor", None)
        progress.update(step=REJECTED, error=error)
        return True

    def resync(self) -> None:
        """Read the operation log again: what another DDS process (the previous leader) recorded since this one loaded
        it. Without it every write would be refused as a conflict with that process."""
        with self._lock:
            self._log, self._version = self._load_log()

    # --- the operation log ---
    def _load_log(self) -> tuple[dict[str, dict[str, Any]], Optional[str]]:
        document, version = self._store.load()
        if document is None:
            return {}, version
        if document.get("schema") != STATE_SCHEMA:
            raise ValueError(f"{self._store.describe()}: unsupported Redfish operation log schema "
                             f"{document.get('schema')!r}")
        return dict(document.get("operations", {})), version

    def _record(self, key: str, op: dict[str, Any]) -> None:
        """Write the log with `op` before anything else happens (the crash-safety rule)."""
        previous = self._log.get(key)
        self._log[key] = op
        try:
            self._save()
        except FabricError:
            if previous is None:
                del self._log[key]  # never acknowledged: forget it, the caller sees the error
            raise

    def _prune(self) -> None:
        now = self._clock()
        stale = [k for k, op in self._log.items() if op["state"] != OperationState.RUNNING.value
                 and (op.get("finished_at") or now) + FINISHED_RETENTION_SECONDS < now]
        if stale:
            for key in stale:
                del self._log[key]
            self._save()

    def _save(self) -> None:
        document: Document = {"schema": STATE_SCHEMA, "operations": self._log}
        try:
            self._version = self._store.save(document, self._version)
        except StateConflict as exc:
            raise FabricError(ErrorCode.BACKEND, f"{self._store.describe()} was changed by another DDS process; "
                                                 f"only one may drive the Redfish service") from exc
        except StateStoreError as exc:
            raise FabricError(ErrorCode.BACKEND, str(exc)) from exc

    def _public(self, key: str) -> Operation:
        op = self._log[key]
        error = FabricError(ErrorCode(op["error_code"]), op["error_message"]) if op.get("error_code") else None
        return Operation(key=key, kind=OperationKind(op["kind"]), node=op["node"], state=OperationState(op["state"]),
                         requested=op["requested"], model=op["model"], pool=op["pool"],
                         devices=tuple(op.get("devices", ())), error=error, started_at=op["started_at"],
                         finished_at=op.get("finished_at"))

    # --- reading the service ---
    def _inventory(self) -> _Inventory:
        root = self._get("/redfish/v1/")
        fabrics = self._cxl_fabrics(root)
        if "CompositionService" not in root and not fabrics:
            raise FabricError(ErrorCode.BACKEND, "the Redfish ServiceRoot has no CompositionService link nor a CXL "
                                                 "fabric (a Fabrics member with FabricType CXL): DDS composes GPUs "
                                                 "through the one and CXL memory through the other")
        blocks: dict[str, _Block] = {}
        target = None
        if "CompositionService" in root:
            composition = self._get(_link(root, "CompositionService", "ServiceRoot"))
            for member in self._get(_link(composition, "ResourceBlocks", "CompositionService")).get("Members", []):
                block = self._read_block(member["@odata.id"])
                if block is not None:
                    blocks[block.uri] = block
            compose = composition.get("Actions", {}).get(COMPOSE_ACTION)
            target = str(compose["target"]) if isinstance(compose, dict) and compose.get("target") else None
        systems: dict[str, _System] = {}
        for member in self._get(_link(root, "Systems", "ServiceRoot")).get("Members", []):
            system = _system_from(self._get(member["@odata.id"]))
            systems[system.uri] = system
        endpoints: list[_Endpoint] = []
        for endpoints_link, connections in fabrics:
            fabric_endpoints = [self._read_endpoint(m["@odata.id"])
                                for m in self._get(endpoints_link).get("Members", [])]
            members = self._get(connections).get("Members", [])
            bindings = [b for b in (self._read_binding(m["@odata.id"]) for m in members) if b is not None]
            endpoints += fabric_endpoints
            blocks.update(self._chunks(fabric_endpoints, bindings, connections, systems))
        systems = {uri: _with_initiators(system, endpoints) for uri, system in systems.items()}
        return _Inventory(blocks, systems, target, tuple(endpoints))

    # --- reading a CXL fabric ---
    def _cxl_fabrics(self, root: dict[str, Any]) -> list[tuple[str, str]]:
        """The (Endpoints, Connections) collections of each CXL fabric; a fabric's type and links are read once."""
        link = root.get("Fabrics", {}).get("@odata.id") if isinstance(root.get("Fabrics"), dict) else None
        if not link:
            return []
        found = []
        for member in self._get(str(link)).get("Members", []):
            uri = str(member["@odata.id"])
            if uri not in self._fabrics:
                fabric = self._get(uri)
                self._fabrics[uri] = (_link(fabric, "Endpoints", f"CXL fabric {uri}"),
                                      _link(fabric, "Connections", f"CXL fabric {uri}")) \
                    if fabric.get("FabricType") == CXL_FABRIC_TYPE else None
            if self._fabrics[uri] is not None:
                found.append(self._fabrics[uri])
        return found

    def _read_endpoint(self, uri: str) -> _Endpoint:
        if uri not in self._endpoints:
            body = self._get(uri)
            entities = [e for e in body.get("ConnectedEntities", []) if isinstance(e, dict)]
            initiator_of = tuple(_entity_link(e) for e in entities if e.get("EntityRole") in ("Initiator", "Both"))
            chunks: tuple[str, ...] = ()
            devices = [_entity_link(e) for e in entities if e.get("EntityType") == "CXLDevice"]
            if all(self._is_type3(device) for device in devices if device):
                chunks = tuple(_entity_link(e) for e in entities
                               if e.get("EntityRole") in ("Target", "Both") and e.get("EntityType") == "MemoryChunk")
            zones = tuple(str(z["@odata.id"]) for z in body.get("Links", {}).get("Zones", []))
            self._endpoints[uri] = _Endpoint(uri, zones, tuple(i for i in initiator_of if i),
                                             tuple(c for c in chunks if c))
        return self._endpoints[uri]

    def _read_binding(self, uri: str) -> Optional[_Binding]:
        """A Connection, or None when it was deleted between the collection's read and its own (a 404)."""
        try:
            return _binding_from(self._get(uri))
        except FabricError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                return None
            raise

    def _is_type3(self, logical_device: str) -> bool:
        """A CXL Type 3 device (memory expander) speaks CXL.mem without CXL.cache; Type 2 (an accelerator with its own
        memory: DMTF's CXL GPU) speaks both, and its memory is not pooled memory."""
        semantics = set(self._get(logical_device).get("SemanticsSupported") or [])
        return "CXLmem" in semantics and "CXLcache" not in semantics

    def _chunks(self, endpoints: list[_Endpoint], bindings: list[_Binding], connections: str,
                systems: dict[str, _System]) -> dict[str, _Block]:
        by_chunk = {chunk: binding for binding in bindings for chunk in binding.chunks}
        owners = {e.uri: uri for uri in systems for e in endpoints
                  if any(_under(link, uri) for link in e.initiator_of)}
        chunks: dict[str, _Block] = {}
        for endpoint in endpoints:
            pool = _last_segment(endpoint.zones[0]) if endpoint.zones else DEFAULT_POOL
            for uri in endpoint.chunks:
                if uri in chunks:
                    continue
                if uri not in self._static:
                    size = self._get(uri).get("MemoryChunkSizeMiB")
                    model = cxl_model(int(size) * 2**20) if isinstance(size, int) and size > 0 else None
                    self._static[uri] = (None if self._host_local(uri) else model, pool)
                model = self._static[uri][0]
                if model is None:
                    continue  # a chunk without a size cannot be planned; a host's own is not the pool's
                binding = by_chunk.get(uri)
                owner = None
                if binding is not None:
                    initiator = binding.initiators[0] if binding.initiators else binding.uri
                    owner = next((owners[i] for i in binding.initiators if i in owners), initiator)
                chunks[uri] = _Block(_chunk_id(uri), uri, model, pool, binding.state if binding else "Unused", owner,
                                     endpoint.uri, connections, binding.uri if binding else None,
                                     binding.chunks if binding else ())
        return chunks

    def _host_local(self, chunk: str) -> bool:
        """Whether a chunk is memory of a host's own device, not pooled memory: its memory domain is a ComputerSystem's
        (`/Systems/<id>/MemoryDomains/...`), or a chassis' contained (`Links.ContainedBy`, at any depth) in a chassis
        holding a ComputerSystem (`Links.ComputerSystems`) — DMTF's public-cxl: `Chassis/CXLType3`, the Type 3 device
        of `CXL-System`, in its zone 3 beside the pooled device and bound by no Connection. Where hardware sits does not
        change while DDS runs: read once per chunk."""
        owner = chunk.split("/MemoryDomains/", 1)[0]
        if "/Systems/" in owner:
            return True
        chassis: Optional[str] = owner if "/Chassis/" in owner else None
        seen: set[str] = set()
        while chassis and chassis not in seen:
            seen.add(chassis)
            try:
                links = self._get(chassis).get("Links") or {}
            except FabricError as exc:
                if exc.code == ErrorCode.NOT_FOUND:
                    return False  # a chassis the service does not serve holds no host we can see
                raise
            if links.get("ComputerSystems"):
                return True
            contained_by = links.get("ContainedBy")
            chassis = str(contained_by["@odata.id"]) if isinstance(contained_by, dict) and \
                contained_by.get("@odata.id") else None
        return False

    def _read_block(self, uri: str) -> Optional[_Block]:
        body = self._get(uri)
        if uri not in self._static:
            self._static[uri] = (self._gpu_model(body), _pool_of(body))
        model, pool = self._static[uri]
        if model is None:
            return None
        systems = body.get("Links", {}).get("ComputerSystems", [])
        state = body.get("CompositionStatus", {}).get("CompositionState", "")
        return _Block(str(body.get("Id", uri.rsplit("/", 1)[-1])), uri, model, pool, state,
                      systems[0]["@odata.id"] if systems else None)

    def _gpu_model(self, block: dict[str, Any]) -> Optional[str]:
        for link in block.get("Processors", []):
            processor = self._get(link["@odata.id"])
            if processor.get("ProcessorType") == "GPU":
                return str(processor.get("Model") or "unknown")
        return None

    def _system_or_raise(self, inventory: _Inventory, node: str, key: str) -> _System:
        system = inventory.system_for(node)
        if system is None:
            raise FabricError(ErrorCode.NOT_FOUND, f"{key}: no ComputerSystem has HostName or Name {node!r}")
        return system

    @staticmethod
    def _is_free(block: _Block) -> bool:
        return block.system_uri is None and block.state == "Unused"

    # --- HTTP ---
    def _url(self, link: str) -> str:
        """The URL of a link the service named: an absolute path under the configured endpoint, or an absolute URL of
        the endpoint's own origin. Anything else is refused before a byte (or a credential) is sent."""
        if len(link) > MAX_LINK_CHARS:
            raise ForeignOrigin(f"the Redfish service named a link of {len(link)} characters "
                                f"(at most {MAX_LINK_CHARS}): not followed")
        url = link if urlsplit(link).scheme else f"{self._base}{link}"
        if not link.startswith("/") and not urlsplit(link).scheme or _origin_of(url) != self._origin:
            raise ForeignOrigin(f"the Redfish service named {_shown(link)}, outside the configured endpoint "
                                f"{self._base}: DDS sends requests and credentials only to that origin (check "
                                f"redfish.endpoint, or the service's links)")
        return url

    def _login(self) -> None:
        """Log in through the service's session service; basic authentication when it has none."""
        if not self._settings.username or self._login_session():
            return
        if self._session_auth:  # it has sessions but refused this login: later calls try again, with backoff
            self._login_failures = 1
            self._next_login_at = self._clock() + LOGIN_BACKOFF_BASE_SECONDS
            return
        self._http.auth = (self._settings.username, self._password)

    def _login_session(self) -> bool:
        """Log in through the service root's `Links.Sessions`. Raises FabricError when that link leaves the configured
        origin: the password goes nowhere else, and a service that names another host for it is misconfigured or
        hostile, which DDS says rather than falling back to another way of sending the password."""
        self._http.headers.pop("X-Auth-Token", None)
        try:
            response = self._exchange("GET", "/redfish/v1/")
            sessions = response.json().get("Links", {}).get("Sessions", {}).get("@odata.id") if response.ok else None
            if not sessions:
                log.info("Redfish service root answered %s with no Links.Sessions: using basic authentication",
                         response.status_code)
                return False
            self._session_auth = True
            sessions_url = self._url(str(sessions))
            response = self._exchange("POST", sessions_url, {"UserName": self._settings.username,
                                                             "Password": self._password})
        except ForeignOrigin as exc:
            raise FabricError(ErrorCode.BACKEND, f"Redfish login refused: {exc}") from exc
        except (requests.RequestException, ValueError, AttributeError) as exc:
            log.info("Redfish session login failed: %s", exc)
            return False
        token = response.headers.get("X-Auth-Token")
        if response.status_code in (200, 201) and token:
            self._http.headers["X-Auth-Token"] = token
            self._session_uri = self._own_link(response.headers.get("Location"), "session")
            return True
        log.warning("Redfish session login refused: %s", _http_error(response))
        return False

    def _relogin(self) -> bool:
        """After a 401 on a session: log in again, unless a failed login asked to wait (exponential backoff)."""
        now = self._clock()
        if now < self._next_login_at:
            return False
        try:
            logged_in = self._login_session()
        except FabricError as exc:
            log.error("%s", exc)
            logged_in = False
        if logged_in:
            log.info("Redfish session expired; logged in again")
            self._login_failures = 0
            return True
        self._login_failures += 1
        wait = min(LOGIN_BACKOFF_MAX_SECONDS, LOGIN_BACKOFF_BASE_SECONDS * 2 ** (self._login_failures - 1))
        self._next_login_at = now + wait
        log.warning("Redfish login failed %d time(s); next try in %.0f s", self._login_failures, wait)
        return False

    def _request(self, method: str, path: str, body: Optional[dict[str, Any]] = None,
                 headers: Optional[dict[str, str]] = None) -> requests.Response:
        """One request; a 401 on a session (expired, or the service restarted) logs in again and retries once."""
        response = self._exchange(method, path, body, headers)
        if response.status_code == 401 and self._session_auth and self._relogin():
            response = self._exchange(method, path, body, headers)
        return response

    def _exchange(self, method: str, link: str, body: Optional[dict[str, Any]] = None,
                  headers: Optional[dict[str, str]] = None) -> requests.Response:
        """One request to the configured origin, read whole within `timeout_seconds` and `max_response_bytes`.
        Redirects are never followed by the HTTP library (it would carry `X-Auth-Token` to any host): a GET follows
        same-origin ones here, anything else is refused."""
        url = self._url(link)
        deadline = time.monotonic() + self._settings.timeout_seconds
        for _ in range(MAX_REDIRECTS + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResponseTooSlow(f"{method} {_shown(link)}: no complete answer within "
                                      f"redfish.timeout_seconds ({self._settings.timeout_seconds:g} s)")
            response = self._http.request(method, url, json=body, headers=headers, stream=True,
                                          allow_redirects=False, timeout=urllib3.Timeout(total=remaining))
            if not response.is_redirect:
                _read_whole(response, deadline, self._settings, f"{method} {_shown(link)}")
                return response
            location = str(response.headers.get("Location", ""))
            response.close()
            target = urljoin(url, location)
            if _origin_of(target) != self._origin:
                raise ForeignOrigin(f"{method} {_shown(link)}: the Redfish service redirected to {_shown(location)}, "
                                    f"outside the configured endpoint {self._base}: not followed (DDS sends requests "
                                    f"and credentials only to that origin)")
            if method != "GET":
                raise ForeignOrigin(f"{method} {_shown(link)}: the Redfish service redirected the change to "
                                    f"{_shown(location)}; DDS re-sends no change: point redfish.endpoint at the URI "
                                    f"the service wants")
            url = target
        raise ForeignOrigin(f"{method} {_shown(link)}: more than {MAX_REDIRECTS} redirects")

    def _own_link(self, link: Optional[str], what: str) -> Optional[str]:
        """A link from a response header (a session, a task monitor), or None when it leaves the origin."""
        if not link:
            return None
        try:
            self._url(link)
        except ForeignOrigin as exc:
            log.warning("Redfish %s link ignored: %s", what, exc)
            return None
        return link

    def _get(self, path: str) -> dict[str, Any]:
        return self._get_resource(path)[0]

    @retry(retry=retry_if_exception_type(requests.ConnectionError), stop=stop_after_attempt(3),
           wait=wait_exponential(multiplier=0.2, max=2.0), reraise=True)
    def _get_resource(self, path: str) -> tuple[dict[str, Any], Optional[str]]:
        """The resource and its ETag (the header, else `@odata.etag`)."""
        try:
            response = self._request("GET", path)
        except requests.Timeout as exc:
            raise FabricError(ErrorCode.TIMEOUT, f"GET {path}: {exc}") from exc
        except requests.ConnectionError:
            raise
        except requests.RequestException as exc:
            raise FabricError(ErrorCode.BACKEND, f"GET {path}: {exc}") from exc
        if response.status_code != 200:
            error = _http_error(response)
            raise FabricError(ErrorCode.NOT_FOUND if response.status_code == 404 else ErrorCode.BACKEND,
                              f"GET {path}: {error}")
        try:
            body = response.json()
        except ValueError as exc:
            raise FabricError(ErrorCode.BACKEND, f"GET {path}: the answer is not JSON ({_shown(str(exc))})") from exc
        if not isinstance(body, dict):
            raise FabricError(ErrorCode.BACKEND, f"GET {path}: the answer is not a JSON object")
        return body, response.headers.get("ETag") or body.get("@odata.etag")

    def _send(self, method: str, path: str, body: Optional[dict[str, Any]],
              headers: Optional[dict[str, str]] = None) -> Optional[str]:
        """A change; the task monitor's URI when the service accepted it for later (202 with a Location)."""
        response = self._request(method, path, body, headers)
        if response.status_code >= 300:
            raise _http_error(response)
        if response.status_code == 202:
            # Without a monitor of its own origin the block is followed through its CompositionState alone.
            return self._own_link(response.headers.get("Location"), "task monitor")
        return None


def _new_op(key: str, kind: OperationKind, node: str, system: str, pool: str, model: str, count: int,
            now: float) -> dict[str, Any]:
    return {"key": key, "kind": kind.value, "node": node, "system": system, "pool": pool, "model": model,
            "requested": count, "started_at": now, "state": OperationState.RUNNING.value, "blocks": {},
            "devices": [], "finished_at": None, "error_code": None, "error_message": ""}


def _failed(op: dict[str, Any], now: float, code: ErrorCode, message: str) -> dict[str, Any]:
    op.update(state=OperationState.FAILED.value, finished_at=now, error_code=code.value, error_message=message)
    return op


def _end_of(block: _Block, system: str) -> str:
    """Why an attach of `block` to `system` failed, as the operation's error says it."""
    if block.target is None:
        return f"resource block {block.id} ended {block.state}"
    if block.system_uri != system:
        return f"memory chunk {block.id} is bound to {block.system_uri} instead (Connection {block.connection})"
    return f"the Connection {block.connection} binding memory chunk {block.id} failed ({block.state})"


def _device_state(block: _Block, detaching: bool) -> DeviceState:
    if detaching:
        return DeviceState.DETACHING
    if block.state == "Composing":
        return DeviceState.ATTACHING
    if block.state in _ONLINE_STATES:
        return DeviceState.ONLINE
    return DeviceState.FAILED


def _link(body: dict[str, Any], name: str, where: str) -> str:
    try:
        return str(body[name]["@odata.id"])
    except (KeyError, TypeError) as exc:
        raise FabricError(ErrorCode.BACKEND, f"the Redfish {where} has no {name} link") from exc


def _pool_of(block: dict[str, Any]) -> str:
    zones = block.get("Links", {}).get("Zones", [])
    return _last_segment(zones[0]["@odata.id"]) if zones else DEFAULT_POOL


@dataclass(frozen=True)
class _Binding:
    """A CXL fabric Connection as DDS reads it: which chunks it binds to which initiators, in which state."""
    uri: str
    chunks: tuple[str, ...]
    initiators: tuple[str, ...]
    state: str  # in the composition vocabulary: Composing, Composed, Failed


def _binding_from(body: dict[str, Any]) -> _Binding:
    chunks = tuple(str(info["MemoryChunk"]["@odata.id"]) for info in body.get("MemoryChunkInfo", [])
                   if isinstance(info, dict) and isinstance(info.get("MemoryChunk"), dict)
                   and "@odata.id" in info["MemoryChunk"])
    initiators = tuple(str(link["@odata.id"]) for link in body.get("Links", {}).get("InitiatorEndpoints", [])
                       if isinstance(link, dict) and "@odata.id" in link)
    return _Binding(str(body.get("@odata.id", "")), chunks, initiators, _connection_state(body.get("Status")))


def _connection_state(status: Any) -> str:
    """A Connection's `Status` as a composition state: Enabled and healthy is Composed (the host has the memory);
    Critical, or a state that says it is not usable, is Failed; anything else (Starting, none yet) is Composing."""
    status = status if isinstance(status, dict) else {}
    if status.get("Health") == "Critical" or status.get("State") in _CONNECTION_FAILED_STATES:
        return "Failed"
    return "Composed" if status.get("State") == "Enabled" else "Composing"


def connection_request(chunk: str, initiator: str, target: Optional[str], name: str) -> dict[str, Any]:
    """The body of the POST that binds `chunk` to the host behind `initiator` (Connection v1_1_0+ MemoryChunkInfo)."""
    links: dict[str, Any] = {"InitiatorEndpoints": [{"@odata.id": initiator}]}
    if target:
        links["TargetEndpoints"] = [{"@odata.id": target}]
    return {"Name": name, "ConnectionType": "Memory", "Links": links,
            "MemoryChunkInfo": [{"AccessCapabilities": MEMORY_ACCESS, "MemoryChunk": {"@odata.id": chunk}}]}


def _chunk_id(uri: str) -> str:
    """A chunk's device id: its URI below the service root without the collection names, dotted
    (`/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/1/MemoryChunks/2` -> `PooledCXLType3.1.2`): chunk `Id`s repeat
    from one memory domain to the next, their URIs do not."""
    parts = uri.rstrip("/").split("/")[3:]
    return ".".join(p for p in parts if p not in ("Chassis", "Systems", "MemoryDomains", "MemoryChunks")) or uri


def _entity_link(entity: dict[str, Any]) -> str:
    link = entity.get("EntityLink")
    return str(link.get("@odata.id", "")) if isinstance(link, dict) else ""


def _under(link: str, uri: str) -> bool:
    return link.rstrip("/") == uri.rstrip("/") or link.startswith(uri.rstrip("/") + "/")


def _last_segment(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _with_initiators(system: _System, endpoints: list[_Endpoint]) -> _System:
    mine = tuple(e for e in endpoints if any(_under(link, system.uri) for link in e.initiator_of))
    return replace(system, initiators=mine) if mine else system


def _system_from(body: dict[str, Any]) -> _System:
    host, name = str(body.get("HostName") or ""), str(body.get("Name") or "")
    actions = {action: str(spec["target"]) for action, spec in body.get("Actions", {}).items()
               if action in (ADD_ACTION, REMOVE_ACTION) and isinstance(spec, dict) and "target" in spec}
    blocks = tuple(link["@odata.id"] for link in body.get("Links", {}).get("ResourceBlocks", []))
    return _System(str(body["@odata.id"]), host or name, (host, name), blocks, actions)


def _linked_blocks(system: dict[str, Any]) -> list[str]:
    return [link["@odata.id"] for link in system.get("Links", {}).get("ResourceBlocks", [])]


def _desired_links(current: list[str], block_uri: str, add: bool) -> list[dict[str, str]]:
    links = [uri for uri in current if uri != block_uri] + ([block_uri] if add else [])
    return [{"@odata.id": uri} for uri in links]


def _task_failure(response: requests.Response) -> Optional[RedfishHTTPError]:
    """The error a task monitor's final answer reports, or None when the request succeeded. Services answer the
    request's own outcome (an error status with a Base message), or 200 with the Task itself (TaskState)."""
    if response.status_code >= 300:
        return _http_error(response)
    try:
        task = response.json() if response.content else {}
    except ValueError:
        return None
    if isinstance(task, dict) and task.get("TaskState") in ("Exception", "Killed", "Cancelled"):
        messages = task.get("Messages") or [{}]
        return RedfishHTTPError(response.status_code, str(messages[-1].get("MessageId", "")),
                                str(messages[-1].get("Message") or f"the task ended {task['TaskState']}"))
    return None


def _warn_if_unverified(settings: RedfishSettings, origin: tuple[str, str, Optional[int]]) -> None:
    """Accept an unverified service, but loudly: a warning and the dds_redfish_tls_unverified gauge."""
    unverified = origin[0] == "http" or (not settings.verify_tls and settings.ca_file is None)
    metrics.REDFISH_TLS_UNVERIFIED.set(1 if unverified else 0)
    if not unverified:
        return
    why = "an http:// endpoint" if origin[0] == "http" else "redfish.verify_tls is false"
    sent = "its password and session token" if settings.username else "its requests"
    log.warning("the Redfish service %s is NOT verified (%s): DDS sends %s to whoever answers at that address; set "
                "redfish.ca_file to the service's CA instead", settings.endpoint, why, sent)


def _origin_of(url: str) -> tuple[str, str, Optional[int]]:
    """(scheme, host, port) with the scheme's default port filled in: what must match for a request to be sent."""
    parts = urlsplit(url)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:  # a port that is not a number: matches no origin
        return ("", "", None)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def _shown(text: str) -> str:
    """A URI or message of the service as a log line or an error shows it: bounded and quoted."""
    return repr(bounded_text(text, 256))


def _read_whole(response: requests.Response, deadline: float, settings: RedfishSettings, what: str) -> None:
    """Read the body of a streamed response into `response.content`, refusing it past `settings.max_response_bytes`
    or `deadline` (each read waits at most until the deadline, so a body dripped a byte at a time is cut off there)."""
    limit = settings.max_response_bytes
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        response.close()
        raise ResponseTooLarge(f"{what}: the answer has {int(declared)} bytes, over redfish.max_response_bytes "
                               f"({limit})")
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResponseTooSlow(f"{what}: the answer was not complete within redfish.timeout_seconds "
                                      f"({settings.timeout_seconds:g} s; {size} bytes read)")
            sock = getattr(response.raw.connection, "sock", None)
            if sock is not None:
                sock.settimeout(remaining)
            chunk = response.raw.read1(_READ_CHUNK_BYTES, decode_content=True)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge(f"{what}: the answer exceeds redfish.max_response_bytes ({limit})")
            chunks.append(chunk)
    except urllib3.exceptions.ReadTimeoutError as exc:
        response.close()
        raise ResponseTooSlow(f"{what}: the answer was not complete within redfish.timeout_seconds "
                              f"({settings.timeout_seconds:g} s; {size} bytes read)") from exc
    except urllib3.exceptions.HTTPError as exc:
        response.close()
        raise requests.ConnectionError(f"{what}: {exc}") from exc
    except requests.RequestException:
        response.close()  # the rest is unread: the connection cannot be used again
        raise
    response._content = b"".join(chunks)  # what `response.content` and `.json()` read
    response._content_consumed = True
    response.raw.release_conn()


def _http_error(response: requests.Response) -> RedfishHTTPError:
    message_id, message = "", response.reason or ""
    try:
        error = response.json().get("error", {})
        message_id = str(error.get("code", ""))
        info = error.get("@Message.ExtendedInfo") or []
        message = str(info[0].get("Message") if info else error.get("message", message))
        message_id = str(info[0].get("MessageId", message_id)) if info else message_id
    except (ValueError, AttributeError):
        pass
    return RedfishHTTPError(response.status_code, message_id, message)

