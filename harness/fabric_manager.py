"""An emulator of the fabric manager (FM) that CoHDI's composable-resource-operator calls in FTI_CDI mode.

The hardware's stand-in, never part of the wheel. Its specification is the operator's own client (composable-resource-
operator 38251b7, internal/cdi/fti/token.go and internal/cdi/fti/fm/): tests/unit/test_fabric_manager_contract.py pins
every answer to the json tags of that client's structs, read from the source archive under ../shared/third_party.

The API, served over HTTPS with the emulator's own CA (the operator trusts it through SSL_CERT_FILE):

    POST   /id_manager/realms/<realm>/protocol/openid-connect/token   OIDC password grant (form); the access token is a
                                                                       JWT whose payload carries `exp` (the client
                                                                       decodes it to know when to renew)
    GET    /fabric_manager/api/v1/machines/<machine uuid>?tenant_uuid=  the machine and its attached resources
    PATCH  /fabric_manager/api/v1/machines/<machine uuid>/update       attach `res_num` devices of a model; 200 with
                                                                       the attached resources once the fabric is done
    DELETE /fabric_manager/api/v1/machines/<machine uuid>/update       detach by `res_uuid`; 204

Every FM call needs `Authorization: Bearer <token>` with an unexpired token (401 otherwise). Errors answer
`{"status": <http status>, "detail": {"code": ..., "message": ..., "data": {...}}}`, the body the client decodes.

Time, as on a real fabric: the operator's client has no "in progress" answer (cdi.ErrWaitingDeviceAttaching is never
returned by the FM client; it blocks on the HTTP call for up to 180 s), so an attach or a detach blocks its request
for the configured latency. The devices are reserved when the request arrives and the change is committed when the
latency has passed, whether or not the caller is still there: an operator killed mid-attach leaves the device attached
in the fabric, which is the hazard the tests look for.

Faults: `fail_next_attaches` / `fail_next_detaches` (the next N calls answer an error after the latency, and change
nothing), `attach_as_critical` (the next N attaches succeed but the device reports op status "2", critical) and
`set_op_status` (a device going critical or warning while attached). Tokens expire after `token_lifetime_s`;
`revoke_tokens()` invalidates every token issued so far.

For tests' invariants, `attachments()` tells which device is attached to which machine; a device is in one place at a
time by construction (pool or one machine). `add_listener` calls back with the machine's uuid after each committed
change (harness/gpu_node_agent.py makes the node side follow).

Runnable on its own:

    python -m harness.fabric_manager --listen 127.0.0.1:8443 --pool A100=8 --pool H100=4 --machine node-1 \\
        --attach-latency 2-5 --detach-latency 2 --state-dir /tmp/fm
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import hashlib
import hmac
import http.server
import ipaddress
import json
import logging
import random
import secrets
import signal
import ssl
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

FM_PREFIX = "/fabric_manager/api/v1/machines/"
TOKEN_PATH_TEMPLATE = "/id_manager/realms/{realm}/protocol/openid-connect/token"
DEFAULT_TENANT = "8c3d6a0e-5f1b-4c7e-9a2d-1b0f6e4c2a90"
DEFAULT_REALM = "cdi"
DEFAULT_TOKEN_LIFETIME_S = 300.0
RESOURCE_TYPE_GPU = "gpu"

# res_op_status values the client knows (fm/client.go reads the first character).
OP_STATUS_OK = "0"
OP_STATUS_WARNING = "1"
OP_STATUS_CRITICAL = "2"
_OP_STATUSES = (OP_STATUS_OK, OP_STATUS_WARNING, OP_STATUS_CRITICAL)

# The emulator's own error codes (the real FM's catalogue is not public; the client only prints code and message).
CODE_UNAUTHORIZED = "E40101"
CODE_FORBIDDEN = "E40301"
CODE_NOT_FOUND = "E40401"
CODE_BAD_REQUEST = "E40001"
CODE_NO_FREE_DEVICE = "E40901"
CODE_IN_PROGRESS = "E40902"
CODE_INJECTED = "E50001"

Latency = Union[float, tuple[float, float]]  # seconds, or (min, max) seconds drawn uniformly per operation


class FabricManagerError(Exception):
    """An error answer: HTTP status plus the FM error body's code and message."""

    def __init__(self, status: int, code: str, message: str, data: Optional[dict[str, Any]] = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.data = data or {}

    def body(self) -> dict[str, Any]:
        return {"status": self.status, "detail": {"code": self.code, "message": self.message, "data": self.data}}


@dataclass
class Device:
    """One device of the fabric: in the pool (machine None), being attached/detached (busy), or on one machine."""

    res_uuid: str
    model: str
    serial: str  # what the node's driver reports as the GPU UUID (nvidia-smi's gpu_uuid)
    index: int
    res_type: str = RESOURCE_TYPE_GPU
    op_status: str = OP_STATUS_OK
    machine: Optional[str] = None
    busy: bool = False  # reserved by an attach (machine still None) or a detach (machine set) in its latency

    @property
    def name(self) -> str:
        return f"{self.model.lower()}-{self.index:03d}"

    def as_resource(self) -> dict[str, Any]:
        """The resource as GET machine and the PATCH answer show it (fm/api GetMachineResource)."""
        return {"res_uuid": self.res_uuid, "res_name": self.name, "res_type": self.res_type,
                "res_status": 0 if self.op_status == OP_STATUS_OK else 1, "res_op_status": self.op_status,
                "res_serial_num": self.serial,
                "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": self.model}]}}


@dataclass
class Machine:
    machine_uuid: str
    name: str
    machine_id: int


@dataclass
class InjectedFault:
    remaining: int
    status: int
    code: str
    message: str


@dataclass
class AttachReservation:
    """Devices taken from the pool for one attach, not yet on the machine (busy)."""

    machine_uuid: str
    devices: list[Device]
    fault: Optional[InjectedFault]
    critical: bool


@dataclass(frozen=True)
class Credentials:
    """What the operator's `credentials` Secret (composable-resource-operator-system) must hold."""

    username: str
    password: str
    client_id: str
    client_secret: str
    realm: str

    def secret_data(self) -> dict[str, str]:
        return {"username": self.username, "password": self.password, "client_id": self.client_id,
                "client_secret": self.client_secret, "realm": self.realm}


@dataclass
class _Faults:
    attach: Optional[InjectedFault] = None
    detach: Optional[InjectedFault] = None
    critical_attaches: int = 0


@dataclass
class CallRecord:
    method: str
    path: str
    status: int
    at: float = field(default_factory=time.time)


class FabricManagerEmulator:
    """The FM's state and HTTPS server. `start()` serves on 127.0.0.1 (a free port unless `port` is given)."""

    def __init__(self, pools: Mapping[str, int], *, attach_latency_s: Latency = 0.0, detach_latency_s: Latency = 0.0,
                 token_lifetime_s: float = DEFAULT_TOKEN_LIFETIME_S, tenant_uuid: str = DEFAULT_TENANT,
                 realm: str = DEFAULT_REALM, state_dir: Optional[Path] = None, host: str = "127.0.0.1",
                 port: int = 0, clock: Callable[[], float] = time.time) -> None:
        for latency in (attach_latency_s, detach_latency_s):
            if min(_bounds(latency)) < 0:
                raise ValueError(f"fabric manager: latencies cannot be negative, got {latency}")
        if token_lifetime_s <= 0:
            raise ValueError(f"fabric manager: token lifetime must be positive, got {token_lifetime_s}")
        self.attach_latency_s = attach_latency_s
        self.detach_latency_s = detach_latency_s
        self.token_lifetime_s = token_lifetime_s
        self.tenant_uuid = tenant_uuid
        self.fabric_uuid = str(uuid.uuid4())
        self.credentials = Credentials(username="dds-operator", password=secrets.token_urlsafe(12),
                                       client_id="composable-resource-operator",
                                       client_secret=secrets.token_urlsafe(16), realm=realm)
        self._host = host
        self._port = port
        self._clock = clock  # tokens' issue and expiry time (a test moves it instead of sleeping)
        self._signing_key = secrets.token_bytes(32)
        self._not_before = 0.0  # tokens issued before this instant are revoked
        self._lock = threading.Lock()
        self._devices: list[Device] = []
        self._machines: dict[str, Machine] = {}
        self._faults = _Faults()
        self._listeners: list[Callable[[str], None]] = []
        self._calls: list[CallRecord] = []
        for model, count in pools.items():
            self.add_devices(model, count)
        self._own_dir = None if state_dir else tempfile.TemporaryDirectory(prefix="dds-fm-")
        self.state_dir = Path(state_dir or self._own_dir.name)  # type: ignore[union-attr]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.ca_cert_path = self.state_dir / "fm-ca.crt"
        self._server: Optional[http.server.ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._context: Optional[ssl.SSLContext] = None

    # -- lifecycle --

    def start(self) -> "FabricManagerEmulator":
        if self._server is not None:
            raise RuntimeError("fabric manager: already started")
        if self._context is None:  # kept across restart_service: the clients trust this CA
            self._context = self._tls_context()
        context = self._context
        server = http.server.ThreadingHTTPServer((self._host, self._port), self._handler_class())
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="fabric-manager", daemon=True)
        self._thread.start()
        log.info("fabric manager emulator serving on https://%s (CA %s)", self.endpoint, self.ca_cert_path)
        return self

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        """The HTTP routes: the fabric manager's API (the cluster-manager emulator serves its own)."""
        return _handler_for(self)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._own_dir is not None:
            self._own_dir.cleanup()

    def restart_service(self, down_s: float = 0.0) -> None:
        """The fabric manager's service dies and comes back `down_s` later, on the same port with the same
        certificate; the hardware (what is attached where) keeps its state. Calls meanwhile are refused, and a call
        under way may lose its answer while the fabric has done it (the hazard of a real restart)."""
        port = self.port
        server, self._server = self._server, None
        assert server is not None
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        log.info("fabric manager emulator: service down for %.1f s", down_s)
        time.sleep(down_s)
        self._port = port
        self.start()

    def __enter__(self) -> "FabricManagerEmulator":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("fabric manager: not started")
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """host:port, the operator's FTI_CDI_ENDPOINT (the client adds https:// and the trailing slash)."""
        return f"{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"https://{self.endpoint}"

    # -- the fabric, for the harness and tests --

    def add_devices(self, model: str, count: int) -> list[str]:
        """Add `count` devices of `model` to the pool; returns their serials (GPU-<uuid>)."""
        if not model or count < 0:
            raise ValueError(f"fabric manager: bad pool entry {model!r}={count}")
        with self._lock:
            start = sum(1 for d in self._devices if d.model == model)
            added = [Device(res_uuid=str(uuid.uuid4()), model=model, serial=f"GPU-{uuid.uuid4()}", index=start + i)
                     for i in range(count)]
            self._devices.extend(added)
        return [device.serial for device in added]

    def register_machine(self, name: str, machine_uuid: Optional[str] = None) -> str:
        """A machine (a node's server) the fabric can attach to; returns its uuid. Idempotent by name."""
        with self._lock:
            for machine in self._machines.values():
                if machine.name == name:
                    return machine.machine_uuid
            machine_uuid = machine_uuid or str(uuid.uuid4())
            self._machines[machine_uuid] = Machine(machine_uuid, name, len(self._machines) + 1)
            return machine_uuid

    def machine_uuid(self, name: str) -> str:
        with self._lock:
            for machine in self._machines.values():
                if machine.name == name:
                    return machine.machine_uuid
        raise KeyError(f"fabric manager: no machine named {name!r}")

    def devices_of(self, machine_uuid: str) -> list[Device]:
        """Copies of the devices attached to a machine: committed attaches, and devices whose detach is under way
        (they stay on the machine until the fabric is done)."""
        with self._lock:
            return [Device(**vars(d)) for d in self._devices if d.machine == machine_uuid]

    def attachments(self) -> dict[str, list[str]]:
        """machine uuid -> serials attached to it (devices mid-detach included: they are still on the machine)."""
        with self._lock:
            view: dict[str, list[str]] = {}
            for device in self._devices:
                if device.machine is not None:
                    view.setdefault(device.machine, []).append(device.serial)
            return view

    def free_count(self, model: str) -> int:
        with self._lock:
            return sum(1 for d in self._devices if d.model == model and d.machine is None and not d.busy)

    def attach(self, machine_uuid: str, model: str, count: int = 1) -> list[Device]:
        """Attach as the PATCH does (blocking for the latency); what tests use to play the operator's part."""
        return self._attach(machine_uuid, RESOURCE_TYPE_GPU, model, count)

    def detach(self, machine_uuid: str, res_uuid: str) -> None:
        """Detach as the DELETE does (blocking for the latency)."""
        self._detach(machine_uuid, RESOURCE_TYPE_GPU, res_uuid)

    def set_op_status(self, serial: str, op_status: str) -> None:
        """A device's health as the fabric reports it: "0" ok, "1" warning, "2" critical (a GPU off the bus)."""
        if op_status not in _OP_STATUSES:
            raise ValueError(f"fabric manager: op status must be one of {_OP_STATUSES}, got {op_status!r}")
        with self._lock:
            device = self._device_by_serial(serial)
            device.op_status = op_status
            machine = device.machine
        if machine is not None:
            self._notify(machine)

    def fail_next_attaches(self, count: int, *, status: int = 500, code: str = CODE_INJECTED,
                           message: str = "fabric switch did not answer the composition request") -> None:
        with self._lock:
            self._faults.attach = InjectedFault(count, status, code, message)

    def fail_next_detaches(self, count: int, *, status: int = 500, code: str = CODE_INJECTED,
                           message: str = "fabric switch did not answer the decomposition request") -> None:
        with self._lock:
            self._faults.detach = InjectedFault(count, status, code, message)

    def attach_as_critical(self, count: int) -> None:
        """The next `count` attaches succeed in the fabric but the device comes up critical (op status "2")."""
        with self._lock:
            self._faults.critical_attaches = count

    def revoke_tokens(self) -> None:
        """Invalidate every token issued so far (the identity manager restarted or rotated its keys)."""
        with self._lock:
            self._not_before = self._clock() + 1e-6

    def add_listener(self, callback: Callable[[str], None]) -> None:
        """`callback(machine_uuid)` after every committed change of that machine's devices (outside the lock)."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def calls(self) -> list[CallRecord]:
        with self._lock:
            return list(self._calls)

    # -- the operations behind the API --

    def _attach(self, machine_uuid: str, res_type: str, model: str, count: int) -> list[Device]:
        reservation = self._reserve_attach(machine_uuid, res_type, model, count)
        time.sleep(_draw(self.attach_latency_s))  # the fabric reconfigures the switch; the request waits for it
        return self._commit_attach(reservation)

    def _reserve_attach(self, machine_uuid: str, res_type: str, model: str, count: int) -> "AttachReservation":
        """Take `count` free devices of `model` for the machine (busy until committed) and the fault, if any, this
        attach will meet. Shared with the cluster-manager emulator, whose attach completes in the background."""
        with self._lock:
            self._machine(machine_uuid)
            if res_type != RESOURCE_TYPE_GPU:
                raise FabricManagerError(400, CODE_BAD_REQUEST, f"resource type {res_type!r} is not offered; "
                                         f"this fabric has {RESOURCE_TYPE_GPU!r} devices only")
            if count < 1:
                raise FabricManagerError(400, CODE_BAD_REQUEST, f"res_num must be at least 1, got {count}")
            free = [d for d in self._devices if d.model == model and d.machine is None and not d.busy]
            if len(free) < count:
                models = sorted({d.model for d in self._devices})
                raise FabricManagerError(409, CODE_NO_FREE_DEVICE,
                                         f"{count} free {model!r} device(s) requested, {len(free)} free; "
                                         f"models in this fabric: {', '.join(models) or 'none'}",
                                         {"model": model, "requested": count, "free": len(free)})
            chosen = free[:count]
            for device in chosen:
                device.busy = True
            fault = self._take(self._faults.attach)
            critical = self._faults.critical_attaches > 0
            if critical:
                self._faults.critical_attaches -= 1
        return AttachReservation(machine_uuid, chosen, fault, critical)

    def _commit_attach(self, reservation: "AttachReservation") -> list[Device]:
        """The fabric is done: the devices join the machine, or go back to the pool when the fault hit (raised)."""
        with self._lock:
            for device in reservation.devices:
                device.busy = False
                if reservation.fault is None:
                    device.machine = reservation.machine_uuid
                    device.op_status = OP_STATUS_CRITICAL if reservation.critical else OP_STATUS_OK
            attached = [Device(**vars(d)) for d in reservation.devices]
        if reservation.fault is not None:
            fault = reservation.fault
            raise FabricManagerError(fault.status, fault.code, fault.message)
        log.info("fabric manager: attached %s to machine %s", [d.serial for d in attached], reservation.machine_uuid)
        self._notify(reservation.machine_uuid)
        return attached

    def _detach(self, machine_uuid: str, res_type: str, res_uuid: str) -> None:
        device, fault = self._reserve_detach(machine_uuid, res_type, res_uuid)
        time.sleep(_draw(self.detach_latency_s))
        self._commit_detach(machine_uuid, device, fault)

    def _reserve_detach(self, machine_uuid: str, res_type: str, res_uuid: str
                        ) -> tuple[Device, Optional[InjectedFault]]:
        with self._lock:
            self._machine(machine_uuid)
            device = next((d for d in self._devices if d.res_uuid == res_uuid), None)
            if device is None or device.machine != machine_uuid or device.res_type != res_type:
                raise FabricManagerError(404, CODE_NOT_FOUND,
                                         f"resource {res_uuid} ({res_type}) is not attached to machine {machine_uuid}")
            if device.busy:
                raise FabricManagerError(409, CODE_IN_PROGRESS, f"resource {res_uuid} is already being detached")
            device.busy = True
            return device, self._take(self._faults.detach)

    def _commit_detach(self, machine_uuid: str, device: Device, fault: Optional[InjectedFault]) -> None:
        with self._lock:
            device.busy = False
            if fault is None:
                device.machine = None
                device.op_status = OP_STATUS_OK
        if fault is not None:
            raise FabricManagerError(fault.status, fault.code, fault.message)
        log.info("fabric manager: detached %s from machine %s", device.serial, machine_uuid)
        self._notify(machine_uuid)

    @staticmethod
    def _take(fault: Optional[InjectedFault]) -> Optional[InjectedFault]:
        if fault is None or fault.remaining <= 0:
            return None
        fault.remaining -= 1
        return fault

    def _machine(self, machine_uuid: str) -> Machine:
        machine = self._machines.get(machine_uuid)
        if machine is None:
            raise FabricManagerError(404, CODE_NOT_FOUND, f"machine {machine_uuid} is not registered in this fabric")
        return machine

    def _device_by_serial(self, serial: str) -> Device:
        for device in self._devices:
            if device.serial == serial:
                return device
        raise KeyError(f"fabric manager: no device with serial {serial!r}")

    def _notify(self, machine_uuid: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback(machine_uuid)
            except Exception:  # a listener's bug must not fail the fabric's answer
                log.exception("fabric manager: listener failed for machine %s", machine_uuid)

    # -- the HTTP API's answers --

    def machine_document(self, machine_uuid: str, tenant_uuid: str) -> dict[str, Any]:
        """GET machines/<uuid>: {"data": {"machines": [GetMachineItem]}}."""
        self._check_tenant(tenant_uuid)
        with self._lock:
            machine = self._machine(machine_uuid)
            # An attach under way is not shown (its device joins the machine when the fabric is done); a detach under
            # way is (the device leaves when the fabric is done).
            resources = [d.as_resource() for d in self._devices if d.machine == machine_uuid]
        return {"data": {"machines": [dict(self._machine_header(machine), mach_status=0,
                                           mach_status_detail="running", resources=resources)]}}

    def scale_up(self, machine_uuid: str, tenant_uuid: str, body: Any) -> dict[str, Any]:
        """PATCH machines/<uuid>/update: attach every res_spec; {"data": {"machines": [ScaleUpResponseMachineItem]}}."""
        self._check_tenant(tenant_uuid)
        specs = _resource_specs(body, machine_uuid, tenant_uuid)
        attached: list[Device] = []
        for spec in specs:
            model = _model_of(spec)
            attached += self._attach(machine_uuid, str(spec.get("res_type", "")), model, _int(spec, "res_num"))
        with self._lock:
            machine = self._machine(machine_uuid)
        return {"data": {"machines": [dict(self._machine_header(machine),
                                           resources=[d.as_resource() for d in attached])]}}

    def scale_down(self, machine_uuid: str, tenant_uuid: str, body: Any) -> None:
        """DELETE machines/<uuid>/update: detach each res_spec's res_uuid."""
        self._check_tenant(tenant_uuid)
        for spec in _resource_specs(body, machine_uuid, tenant_uuid):
            res_uuid = spec.get("res_uuid")
            if not isinstance(res_uuid, str) or not res_uuid:
                raise FabricManagerError(400, CODE_BAD_REQUEST, "each res_specs entry needs a res_uuid to detach")
            self._detach(machine_uuid, str(spec.get("res_type", "")), res_uuid)

    def _machine_header(self, machine: Machine) -> dict[str, Any]:
        return {"fabric_uuid": self.fabric_uuid, "fabric_id": 1, "mach_uuid": machine.machine_uuid,
                "mach_id": machine.machine_id, "mach_name": machine.name, "tenant_uuid": self.tenant_uuid}

    def _check_tenant(self, tenant_uuid: str) -> None:
        if tenant_uuid != self.tenant_uuid:
            raise FabricManagerError(403, CODE_FORBIDDEN, f"tenant_uuid {tenant_uuid!r} is not this fabric's tenant")

    # -- tokens --

    def issue_token(self, form: Mapping[str, str]) -> dict[str, Any]:
        """The identity manager's password grant (token.go's `token` struct)."""
        expected = self.credentials
        if form.get("grant_type") != "password":
            raise FabricManagerError(400, "unsupported_grant_type",
                                     f"grant_type must be 'password', got {form.get('grant_type')!r}")
        if (form.get("client_id"), form.get("client_secret")) != (expected.client_id, expected.client_secret):
            raise FabricManagerError(401, "invalid_client", "client_id or client_secret is wrong")
        if (form.get("username"), form.get("password")) != (expected.username, expected.password):
            raise FabricManagerError(401, "invalid_grant", "invalid user credentials")
        now = self._clock()
        lifetime = self.token_lifetime_s
        access = self._jwt({"exp": int(now + lifetime), "iat": now, "jti": str(uuid.uuid4()),
                            "iss": f"{self.base_url}/id_manager/realms/{expected.realm}", "sub": expected.username,
                            "typ": "Bearer", "azp": expected.client_id, "scope": form.get("scope", "")})
        refresh = self._jwt({"exp": int(now + 2 * lifetime), "iat": now, "typ": "Refresh"})
        return {"access_token": access, "expires_in": int(lifetime), "refresh_expires_in": int(2 * lifetime),
                "refresh_token": refresh, "token_type": "Bearer", "id_token": self._jwt({"exp": int(now + lifetime),
                                                                                        "typ": "ID"}),
                "not-before-policy": 0, "session_state": str(uuid.uuid4()), "scope": "openid profile email"}

    def check_bearer(self, header: Optional[str]) -> None:
        if not header or not header.lower().startswith("bearer "):
            raise FabricManagerError(401, CODE_UNAUTHORIZED, "missing bearer token")
        claims = self._verify_jwt(header.split(" ", 1)[1].strip())
        if claims.get("typ") != "Bearer":
            raise FabricManagerError(401, CODE_UNAUTHORIZED, "not an access token")
        if float(claims.get("exp", 0)) <= self._clock():
            raise FabricManagerError(401, CODE_UNAUTHORIZED, "access token expired")
        with self._lock:
            revoked = float(claims.get("iat", 0)) < self._not_before
        if revoked:
            raise FabricManagerError(401, CODE_UNAUTHORIZED, "access token revoked")

    def _jwt(self, claims: dict[str, Any]) -> str:
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        payload = _b64(json.dumps(claims).encode())
        signature = hmac.new(self._signing_key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64(signature)}"

    def _verify_jwt(self, token: str) -> dict[str, Any]:
        parts = token.split(".")
        if len(parts) != 3:
            raise FabricManagerError(401, CODE_UNAUTHORIZED, "malformed token")
        expected = hmac.new(self._signing_key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(_b64(expected), parts[2]):
            raise FabricManagerError(401, CODE_UNAUTHORIZED, "token signature does not verify")
        return dict(json.loads(_unb64(parts[1])))

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self._calls.append(CallRecord(method, path, status))

    # -- TLS --

    def _tls_context(self) -> ssl.SSLContext:
        cert_pem, key_pem, ca_pem = _server_certificate(self._host)
        self.ca_cert_path.write_bytes(ca_pem)
        cert_file = self.state_dir / "fm-server.crt"
        key_file = self.state_dir / "fm-server.key"
        cert_file.write_bytes(cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        return context


def _bounds(latency: Latency) -> tuple[float, float]:
    return (float(latency), float(latency)) if isinstance(latency, (int, float)) else (latency[0], latency[1])


def _draw(latency: Latency) -> float:
    """Seconds for one operation: a fixed latency, or uniform in (min, max) as the simulated fabric draws them."""
    low, high = sorted(_bounds(latency))
    return random.uniform(low, high)


def _resource_specs(body: Any, machine_uuid: str, tenant_uuid: str) -> list[dict[str, Any]]:
    """The res_specs of the one machine entry of a ScaleUpBody/ScaleDownBody, checked against the URL."""
    if not isinstance(body, dict) or not isinstance(body.get("tenants"), dict):
        raise FabricManagerError(400, CODE_BAD_REQUEST, "body must be {\"tenants\": {...}}")
    tenants = body["tenants"]
    if tenants.get("tenant_uuid") != tenant_uuid:
        raise FabricManagerError(400, CODE_BAD_REQUEST,
                                 f"tenants.tenant_uuid {tenants.get('tenant_uuid')!r} differs from the query's")
    machines = tenants.get("machines")
    if not isinstance(machines, list) or len(machines) != 1 or not isinstance(machines[0], dict):
        raise FabricManagerError(400, CODE_BAD_REQUEST, "tenants.machines must hold exactly this machine")
    if machines[0].get("mach_uuid") != machine_uuid:
        raise FabricManagerError(400, CODE_BAD_REQUEST,
                                 f"tenants.machines[0].mach_uuid {machines[0].get('mach_uuid')!r} is not "
                                 f"{machine_uuid}")
    specs: list[dict[str, Any]] = []
    for resource in machines[0].get("resources") or []:
        if not isinstance(resource, dict) or not isinstance(resource.get("res_specs"), list):
            raise FabricManagerError(400, CODE_BAD_REQUEST, "each resources entry needs a res_specs list")
        specs += [spec for spec in resource["res_specs"] if isinstance(spec, dict)]
    if not specs:
        raise FabricManagerError(400, CODE_BAD_REQUEST, "no res_specs in the request")
    return specs


def _model_of(spec: Mapping[str, Any]) -> str:
    conditions = (spec.get("res_spec") or {}).get("condition") or []
    for condition in conditions:
        if condition.get("column") == "model" and condition.get("operator") == "eq" and condition.get("value"):
            return str(condition["value"])
    raise FabricManagerError(400, CODE_BAD_REQUEST, "res_spec.condition needs {column: model, operator: eq, value}")


def _int(spec: Mapping[str, Any], key: str) -> int:
    value = spec.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FabricManagerError(400, CODE_BAD_REQUEST, f"{key} must be an integer, got {value!r}")
    return value


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _server_certificate(host: str) -> tuple[bytes, bytes, bytes]:
    """A CA of the emulator's own and a server certificate for `host` (plus localhost): (cert, key, CA) PEMs."""
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=7)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dds fabric-manager emulator CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        sans.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        sans.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fabric-manager")])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(pem), key_pem, ca.public_bytes(pem)


def _handler_for(fabric: FabricManagerEmulator) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_FabricManagerHandler):
        emulator = fabric
    return Handler


class _FabricManagerHandler(http.server.BaseHTTPRequestHandler):
    emulator: FabricManagerEmulator
    protocol_version = "HTTP/1.1"  # keep-alive, as Go's client expects

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve(self._post)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(self._get)

    def do_PATCH(self) -> None:  # noqa: N802
        self._serve(self._patch)

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve(self._delete)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (signature of the base class)
        log.debug("fabric manager: %s", format % args)

    # -- routes --

    def _post(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        realm = self.emulator.credentials.realm
        if path != TOKEN_PATH_TEMPLATE.format(realm=realm):
            raise FabricManagerError(404, CODE_NOT_FOUND, f"no such endpoint {path} (realm {realm!r})")
        form = dict(urllib.parse.parse_qsl(self._body().decode()))
        return 200, self.emulator.issue_token(form)

    def _get(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        machine_uuid, action = self._fm_route(path)
        if action:
            raise FabricManagerError(405, CODE_BAD_REQUEST, f"GET is not allowed on {path}")
        return 200, self.emulator.machine_document(machine_uuid, query.get("tenant_uuid", ""))

    def _patch(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        machine_uuid, action = self._fm_route(path, need_update=True)
        return 200, self.emulator.scale_up(machine_uuid, query.get("tenant_uuid", ""), self._json_body())

    def _delete(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        machine_uuid, action = self._fm_route(path, need_update=True)
        self.emulator.scale_down(machine_uuid, query.get("tenant_uuid", ""), self._json_body())
        return 204, None

    def _fm_route(self, path: str, need_update: bool = False) -> tuple[str, str]:
        if not path.startswith(FM_PREFIX):
            raise FabricManagerError(404, CODE_NOT_FOUND, f"no such endpoint {path}")
        self.emulator.check_bearer(self.headers.get("Authorization"))
        machine_uuid, _, action = path[len(FM_PREFIX):].partition("/")
        if not machine_uuid or action not in ("", "update") or (need_update and action != "update"):
            raise FabricManagerError(404, CODE_NOT_FOUND, f"no such endpoint {path}")
        return machine_uuid, action

    # -- plumbing --

    def _serve(self, route: Callable[[str, dict[str, str]], tuple[int, Optional[dict[str, Any]]]]) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        try:
            status, document = route(parsed.path, query)
        except FabricManagerError as error:
            status, document = error.status, self._error_document(error)
            log.info("fabric manager: %s %s -> %s", self.command, parsed.path, error)
        except Exception as exc:  # answer the client rather than drop the connection, and say what broke
            log.exception("fabric manager: %s %s failed", self.command, parsed.path)
            status, document = 500, FabricManagerError(500, "E50000", f"emulator error: {exc}").body()
        self.emulator._record(self.command, parsed.path, status)
        self._reply(status, document)

    def _error_document(self, error: FabricManagerError) -> dict[str, Any]:
        """The error body of this API (fm/api ErrorBody)."""
        return error.body()

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> Any:
        raw = self._body()
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError as exc:
            raise FabricManagerError(400, CODE_BAD_REQUEST, f"body is not JSON: {exc}") from exc

    def _reply(self, status: int, document: Optional[dict[str, Any]]) -> None:
        payload = b"" if document is None else json.dumps(document).encode()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.send_response(status)
            if document is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)


# -- command line --

def _parse_pool(text: str) -> tuple[str, int]:
    model, sep, count = text.partition("=")
    if not sep or not model or not count.isdigit():
        raise argparse.ArgumentTypeError(f"--pool wants MODEL=COUNT (e.g. A100=8), got {text!r}")
    return model, int(count)


def _parse_latency(text: str) -> Latency:
    low, sep, high = text.partition("-")
    try:
        return (float(low), float(high)) if sep else float(low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a latency is SECONDS or MIN-MAX (e.g. 3 or 2-5), got {text!r}") from None


def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT (e.g. 127.0.0.1:8443), got {text!r}")
    return host, int(port)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.fabric_manager", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_parse_listen, default=("127.0.0.1", 0), help="HOST:PORT (port 0: free)")
    parser.add_argument("--pool", type=_parse_pool, action="append", default=[], help="MODEL=COUNT, repeatable")
    parser.add_argument("--machine", action="append", default=[], help="register a machine by name, repeatable")
    parser.add_argument("--attach-latency", type=_parse_latency, default=0.0,
                        help="seconds an attach blocks, or MIN-MAX drawn per attach")
    parser.add_argument("--detach-latency", type=_parse_latency, default=0.0,
                        help="seconds a detach blocks, or MIN-MAX drawn per detach")
    parser.add_argument("--token-lifetime", type=float, default=DEFAULT_TOKEN_LIFETIME_S, help="seconds")
    parser.add_argument("--tenant", default=DEFAULT_TENANT, help="tenant uuid (the operator's FTI_CDI_TENANT_ID)")
    parser.add_argument("--state-dir", type=Path, help="where the CA certificate is written (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host, port = args.listen
    fabric = FabricManagerEmulator(dict(args.pool), attach_latency_s=args.attach_latency,
                                   detach_latency_s=args.detach_latency, token_lifetime_s=args.token_lifetime,
                                   tenant_uuid=args.tenant, state_dir=args.state_dir, host=host, port=port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with fabric:
        print(json.dumps({"endpoint": fabric.endpoint, "ca_cert": str(fabric.ca_cert_path),
                          "tenant_uuid": fabric.tenant_uuid,
                          "machines": {name: fabric.register_machine(name) for name in args.machine},
                          "credentials": fabric.credentials.secret_data()}, indent=2), flush=True)
        stop.wait()
    return 0


@contextlib.contextmanager
def running_fabric_manager(pools: Mapping[str, int], **options: Any) -> Iterator[FabricManagerEmulator]:
    """`with running_fabric_manager({"A100": 4}, attach_latency_s=2) as fm:` — started, stopped on exit."""
    fabric = FabricManagerEmulator(pools, **options)
    with fabric:
        yield fabric


if __name__ == "__main__":
    raise SystemExit(main())
