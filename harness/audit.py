"""The test control plane's audit log: which requests DDS's and cluster-autoscaler's ServiceAccounts sent, and which of
them the apiserver refused.

harness/controlplane.py starts kube-apiserver with `POLICY`: Metadata level (who, verb, object; no bodies) for users
in `system:serviceaccounts` only, without the RequestReceived stage, so the log stays small — the test's own admin
client, kwok and kube-scheduler are not ServiceAccounts and are not logged. Each control plane registers its log here
(`register`) when it is built; harness/pytest_plugin.py reads every registered log after each test, fails the test on
a 403 answered to DDS or CA (`forbidden`), and gathers the (verb, resource, subresource, apiGroup) DDS used for the
suite's RBAC comparison (tests/integration/ops/test_rbac_audit.py).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    # One event per request at its end (ResponseComplete; a watch also logs ResponseStarted), none at receipt.
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}

FORBIDDEN = 403
_ADMISSION_DENIAL = "denied the request"  # `admission webhook "<name>" denied the request: <its reason>`


@dataclass(frozen=True)
class Grant:
    """What an RBAC rule decides on for one resource request: the key of the suite's comparison."""

    verb: str
    resource: str
    subresource: str
    api_group: str

    def describe(self) -> str:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {self.api_group or 'core'}/{resource}"


@dataclass(frozen=True)
class AuditedRequest:
    """One audit event of a resource request (non-resource URLs such as discovery carry no objectRef and are left
    out: RBAC grants them to every authenticated user)."""

    user: str
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    uri: str
    received: float = 0.0  # when the apiserver received it (epoch seconds)
    # A 403 from an admission webhook's denial (the CDI operator's refuses a request clashing with another's), not
    # from RBAC: the roles are not in question.
    denied_by_admission: bool = False

    @property
    def grant(self) -> Grant:
        return Grant(self.verb, self.resource, self.subresource, self.api_group)

    def describe(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        name = f" {self.name}" if self.name else ""
        return (f"{self.user}: {self.verb} {self.grant.describe().split(' ', 1)[1]}{name}{where} -> {self.code} "
                f"({self.uri})")


def write_policy(path: Path) -> Path:
    path.write_text(yaml.safe_dump(POLICY, sort_keys=False))
    return path


def _request(event: dict[str, Any]) -> AuditedRequest | None:
    ref = event.get("objectRef")
    if not ref or not ref.get("resource"):
        return None
    return AuditedRequest(
        user=(event.get("user") or {}).get("username", ""), verb=event.get("verb", ""),
        api_group=ref.get("apiGroup", ""), resource=ref["resource"], subresource=ref.get("subresource", ""),
        namespace=ref.get("namespace", ""), name=ref.get("name", ""),
        code=int((event.get("responseStatus") or {}).get("code", 0)), uri=event.get("requestURI", ""),
        received=_epoch(event.get("requestReceivedTimestamp")),
        denied_by_admission=_ADMISSION_DENIAL in str((event.get("responseStatus") or {}).get("message", "")))


def _epoch(stamp: Any) -> float:
    if not stamp:
        return 0.0
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def read_requests(path: Path, offset: int = 0) -> tuple[list[AuditedRequest], int]:
    """The resource requests logged in `path` from byte `offset` on, and the offset to read from next time. A line the
    apiserver is still writing (no newline yet) is left for the next read."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return [], offset
    complete = data[:data.rfind(b"\n") + 1]
    requests = []
    for line in complete.splitlines():
        if not line.strip():
            continue
        request = _request(json.loads(line))
        if request is not None:
            requests.append(request)
    return requests, offset + len(complete)


def forbidden(requests: Iterable[AuditedRequest], users: Iterable[str],
              restarts: Iterable[tuple[float, float]] = ()) -> list[AuditedRequest]:
    """The requests of `users` the apiserver answered 403 (each once, in log order), except those received while it
    was restarting (`restarts`: (began, ready) windows; `restarted`): it denies everything until its RBAC informers
    have synced."""
    wanted = set(users)
    windows = list(restarts)

    def restarting(request: AuditedRequest) -> bool:
        return any(began <= request.received <= ready + RESTART_MARGIN_S for began, ready in windows)

    return list(dict.fromkeys(r for r in requests if r.user in wanted and r.code == FORBIDDEN
                              and not r.denied_by_admission and not restarting(r)))


def grants_used(requests: Iterable[AuditedRequest], user: str) -> set[Grant]:
    """What `user` asked for and was allowed (a refused request is reported by `forbidden`, not counted as a use)."""
    return {r.grant for r in requests if r.user == user and r.code != FORBIDDEN}


# --- the logs of the control planes started in this process ---

_LOGS: list[Path] = []
_RESTARTS: list[tuple[float, float]] = []
_LOGS_LOCK = threading.Lock()
RESTART_MARGIN_S = 5.0  # after /readyz, for requests already queued when it turned ready


def register(path: Path) -> None:
    """Called by each ControlPlane for its audit log, so checks after a test find planes the test started itself."""
    with _LOGS_LOCK:
        if path not in _LOGS:
            _LOGS.append(path)


def registered() -> list[Path]:
    with _LOGS_LOCK:
        return list(_LOGS)


def restarted(path: Path, began: float, ready: float) -> None:
    """The apiserver writing `path` was restarted between `began` and `ready` (epoch seconds). The window excuses 403s
    in every log, not only `path`'s: restarts are rare and tests run one at a time, so nothing else is refused then."""
    with _LOGS_LOCK:
        _RESTARTS.append((began, ready))


def restarts() -> list[tuple[float, float]]:
    with _LOGS_LOCK:
        return list(_RESTARTS)


class AuditCursor:
    """Reads each registered log from where the previous `read` stopped (a log registered since starts at 0): one
    cursor per test session, read after each test, gives each test the requests sent since the previous test."""

    def __init__(self, logs: Callable[[], list[Path]] = registered) -> None:
        self._logs = logs
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[AuditedRequest]:
        return [request for _, requests in self.read_per_log() for request in requests]

    def read_per_log(self) -> list[tuple[Path, list[AuditedRequest]]]:
        """As `read`, each log's requests apart (which control plane, so which RBAC, answered them)."""
        out: list[tuple[Path, list[AuditedRequest]]] = []
        for path in self._logs():
            requests, self._offsets[path] = read_requests(path, self._offsets.get(path, 0))
            out.append((path, requests))
        return out
