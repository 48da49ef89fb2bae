"""An emulator of the FTI cluster manager (CM) that CoHDI's composable-resource-operator calls with
`FTI_CDI_API_TYPE=CM`: the one FTI API with which the operator can attach in DEVICE_PLUGIN mode at commit 38251b7
(docs/composability.md, "Device modes").

The hardware's stand-in, never part of the wheel. It is the fabric-manager emulator (harness/fabric_manager.py) with
the cluster manager's routes: the same pool of devices by model, machines, attach/detach latencies, injected faults,
OIDC token endpoint (the CM client logs in through the same internal/cdi/fti/token.go), TLS with its own CA, call
record and listeners (harness/gpu_node_agent.py follows `devices_of(machine)` either way). One hardware model, two
APIs over it: a subclass rather than a copy.

Its specification is the operator's CM client (internal/cdi/fti/cm/client.go, cm/api/machine.go);
tests/unit/test_cluster_manager_contract.py pins every answer to the json tags of those structs, read from the source
archive. The API (every call with `Authorization: Bearer <token>`):

    GET  /cluster_manager/cluster_autoscaler/v3/tenants/<tenant>/clusters/<cluster>/machines/<machine uuid>
         -> {"data": {"tenant_uuid", "cluster": {"cluster_uuid", "machine": {..., "resspecs": [...]}}}}
    POST .../machines/<machine uuid>/actions/resize
         {"increase_resource_count": {"spec_uuid", "device_count"}}          -> 202, the devices come later
         {"remove_resources": {"spec_uuid", "device_count", "devices": [<device_id>]}}  -> 202, they go later

The model, as the client reads it:
- a machine has one resource spec per model of the pool (type "gpu", selector `model eq <model>`, a stable
  spec_uuid); a model the fabric does not hold has no spec, so the client sends `spec_uuid: ""`, answered 404.
- `device_count` is the spec's target: its devices attached and not being removed, plus adds under way. A resize
  names the new target (the client sends the GET's count + 1, or - 1 with the device to remove).
- a resize answers at once (202); the attach or detach completes in the background after the latency. The client
  polls: it requeues 30 s after a resize and then looks at the machine again (cm/client.go returns
  ErrWaitingDeviceAttaching / ErrWaitingDeviceDetaching). A device being added is not listed until the fabric is
  done (ADD_COMPLETE); one being removed is listed as REMOVING (a name of this emulator: the client only tells
  REMOVE_FAILED apart).
- one resize of a spec at a time: another resize of it while one is under way is answered 409 (the client would
  otherwise add twice: `_check_no_resize_under_way` says why). The operator retries a 409 with backoff. Which a real
  CM does is FTI's to say: `repeated_resize=RepeatedResize.ACCEPT` plays the other answer (the repeat is applied).
- an add the fabric failed (`fail_next_attaches`) is listed as ADD_FAILED with the fault's message as status_reason,
  outside the target, for `failed_add_visible_s`; then dropped. The client has no call that acknowledges a failed add
  (it reports any unused ADD_FAILED device as its error and retries), so a CM that kept the entry would block every
  later add of that model to the machine: this emulator forgets it by default, and says how long it shows it;
  `failed_adds=FailedAdds.KEEP` plays a CM that keeps it (until `clear_failed_adds`).
- a remove the fabric failed (`fail_next_detaches`) leaves the device attached, listed REMOVE_FAILED with the reason,
  until it is removed again.
- errors answer `{"status": <http status>, "detail": {"code", "message"}}` (cm/api ErrorBody).

Runnable on its own like the fabric-manager emulator:

    python -m harness.cluster_manager --listen 127.0.0.1:8443 --pool A100=8 --machine node-1 --attach-latency 2-5
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Optional, Sequence

from harness.fabric_manager import (CODE_BAD_REQUEST, CODE_IN_PROGRESS, CODE_NOT_FOUND, OP_STATUS_OK,
                                    RESOURCE_TYPE_GPU, AttachReservation, Device, FabricManagerEmulator,
                                    FabricManagerError, Latency, _draw, _FabricManagerHandler, _parse_latency,
                                    _parse_listen, _parse_pool)

log = logging.getLogger(__name__)

CM_API_PREFIX = "/cluster_manager/cluster_autoscaler/v3/tenants/"
DEFAULT_CLUSTER = "3f9a7c52-8d1e-4b6a-9c0f-5e2d7a1b8c43"
DEFAULT_FAILED_ADD_VISIBLE_S = 45.0

# Device statuses: the three the client knows (cm/client.go), and this emulator's name for a removal under way.
ADD_COMPLETE = "ADD_COMPLETE"
ADD_FAILED = "ADD_FAILED"
REMOVE_FAILED = "REMOVE_FAILED"
REMOVING = "REMOVING"

CODE_COUNT_MISMATCH = "E40903"
_SPEC_NAMESPACE = uuid.UUID("0b5e4d8a-6c2f-4f1e-8a3d-7e9c1b2a4f60")  # spec uuids derived from (machine, model)


class RepeatedResize(str, Enum):
    """What the CM does with a resize of a spec while an earlier one is under way (FTI has not said: docs/composability.md
    "Known issues"). REFUSE (409) is what the operator's client needs; ACCEPT is the other possibility, under which
    the client adds twice."""

    REFUSE = "refuse"
    ACCEPT = "accept"


class FailedAdds(str, Enum):
    """How long the CM lists a failed add (ADD_FAILED): FORGET it after `failed_add_visible_s`, or KEEP it (the
    client has no call to acknowledge it, so every later add of the model to the machine fails on it)."""

    FORGET = "forget"
    KEEP = "keep"


@dataclass
class _FailedAdd:
    machine_uuid: str
    model: str
    device: Device  # a copy, as the fabric had it when the add failed (back in the pool since)
    reason: str
    until: float


class ClusterManagerEmulator(FabricManagerEmulator):
    """The fabric-manager emulator's hardware behind the cluster manager's API. `start()` serves on 127.0.0.1."""

    def __init__(self, pools: Mapping[str, int], *, cluster_uuid: str = DEFAULT_CLUSTER,
                 failed_add_visible_s: float = DEFAULT_FAILED_ADD_VISIBLE_S,
                 repeated_resize: RepeatedResize = RepeatedResize.REFUSE, failed_adds: FailedAdds = FailedAdds.FORGET,
                 **options: Any) -> None:
        if failed_add_visible_s <= 0:
            raise ValueError(f"cluster manager: failed_add_visible_s must be positive, got {failed_add_visible_s}")
        super().__init__(pools, **options)
        self.cluster_uuid = cluster_uuid
        self.failed_add_visible_s = failed_add_visible_s
        self.repeated_resize = RepeatedResize(repeated_resize)
        self.failed_adds_kept = FailedAdds(failed_adds) is FailedAdds.KEEP
        self._pending_adds: dict[tuple[str, str], int] = {}  # (machine, model) -> devices on their way
        self._failed_adds: list[_FailedAdd] = []
        self._remove_failures: dict[str, str] = {}  # serial -> why the fabric refused its removal
        self._workers: list[threading.Thread] = []

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        emulator = self

        class Handler(_ClusterManagerHandler):
            cluster_manager = emulator
        Handler.emulator = emulator
        return Handler

    def stop(self) -> None:
        for worker in list(self._workers):
            worker.join(timeout=30)  # an attach or detach under way ends (its latency) before the state is dropped
        super().stop()

    def spec_uuid(self, machine_uuid: str, model: str) -> str:
        """The machine's resource spec for a model (stable: the same machine and model give the same uuid)."""
        return str(uuid.uuid5(_SPEC_NAMESPACE, f"{machine_uuid}/{model}"))

    def failed_adds(self, machine_uuid: str) -> list[tuple[str, str]]:
        """(serial, reason) of the ADD_FAILED entries the machine shows now."""
        with self._lock:
            self._forget_expired_failures()
            return [(f.device.serial, f.reason) for f in self._failed_adds if f.machine_uuid == machine_uuid]

    def resize_calls(self) -> list[Any]:
        """The resize POSTs answered so far (CallRecord), attaches and detaches alike."""
        return [c for c in self.calls() if c.method == "POST" and c.path.endswith("/actions/resize")]

    # -- the API's answers --

    def machine_data(self, tenant_uuid: str, cluster_uuid: str, machine_uuid: str) -> dict[str, Any]:
        """GET machines/<uuid>: cm/api MachineData."""
        self._check_scope(tenant_uuid, cluster_uuid)
        with self._lock:
            machine = self._machine(machine_uuid)
            self._forget_expired_failures()
            specs = [self._spec_document(machine_uuid, model) for model in self._models()]
        return {"data": {"tenant_uuid": self.tenant_uuid, "cluster": {"cluster_uuid": self.cluster_uuid, "machine": {
            "uuid": machine.machine_uuid, "name": machine.name, "status": "ACTIVE", "status_reason": "",
            "resspecs": specs}}}}

    def resize(self, tenant_uuid: str, cluster_uuid: str, machine_uuid: str, body: Any) -> None:
        """POST machines/<uuid>/actions/resize: one increase_resource_count or one remove_resources, refused (409)
        while an earlier resize of the same spec is under way."""
        self._check_scope(tenant_uuid, cluster_uuid)
        if not isinstance(body, dict) or len(body) != 1 or \
                next(iter(body)) not in ("increase_resource_count", "remove_resources"):
            raise FabricManagerError(400, CODE_BAD_REQUEST, "body must be {\"increase_resource_count\": {...}} or "
                                     "{\"remove_resources\": {...}}")
        action, target = next(iter(body.items()))
        if not isinstance(target, dict):
            raise FabricManagerError(400, CODE_BAD_REQUEST, f"{action} must be an object")
        model = self._model_of_spec(machine_uuid, target.get("spec_uuid"))
        count = _count(target)
        if self.repeated_resize is RepeatedResize.REFUSE:
            self._check_no_resize_under_way(machine_uuid, model)
        if action == "increase_resource_count":
            self._increase(machine_uuid, model, count)
        else:
            self._remove(machine_uuid, model, count, target.get("devices"))

    # -- adds and removals --

    def _increase(self, machine_uuid: str, model: str, count: int) -> None:
        with self._lock:
            current = self._target(machine_uuid, model)
        if count <= current:
            raise FabricManagerError(409, CODE_COUNT_MISMATCH,
                                     f"device_count {count} is not above the {model} spec's current count {current} "
                                     f"on machine {machine_uuid}: nothing to add")
        reservation = self._reserve_attach(machine_uuid, RESOURCE_TYPE_GPU, model, count - current)
        with self._lock:
            key = (machine_uuid, model)
            self._pending_adds[key] = self._pending_adds.get(key, 0) + len(reservation.devices)
        self._in_background(f"cm-add-{model}", lambda: self._complete_add(reservation, model))
        log.info("cluster manager: adding %d %s to machine %s", count - current, model, machine_uuid)

    def _complete_add(self, reservation: AttachReservation, model: str) -> None:
        time.sleep(_draw(self.attach_latency_s))
        try:
            self._commit_attach(reservation)
        except FabricManagerError as error:
            until = time.monotonic() + self.failed_add_visible_s
            with self._lock:
                self._failed_adds += [_FailedAdd(reservation.machine_uuid, model, Device(**vars(d)), error.message,
                                                 until) for d in reservation.devices]
            log.info("cluster manager: adding %s to machine %s failed: %s",
                     [d.serial for d in reservation.devices], reservation.machine_uuid, error.message)
        finally:
            with self._lock:
                key = (reservation.machine_uuid, model)
                self._pending_adds[key] -= len(reservation.devices)

    def _remove(self, machine_uuid: str, model: str, count: int, devices: Any) -> None:
        if not isinstance(devices, list) or not devices or not all(isinstance(d, str) and d for d in devices):
            raise FabricManagerError(400, CODE_BAD_REQUEST, "remove_resources.devices must list the device_ids to "
                                     "remove")
        with self._lock:
            on_machine = {d.serial: d for d in self._devices if d.machine == machine_uuid and d.model == model}
            unknown = [serial for serial in devices if serial not in on_machine]
            if unknown:
                raise FabricManagerError(404, CODE_NOT_FOUND, f"device(s) {unknown} are not {model} devices of "
                                         f"machine {machine_uuid}")
            new = [on_machine[serial] for serial in devices]
            expected = self._target(machine_uuid, model) - len(new)
        if count != expected:
            raise FabricManagerError(409, CODE_COUNT_MISMATCH,
                                     f"device_count {count} does not match removing {len(new)} device(s) from the "
                                     f"{model} spec of machine {machine_uuid}, which would leave {expected}")
        for device in new:
            reserved, fault = self._reserve_detach(machine_uuid, RESOURCE_TYPE_GPU, device.res_uuid)
            with self._lock:
                self._remove_failures.pop(reserved.serial, None)
            self._in_background(f"cm-remove-{model}",
                                lambda d=reserved, f=fault: self._complete_remove(machine_uuid, d, f))
        log.info("cluster manager: removing %s from machine %s", [d.serial for d in new], machine_uuid)

    def _complete_remove(self, machine_uuid: str, device: Device, fault: Any) -> None:
        time.sleep(_draw(self.detach_latency_s))
        try:
            self._commit_detach(machine_uuid, device, fault)
        except FabricManagerError as error:
            with self._lock:
                self._remove_failures[device.serial] = error.message
            log.info("cluster manager: removing %s from machine %s failed: %s", device.serial, machine_uuid,
                     error.message)

    def _check_no_resize_under_way(self, machine_uuid: str, model: str) -> None:
        """One resize of a spec at a time. The CM client keeps no record of the resize it sent: whenever it looks at a
        resource still attaching with no device of its own, it asks for the spec's count + 1 again, and it looks
        again on any event (its own status writes race its reconciles; a restarted operator looks at once). Against
        a CM that accepted that second resize it adds a device no resource takes (seen in the e2e with an earlier
        version of this emulator, docs/composability.md "Known issues"); answered 409 instead, the operator retries
        with backoff and then takes the device of the first resize. The client being the specification, this is
        the behaviour it needs of the CM."""
        with self._lock:
            adding = self._pending_adds.get((machine_uuid, model), 0)
            removing = [d.serial for d in self._devices if d.machine == machine_uuid and d.model == model and d.busy]
        if adding or removing:
            under_way = f"{adding} device(s) being added" if adding else f"{removing} being removed"
            raise FabricManagerError(409, CODE_IN_PROGRESS, f"a resize of the {model} spec of machine {machine_uuid} "
                                     f"is under way ({under_way}): try again once it is done")

    def _in_background(self, name: str, work: Any) -> None:
        worker = threading.Thread(target=work, name=name, daemon=True)
        with self._lock:
            self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    # -- the documents (callers hold the lock) --

    def _models(self) -> list[str]:
        return sorted({d.model for d in self._devices if d.res_type == RESOURCE_TYPE_GPU})

    def _target(self, machine_uuid: str, model: str) -> int:
        staying = sum(1 for d in self._devices if d.machine == machine_uuid and d.model == model and not d.busy)
        return staying + self._pending_adds.get((machine_uuid, model), 0)

    def _spec_document(self, machine_uuid: str, model: str) -> dict[str, Any]:
        attached = [d for d in self._devices if d.machine == machine_uuid and d.model == model]
        failed = [f for f in self._failed_adds if f.machine_uuid == machine_uuid and f.model == model]
        # Completed devices first: the client takes the first device no ComposableResource holds.
        devices = [self._device_document(d, *self._status_of(d)) for d in attached]
        devices += [self._device_document(f.device, ADD_FAILED, f.reason) for f in failed]
        return {"spec_uuid": self.spec_uuid(machine_uuid, model), "type": RESOURCE_TYPE_GPU,
                "selector": {"version": "1", "expression": {"conditions": [
                    {"column": "model", "operator": "eq", "value": model}]}},
                "min_resspec_count": 0, "max_resspec_count": sum(1 for d in self._devices if d.model == model),
                "device_count": self._target(machine_uuid, model), "devices": devices}

    def _status_of(self, device: Device) -> tuple[str, str]:
        if device.busy:
            return REMOVING, ""
        if device.serial in self._remove_failures:
            return REMOVE_FAILED, self._remove_failures[device.serial]
        return ADD_COMPLETE, ""

    def _device_document(self, device: Device, status: str, reason: str) -> dict[str, Any]:
        from harness.gpu_node_agent import gpu_spec  # the product name the node's driver reports for the model

        return {"device_id": device.serial, "status": status, "status_reason": reason, "detail": {
            "fabric_uuid": self.fabric_uuid, "fabric_id": 1, "res_uuid": device.res_uuid,
            "fabr_gid": f"{self.fabric_uuid}/{device.index}", "res_type": device.res_type, "res_name": device.name,
            "res_status": 0 if device.op_status == OP_STATUS_OK else 1, "res_op_status": device.op_status,
            "resspecs": [{"resspec_uuid": self.spec_uuid(device.machine or "", device.model),
                          "productname": gpu_spec(device.model).product_name, "model": device.model,
                          "vendor": "NVIDIA", "removable": True}],
            "tenant_uuid": self.tenant_uuid, "mach_uuid": device.machine or ""}}

    def _model_of_spec(self, machine_uuid: str, spec_uuid: Any) -> str:
        with self._lock:
            self._machine(machine_uuid)
            specs = {self.spec_uuid(machine_uuid, model): model for model in self._models()}
        if not isinstance(spec_uuid, str) or not spec_uuid:
            raise FabricManagerError(404, CODE_NOT_FOUND,
                                     f"spec_uuid is empty: machine {machine_uuid} has no resource spec for the "
                                     f"requested model (its specs: {_describe(specs)})")
        if spec_uuid not in specs:
            raise FabricManagerError(404, CODE_NOT_FOUND, f"machine {machine_uuid} has no resource spec {spec_uuid} "
                                     f"(its specs: {_describe(specs)})")
        return specs[spec_uuid]

    def clear_failed_adds(self) -> None:
        """What an administrator does on a CM that keeps failed adds: acknowledge them (no API call of the client's)."""
        with self._lock:
            self._failed_adds = []

    def _forget_expired_failures(self) -> None:
        if self.failed_adds_kept:
            return
        now = time.monotonic()
        self._failed_adds = [f for f in self._failed_adds if f.until > now]

    def _check_scope(self, tenant_uuid: str, cluster_uuid: str) -> None:
        if tenant_uuid != self.tenant_uuid:
            raise FabricManagerError(403, "E40301", f"tenant {tenant_uuid!r} is not this cluster manager's tenant")
        if cluster_uuid != self.cluster_uuid:
            raise FabricManagerError(404, CODE_NOT_FOUND, f"cluster {cluster_uuid!r} is not known to this tenant "
                                     f"(the operator's FTI_CDI_CLUSTER_ID must be {self.cluster_uuid})")


def _count(target: Mapping[str, Any]) -> int:
    value = target.get("device_count")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FabricManagerError(400, CODE_BAD_REQUEST, f"device_count must be a non-negative integer, got {value!r}")
    return value


def _describe(specs: Mapping[str, str]) -> str:
    return ", ".join(f"{spec} (model eq {model})" for spec, model in sorted(specs.items())) or "none"


class _ClusterManagerHandler(_FabricManagerHandler):
    cluster_manager: ClusterManagerEmulator

    def _get(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        tenant, cluster, machine, action = self._cm_route(path)
        if action:
            raise FabricManagerError(405, CODE_BAD_REQUEST, f"GET is not allowed on {path}")
        return 200, self.cluster_manager.machine_data(tenant, cluster, machine)

    def _post(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        if not path.startswith(CM_API_PREFIX):
            return super()._post(path, query)  # the identity manager's token endpoint
        tenant, cluster, machine, action = self._cm_route(path)
        if action != "actions/resize":
            raise FabricManagerError(404, CODE_NOT_FOUND, f"no such endpoint {path}")
        self.cluster_manager.resize(tenant, cluster, machine, self._json_body())
        return 202, None

    def _patch(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        raise FabricManagerError(405, CODE_BAD_REQUEST, f"PATCH is not part of the cluster manager's API ({path})")

    def _delete(self, path: str, query: dict[str, str]) -> tuple[int, Optional[dict[str, Any]]]:
        raise FabricManagerError(405, CODE_BAD_REQUEST, f"DELETE is not part of the cluster manager's API ({path})")

    def _cm_route(self, path: str) -> tuple[str, str, str, str]:
        """tenants/<t>/clusters/<c>/machines/<m>[/<action>] -> (t, c, m, action), after the bearer check."""
        if not path.startswith(CM_API_PREFIX):
            raise FabricManagerError(404, CODE_NOT_FOUND, f"no such endpoint {path}")
        self.emulator.check_bearer(self.headers.get("Authorization"))
        parts = path[len(CM_API_PREFIX):].split("/")
        if len(parts) < 5 or parts[1] != "clusters" or parts[3] != "machines" or not all(parts[:5:2]) \
                or not parts[4]:
            raise FabricManagerError(404, CODE_NOT_FOUND, f"no such endpoint {path}")
        return parts[0], parts[2], parts[4], "/".join(parts[5:])

    def _error_document(self, error: FabricManagerError) -> dict[str, Any]:
        return {"status": error.status, "detail": {"code": error.code, "message": error.message}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cluster_manager", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_parse_listen, default=("127.0.0.1", 0), help="HOST:PORT (port 0: free)")
    parser.add_argument("--pool", type=_parse_pool, action="append", default=[], help="MODEL=COUNT, repeatable")
    parser.add_argument("--machine", action="append", default=[], help="register a machine by name, repeatable")
    parser.add_argument("--attach-latency", type=_parse_latency, default=0.0, help="seconds, or MIN-MAX")
    parser.add_argument("--detach-latency", type=_parse_latency, default=0.0, help="seconds, or MIN-MAX")
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER, help="cluster uuid (the operator's FTI_CDI_CLUSTER_ID)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host, port = args.listen
    attach: Latency = args.attach_latency
    manager = ClusterManagerEmulator(dict(args.pool), cluster_uuid=args.cluster, attach_latency_s=attach,
                                     detach_latency_s=args.detach_latency, host=host, port=port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with manager:
        print(json.dumps({"endpoint": manager.endpoint, "ca_cert": str(manager.ca_cert_path),
                          "tenant_uuid": manager.tenant_uuid, "cluster_uuid": manager.cluster_uuid,
                          "machines": {name: manager.register_machine(name) for name in args.machine},
                          "credentials": manager.credentials.secret_data()}, indent=2), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
