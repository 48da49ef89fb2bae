"""A Redfish service that composes GPUs, for tests and demos: http.server on 127.0.0.1 in a thread.

No composition-capable Redfish emulator is published (sushy-tools has no CompositionService; DMTF's
Redfish-Interface-Emulator composes only by POST/DELETE of Systems), so this one follows the DMTF schema for the part DDS
uses:

| URI                                                              | schema                                   |
|------------------------------------------------------------------|------------------------------------------|
| /redfish/v1/                                                     | ServiceRoot.v1_15_0                      |
| /redfish/v1/SessionService/Sessions[/<id>]                       | SessionCollection / Session.v1_6_0       |
| /redfish/v1/Systems[/<id>]                                       | ComputerSystem.v1_20_0 (Links.ResourceBlocks, AddResourceBlock / RemoveResourceBlock actions) |
| /redfish/v1/CompositionService                                   | CompositionService.v1_2_0                |
| /redfish/v1/CompositionService/ResourceBlocks/<id>               | ResourceBlock.v1_4_0 (CompositionStatus) |
| /redfish/v1/CompositionService/ResourceBlocks/<id>/Processors/GPU0 | Processor.v1_18_0, ProcessorType GPU   |
| /redfish/v1/CompositionService/ResourceZones/<id>                | Zone.v1_6_0 (ZoneOfResourceBlocks)       |

A GPU lives in a ResourceBlock of type Processor (ResourceBlockType has no GPU value). Composing a block into a system
(PATCH of the system's Links.ResourceBlocks, or the AddResourceBlock action) links it at once and leaves it `Composing`
for `composition_latency_s`, then `Composed`; removing it keeps it linked for `decomposition_latency_s`, then `Unused`.
Faults: `faults.compose_http_errors` answers the next N compose requests with 500 (nothing changes);
`faults.failing_blocks` ends those blocks' composition in `Failed`; `max_blocks_per_system` answers a compose beyond it
with 400 Base ResourceExhaustion. Time comes from an injected clock; state advances lazily on every request.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

ROOT = "/redfish/v1"
SYSTEMS = f"{ROOT}/Systems"
COMPOSITION = f"{ROOT}/CompositionService"
BLOCKS = f"{COMPOSITION}/ResourceBlocks"
ZONES = f"{COMPOSITION}/ResourceZones"
SESSIONS = f"{ROOT}/SessionService/Sessions"
ADD_ACTION = "ComputerSystem.AddResourceBlock"
REMOVE_ACTION = "ComputerSystem.RemoveResourceBlock"


@dataclass
class EmulatedSystem:
    id: str
    name: str
    host_name: str = ""


@dataclass
class EmulatorFaults:
    compose_http_errors: int = 0  # answer the next N compose requests with 500 Internal Server Error
    failing_blocks: set[str] = field(default_factory=set)  # these blocks end composition Failed


@dataclass
class EmulatorConfig:
    systems: list[EmulatedSystem]
    gpus: dict[str, dict[str, int]]  # zone id -> model -> GPU blocks
    composition_latency_s: float = 0.2
    decomposition_latency_s: float = 0.1
    username: str = ""  # empty: no authentication
    password: str = ""
    advertise_actions: bool = True  # False: clients must PATCH Links.ResourceBlocks
    max_blocks_per_system: Optional[int] = None
    faults: EmulatorFaults = field(default_factory=EmulatorFaults)


@dataclass
class _Block:
    id: str
    model: str
    zone: str
    state: str = "Unused"
    system: Optional[str] = None
    settles_at: Optional[float] = None
    removing: bool = False
    generation: int = 0

    @property
    def uri(self) -> str:
        return f"{BLOCKS}/{self.id}"


class RedfishError(Exception):
    def __init__(self, status: int, message_id: str, message: str):
        super().__init__(message)
        self.status = status
        self.message_id = message_id
        self.message = message


class RedfishEmulator:
    """Start with `start()` (or as a context manager); `url` is the service's base URL."""

    def __init__(self, config: EmulatorConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._systems = {s.id: s for s in config.systems}
        self._system_links: dict[str, list[str]] = {s.id: [] for s in config.systems}
        self._system_generation: dict[str, int] = {s.id: 0 for s in config.systems}
        self._blocks: dict[str, _Block] = {}
        for zone, models in sorted(config.gpus.items()):
            for model, count in sorted(models.items()):
                for _ in range(count):
                    block_id = f"GPU-{len(self._blocks) + 1:03d}"
                    self._blocks[block_id] = _Block(block_id, model, zone)
        self._sessions: dict[str, str] = {}  # token -> session id
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for tests
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # --- lifecycle ---
    def start(self) -> str:
        handler = type("Handler", (_Handler,), {"emulator": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="redfish-emulator", daemon=True)
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the emulator is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "RedfishEmulator":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test helpers ---
    def add_system(self, system: EmulatedSystem) -> bool:
        """Register one more ComputerSystem (a server racked while the service runs). False when its id exists."""
        with self._lock:
            if system.id in self._systems:
                return False
            self._systems[system.id] = system
            self._system_links[system.id] = []
            self._system_generation[system.id] = 0
            return True

    def system_ids(self) -> set[str]:
        with self._lock:
            return set(self._systems)

    def block_states(self) -> dict[str, tuple[str, Optional[str]]]:
        """Block id -> (CompositionState, system id)."""
        with self._lock:
            self._advance()
            return {b.id: (b.state, b.system) for b in self._blocks.values()}

    # --- request handling (called by the handler thread) ---
    def handle(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any, dict[str, str]]:
        path = path.split("?", 1)[0].rstrip("/") or "/"
        with self._lock:
            self.requests.append((method, path))
            self._advance()
            if method == "POST" and path == SESSIONS:
                return self._login(body)
            if path not in ("/redfish", ROOT) and not self._authorized(headers):
                raise RedfishError(401, "Base.1.8.NoValidSession", "authentication required")
            if method == "GET":
                return 200, self._get(path), {}
            if method == "PATCH" and path.startswith(SYSTEMS + "/"):
                return self._patch_system(path.rsplit("/", 1)[1], body)
            if method == "POST" and path.startswith(SYSTEMS + "/") and "/Actions/" in path:
                return self._action(path, body)
            if method == "DELETE" and path.startswith(SESSIONS + "/"):
                self._sessions = {t: s for t, s in self._sessions.items() if s != path.rsplit("/", 1)[1]}
                return 204, None, {}
        raise RedfishError(405, "Base.1.8.OperationNotAllowed", f"{method} {path} is not supported")

    def _advance(self) -> None:
        now = self._clock()
        for block in self._blocks.values():
            if block.settles_at is None or block.settles_at > now:
                continue
            block.settles_at = None
            block.generation += 1
            if block.removing:
                self._unlink(block)
            elif block.id in self.config.faults.failing_blocks:
                block.state = "Failed"
            else:
                block.state = "Composed"

    def _unlink(self, block: _Block) -> None:
        if block.system is not None:
            self._system_links[block.system].remove(block.id)
            self._system_generation[block.system] += 1
        block.system, block.state, block.removing = None, "Unused", False

    # --- authentication ---
    def _login(self, body: Any) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(body, dict) or body.get("UserName") != self.config.username or \
                body.get("Password") != self.config.password:
            raise RedfishError(401, "Base.1.8.InsufficientPrivilege", "wrong user name or password")
        session_id, token = str(len(self._sessions) + 1), secrets.token_hex(16)
        self._sessions[token] = session_id
        uri = f"{SESSIONS}/{session_id}"
        return 201, {"@odata.id": uri, "@odata.type": "#Session.v1_6_0.Session", "Id": session_id,
                     "Name": "DDS session", "UserName": self.config.username}, {"X-Auth-Token": token,
                                                                                 "Location": uri}

    def _authorized(self, headers: dict[str, str]) -> bool:
        if not self.config.username:
            return True
        if headers.get("x-auth-token") in self._sessions:
            return True
        expected = base64.b64encode(f"{self.config.username}:{self.config.password}".encode()).decode()
        return headers.get("authorization") == f"Basic {expected}"

    # --- GET ---
    def _get(self, path: str) -> dict[str, Any]:
        parts = path[len(ROOT):].strip("/").split("/") if path.startswith(ROOT) else []
        if path in ("/redfish", ROOT):
            return self._service_root() if path == ROOT else {"v1": ROOT + "/"}
        if path == SYSTEMS:
            return _collection(SYSTEMS, "#ComputerSystemCollection.ComputerSystemCollection", "Systems",
                               [f"{SYSTEMS}/{s}" for s in self._systems])
        if path.startswith(SYSTEMS + "/") and len(parts) == 2 and parts[1] in self._systems:
            return self._system(parts[1])
        if path == COMPOSITION:
            return {"@odata.id": COMPOSITION, "@odata.type": "#CompositionService.v1_2_0.CompositionService",
                    "Id": "CompositionService", "Name": "Composition Service", "ServiceEnabled": True,
                    "AllowOverprovisioning": False, "AllowZoneAffinity": True,
                    "Status": {"State": "Enabled", "Health": "OK"},
                    "ResourceBlocks": {"@odata.id": BLOCKS}, "ResourceZones": {"@odata.id": ZONES}}
        if path == BLOCKS:
            return _collection(BLOCKS, "#ResourceBlockCollection.ResourceBlockCollection", "Resource Blocks",
                               [b.uri for b in self._blocks.values()])
        if path == ZONES:
            return _collection(ZONES, "#ZoneCollection.ZoneCollection", "Resource Zones",
                               [f"{ZONES}/{z}" for z in sorted({b.zone for b in self._blocks.values()})])
        if path.startswith(ZONES + "/") and len(parts) == 3:
            return self._zone(parts[2])
        if path.startswith(BLOCKS + "/") and parts[2] in self._blocks:
            block = self._blocks[parts[2]]
            if len(parts) == 3:
                return self._block(block)
            if parts[3:] == ["Processors"]:
                return _collection(f"{block.uri}/Processors", "#ProcessorCollection.ProcessorCollection",
                                   "Processors", [f"{block.uri}/Processors/GPU0"])
            if parts[3:] == ["Processors", "GPU0"]:
                return self._processor(block)
        raise RedfishError(404, "Base.1.8.ResourceMissingAtURI", f"{path} does not exist")

    def _service_root(self) -> dict[str, Any]:
        return {"@odata.id": ROOT + "/", "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot", "Id": "RootService",
                "Name": "DDS Redfish emulator", "RedfishVersion": "1.18.0",
                "Systems": {"@odata.id": SYSTEMS}, "CompositionService": {"@odata.id": COMPOSITION},
                "SessionService": {"@odata.id": f"{ROOT}/SessionService"},
                "Links": {"Sessions": {"@odata.id": SESSIONS}}}

    def _system(self, system_id: str) -> dict[str, Any]:
        system = self._systems[system_id]
        uri = f"{SYSTEMS}/{system_id}"
        body: dict[str, Any] = {
            "@odata.id": uri, "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
            "@odata.etag": f'W/"{self._system_generation[system_id]}"', "Id": system_id, "Name": system.name,
            "HostName": system.host_name, "SystemType": "Composed", "PowerState": "On",
            "Status": {"State": "Enabled", "Health": "OK"},
            "Links": {"ResourceBlocks": [{"@odata.id": f"{BLOCKS}/{b}"} for b in self._system_links[system_id]]}}
        if self.config.advertise_actions:
            body["Actions"] = {f"#{ADD_ACTION}": {"target": f"{uri}/Actions/{ADD_ACTION}"},
                               f"#{REMOVE_ACTION}": {"target": f"{uri}/Actions/{REMOVE_ACTION}"}}
        return body

    def _block(self, block: _Block) -> dict[str, Any]:
        systems = [{"@odata.id": f"{SYSTEMS}/{block.system}"}] if block.system else []
        return {"@odata.id": block.uri, "@odata.type": "#ResourceBlock.v1_4_0.ResourceBlock",
                "@odata.etag": f'W/"{block.generation}"', "Id": block.id, "Name": f"{block.model} {block.id}",
                "ResourceBlockType": ["Processor"],
                "Status": {"State": "Enabled", "Health": "Critical" if block.state == "Failed" else "OK"},
                "CompositionStatus": {"CompositionState": block.state, "Reserved": False, "SharingCapable": False,
                                      "MaxCompositions": 1, "NumberOfCompositions": 1 if block.system else 0},
                "Processors": [{"@odata.id": f"{block.uri}/Processors/GPU0"}],
                "Links": {"ComputerSystems": systems, "Zones": [{"@odata.id": f"{ZONES}/{block.zone}"}]}}

    def _processor(self, block: _Block) -> dict[str, Any]:
        return {"@odata.id": f"{block.uri}/Processors/GPU0", "@odata.type": "#Processor.v1_18_0.Processor",
                "Id": "GPU0", "Name": f"{block.model} GPU", "ProcessorType": "GPU", "Manufacturer": "NVIDIA",
                "Model": block.model, "Status": {"State": "Enabled", "Health": "OK"}}

    def _zone(self, zone: str) -> dict[str, Any]:
        members = [b for b in self._blocks.values() if b.zone == zone]
        if not members:
            raise RedfishError(404, "Base.1.8.ResourceMissingAtURI", f"zone {zone} does not exist")
        return {"@odata.id": f"{ZONES}/{zone}", "@odata.type": "#Zone.v1_6_0.Zone", "Id": zone, "Name": zone,
                "ZoneType": "ZoneOfResourceBlocks", "Status": {"State": "Enabled", "Health": "OK"},
                "Links": {"ResourceBlocks": [{"@odata.id": b.uri} for b in members]}}

    # --- composition ---
    def _patch_system(self, system_id: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if system_id not in self._systems:
            raise RedfishError(404, "Base.1.8.ResourceMissingAtURI", f"system {system_id} does not exist")
        try:
            wanted = [_block_id(link["@odata.id"]) for link in body["Links"]["ResourceBlocks"]]
        except (KeyError, TypeError) as exc:
            raise RedfishError(400, "Base.1.8.PropertyValueFormatError",
                               f"body must carry Links.ResourceBlocks as a list of links: {exc}") from exc
        current = self._system_links[system_id]
        for block_id in [b for b in current if b not in wanted]:
            self._remove(system_id, block_id)
        for block_id in [b for b in wanted if b not in current]:
            self._add(system_id, block_id)
        return 200, self._system(system_id), {}

    def _action(self, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        parts = path[len(SYSTEMS) + 1:].split("/")
        if len(parts) != 3 or parts[0] not in self._systems or not self.config.advertise_actions:
            raise RedfishError(404, "Base.1.8.ResourceMissingAtURI", f"{path} does not exist")
        try:
            block_id = _block_id(body["ResourceBlock"]["@odata.id"])
        except (KeyError, TypeError) as exc:
            raise RedfishError(400, "Base.1.8.ActionParameterMissing",
                               f"{parts[2]} needs the parameter ResourceBlock: {exc}") from exc
        if parts[2] == ADD_ACTION:
            self._add(parts[0], block_id)
        elif parts[2] == REMOVE_ACTION:
            self._remove(parts[0], block_id)
        else:
            raise RedfishError(404, "Base.1.8.ActionNotSupported", f"action {parts[2]} is not supported")
        return 204, None, {}

    def _add(self, system_id: str, block_id: str) -> None:
        block = self._blocks.get(block_id)
        if block is None:
            raise RedfishError(400, "Base.1.8.ResourceMissingAtURI", f"resource block {block_id} does not exist")
        if self.config.faults.compose_http_errors > 0:
            self.config.faults.compose_http_errors -= 1
            raise RedfishError(500, "Base.1.8.InternalError", "injected fault: the composition engine failed")
        if block.system is not None or block.state != "Unused":
            raise RedfishError(400, "Base.1.8.ResourceInUse", f"resource block {block_id} is {block.state}")
        limit = self.config.max_blocks_per_system
        if limit is not None and len(self._system_links[system_id]) >= limit:
            raise RedfishError(400, "Base.1.8.ResourceExhaustion",
                               f"system {system_id} has no free slot ({limit} resource blocks)")
        block.system, block.state, block.removing = system_id, "Composing", False
        block.settles_at = self._clock() + self.config.composition_latency_s
        block.generation += 1
        self._system_links[system_id].append(block_id)
        self._system_generation[system_id] += 1

    def _remove(self, system_id: str, block_id: str) -> None:
        block = self._blocks.get(block_id)
        if block is None or block.system != system_id:
            raise RedfishError(400, "Base.1.8.ResourceMissingAtURI",
                               f"resource block {block_id} is not part of system {system_id}")
        if block.removing:
            return
        block.removing = True
        block.settles_at = self._clock() + self.config.decomposition_latency_s
        block.generation += 1


def _collection(uri: str, odata_type: str, name: str, members: list[str]) -> dict[str, Any]:
    return {"@odata.id": uri, "@odata.type": odata_type, "Name": name, "Members@odata.count": len(members),
            "Members": [{"@odata.id": m} for m in members]}


def _block_id(uri: str) -> str:
    if not isinstance(uri, str) or not uri.startswith(BLOCKS + "/"):
        raise RedfishError(400, "Base.1.8.PropertyValueNotInList", f"{uri!r} is not a resource block")
    return uri.rstrip("/").rsplit("/", 1)[1]


class _Handler(BaseHTTPRequestHandler):
    emulator: RedfishEmulator
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: without this each answer waits ~40 ms

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
            status, payload, headers = self.emulator.handle(
                method, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        except json.JSONDecodeError as exc:
            status, payload, headers = 400, _error("Base.1.8.MalformedJSON", str(exc)), {}
        except RedfishError as exc:
            status, payload, headers = exc.status, _error(exc.message_id, exc.message), {}
        data = json.dumps(payload).encode() if payload is not None else b""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("OData-Version", "4.0")
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


def _error(message_id: str, message: str) -> dict[str, Any]:
    return {"error": {"code": message_id, "message": message,
                      "@Message.ExtendedInfo": [{"@odata.type": "#Message.v1_1_1.Message", "MessageId": message_id,
                                                 "Message": message, "Severity": "Warning"}]}}
