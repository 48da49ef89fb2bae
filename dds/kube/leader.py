"""Leader election on a `coordination.k8s.io/v1` Lease, with the semantics of client-go's leaderelection.

Only the leader acts (attaches, detaches, scales MachineSets) and answers cluster-autoscaler; see docs/operations.md
"Leader election" for what a standby answers and why.

Rules, as client-go applies them:
- A candidate takes the lease when it is free (no holder: released on a graceful stop) or expired. "Expired" is
  judged on this replica's own clock: the lease is expired when the record has not *changed* for its
  leaseDurationSeconds since this replica first saw it that way. The holder's renewTime is not compared with the local
  clock, so clock skew between nodes cannot make two leaders.
- Every write carries the resourceVersion read just before (optimistic concurrency): when two candidates race, the
  apiserver accepts one and answers 409 Conflict to the other.
- The leader renews every retry period. If no renewal has succeeded for renew_deadline it steps down (callback), which
  happens before anyone else may take the lease (renew_deadline < lease_duration, and each API call is bounded so that
  the step-down never lands after the lease could expire elsewhere). Seeing another holder steps down at once.
- `stop()` releases the lease (empty holder), so a standby takes over on its next retry instead of waiting for expiry.
"""

from __future__ import annotations

import datetime
import logging
import math
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Optional, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dds.config import Settings
from dds.metrics import IS_LEADER, LEADER_TRANSITIONS

log = logging.getLogger(__name__)

Clock = Callable[[], float]
# client-go waits retry_period * (1 + random * 1.2) between acquire attempts, so candidates do not retry in lockstep.
_ACQUIRE_JITTER = 1.2


class LeaseConflict(Exception):
    """Someone else wrote (or created) the lease since we read it."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str  # "" = free
    lease_duration_seconds: int
    acquire_time: Optional[datetime.datetime]
    renew_time: Optional[datetime.datetime]
    transitions: int
    resource_version: str = ""  # what the next write must match; "" for a lease not created yet

    def content(self) -> tuple[object, ...]:
        """What identifies a change of the record (client-go compares the whole record it observed)."""
        return (self.holder, self.lease_duration_seconds, self.acquire_time, self.renew_time, self.transitions,
                self.resource_version)


class LeaseStore(Protocol):
    def get(self) -> Optional[LeaseRecord]: ...

    def create(self, record: LeaseRecord) -> LeaseRecord: ...

    def update(self, record: LeaseRecord) -> LeaseRecord:
        """Write `record` if the stored resourceVersion still equals record.resource_version, else LeaseConflict."""
        ...


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    lease_duration: float
    renew_deadline: float
    retry_period: float

    @classmethod
    def from_settings(cls, settings: Settings) -> "ElectionTiming":
        timing = cls(settings.lease_duration_seconds, settings.renew_deadline_seconds, settings.retry_period_seconds)
        timing.validate()
        return timing

    def validate(self) -> None:
        if not self.renew_deadline < self.lease_duration:
            raise ValueError(f"renew_deadline_seconds ({self.renew_deadline}) must be less than "
                             f"lease_duration_seconds ({self.lease_duration}), or two replicas could lead at once")
        if not self.retry_period < self.renew_deadline:
            raise ValueError(f"retry_period_seconds ({self.retry_period}) must be less than "
                             f"renew_deadline_seconds ({self.renew_deadline}), or a leader never retries a renewal")

    @property
    def lease_duration_whole_seconds(self) -> int:
        return max(1, math.ceil(self.lease_duration))  # Lease.spec.leaseDurationSeconds is an integer

    @property
    def request_timeout(self) -> float:
        # Bounded so that a renewal hanging at the renew deadline still ends (and steps down) before the lease expires.
        return max(0.1, min(self.retry_period, (self.lease_duration - self.renew_deadline) / 2))


class KubeLeaseStore:
    """The Lease `namespace/name` through the API (coordination.k8s.io/v1)."""

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str, request_timeout: float) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self._namespace = namespace
        self._name = name
        self._timeout = request_timeout

    def get(self) -> Optional[LeaseRecord]:
        try:
            lease = self._api.read_namespaced_lease(self._name, self._namespace, _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        spec = lease.spec
        return LeaseRecord(holder=spec.holder_identity or "", lease_duration_seconds=spec.lease_duration_seconds or 0,
                           acquire_time=spec.acquire_time, renew_time=spec.renew_time,
                           transitions=spec.lease_transitions or 0, resource_version=lease.metadata.resource_version)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        try:
            created = self._api.create_namespaced_lease(self._namespace, self._body(record),
                                                        _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 409:
                raise LeaseConflict(f"Lease {self._namespace}/{self._name} was created by someone else") from None
            raise
        return replace(record, resource_version=created.metadata.resource_version)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        try:
            updated = self._api.replace_namespaced_lease(self._name, self._namespace, self._body(record),
                                                         _request_timeout=self._timeout)
        except ApiException as error:
            if error.status in (404, 409):
                raise LeaseConflict(f"Lease {self._namespace}/{self._name} changed since it was read") from None
            raise
        return replace(record, resource_version=updated.metadata.resource_version)

    def _body(self, record: LeaseRecord) -> dict:
        metadata: dict = {"name": self._name, "namespace": self._namespace}
        if record.resource_version:
            metadata["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": record.lease_duration_seconds,
                "acquireTime": _micro_time(record.acquire_time),
                "renewTime": _micro_time(record.renew_time),
                "leaseTransitions": record.transitions,
            },
        }


def default_identity() -> str:
    """The pod name (hostname) plus a random suffix: a restarted container is a new candidate, like client-go's."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    """Campaigns for the lease and keeps it; `is_leader` is what the rest of DDS asks before acting.

    Callbacks run on the election thread and must return quickly (start or signal work, do not do it there).
    """

    def __init__(self, api_client: Optional[client.ApiClient], settings: Settings,
                 on_started_leading: Callable[[], None], on_stopped_leading: Callable[[], None],
                 clock: Clock = time.time, store: Optional[LeaseStore] = None) -> None:
        self.timing = ElectionTiming.from_settings(settings)
        self.identity = settings.identity or default_identity()
        self.lease_name = f"{settings.namespace}/{settings.lease_name}"
        if store is None:
            if api_client is None:
                raise ValueError("LeaderElector: pass an api_client or a store")
            store = KubeLeaseStore(api_client, settings.namespace, settings.lease_name, self.timing.request_timeout)
        self._store = store
        self._clock = clock
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._leading = False
        self._last_renew = 0.0
        self._observed: Optional[LeaseRecord] = None
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        IS_LEADER.set(0)

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def observed_leader(self) -> str:
        """The holder this replica last saw ("" when none): for logs and for the answer a standby gives."""
        return self._observed.holder if self._observed is not None else ""

    # One election step. The thread loop calls it; tests call it directly with a fake clock.
    def step(self) -> None:
        now = self._clock()
        renewed = self._try_acquire_or_renew(now)
        if renewed:
            self._last_renew = now
            if not self._leading:
                self._start_leading()
        elif self._leading:
            holder = self.observed_leader
            if holder and holder != self.identity:
                self._stop_leading(f"the lease is now held by {holder}")
            elif now - self._last_renew >= self.timing.renew_deadline:
                self._stop_leading(f"no successful renewal for {now - self._last_renew:.1f}s "
                                   f"(renew deadline {self.timing.renew_deadline}s)")

    def next_wait(self) -> float:
        """Seconds until the next step: the retry period (jittered for candidates), never past the renew deadline."""
        if not self._leading:
            return self.timing.retry_period * (1 + random.random() * _ACQUIRE_JITTER)
        until_deadline = self._last_renew + self.timing.renew_deadline - self._clock()
        return max(0.0, min(self.timing.retry_period, until_deadline))

    def run(self) -> None:
        """Campaign until `stop()`; then release the lease if held."""
        log.info("leader election for Lease %s as %s", self.lease_name, self.identity)
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.next_wait())
        self.release()

    def run_in_thread(self) -> threading.Thread:
        if self._thread is not None:
            raise RuntimeError("the leader elector is already running")
        self._thread = threading.Thread(target=self.run, name="dds-leader-election", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop campaigning and release the lease (immediate handover); waits for the election thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        else:
            self.release()

    def release(self) -> None:
        """Give the lease up if we hold it: empty holder, so the next candidate does not wait for expiry."""
        if not self._leading:
            return
        now = self._clock()
        record = self._observed
        if record is not None and record.holder == self.identity:
            released = replace(record, holder="", lease_duration_seconds=1, acquire_time=_utc(now),
                               renew_time=_utc(now))
            try:
                self._observe(self._store.update(released), now)
            except (LeaseConflict, ApiException, OSError) as error:
                log.warning("could not release Lease %s (standbys wait for it to expire): %s", self.lease_name, error)
        self._stop_leading("released on shutdown")

    def _try_acquire_or_renew(self, now: float) -> bool:
        try:
            current = self._store.get()
            if current is None:
                self._observe(self._store.create(self._claim(None, now)), now)
                return True
            self._observe(current, now)
            if current.holder and current.holder != self.identity and not self._expired(current, now):
                return False
            self._observe(self._store.update(self._claim(current, now)), now)
            return True
        except LeaseConflict as conflict:
            log.debug("lease %s: %s", self.lease_name, conflict)
            return False
        except (ApiException, OSError) as error:
            # urllib3's timeouts and connection errors are OSErrors: the apiserver is unreachable, try again later.
            log.warning("lease %s: %s", self.lease_name, _short(error))
            return False

    def _claim(self, current: Optional[LeaseRecord], now: float) -> LeaseRecord:
        duration = self.timing.lease_duration_whole_seconds
        if current is None:
            return LeaseRecord(self.identity, duration, _utc(now), _utc(now), transitions=0)
        if current.holder == self.identity:
            return replace(current, lease_duration_seconds=duration, renew_time=_utc(now))
        return replace(current, holder=self.identity, lease_duration_seconds=duration, acquire_time=_utc(now),
                       renew_time=_utc(now), transitions=current.transitions + 1)

    def _observe(self, record: LeaseRecord, now: float) -> None:
        if self._observed is None or self._observed.content() != record.content():
            self._observed = record
            self._observed_at = now

    def _expired(self, record: LeaseRecord, now: float) -> bool:
        return self._observed_at + record.lease_duration_seconds <= now

    def _start_leading(self) -> None:
        self._leading = True
        IS_LEADER.set(1)
        LEADER_TRANSITIONS.labels("started").inc()
        log.info("%s became the leader (Lease %s)", self.identity, self.lease_name)
        _call(self._on_started, "on_started_leading")

    def _stop_leading(self, reason: str) -> None:
        if not self._leading:
            return
        self._leading = False
        IS_LEADER.set(0)
        LEADER_TRANSITIONS.labels("stopped").inc()
        log.warning("%s stopped leading (Lease %s): %s", self.identity, self.lease_name, reason)
        _call(self._on_stopped, "on_stopped_leading")


def _call(callback: Callable[[], None], name: str) -> None:
    try:
        callback()
    except Exception:  # a failing callback must not end the election loop (and with it the lease renewals)
        log.exception("leader election callback %s failed", name)


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)


def _micro_time(value: Optional[datetime.datetime]) -> Optional[str]:
    # metav1.MicroTime wants exactly six fractional digits; datetime.isoformat() drops them when they are zero.
    if value is None:
        return None
    return value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _short(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"API error {error.status} {error.reason}"
    return f"{type(error).__name__}: {error}"
