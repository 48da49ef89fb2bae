"""A Redfish composition service for tests and demos, whose world is one of DMTF's published mockups.

DMTF publishes its composability examples as mockups (`../shared/third_party/redfish-publications-2025.4-subset.tar.gz`,
extracted and checksum-checked into `~/.cache/dds/redfish-publications/` on first use): a JSON tree, one
`<uri>/index.json` per resource. The emulator loads one (default `public-composability`) as its starting state, adds
what the test asks for in the same shapes, and changes it as DSP0268 describes:

- GPU resource blocks: copies of the mockup's GPU offload block (a `ResourceBlock` of type `Processor` whose Processor
  has `ProcessorType: GPU`; `public-composability`'s `OffloadBlock9` when the mockup has none), `GPU-001`, ... in the
  zones the config names (a zone the mockup lacks is a copy of its first `ZoneOfResourceBlocks`).
- ComputerSystems for the config's systems: copies of the mockup's first system that advertises
  `#ComputerSystem.AddResourceBlock`, with no resource blocks yet.
- Composition: `#ComputerSystem.AddResourceBlock` / `RemoveResourceBlock` (where the system advertises them), a PATCH
  of the system's `Links.ResourceBlocks` (with `If-Match`: 412 when the ETag is stale), and
  `#CompositionService.Compose` (a `ComposeSystem` stanza naming an existing system by `@odata.id`: its desired
  `Links.ResourceBlocks`) where the CompositionService advertises it (at the target it advertises). A block being added
  is linked at once and `Composing` for `composition_latency_s`, then `Composed`; a block being removed stays linked
  for `decomposition_latency_s`, then is `Unused`. A change slower than `task_after_s` is answered `202 Accepted` with
  a task monitor (`Location`) and a `Task` in the TaskService; the monitor answers 202 while the task runs, then the
  request's own outcome.
- `$metadata` (the references of every schema namespace served, to DMTF's CSDL), `/redfish/v1/odata`, SessionService
  (login, inactivity expiry after `SessionTimeout`, logout), `ETag` headers and `@odata.etag` on systems and blocks.
- Refusals carry Base registry messages in `@Message.ExtendedInfo`.

CXL memory (DMTF's `public-cxl` / `public-cxl-multiswitch`: a `Fabrics/CXL` with Endpoints, Zones and Connections and
no CompositionService): the fabric's Connections are live. `memory` adds chunks (`MemoryChunks` shaped like the
mockup's) to the memory domain of the pooled Type 3 device whose target endpoint is in the zone named, listed as
`MemoryChunk` entities of that endpoint. Each configured system gets a processor and an initiator Endpoint (copies of
the mockup's, in every zone with Type 3 memory). A POST of a `Connection` (`ConnectionType: Memory`, `MemoryChunkInfo`,
`Links.InitiatorEndpoints`, optional `Links.TargetEndpoints`) to the Connections collection binds the chunks: it is
`Starting` for `composition_latency_s`, then `Enabled` (202 + task monitor when slower than `task_after_s`, like a
composition); a chunk is in one Connection at a time (409 ResourceInUse for a second); initiator and target must share
a zone; `MemoryRegionInfo` is refused (no memory regions in a CXL fabric's Connections, Connection v1_3_3). A DELETE
removes it (after `decomposition_latency_s`, 202 when slower than `task_after_s`). The host side shows what is bound as
the mockup does for its own host: one `Memory` per Enabled Connection in the system's Memory collection
(`MemoryMediaSources`: the chunk), and `MemorySummary.TotalSystemMemoryGiB` grown by it.

Faults for tests: `compose_http_errors` (the next N composition requests answer 500, nothing changes), `failing_blocks`
(their composition ends `Failed`), `failing_tasks` (their composition task ends `Exception` and the service rolls the
block back), `concurrent_writes` (the next N PATCHes find the system just changed by another client: 412),
`max_blocks_per_system` (400 ResourceExhaustion), `phantom_connections` (the next N Connection POSTs are answered 201
and nothing is created), `gone_connections` (URIs the Connections collection lists that answer 404, as a Connection
deleted between a client's read of the collection and of the member). Memory chunks are named by URI in `failing_blocks`
/ `failing_tasks` (their Connection ends Failed / its task ends Exception and the Connection is removed);
`compose_http_errors` applies to Connection POSTs and DELETEs too, `refusal_chars` to Connection POSTs. Time comes from
an injected clock; state advances lazily.

Hostile faults, a service lying to its client (DDS must treat it as an untrusted peer, docs/redfish.md):
`sessions_link` (the service root's `Links.Sessions` names another URI, "" removes it: no session service),
`foreign_members` (absolute `@odata.id`s of another host listed among the Systems), `redirects` (a GET of a path, as
asked, answers 307 to another URI), `refusal_chars` (the next composition is refused with a message this long),
`padding_bytes` (the service root carries this much padding), `drip_seconds` (the service root's body is sent a byte
at a time, this long apart). `CredentialTrap` is the other host: it records whatever reaches it.

Standalone: `python -m harness.redfish_emulator --mockup DIR --listen HOST:PORT` (user admin, password password).
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import os
import re
import secrets
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = "/redfish/v1"
SYSTEMS = f"{ROOT}/Systems"
COMPOSITION = f"{ROOT}/CompositionService"
BLOCKS = f"{COMPOSITION}/ResourceBlocks"
ZONES = f"{COMPOSITION}/ResourceZones"
SESSION_SERVICE = f"{ROOT}/SessionService"
SESSIONS = f"{SESSION_SERVICE}/Sessions"
TASK_SERVICE = f"{ROOT}/TaskService"
TASKS = f"{TASK_SERVICE}/Tasks"
TASK_MONITORS = f"{TASK_SERVICE}/TaskMonitors"
METADATA = f"{ROOT}/$metadata"
ODATA = f"{ROOT}/odata"
ADD_ACTION = "ComputerSystem.AddResourceBlock"
REMOVE_ACTION = "ComputerSystem.RemoveResourceBlock"
COMPOSE_ACTION = "CompositionService.Compose"
BASE = "Base.1.19"  # the Base message registry version the refusals name

REPO = Path(__file__).resolve().parent.parent
PUBLICATIONS_ARCHIVE = REPO.parent / "shared" / "third_party" / "redfish-publications-2025.4-subset.tar.gz"
PUBLICATIONS_SHA256 = "be90b24d02d73dd0f2bc3ff6490d8a4aa7477203d149e8b7ec20e7952d8c0301"
PUBLICATIONS_TOP = "redfish-publications-2025.4"
DEFAULT_MOCKUP = "public-composability"
STANDALONE_USER, STANDALONE_PASSWORD = "admin", "password"
_PUBLIC = (ROOT, "/redfish", METADATA, ODATA)  # served without authentication (DSP0266)


# --- DMTF's publications, extracted once per machine ---
def publications(cache_dir: Optional[Path] = None) -> Path:
    """The extracted archive's top folder (`csdl/`, `mockups/`), extracting it after checking its sha256."""
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dds" / "redfish-publications"
    target = cache / PUBLICATIONS_SHA256[:16]
    if (target / PUBLICATIONS_TOP / "csdl").is_dir():
        return target / PUBLICATIONS_TOP
    if not PUBLICATIONS_ARCHIVE.is_file():
        raise FileNotFoundError(f"{PUBLICATIONS_ARCHIVE} is missing: DMTF's Redfish publications come from "
                                f"../shared/third_party beside the checkout")
    digest = hashlib.sha256(PUBLICATIONS_ARCHIVE.read_bytes()).hexdigest()
    if digest != PUBLICATIONS_SHA256:
        raise ValueError(f"{PUBLICATIONS_ARCHIVE}: sha256 {digest}, expected {PUBLICATIONS_SHA256} "
                         f"(../shared/third_party/README.md)")
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=cache, prefix="extract-"))
    try:
        with tarfile.open(PUBLICATIONS_ARCHIVE) as archive:
            archive.extractall(scratch, filter="data")
        try:
            scratch.rename(target)  # atomic: a concurrent extraction either wins or finds the folder in place
        except OSError:
            if not (target / PUBLICATIONS_TOP / "csdl").is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target / PUBLICATIONS_TOP


def mockup_path(name: str = DEFAULT_MOCKUP) -> Path:
    return publications() / "mockups" / name


def csdl_path() -> Path:
    return publications() / "csdl"


def load_mockup(directory: Path) -> dict[str, dict[str, Any]]:
    """URI -> resource, from a mockup folder (`index.json` per URI; `$metadata` is generated, not read)."""
    if not (directory / "index.json").is_file():
        raise FileNotFoundError(f"{directory} is not a Redfish mockup: no index.json (the service root) in it")
    docs: dict[str, dict[str, Any]] = {}
    for index in sorted(directory.rglob("index.json")):
        relative = index.parent.relative_to(directory).as_posix()
        uri = ROOT if relative == "." else f"{ROOT}/{relative}"
        docs[uri] = _as_served(uri, json.loads(index.read_text()))
    for doc in docs.values():
        _without_dangling_links(doc, docs)
    return docs


def _slips_corrected(node: Any) -> None:
    """Property-level slips of DMTF's CXL mockups that DMTF's CSDL refuses, served as the schema has them: a LogEntry
    `Created` without seconds, a Thermal fan's pre-1.0 `ReadingRPM` (`Reading` with `ReadingUnits: RPM`), a redundancy
    `Mode` of `N+1` (`N+m`, its `MinNumNeeded` saying N), a switch PID target's `VCS ID` (`VcsID`)."""
    if isinstance(node, list):
        for item in node:
            _slips_corrected(item)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("Created"), str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", node["Created"]):
        node["Created"] += ":00+00:00"
    if "ReadingRPM" in node and "Reading" not in node:
        node["Reading"], node["ReadingUnits"] = node.pop("ReadingRPM"), "RPM"
    if node.get("Mode") == "N+1" and "RedundancySet" in node:
        node["Mode"] = "N+m"
    if "VCS ID" in node:
        node["VcsID"] = node.pop("VCS ID")
    for value in node.values():
        _slips_corrected(value)


def _without_dangling_links(node: Any, docs: dict[str, dict[str, Any]]) -> None:
    """Links a live service must not serve: a `DataSourceUri` naming a resource the mockup does not carry (DMTF's
    multiswitch mockup names sensors of chassis it leaves out), a `Links.ComputerSystems` entry that is no system."""
    if isinstance(node, list):
        for item in node:
            _without_dangling_links(item, docs)
        return
    if not isinstance(node, dict):
        return
    source = node.get("DataSourceUri")
    if isinstance(source, str) and _normal(source) not in docs:
        del node["DataSourceUri"]
    systems = node.get("ComputerSystems")
    if isinstance(systems, list):
        node["ComputerSystems"] = [link for link in systems if not isinstance(link, dict)
                                   or str(link.get("@odata.id", "")).startswith(SYSTEMS + "/")]
    for value in node.values():
        _without_dangling_links(value, docs)


def _as_served(uri: str, doc: dict[str, Any]) -> dict[str, Any]:
    """A mockup resource as a live service serves it. DMTF's mockups are documentation: they carry the
    `@Redfish.Copyright` annotation (allowed in mockups only) and a few slips DSP0266 forbids a service (an `@odata.id`
    or `Id` that is not the resource's own URI or its last segment, an action target not at `<URI>/Actions/<action>`,
    a Role without its mandatory `RoleId`), which DMTF's validator reports as failures."""
    doc.pop("@Redfish.Copyright", None)
    _slips_corrected(doc)
    if "@odata.id" in doc and _normal(doc["@odata.id"]) != uri:
        doc["@odata.id"] = uri  # a resource is where it is served (one mockup copy-pasted another's @odata.id)
    if "Id" in doc and "@odata.id" in doc and doc["Id"] != _last(uri):
        doc["Id"] = _last(uri)
    for name, action in doc.get("Actions", {}).items():
        if name.startswith("#") and isinstance(action, dict) and "target" in action:
            action["target"] = f"{uri}/Actions/{name[1:]}"  # DSP0266's form; the mockups misspell a few
    if _type_name(doc) == "Role" and "RoleId" not in doc:
        doc["RoleId"] = doc.get("Id", _last(uri))
    return doc


# --- configuration ---
@dataclass
class EmulatedSystem:
    id: str
    name: str
    host_name: str = ""


@dataclass
class EmulatorFaults:
    compose_http_errors: int = 0  # answer the next N composition requests with 500 InternalError
    failing_blocks: set[str] = field(default_factory=set)  # these blocks end composition Failed
    failing_tasks: set[str] = field(default_factory=set)  # composing these ends the task in Exception (rolled back)
    concurrent_writes: int = 0  # the next N PATCHes of a system find it changed by another client (412)
    sessions_link: Optional[str] = None  # the service root's Links.Sessions: None as served, "" removed, else this
    foreign_members: list[str] = field(default_factory=list)  # absolute @odata.ids added to the Systems collection
    redirects: dict[str, str] = field(default_factory=dict)  # path -> where a GET of it is redirected (307)
    refusal_chars: int = 0  # the next composition is refused (400) with a message of this many characters
    padding_bytes: int = 0  # the service root carries an Oem padding of this many bytes
    drip_seconds: float = 0.0  # the service root's body is sent one byte at a time, this long apart
    phantom_connections: int = 0  # the next N Connection POSTs answer 201 with a Location and create nothing
    gone_connections: list[str] = field(default_factory=list)  # listed in Connections, 404 (deleted between reads)


@dataclass
class EmulatorConfig:
    systems: list[EmulatedSystem]
    gpus: dict[str, dict[str, int]]  # zone id -> model -> GPU blocks
    composition_latency_s: float = 0.2
    decomposition_latency_s: float = 0.1
    username: str = ""  # empty: no authentication
    password: str = ""
    advertise_actions: bool = True  # False: no Add/RemoveResourceBlock, clients must PATCH Links.ResourceBlocks
    max_blocks_per_system: Optional[int] = None
    faults: EmulatorFaults = field(default_factory=EmulatorFaults)
    mockup: Optional[Path] = None  # default: DMTF's public-composability
    compose_action: Optional[bool] = None  # None: as the mockup advertises; True adds it, False removes it
    task_after_s: Optional[float] = 1.0  # changes slower than this answer 202 + task monitor; None: never
    session_timeout_s: Optional[int] = None  # None: the mockup's SessionService.SessionTimeout
    memory: dict[str, dict[int, int]] = field(default_factory=dict)  # CXL zone id -> chunk size MiB -> chunks


class RedfishError(Exception):
    """A refusal: HTTP status and a Base registry message."""

    def __init__(self, status: int, message_key: str, message: str, args: tuple[str, ...] = ()):
        super().__init__(message)
        self.status = status
        self.message_id = f"{BASE}.{message_key}"
        self.message = message
        self.args_ = args


# --- the emulator's model of what composition changes ---
@dataclass
class _Block:
    id: str  # the last URI segment (the mockup's Id may differ)
    uri: str
    state: str = "Unused"
    systems: list[str] = field(default_factory=list)  # system uris
    settles_at: Optional[float] = None
    removing: bool = False
    generation: int = 0
    task: Optional[str] = None


@dataclass
class _System:
    id: str
    uri: str
    blocks: list[str] = field(default_factory=list)  # block uris, in Links.ResourceBlocks
    composable: bool = True  # carries Links.ResourceBlocks
    generation: int = 0


@dataclass
class _Connection:
    """A CXL fabric Connection: `doc` as created (or as the mockup has it), the rest live."""
    id: str
    uri: str
    doc: dict[str, Any]
    chunks: list[str]
    initiators: list[str]
    targets: list[str]
    state: str = "Enabled"  # Starting, Enabled, Failed
    settles_at: Optional[float] = None
    removing: bool = False
    task: Optional[str] = None


@dataclass
class _Host:
    """A configured system on a CXL fabric: its initiator endpoint and the memory it has of its own."""
    system: str
    endpoint: str
    own_gib: float


@dataclass
class _Session:
    id: str
    token: str
    user: str
    last_used: float


@dataclass
class _Task:
    id: str
    started: float
    blocks: list[str]  # block uris this task waits for
    state: str = "Running"
    messages: list[dict[str, Any]] = field(default_factory=list)
    ended: Optional[float] = None


class RedfishEmulator:
    """Start with `start()` (or as a context manager); `url` is the service's base URL."""

    def __init__(self, config: EmulatorConfig, clock: Callable[[], float] = time.monotonic,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self._clock = clock
        self._listen = (host, port)
        self._lock = threading.RLock()
        self._docs = load_mockup(config.mockup or mockup_path())
        self._composition = COMPOSITION in self._docs and BLOCKS in self._docs
        self._fabric = next((uri for uri, doc in sorted(self._docs.items()) if _type_name(doc) == "Fabric"
                             and doc.get("FabricType") == "CXL"), None)
        if not self._composition and (config.gpus or self._fabric is None):
            # DMTF's CXL mockups attach devices through Fabrics (endpoints, zones, connections), not through a
            # CompositionService's resource blocks: GPUs are composed in the composability mockups only.
            raise ValueError(f"{config.mockup}: no CompositionService with ResourceBlocks; DDS composes GPUs "
                             f"through a CompositionService (DSP0268 resource blocks), so this emulator serves GPUs "
                             f"only on mockups that have one (public-composability, public-compose-action, "
                             f"public-constrained-composition)"
                             + ("; its CXL fabric serves memory (EmulatorConfig.memory)" if self._fabric else ""))
        if config.memory and self._fabric is None:
            raise ValueError(f"{config.mockup or DEFAULT_MOCKUP}: no CXL fabric (Fabrics member with FabricType CXL) "
                             f"to serve memory from: use public-cxl or public-cxl-multiswitch")
        self._connections: dict[str, _Connection] = {}  # by uri
        self._chunk_targets: dict[str, str] = {}  # memory chunk uri -> its target endpoint uri
        self._local: dict[str, str] = {}  # chunk uri -> the mockup system whose own Memory it backs, unconnected
        self._hosts: dict[str, _Host] = {}  # by system uri
        self._connection_seq = 0
        self._blocks: dict[str, _Block] = {}  # by uri
        self._systems: dict[str, _System] = {}  # by uri
        self._sessions: dict[str, _Session] = {}  # by token
        self._tasks: dict[str, _Task] = {}
        self._session_seq = 0
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for tests
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._read_world()
        self._add_services()
        self._add_gpus(config.gpus)
        if self._fabric is not None:
            self._read_fabric()
            self._add_memory(config.memory)
        for system in config.systems:
            self.add_system(system)

    # --- building the world ---
    def _read_world(self) -> None:
        for uri, doc in self._docs.items():
            kind = _type_name(doc)
            if kind == "ResourceBlock":
                state = doc.get("CompositionStatus", {}).get("CompositionState", "Unused")
                linked = [link["@odata.id"] for link in doc.get("Links", {}).get("ComputerSystems", [])]
                self._blocks[uri] = _Block(_last(uri), uri, state, linked)
        for uri, doc in self._docs.items():
            if _type_name(doc) != "ComputerSystem":
                continue
            links = doc.get("Links", {}).get("ResourceBlocks")
            system = _System(_last(uri), uri, [link["@odata.id"] for link in links or []], links is not None)
            self._systems[uri] = system
            for block_uri in system.blocks:  # the mockup names some links on one side only
                block = self._blocks.get(block_uri)
                if block is not None and uri not in block.systems:
                    block.systems.append(uri)
        for block in self._blocks.values():
            for system_uri in block.systems:
                system = self._systems.get(system_uri)
                if system is not None and system.composable and block.uri not in system.blocks:
                    system.blocks.append(block.uri)
        if not self.config.advertise_actions:
            for uri in self._systems:
                actions = self._docs[uri].get("Actions", {})
                for name in (f"#{ADD_ACTION}", f"#{REMOVE_ACTION}"):
                    actions.pop(name, None)
        composition = self._docs.get(COMPOSITION)
        if composition is not None and self.config.compose_action is not None:
            actions = composition.setdefault("Actions", {})
            if not self.config.compose_action:
                actions.pop(f"#{COMPOSE_ACTION}", None)
            elif f"#{COMPOSE_ACTION}" not in actions:
                actions[f"#{COMPOSE_ACTION}"] = {"target": f"{COMPOSITION}/Actions/{COMPOSE_ACTION}"}
            if not actions:
                del composition["Actions"]

    def _add_services(self) -> None:
        """SessionService and TaskService where the mockup lacks them, linked from the service root and `odata`."""
        root = self._docs[ROOT]
        if SESSION_SERVICE not in self._docs:
            self._docs[SESSION_SERVICE] = {
                "@odata.id": SESSION_SERVICE, "@odata.type": "#SessionService.v1_2_0.SessionService",
                "Id": "SessionService", "Name": "Session Service", "ServiceEnabled": True, "SessionTimeout": 1800,
                "Status": {"State": "Enabled", "Health": "OK"}, "Sessions": {"@odata.id": SESSIONS}}
        if self.config.session_timeout_s is not None:
            self._docs[SESSION_SERVICE]["SessionTimeout"] = self.config.session_timeout_s
        root["SessionService"] = {"@odata.id": SESSION_SERVICE}
        root.setdefault("Links", {})["Sessions"] = {"@odata.id": SESSIONS}
        self._docs.pop(SESSIONS, None)  # the collection is the live sessions
        for uri in [u for u in self._docs if u.startswith(SESSIONS + "/")]:
            del self._docs[uri]
        self._docs[TASK_SERVICE] = {
            "@odata.id": TASK_SERVICE, "@odata.type": "#TaskService.v1_3_0.TaskService", "Id": "TaskService",
            "Name": "Task Service", "ServiceEnabled": True, "CompletedTaskOverWritePolicy": "Oldest",
            "LifeCycleEventOnTaskStateChange": False, "Status": {"State": "Enabled", "Health": "OK"},
            "Tasks": {"@odata.id": TASKS}}
        root["Tasks"] = {"@odata.id": TASK_SERVICE}
        odata = self._docs.setdefault(ODATA, {"@odata.context": METADATA, "value": []})
        odata.pop("@Redfish.Copyright", None)
        listed = {entry.get("url", "").rstrip("/") for entry in odata["value"]}
        for name, value in root.items():
            if isinstance(value, dict) and "@odata.id" in value and value["@odata.id"].rstrip("/") not in listed:
                odata["value"].append({"name": name, "kind": "Singleton", "url": value["@odata.id"]})

    def _add_gpus(self, gpus: dict[str, dict[str, int]]) -> None:
        if not gpus:
            return
        block_template, processor_template = self._gpu_templates()
        for zone, models in sorted(gpus.items()):
            zone_doc = self._zone(zone)
            for model, count in sorted(models.items()):
                for _ in range(count):
                    block_id = f"GPU-{sum(1 for b in self._blocks if _last(b).startswith('GPU-')) + 1:03d}"
                    uri = f"{BLOCKS}/{block_id}"
                    processor_uri = f"{uri}/Processors/GPU0"
                    block = copy.deepcopy(block_template)
                    block.update({"@odata.id": uri, "Id": block_id, "Name": f"{model} {block_id}",
                                  "Processors": [{"@odata.id": processor_uri}]})
                    block["Links"] = {"ComputerSystems": [], "Zones": [{"@odata.id": zone_doc["@odata.id"]}]}
                    processor = copy.deepcopy(processor_template)
                    processor.update({"@odata.id": processor_uri, "Id": "GPU0", "Name": f"{model} GPU",
                                      "Model": model})
                    processor.pop("Links", None)  # the template's chassis is not this block's
                    self._docs[uri] = block
                    self._docs[processor_uri] = processor
                    self._blocks[uri] = _Block(block_id, uri)
                    self._docs[BLOCKS]["Members"].append({"@odata.id": uri})
                    zone_doc.setdefault("Links", {}).setdefault("ResourceBlocks", []).append({"@odata.id": uri})

    def _gpu_templates(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The mockup's GPU offload block and its processor, or public-composability's when it has none."""
        for docs in (self._docs, load_mockup(mockup_path(DEFAULT_MOCKUP))):
            for uri, doc in docs.items():
                if _type_name(doc) != "ResourceBlock":
                    continue
                for link in doc.get("Processors", []):
                    processor = docs.get(link["@odata.id"].rstrip("/"))
                    if processor and processor.get("ProcessorType") == "GPU":
                        block = copy.deepcopy(doc)
                        block["CompositionStatus"] = {**block.get("CompositionStatus", {}),
                                                      "CompositionState": "Unused", "Reserved": False}
                        if "NumberOfCompositions" in block["CompositionStatus"]:
                            block["CompositionStatus"]["NumberOfCompositions"] = 0
                        if "Pool" in block:
                            block["Pool"] = "Free"
                        return block, copy.deepcopy(processor)
        raise ValueError("no GPU resource block in the mockup nor in public-composability")

    def _zone(self, zone: str) -> dict[str, Any]:
        uri = f"{ZONES}/{zone}"
        if uri in self._docs:
            return self._docs[uri]
        templates = [d for u, d in self._docs.items() if u.startswith(ZONES + "/") and _type_name(d) == "Zone"]
        doc = copy.deepcopy(templates[0]) if templates else {
            "@odata.type": "#Zone.v1_6_3.Zone", "ZoneType": "ZoneOfResourceBlocks",
            "Status": {"State": "Enabled", "Health": "OK"}}
        doc.update({"@odata.id": uri, "Id": zone, "Name": f"Resource Zone {zone}"})
        doc["Links"] = {"ResourceBlocks": []}
        doc.pop("@Redfish.CollectionCapabilities", None)
        self._docs[uri] = doc
        self._docs.setdefault(ZONES, {"@odata.id": ZONES, "@odata.type": "#ZoneCollection.ZoneCollection",
                                      "Name": "Resource Zones", "Members": []})["Members"].append({"@odata.id": uri})
        self._docs[COMPOSITION].setdefault("ResourceZones", {"@odata.id": ZONES})
        return doc

    # --- the CXL fabric ---
    def _read_fabric(self) -> None:
        """Connections as live state; every endpoint in the Endpoints collection (the mockups leave some out)."""
        connections, endpoints = f"{self._fabric}/Connections", f"{self._fabric}/Endpoints"
        for uri, doc in sorted(self._docs.items()):
            if uri.startswith(connections + "/") and _type_name(doc) == "Connection":
                connection = _Connection(_last(uri), uri, doc, _links_of(doc.get("MemoryChunkInfo", []), "MemoryChunk"),
                                         _links_of(doc.get("Links", {}).get("InitiatorEndpoints", [])),
                                         _links_of(doc.get("Links", {}).get("TargetEndpoints", [])))
                self._connections[uri] = connection
                self._connection_seq = max(self._connection_seq, int(connection.id) if connection.id.isdigit() else 0)
            elif uri.startswith(endpoints + "/") and _type_name(doc) == "Endpoint":
                if {"@odata.id": uri} not in self._docs[endpoints]["Members"]:
                    self._docs[endpoints]["Members"].append({"@odata.id": uri})
                for entity in doc.get("ConnectedEntities", []):
                    if entity.get("EntityType") == "MemoryChunk" and entity.get("EntityRole") == "Target":
                        self._chunk_targets.setdefault(entity["EntityLink"]["@odata.id"], uri)
        for uri in [u for u in self._docs if u.startswith(connections + "/")]:
            del self._docs[uri]  # served from the live state
        bound = {chunk for c in self._connections.values() for chunk in c.chunks}
        for uri, doc in self._docs.items():
            if _type_name(doc) == "Memory" and uri.startswith(SYSTEMS + "/"):
                for chunk in _links_of(doc.get("Links", {}).get("MemoryMediaSources", [])):
                    if chunk in self._chunk_targets and chunk not in bound:
                        # DMTF's public-cxl: the host's directly attached Type 3 device, a target endpoint with no
                        # Connection; its memory is that host's, not the pool's.
                        self._local[chunk] = uri.split("/Memory/", 1)[0]

    def _type3_targets(self) -> list[str]:
        """Target endpoints of Type 3 logical devices (CXL.mem without CXL.cache) that name memory chunks."""
        found = []
        for uri in sorted(set(self._chunk_targets.values())):
            devices = [e["EntityLink"]["@odata.id"] for e in self._docs[uri].get("ConnectedEntities", [])
                       if e.get("EntityType") == "CXLDevice"]
            semantics = [set(self._docs.get(d, {}).get("SemanticsSupported", [])) for d in devices]
            if semantics and all("CXLmem" in s and "CXLcache" not in s for s in semantics):
                found.append(uri)
        return found

    def _memory_zones(self) -> list[str]:
        return sorted({z["@odata.id"] for t in self._type3_targets() for z in self._docs[t].get("Links", {})
                       .get("Zones", [])})

    def _add_memory(self, memory: dict[str, dict[int, int]]) -> None:
        """Chunks in the memory domain of the zone's first Type 3 target endpoint's device."""
        for zone, sizes in sorted(memory.items()):
            zone_uri = f"{self._fabric}/Zones/{zone}"
            targets = [t for t in self._type3_targets()
                       if {"@odata.id": zone_uri} in self._docs[t].get("Links", {}).get("Zones", [])]
            if not targets:
                raise ValueError(f"memory zone {zone!r}: the mockup has no Type 3 memory endpoint in it (zones with "
                                 f"one: {', '.join(_last(z) for z in self._memory_zones())})")
            target = targets[0]
            template_uri = min(c for c, t in self._chunk_targets.items() if t == target)
            template = self._docs[template_uri]
            collection = template_uri.rsplit("/", 1)[0]
            domain = self._docs[collection.rsplit("/", 1)[0]]
            devices = _links_of(template.get("Links", {}).get("CXLLogicalDevices", []))
            for size, count in sorted(sizes.items()):
                for _ in range(count):
                    number = len(self._docs[collection]["Members"]) + 1
                    uri = f"{collection}/{number}"
                    chunk = copy.deepcopy(template)
                    chunk.update({"@odata.id": uri, "Id": str(number), "Name": f"Memory Chunk {number}",
                                  "MemoryChunkSizeMiB": size, "AddressRangeOffsetMiB": domain.get("MemorySizeMiB", 0)})
                    self._docs[uri] = chunk
                    self._docs[collection]["Members"].append({"@odata.id": uri})
                    self._docs[target]["ConnectedEntities"].append(
                        {"EntityType": "MemoryChunk", "EntityRole": "Target", "EntityLink": {"@odata.id": uri}})
                    self._chunk_targets[uri] = target
                    domain["MemorySizeMiB"] = domain.get("MemorySizeMiB", 0) + size
                    for device in devices:
                        if "MemorySizeMiB" in self._docs.get(device, {}):
                            self._docs[device]["MemorySizeMiB"] += size

    def _add_host(self, system: _System, doc: dict[str, Any]) -> None:
        """A processor and an initiator endpoint for a configured system, copied from the mockup's host."""
        initiator = next(uri for uri, d in sorted(self._docs.items()) if _type_name(d) == "Endpoint"
                         and any(e.get("EntityRole") == "Initiator" and e.get("EntityType") == "Processor"
                                 for e in d.get("ConnectedEntities", [])))
        cpu_uri = next(e["EntityLink"]["@odata.id"] for e in self._docs[initiator]["ConnectedEntities"]
                       if e.get("EntityType") == "Processor")
        endpoint_uri = f"{self._fabric}/Endpoints/I-{system.id}"
        cpu = copy.deepcopy(self._docs[cpu_uri])
        for key in ("Ports", "Links", "Description"):
            cpu.pop(key, None)
        mine = f"{system.uri}/Processors/CPU"
        cpu.update({"@odata.id": mine, "UUID": str(uuid.uuid5(uuid.NAMESPACE_URL, mine)).upper(),
                    "Links": {"Endpoints": [{"@odata.id": endpoint_uri}]}})
        self._docs[mine] = cpu
        self._docs[f"{system.uri}/Processors"] = _collection(f"{system.uri}/Processors",
                                                             "#ProcessorCollection.ProcessorCollection",
                                                             "Processors Collection", [mine])
        endpoint = copy.deepcopy(self._docs[initiator])
        zones = [{"@odata.id": z} for z in self._memory_zones()]
        endpoint.update({"@odata.id": endpoint_uri, "Id": _last(endpoint_uri), "Name": f"{doc['Name']} Initiator",
                         "Description": f"Initiator endpoint of {system.uri}",
                         "ConnectedEntities": [{"EntityType": "Processor", "EntityRole": "Initiator",
                                                "Identifiers": [{"DurableName": cpu["UUID"],
                                                                 "DurableNameFormat": "UUID"}],
                                                "EntityLink": {"@odata.id": mine}}],
                         "Links": {"Zones": zones}})
        self._docs[endpoint_uri] = endpoint
        self._docs[f"{self._fabric}/Endpoints"]["Members"].append({"@odata.id": endpoint_uri})
        for zone in zones:
            self._docs[zone["@odata.id"]].setdefault("Links", {}).setdefault("Endpoints", []).append(
                {"@odata.id": endpoint_uri})
        doc["Processors"] = {"@odata.id": f"{system.uri}/Processors"}
        doc["Memory"] = {"@odata.id": f"{system.uri}/Memory"}
        self._hosts[system.uri] = _Host(system.uri, endpoint_uri,
                                        float(doc.get("MemorySummary", {}).get("TotalSystemMemoryGiB", 0)))

    # --- lifecycle ---
    def start(self) -> str:
        handler = type("Handler", (_Handler,), {"emulator": self})
        self._server = ThreadingHTTPServer(self._listen, handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="redfish-emulator", daemon=True)
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the emulator is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

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
            uri = f"{SYSTEMS}/{system.id}"
            if uri in self._systems:
                return False
            doc = self._system_template()
            old = doc["@odata.id"]
            for action in doc.get("Actions", {}).values():
                action["target"] = action["target"].replace(old, uri)
            doc.update({"@odata.id": uri, "Id": system.id, "Name": system.name, "HostName": system.host_name,
                        "UUID": str(uuid.uuid5(uuid.NAMESPACE_URL, uri)),
                        "SystemType": "Composed" if self._composition else "Physical"})
            doc["Links"] = {"ResourceBlocks": []} if self._composition else {}
            for link in [k for k, v in doc.items() if isinstance(v, dict) and "@odata.id" in v]:
                del doc[link]  # the template's processors, memory, storage are not this server's
            for link in ("PCIeDevices", "PCIeFunctions"):
                doc.pop(link, None)
            self._systems[uri] = _System(system.id, uri, composable=self._composition)
            if self._fabric is not None:
                self._add_host(self._systems[uri], doc)
            self._docs[uri] = doc
            self._docs[SYSTEMS]["Members"].append({"@odata.id": uri})
            return True

    def _system_template(self) -> dict[str, Any]:
        systems = [self._docs[u] for u in self._systems]
        capable = [d for d in systems if f"#{ADD_ACTION}" in d.get("Actions", {})]
        template = copy.deepcopy((capable or systems or [{"@odata.id": SYSTEMS + "/template",
                                                          "@odata.type": "#ComputerSystem.v1_27_0.ComputerSystem",
                                                          "PowerState": "On",
                                                          "Status": {"State": "Enabled", "Health": "OK"}}])[0])
        for key in ("Description", "Composition", "Boot", "@Redfish.Copyright"):
            template.pop(key, None)
        if self._composition and self.config.advertise_actions and f"#{ADD_ACTION}" not in template.get("Actions", {}):
            base = template["@odata.id"]
            template.setdefault("Actions", {}).update({
                f"#{ADD_ACTION}": {"target": f"{base}/Actions/{ADD_ACTION}"},
                f"#{REMOVE_ACTION}": {"target": f"{base}/Actions/{REMOVE_ACTION}"}})
        return template

    def system_ids(self) -> set[str]:
        with self._lock:
            return {s.id for s in self._systems.values()}

    def block_states(self) -> dict[str, tuple[str, Optional[str]]]:
        """Block id -> (CompositionState, system id or None), for every resource block of the service."""
        with self._lock:
            self._advance()
            return {b.id: (b.state, _last(b.systems[0]) if b.systems else None) for b in self._blocks.values()}

    def chunks(self) -> dict[str, tuple[str, Optional[str]]]:
        """Memory chunk uri -> (its Connection's state, "Unused", or "Local" for a host's own device; the id of the
        system it is bound to, or None for none or a system not configured), for every chunk a target endpoint names."""
        with self._lock:
            self._advance()
            hosts = {h.endpoint: _last(h.system) for h in self._hosts.values()}
            out: dict[str, tuple[str, Optional[str]]] = {}
            for chunk in sorted(self._chunk_targets):
                holder = next((c for c in self._connections.values() if chunk in c.chunks), None)
                if chunk in self._local:
                    out[chunk] = ("Local", _last(self._local[chunk]))
                elif holder is None:
                    out[chunk] = ("Unused", None)
                else:
                    out[chunk] = (holder.state, next((hosts[i] for i in holder.initiators if i in hosts), None))
            return out

    def bound_memory_mib(self) -> dict[str, int]:
        """System id -> MiB of memory its Enabled Connections bind (what the host's memory controller sees)."""
        return {system: sum(sizes) for system, sizes in self.bound_chunks_mib().items()}

    def bound_chunks_mib(self) -> dict[str, list[int]]:
        """System id -> the size in MiB of each chunk its Enabled Connections bind, for every configured system."""
        with self._lock:
            self._advance()
            return {_last(h.system): [self._chunk_mib(c) for b in self._bound_to(h) for c in b.chunks]
                    for h in self._hosts.values()}

    def expire_sessions(self) -> None:
        """End every session, as the service does when they time out or the BMC restarts."""
        with self._lock:
            self._sessions.clear()

    def get(self, uri: str) -> dict[str, Any]:
        """A resource as the service serves it (for tests and the validator's report)."""
        with self._lock:
            self._advance()
            return self._get(_normal(uri))

    # --- request handling (called by the handler thread) ---
    def handle(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any, dict[str, str]]:
        asked, path = path, _normal(path)
        with self._lock:
            self.requests.append((method, path))
            self._advance()
            if method == "POST" and path == SESSIONS:
                return self._login(body)
            if path not in _PUBLIC:
                self._authorize(headers)
            if method == "GET" and asked in self.config.faults.redirects:  # the path exactly as asked
                return 307, None, {"Location": self.config.faults.redirects[asked]}
            if method in ("GET", "HEAD"):
                return self._read(path)
            if method == "PATCH":
                return self._patch(path, headers, body)
            if method == "POST" and "/Actions/" in path:
                return self._action(path, body)
            if method == "DELETE" and path.startswith(SESSIONS + "/"):
                return self._logout(path)
            if self._fabric is not None and method == "POST" and path == f"{self._fabric}/Connections":
                return self._connect(body)
            if method == "DELETE" and path in self._connections:
                return self._disconnect(self._connections[path])
        if path in self._docs or path in self._systems or path in self._connections:
            raise RedfishError(405, "OperationNotAllowed", f"{method} is not allowed on {path}", (method, path))
        raise RedfishError(404, "ResourceMissingAtURI", f"The resource at the URI '{path}' was not found.", (path,))

    def _advance(self) -> None:
        now = self._clock()
        for block in self._blocks.values():
            if block.settles_at is None or block.settles_at > now:
                continue
            block.settles_at = None
            block.generation += 1
            task = self._tasks.get(block.task or "")
            block.task = None
            if block.removing:
                self._unlink(block)
            elif task is not None and block.id in self.config.faults.failing_tasks:
                self._unlink(block)  # the service rolls the composition back
                task.messages.append(_message("InternalError", f"The composition of resource block {block.id} "
                                                               f"failed and was rolled back."))
            elif block.id in self.config.faults.failing_blocks:
                block.state = "Failed"
            else:
                block.state = "Composed"
        for connection in list(self._connections.values()):
            if connection.settles_at is None or connection.settles_at > now:
                continue
            connection.settles_at = None
            task = self._tasks.get(connection.task or "")
            connection.task = None
            chunk = connection.chunks[0] if connection.chunks else ""
            if connection.removing:
                del self._connections[connection.uri]
            elif task is not None and chunk in self.config.faults.failing_tasks:
                del self._connections[connection.uri]  # the service rolls the binding back
                task.messages.append(_message("InternalError", f"Binding memory chunk {chunk} failed and the "
                                                               f"connection {connection.uri} was removed."))
            else:
                connection.state = "Failed" if chunk in self.config.faults.failing_blocks else "Enabled"
        for task in self._tasks.values():
            if task.state == "Running" and all(self._task_of(b) != task.id for b in task.blocks):
                task.state = "Exception" if task.messages else "Completed"
                task.ended = now

    def _task_of(self, uri: str) -> Optional[str]:
        """The task a resource block or Connection still waits on (a Connection gone waits on none)."""
        if uri in self._blocks:
            return self._blocks[uri].task
        connection = self._connections.get(uri)
        return connection.task if connection is not None else None

    def _unlink(self, block: _Block) -> None:
        for system_uri in block.systems:
            system = self._systems.get(system_uri)
            if system is not None and block.uri in system.blocks:
                system.blocks.remove(block.uri)
                system.generation += 1
        block.systems, block.state, block.removing = [], "Unused", False

    # --- authentication ---
    def _login(self, body: Any) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(body, dict) or "UserName" not in body or "Password" not in body:
            raise RedfishError(400, "PropertyMissing", "The property UserName or Password is a required property "
                                                       "and must be included in the request.", ("UserName",))
        if body["UserName"] != self.config.username or body["Password"] != self.config.password:
            raise RedfishError(401, "ResourceAtUriUnauthorized", f"While accessing the resource at '{SESSIONS}', the "
                                                                 f"service received an authorization error: wrong "
                                                                 f"user name or password.", (SESSIONS, "Unauthorized"))
        self._session_seq += 1
        session = _Session(f"{self._session_seq}{secrets.token_hex(4)}", secrets.token_hex(16), body["UserName"],
                           self._clock())
        self._sessions[session.token] = session
        uri = f"{SESSIONS}/{session.id}"
        return 201, self._session_doc(session), {"X-Auth-Token": session.token, "Location": uri}

    def _authorize(self, headers: dict[str, str]) -> None:
        if not self.config.username:
            return
        now = self._clock()
        timeout = float(self._docs[SESSION_SERVICE].get("SessionTimeout", 1800))
        for token in [t for t, s in self._sessions.items() if now - s.last_used > timeout]:
            del self._sessions[token]
        session = self._sessions.get(headers.get("x-auth-token", ""))
        if session is not None:
            session.last_used = now
            return
        expected = base64.b64encode(f"{self.config.username}:{self.config.password}".encode()).decode()
        if headers.get("authorization") != f"Basic {expected}":
            raise RedfishError(401, "NoValidSession", "There is no valid session established with the "
                                                      "implementation.")

    def _logout(self, path: str) -> tuple[int, Any, dict[str, str]]:
        session_id = _last(path)
        tokens = [t for t, s in self._sessions.items() if s.id == session_id]
        if not tokens:
            raise RedfishError(404, "ResourceNotFound", f"The requested resource of type Session named "
                                                        f"'{session_id}' was not found.", ("Session", session_id))
        del self._sessions[tokens[0]]
        return 204, None, {}

    def _session_doc(self, session: _Session) -> dict[str, Any]:
        return {"@odata.id": f"{SESSIONS}/{session.id}", "@odata.type": "#Session.v1_8_0.Session",
                "Id": session.id, "Name": "User Session", "UserName": session.user}

    # --- GET ---
    def _read(self, path: str) -> tuple[int, Any, dict[str, str]]:
        if path.startswith(TASK_MONITORS + "/"):
            return self._monitor(_last(path))
        if path == METADATA:
            return 200, self._metadata(), {"Content-Type": "application/xml"}
        body = self._get(path)
        headers = {"ETag": body["@odata.etag"]} if "@odata.etag" in body else {}
        if path == ROOT:
            self._lie_in_root(body)
        elif path == SYSTEMS and self.config.faults.foreign_members:
            body["Members"] += [{"@odata.id": uri} for uri in self.config.faults.foreign_members]
            body["Members@odata.count"] = len(body["Members"])
        return 200, body, headers

    def _lie_in_root(self, root: dict[str, Any]) -> None:
        faults = self.config.faults
        if faults.sessions_link == "":
            root.get("Links", {}).pop("Sessions", None)
        elif faults.sessions_link is not None:
            root.setdefault("Links", {})["Sessions"] = {"@odata.id": faults.sessions_link}
        if faults.padding_bytes:
            root["Oem"] = {"Padding": "x" * faults.padding_bytes}

    def _get(self, path: str) -> dict[str, Any]:
        if path == "/redfish":
            return {"v1": ROOT + "/"}
        if path in self._blocks:
            return self._block_doc(self._blocks[path])
        if path in self._systems:
            return self._system_doc(self._systems[path])
        if self._fabric is not None:
            fabric = self._fabric_doc(path)
            if fabric is not None:
                return fabric
        if path == SESSIONS:
            return _collection(SESSIONS, "#SessionCollection.SessionCollection", "Session Collection",
                               [f"{SESSIONS}/{s.id}" for s in self._sessions.values()])
        if path.startswith(SESSIONS + "/"):
            for session in self._sessions.values():
                if session.id == _last(path):
                    return self._session_doc(session)
        if path == TASKS:
            return _collection(TASKS, "#TaskCollection.TaskCollection", "Task Collection",
                               [f"{TASKS}/{t}" for t in self._tasks])
        if path.startswith(TASKS + "/") and _last(path) in self._tasks:
            return self._task_doc(self._tasks[_last(path)])
        if path in self._docs:
            body = copy.deepcopy(self._docs[path])
            if path.endswith(("/ActivePool", "/FreePool")) and "Members" in body:
                active = path.endswith("/ActivePool")
                body["Members"] = [{"@odata.id": b.uri} for b in self._blocks.values() if bool(b.systems) == active]
            if "Members" in body:
                body["Members@odata.count"] = len(body["Members"])
            return body
        raise RedfishError(404, "ResourceMissingAtURI", f"The resource at the URI '{path}' was not found.", (path,))

    def _block_doc(self, block: _Block) -> dict[str, Any]:
        body = copy.deepcopy(self._docs[block.uri])
        status = body.setdefault("CompositionStatus", {})
        status["CompositionState"] = block.state
        if "NumberOfCompositions" in status:
            status["NumberOfCompositions"] = len(block.systems)
        if "Pool" in body:
            body["Pool"] = "Active" if block.systems else "Free"
        body.setdefault("Links", {})["ComputerSystems"] = [{"@odata.id": s} for s in block.systems]
        if block.state == "Failed":
            body["Status"] = {**body.get("Status", {}), "Health": "Critical"}
        body["@odata.etag"] = f'W/"{block.generation}"'
        return body

    def _system_doc(self, system: _System) -> dict[str, Any]:
        body = copy.deepcopy(self._docs[system.uri])
        if system.composable:
            body.setdefault("Links", {})["ResourceBlocks"] = [{"@odata.id": b} for b in system.blocks]
        host = self._hosts.get(system.uri)
        if host is not None:
            bound = sum(self._chunk_mib(c) for b in self._bound_to(host) for c in b.chunks)
            body.setdefault("MemorySummary", {})["TotalSystemMemoryGiB"] = host.own_gib + bound / 1024
        body["@odata.etag"] = f'W/"{system.generation}"'
        return body

    # --- the CXL fabric, as served ---
    def _fabric_doc(self, path: str) -> Optional[dict[str, Any]]:
        """Live CXL resources: Connections, endpoints' Links.Connections, a host's Memory; None for anything else."""
        connections = f"{self._fabric}/Connections"
        if path == connections:
            return _collection(connections, "#ConnectionCollection.ConnectionCollection", "CXL Connection Collection",
                               list(self._connections) + self.config.faults.gone_connections)
        if path in self._connections:
            return self._connection_doc(self._connections[path])
        if path.startswith(f"{self._fabric}/Endpoints/") and path in self._docs:
            body = copy.deepcopy(self._docs[path])
            links = [c.uri for c in self._connections.values() if path in c.initiators + c.targets]
            body.setdefault("Links", {}).pop("Connections", None)
            if links:
                body["Links"]["Connections"] = [{"@odata.id": uri} for uri in links]
            return body
        for host in self._hosts.values():
            if path == f"{host.system}/Memory":
                return _collection(path, "#MemoryCollection.MemoryCollection", "Memory Collection",
                                   [f"{path}/CXL-{c.id}" for c in self._bound_to(host)])
            if path.startswith(f"{host.system}/Memory/CXL-"):
                for connection in self._bound_to(host):
                    if _last(path) == f"CXL-{connection.id}":
                        return self._memory_doc(host, connection)
        return None

    def _bound_to(self, host: _Host) -> list[_Connection]:
        """The Enabled Connections binding memory to `host`: what its memory controller sees."""
        return [c for c in self._connections.values()
                if host.endpoint in c.initiators and c.state == "Enabled" and not c.removing]

    def _chunk_mib(self, chunk: str) -> int:
        return int(self._docs.get(chunk, {}).get("MemoryChunkSizeMiB", 0))

    def _connection_doc(self, connection: _Connection) -> dict[str, Any]:
        body = copy.deepcopy(connection.doc)
        failed = connection.state == "Failed"
        body["Status"] = {"State": "UnavailableOffline" if failed else connection.state,
                          "Health": "Critical" if failed else "OK"}
        return body

    def _memory_doc(self, host: _Host, connection: _Connection) -> dict[str, Any]:
        """Remote memory as DMTF's CXL mockups show it on their host (`Memory` RCXL3): a logical memory device whose
        media source is the bound chunk."""
        uri = f"{host.system}/Memory/CXL-{connection.id}"
        return {"@odata.id": uri, "@odata.type": "#Memory.v1_23_0.Memory", "Id": _last(uri),
                "Name": "CXL Device memory", "Description": f"Remote CXL memory bound by {connection.uri}",
                "Status": {"State": "Enabled", "Health": "OK"}, "MemoryDeviceType": "Logical",
                "CapacityMiB": sum(self._chunk_mib(c) for c in connection.chunks),
                "Links": {"Endpoints": [{"@odata.id": host.endpoint}],
                          "MemoryMediaSources": [{"@odata.id": c} for c in connection.chunks]}}

    # --- binding memory: Connections ---
    def _connect(self, body: Any) -> tuple[int, Any, dict[str, str]]:
        chunks, initiators, targets = self._check_connection(body)
        faults = self.config.faults
        if faults.refusal_chars > 0:
            size, faults.refusal_chars = faults.refusal_chars, 0
            raise RedfishError(400, "ActionNotSupported", ("The connection was refused: " + "z" * size)[:size])
        if faults.compose_http_errors > 0:
            faults.compose_http_errors -= 1
            raise RedfishError(500, "InternalError", "The request failed due to an internal service error: "
                                                     "injected fault, the fabric manager failed.")
        self._connection_seq += 1
        uri = f"{self._fabric}/Connections/{self._connection_seq}"
        if faults.phantom_connections > 0:
            faults.phantom_connections -= 1
            return 201, None, {"Location": uri}  # accepted, and lost
        template = next((c.doc for c in self._connections.values()), {"@odata.type": "#Connection.v1_4_0.Connection"})
        doc = {"@odata.id": uri, "@odata.type": template["@odata.type"], "Id": _last(uri),
               "Name": str(body.get("Name") or f"Connection {_last(uri)}"), "ConnectionType": "Memory",
               "MemoryChunkInfo": [{"AccessCapabilities": info.get("AccessCapabilities") or ["Read", "Write"],
                                    "MemoryChunk": {"@odata.id": chunk}}
                                   for info, chunk in zip(body["MemoryChunkInfo"], chunks)],
               "Links": {"InitiatorEndpoints": [{"@odata.id": i} for i in initiators],
                         "TargetEndpoints": [{"@odata.id": t} for t in targets]}}
        now = self._clock()
        connection = _Connection(_last(uri), uri, doc, chunks, initiators, targets, "Starting",
                                 now + self.config.composition_latency_s)
        self._connections[uri] = connection
        return self._accepted(connection, self.config.composition_latency_s, 201)

    def _disconnect(self, connection: _Connection) -> tuple[int, Any, dict[str, str]]:
        faults = self.config.faults
        if faults.compose_http_errors > 0:
            faults.compose_http_errors -= 1
            raise RedfishError(500, "InternalError", "The request failed due to an internal service error: "
                                                     "injected fault, the fabric manager failed.")
        if connection.removing:
            return 204, None, {}
        connection.removing, connection.settles_at = True, self._clock() + self.config.decomposition_latency_s
        threshold = self.config.task_after_s
        if threshold is None or self.config.decomposition_latency_s <= threshold:
            del self._connections[connection.uri]
            return 204, None, {}
        return self._accepted(connection, self.config.decomposition_latency_s, 204)

    def _accepted(self, connection: _Connection, latency: float, status: int) -> tuple[int, Any, dict[str, str]]:
        """Done at once (`status`), or 202 with a task monitor when the change is slower than task_after_s."""
        threshold = self.config.task_after_s
        if threshold is None or latency <= threshold:
            if status == 201:
                return 201, self._connection_doc(connection), {"Location": connection.uri}
            return status, None, {}
        task = _Task(str(len(self._tasks) + 1), self._clock(), [connection.uri])
        self._tasks[task.id] = task
        connection.task = task.id
        return 202, self._task_doc(task), {"Location": f"{TASK_MONITORS}/{task.id}",
                                           "Retry-After": str(max(1, round(latency)))}

    def _check_connection(self, body: Any) -> tuple[list[str], list[str], list[str]]:
        """Refuse (Base messages) a Connection this fabric cannot make, before anything changes."""
        if not isinstance(body, dict) or body.get("ConnectionType") != "Memory":
            raise RedfishError(400, "PropertyValueNotInList", "The value for the property ConnectionType is not in "
                                                              "the list of acceptable values: this CXL fabric makes "
                                                              "Memory connections.", ("ConnectionType",))
        if body.get("MemoryRegionInfo"):
            raise RedfishError(400, "PropertyNotWritable", "The property MemoryRegionInfo cannot be assigned a value: "
                                                           "memory regions from Connection resources are not allowed "
                                                           "in a CXL fabric; bind MemoryChunkInfo.")
        infos = body.get("MemoryChunkInfo")
        links = body.get("Links") if isinstance(body.get("Links"), dict) else {}
        try:
            chunks = [str(info["MemoryChunk"]["@odata.id"]).rstrip("/") for info in infos]
            initiators = [str(link["@odata.id"]).rstrip("/") for link in links["InitiatorEndpoints"]]
            targets = [str(link["@odata.id"]).rstrip("/") for link in links.get("TargetEndpoints", [])]
        except (KeyError, TypeError) as exc:
            raise RedfishError(400, "CreateFailedMissingReqProperties", f"The create operation failed because the "
                                                                        f"required property {exc} was missing from "
                                                                        f"the request.") from exc
        if not chunks or not initiators:
            raise RedfishError(400, "CreateFailedMissingReqProperties", "The create operation failed: a Memory "
                                                                        "connection names MemoryChunkInfo and "
                                                                        "Links.InitiatorEndpoints.")
        for initiator in initiators:
            doc = self._docs.get(initiator, {})
            if _type_name(doc) != "Endpoint" or not any(e.get("EntityRole") == "Initiator"
                                                        for e in doc.get("ConnectedEntities", [])):
                raise RedfishError(400, "ResourceNotFound", f"The requested resource of type Endpoint named "
                                                            f"'{initiator}' was not found as an initiator endpoint.",
                                   ("Endpoint", initiator))
        for chunk in chunks:
            target = self._chunk_targets.get(chunk)
            if target is None:
                raise RedfishError(400, "ResourceNotFound", f"The requested resource of type MemoryChunks named "
                                                            f"'{chunk}' was not found in this fabric.",
                                   ("MemoryChunks", chunk))
            if targets and target not in targets:
                raise RedfishError(400, "PropertyValueConflict", f"The property MemoryChunk could not be written "
                                                                 f"because its value conflicts with the value of "
                                                                 f"TargetEndpoints: {chunk} is reached through "
                                                                 f"{target}.", ("MemoryChunk", "TargetEndpoints"))
            if chunk in self._local:
                raise RedfishError(409, "ResourceInUse", f"The change to the requested resource failed because the "
                                                         f"resource is in use: memory chunk {chunk} is the local "
                                                         f"memory of {self._local[chunk]}.")
            holder = next((c for c in self._connections.values() if chunk in c.chunks), None)
            if holder is not None:
                raise RedfishError(409, "ResourceInUse", f"The change to the requested resource failed because the "
                                                         f"resource is in use: memory chunk {chunk} is bound by "
                                                         f"{holder.uri}.")
            zones = {z["@odata.id"] for z in self._docs[target].get("Links", {}).get("Zones", [])}
            for initiator in initiators:
                if not zones & {z["@odata.id"] for z in self._docs[initiator].get("Links", {}).get("Zones", [])}:
                    raise RedfishError(400, "PropertyValueConflict", f"The property InitiatorEndpoints could not be "
                                                                     f"written because its value conflicts with the "
                                                                     f"zoning: {initiator} shares no zone with "
                                                                     f"{target}.", ("InitiatorEndpoints", "Zones"))
        return chunks, initiators, targets or sorted({self._chunk_targets[c] for c in chunks})

    def _task_doc(self, task: _Task) -> dict[str, Any]:
        body: dict[str, Any] = {
            "@odata.id": f"{TASKS}/{task.id}", "@odata.type": "#Task.v1_7_4.Task", "Id": task.id,
            "Name": f"Composition task {task.id}", "TaskState": task.state, "StartTime": _iso(task.started),
            "TaskStatus": {"Running": "OK", "Completed": "OK"}.get(task.state, "Critical"),
            "TaskMonitor": f"{TASK_MONITORS}/{task.id}", "Messages": task.messages,
            "PercentComplete": 100 if task.ended is not None else 50}
        if task.ended is not None:
            body["EndTime"] = _iso(task.ended)
        return body

    def _monitor(self, task_id: str) -> tuple[int, Any, dict[str, str]]:
        task = self._tasks.get(task_id)
        if task is None:
            raise RedfishError(404, "ResourceMissingAtURI", f"The resource at the URI "
                                                            f"'{TASK_MONITORS}/{task_id}' was not found.")
        if task.state == "Running":
            return 202, self._task_doc(task), {"Location": f"{TASK_MONITORS}/{task_id}", "Retry-After": "1"}
        if task.state == "Completed":
            return 204, None, {}
        message = task.messages[-1]
        raise RedfishError(500, _last(message["MessageId"]), message["Message"])

    def _metadata(self) -> str:
        """References to DMTF's CSDL for every namespace a served resource uses (DSP0266 $metadata)."""
        namespaces: set[str] = {"RedfishExtensions.v1_0_0"}
        served = [self._get(u) for u in list(self._docs)] + [self._task_doc(t) for t in self._tasks.values()]
        served += [self._session_doc(s) for s in self._sessions.values()]
        served += [self._connection_doc(c) for c in self._connections.values()]
        served += [{"@odata.type": "#Memory.v1_23_0.Memory"}, {"@odata.type": "#MemoryCollection.MemoryCollection"},
                   {"@odata.type": "#ConnectionCollection.ConnectionCollection"},
                   {"@odata.type": "#Connection.v1_4_0.Connection"}] if self._fabric else []
        extra = ["#SessionCollection.SessionCollection", "#Session.v1_8_0.Session", "#TaskCollection.TaskCollection",
                 "#Task.v1_7_4.Task", "#Message.v1_3_0.Message"]
        for odata_type in _odata_types(served) + extra:
            namespace = odata_type.lstrip("#").rsplit(".", 1)[0]
            namespaces.add(namespace)
            namespaces.add(namespace.split(".", 1)[0])
        files: dict[str, list[str]] = {}
        for namespace in sorted(namespaces):
            files.setdefault(namespace.split(".", 1)[0], []).append(namespace)
        root_version = self._docs[ROOT]["@odata.type"].lstrip("#").rsplit(".", 1)[0]
        lines = ['<?xml version="1.0" encoding="UTF-8"?>',
                 '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">']
        for schema, included in sorted(files.items()):
            lines.append(f'  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/{schema}_v1.xml">')
            for namespace in included:
                alias = ' Alias="Redfish"' if namespace.startswith("RedfishExtensions.") else ""
                lines.append(f'    <edmx:Include Namespace="{namespace}"{alias}/>')
            lines.append("  </edmx:Reference>")
        lines += ["  <edmx:DataServices>",
                  '    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">',
                  f'      <EntityContainer Name="Service" Extends="{root_version}.ServiceContainer"/>',
                  "    </Schema>", "  </edmx:DataServices>", "</edmx:Edmx>", ""]
        return "\n".join(lines)

    # --- composition ---
    def _patch(self, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any, dict[str, str]]:
        system = self._systems.get(path)
        if system is None or not system.composable:
            raise RedfishError(405, "OperationNotAllowed", f"PATCH is not allowed on {path}", ("PATCH", path))
        if self.config.faults.concurrent_writes > 0:
            self.config.faults.concurrent_writes -= 1
            self._docs[path]["AssetTag"] = f"changed-by-another-client-{system.generation + 1}"
            system.generation += 1
        etag = f'W/"{system.generation}"'
        if_match = headers.get("if-match")
        if if_match is not None and if_match not in ("*", etag):
            raise RedfishError(412, "PreconditionFailed", f"The ETag supplied did not match the ETag required to "
                                                          f"change this resource ({if_match}, now {etag}).")
        try:
            wanted = [link["@odata.id"].rstrip("/") for link in body["Links"]["ResourceBlocks"]]
            extra = set(body) - {"Links"} or set(body["Links"]) - {"ResourceBlocks"}
        except (KeyError, TypeError, AttributeError) as exc:
            raise RedfishError(400, "PropertyValueFormatError", f"The value for the property Links.ResourceBlocks "
                                                                f"is not a list of links ({exc}).") from exc
        if extra:
            raise RedfishError(400, "PropertyNotWritable", f"The property {sorted(extra)[0]} is a read-only "
                                                           f"property and cannot be assigned a value.")
        return self._change(system, wanted)

    def _action(self, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        compose = self._docs.get(COMPOSITION, {}).get("Actions", {}).get(f"#{COMPOSE_ACTION}")
        if compose is not None and path == _normal(compose["target"]):
            return self._compose(body)
        for system in self._systems.values():
            actions = self._docs[system.uri].get("Actions", {})
            for name in (ADD_ACTION, REMOVE_ACTION):
                spec = actions.get(f"#{name}")
                if spec is not None and path == _normal(spec["target"]):
                    return self._block_action(system, name, body)
        raise RedfishError(404, "ActionNotSupported", f"The action {_last(path)} is not supported by the "
                                                      f"resource.", (_last(path),))

    def _block_action(self, system: _System, name: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        try:
            block_uri = body["ResourceBlock"]["@odata.id"].rstrip("/")
        except (KeyError, TypeError, AttributeError) as exc:
            raise RedfishError(400, "ActionParameterMissing", f"The action {name} requires the parameter "
                                                              f"ResourceBlock to be present in the request "
                                                              f"body.", (name, "ResourceBlock")) from exc
        block = self._blocks.get(block_uri)
        if block is not None and body.get("ResourceBlockETag") not in (None, f'W/"{block.generation}"'):
            raise RedfishError(428, "PreconditionRequired", "A precondition header or annotation is required to "
                                                            "change this resource: ResourceBlockETag is stale.")
        if body.get("ComputerSystemETag") not in (None, f'W/"{system.generation}"'):
            raise RedfishError(428, "PreconditionRequired", "A precondition header or annotation is required to "
                                                            "change this resource: ComputerSystemETag is stale.")
        wanted = [b for b in system.blocks if b != block_uri]
        if name == ADD_ACTION:
            wanted.append(block_uri)
        elif block_uri not in system.blocks:
            raise RedfishError(400, "ResourceNotFound", f"The requested resource of type ResourceBlock named "
                                                        f"'{_last(block_uri)}' was not found in {system.uri}.")
        status, _, headers = self._change(system, wanted)
        return (status, None, headers) if status == 202 else (204, None, {})

    def _compose(self, body: Any) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(body, dict) or body.get("RequestType") not in ("Apply", "Preview", "PreviewReserve"):
            raise RedfishError(400, "ActionParameterMissing", "The action Compose requires the parameter "
                                                              "RequestType to be present in the request body.")
        if body.get("RequestFormat", "Manifest") != "Manifest" or not isinstance(body.get("Manifest"), dict):
            raise RedfishError(400, "ActionParameterMissing", "The action Compose requires the parameter Manifest "
                                                              "to be present in the request body.")
        stanzas = body["Manifest"].get("Stanzas") or []
        plans: list[tuple[_System, list[str]]] = []
        for stanza in stanzas:
            request = stanza.get("Request") or {}
            system = self._systems.get(str(request.get("@odata.id", "")).rstrip("/"))
            if stanza.get("StanzaType") != "ComposeSystem" or system is None:
                raise RedfishError(400, "ActionParameterValueNotInList",
                                   f"The value {stanza.get('StanzaType')!r} for the parameter StanzaType is not "
                                   f"supported here: this service recomposes existing systems (ComposeSystem with "
                                   f"the system's @odata.id).")
            wanted = [link["@odata.id"].rstrip("/") for link in request.get("Links", {}).get("ResourceBlocks", [])]
            self._check(system, wanted)  # all or nothing: the whole manifest is checked before any change
            plans.append((system, wanted))
        if body["RequestType"] != "Apply":
            return 200, body, {}
        status, headers = 200, {}
        for system, wanted in plans:
            status, _, headers = self._change(system, wanted)
        response = copy.deepcopy(body)
        for stanza, (system, _) in zip(response["Manifest"]["Stanzas"], plans):
            stanza["Response"] = self._system_doc(system)
        return (status, None, headers) if status == 202 else (200, response, {})

    def _check(self, system: _System, wanted: list[str]) -> None:
        """Refuse (Base messages) a change of `system`'s resource blocks to `wanted` before any part of it is done."""
        limit = self.config.max_blocks_per_system
        for block_uri in [b for b in wanted if b not in system.blocks]:
            block = self._blocks.get(block_uri)
            if block is None:
                raise RedfishError(400, "ResourceNotFound", f"The requested resource of type ResourceBlock named "
                                                            f"'{_last(block_uri)}' was not found.",
                                   ("ResourceBlock", _last(block_uri)))
            if block.systems or block.state != "Unused":
                raise RedfishError(409, "ResourceInUse", f"The change to the requested resource failed because the "
                                                         f"resource block {block.id} is in use ({block.state}).")
        if limit is not None and len(wanted) > limit and len(wanted) > len(system.blocks):
            raise RedfishError(400, "ResourceExhaustion", f"The resource '{system.uri}' was unable to satisfy the "
                                                          f"request due to unavailability of resources: it takes "
                                                          f"{limit} resource blocks.", (system.uri,))

    def _change(self, system: _System, wanted: list[str]) -> tuple[int, Any, dict[str, str]]:
        """Move `system`'s resource blocks to `wanted`; 202 and a task when slower than task_after_s."""
        self._check(system, wanted)
        if self.config.faults.refusal_chars > 0:
            size, self.config.faults.refusal_chars = self.config.faults.refusal_chars, 0
            raise RedfishError(400, "ActionNotSupported", ("The composition was refused: " + "z" * size)[:size])
        if self.config.faults.compose_http_errors > 0:
            self.config.faults.compose_http_errors -= 1
            raise RedfishError(500, "InternalError", "The request failed due to an internal service error: "
                                                     "injected fault, the composition engine failed.")
        now = self._clock()
        changed: list[_Block] = []
        for block_uri in [b for b in system.blocks if b not in wanted]:
            block = self._blocks.get(block_uri)
            if block is not None and not block.removing:
                block.removing, block.settles_at = True, now + self.config.decomposition_latency_s
                block.generation += 1
                changed.append(block)
        for block_uri in [b for b in wanted if b not in system.blocks]:
            block = self._blocks[block_uri]
            block.systems, block.state, block.removing = [system.uri], "Composing", False
            block.settles_at = now + self.config.composition_latency_s
            block.generation += 1
            system.blocks.append(block_uri)
            changed.append(block)
        if changed:
            system.generation += 1
        slowest = max((b.settles_at - now for b in changed if b.settles_at is not None), default=0.0)
        threshold = self.config.task_after_s
        if threshold is None or slowest <= threshold:
            return 200, self._system_doc(system), {}
        task = _Task(str(len(self._tasks) + 1), now, [b.uri for b in changed])
        self._tasks[task.id] = task
        for block in changed:
            block.task = task.id
        monitor = f"{TASK_MONITORS}/{task.id}"
        return 202, self._task_doc(task), {"Location": monitor, "Retry-After": str(max(1, round(slowest)))}


def _collection(uri: str, odata_type: str, name: str, members: list[str]) -> dict[str, Any]:
    return {"@odata.id": uri, "@odata.type": odata_type, "Name": name, "Members@odata.count": len(members),
            "Members": [{"@odata.id": m} for m in members]}


def _links_of(entries: list[Any], key: Optional[str] = None) -> list[str]:
    """The `@odata.id`s of a list of links (of `entry[key]` when key is given)."""
    found = []
    for entry in entries or []:
        link = entry.get(key) if key and isinstance(entry, dict) else entry
        if isinstance(link, dict) and "@odata.id" in link:
            found.append(str(link["@odata.id"]).rstrip("/"))
    return found


def _normal(path: str) -> str:
    path = path.split("?", 1)[0].split("#", 1)[0]
    return path.rstrip("/") or "/"


def _last(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _type_name(doc: dict[str, Any]) -> str:
    """`ResourceBlock` for `#ResourceBlock.v1_4_3.ResourceBlock`."""
    return str(doc.get("@odata.type", "")).rsplit(".", 1)[-1]


def _odata_types(docs: list[Any]) -> list[str]:
    found: list[str] = []
    for doc in docs:
        if isinstance(doc, dict):
            if isinstance(doc.get("@odata.type"), str):
                found.append(doc["@odata.type"])
            found += _odata_types(list(doc.values()))
        elif isinstance(doc, list):
            found += _odata_types(doc)
    return found


def _iso(seconds: float) -> str:
    """A clock reading as an ISO 8601 time (the clock may be monotonic: anchored at the wall clock's now)."""
    wall = time.time() - (time.monotonic() - seconds) if seconds < 1e9 else seconds
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(wall))


def _message(key: str, message: str, args: tuple[str, ...] = ()) -> dict[str, Any]:
    severity = "Critical" if key in ("InternalError", "GeneralError") else "Warning"
    return {"@odata.type": "#Message.v1_3_0.Message", "MessageId": f"{BASE}.{key}", "Message": message,
            "MessageArgs": list(args), "MessageSeverity": severity, "Resolution": "See the message."}


def _error(error: RedfishError) -> dict[str, Any]:
    info = _message(error.message_id.rsplit(".", 1)[-1], error.message, error.args_)
    return {"error": {"code": error.message_id, "message": error.message, "@Message.ExtendedInfo": [info]}}


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
            status, payload, headers = 400, _error(RedfishError(400, "MalformedJSON", f"The request body submitted "
                                                                                      f"was malformed JSON: {exc}")), {}
        except RedfishError as exc:
            status, payload, headers = exc.status, _error(exc), {}
        if isinstance(payload, str):
            data = payload.encode()
        else:
            data = json.dumps(payload).encode() if payload is not None else b""
            if data:
                headers.setdefault("Content-Type", "application/json;charset=utf-8")
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("OData-Version", "4.0")
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="redfish"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        drip = self.emulator.config.faults.drip_seconds if _normal(self.path) == ROOT else 0.0
        if method == "HEAD":
            return
        if not drip:
            self.wfile.write(data)
            return
        try:
            for offset in range(len(data)):
                self.wfile.write(data[offset:offset + 1])
                self.wfile.flush()
                time.sleep(drip)
        except OSError:
            return  # the client gave up: what a hostile service would not care about either

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class CredentialTrap:
    """Another host, where a lying Redfish service points its client: it records every request (method, path,
    headers, body) and answers as a session service would (201 with a token), so a client that trusts the lie goes
    on sending."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.received: list[tuple[str, str, dict[str, str], bytes]] = []
        trap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                trap.received.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                data = b"{}"
                self.send_response(201 if self.command == "POST" else 200)
                self.send_header("X-Auth-Token", "trap-token")
                self.send_header("Location", "/redfish/v1/SessionService/Sessions/trap")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _record

        self._server = ThreadingHTTPServer((host, 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="credential-trap", daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def secrets_seen(self, *secrets_: str) -> list[str]:
        """Which of `secrets_` reached this host, in a header or a body."""
        seen = []
        for secret in secrets_:
            if any(secret in " ".join(headers.values()) or secret.encode() in body
                   for _, _, headers, body in self.received):
                seen.append(secret)
        return seen

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _parse_counts(values: list[str], option: str, middle: str, pattern: str, example: str) -> dict[str, dict[str, int]]:
    """`ZONE:<middle>:COUNT` options (repeatable) as zone -> middle -> count."""
    counts: dict[str, dict[str, int]] = {}
    for value in values:
        match = re.fullmatch(rf"([^:]+):({pattern}):(\d+)", value)
        if not match:
            raise argparse.ArgumentTypeError(f"{option} {value!r}: expected ZONE:{middle}:COUNT, e.g. {example}")
        counts.setdefault(match[1], {})[match[2]] = int(match[3])
    return counts


def _parse_gpus(values: list[str]) -> dict[str, dict[str, int]]:
    return _parse_counts(values, "--gpus", "MODEL", "[^:]+", "2:A30:8")


def _parse_memory(values: list[str]) -> dict[str, dict[int, int]]:
    counts = _parse_counts(values, "--memory", "MIB", r"\d+", "3:16384:8")
    return {zone: {int(size): count for size, count in sizes.items()} for zone, sizes in counts.items()}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.redfish_emulator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mockup", type=Path, help=f"a DMTF mockup folder (default: the archive's {DEFAULT_MOCKUP})")
    parser.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT")
    parser.add_argument("--gpus", action="append", default=[], metavar="ZONE:MODEL:COUNT",
                        help="GPU resource blocks to add (repeatable); default 2:A30:4")
    parser.add_argument("--system", action="append", default=[], metavar="NAME",
                        help="a ComputerSystem whose HostName is NAME (a Kubernetes node name; repeatable)")
    parser.add_argument("--memory", action="append", default=[], metavar="ZONE:MIB:COUNT",
                        help="CXL memory chunks to add on a CXL mockup (repeatable), e.g. 3:16384:8")
    parser.add_argument("--composition-latency", type=float, default=5.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen {args.listen!r}: expected HOST:PORT")
    config = EmulatorConfig(systems=[EmulatedSystem(n, n, host_name=n) for n in args.system],
                            gpus=_parse_gpus(args.gpus) if args.gpus else {} if args.memory else {"2": {"A30": 4}},
                            memory=_parse_memory(args.memory),
                            composition_latency_s=args.composition_latency,
                            decomposition_latency_s=args.composition_latency / 2,
                            username=STANDALONE_USER, password=STANDALONE_PASSWORD, mockup=args.mockup)
    emulator = RedfishEmulator(config, host=host, port=int(port))
    print(f"Redfish service on {emulator.start()}{ROOT}/ (user {STANDALONE_USER}, password {STANDALONE_PASSWORD})",
          flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
