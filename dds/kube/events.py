"""Kubernetes Events for DDS's decisions: what `kubectl describe pod|node|machineset` shows.

`KubeEventRecorder` implements dds/model/events.py's EventRecorder with core/v1 Events (the API `kubectl describe`
lists and prints as "(xN over T)"), reporting controller `dds.cdi.dev/dds` and the pod name as reporting instance.

- Non-blocking: `emit` only puts the event on a bounded queue; one worker thread writes to the apiserver. A decision
  never waits on the API, and the worker waits for CA's calls under way (`pause`) before each write. When the queue
  is full (apiserver slow or down, or an event storm) the event is dropped and counted in
  `dds_events_dropped_total{reason="queue_full"}`: Events are best-effort by design in Kubernetes too.
- Never raises into the caller: API failures are logged and counted (`reason="api_error"`).
- Aggregated like client-go's recorder: the same object + type + reason + message seen again within 10 minutes of its
  last occurrence increments `count` and `lastTimestamp` of the existing Event (a PATCH) instead of creating a new one.
  The cache is in memory and bounded (least recently used entries are forgotten), as in client-go.
- An Event for a cluster-scoped object (Node, ComposabilityRequest) goes to namespace `default`, where the apiserver
  expects it; a namespaced object's Event goes to the object's namespace.
"""

from __future__ import annotations

import datetime
import logging
import queue
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Union

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dds.kube import raw
from dds.metrics import EVENTS_DROPPED
from dds.model.events import ObjectRef

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "dds.cdi.dev/dds"
SOURCE_COMPONENT = "dds"
AGGREGATION_WINDOW_SECONDS = 600.0
# The events.k8s.io API caps `note` at 1 KiB; keep core/v1 messages within the same bound so both views agree.
MAX_MESSAGE_LENGTH = 1024
_MAX_NAME_LENGTH = 253
_CLUSTER_SCOPED_EVENT_NAMESPACE = "default"

Clock = Callable[[], float]


class EventGone(Exception):
    """The Event to update no longer exists (expired by the apiserver's event TTL, or deleted)."""


class EventSink(Protocol):
    def create(self, namespace: str, body: dict) -> None: ...

    def patch(self, namespace: str, name: str, body: dict) -> None:
        """Merge-patch an Event; raises EventGone when it does not exist."""
        ...


class KubeEventSink:
    """core/v1 Events through the API. A new Event is POSTed as it is (dds/kube/raw.py: a burst of them costs the
    interpreter a quarter of what the typed call does); a repeat is a PATCH through the client."""

    def __init__(self, api_client: client.ApiClient, request_timeout: float = 10.0) -> None:
        self._client = api_client
        self._api = client.CoreV1Api(api_client)
        self._timeout = request_timeout

    def create(self, namespace: str, body: dict) -> None:
        try:
            response = raw.send(self._client, "POST", f"/api/v1/namespaces/{namespace}/events", body=body,
                                read_timeout=self._timeout)
            status, reason, data = response.status, response.reason, response.data
        except ApiException as error:  # kubernetes < 35 raises for an error status
            body = error.body or b""
            status, reason, data = error.status, error.reason, body if isinstance(body, bytes) else body.encode()
        if status >= 300:
            raise ApiException(status=status, reason=f"{reason}: {data.decode(errors='replace')[:300]}")

    def patch(self, namespace: str, name: str, body: dict) -> None:
        try:
            self._api.patch_namespaced_event(name, namespace, body, _request_timeout=self._timeout,
                                             _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                raise EventGone(f"Event {namespace}/{name}") from None
            raise


@dataclass(frozen=True, slots=True)
class _Key:
    involved: ObjectRef
    event_type: str
    reason: str
    message: str


@dataclass(slots=True)
class _Written:
    namespace: str
    name: str
    count: int
    last_seen: float


@dataclass(frozen=True, slots=True)
class _Pending:
    key: _Key
    at: float  # when it was emitted (the Event's timestamp), not when the worker writes it


@dataclass(frozen=True, slots=True)
class _FlushMarker:
    done: threading.Event


_STOP = object()
_QueueItem = Union[_Pending, _FlushMarker, object]


class KubeEventRecorder:
    """EventRecorder writing core/v1 Events from a background thread (see the module docstring)."""

    def __init__(self, sink: EventSink, reporting_instance: Optional[str] = None, clock: Clock = time.time,
                 queue_size: int = 1000, cache_size: int = 4096,
                 aggregation_window: float = AGGREGATION_WINDOW_SECONDS) -> None:
        if queue_size < 1 or cache_size < 1:
            raise ValueError("KubeEventRecorder: queue_size and cache_size must be at least 1")
        self._sink = sink
        # Called before each write: the app makes it wait while one of cluster-autoscaler's calls is under way, so
        # the Events of a burst are written between the calls, not inside their deadlines (dds/controller/
        # calls_first.py).
        self.pause: Callable[[], object] = lambda: None
        # In a pod the hostname is the pod name, which is what reportingInstance should say.
        self._instance = reporting_instance or socket.gethostname()
        self._clock = clock
        self._window = aggregation_window
        self._cache_size = cache_size
        self._written: OrderedDict[_Key, _Written] = OrderedDict()
        self._queue: queue.Queue[_QueueItem] = queue.Queue(maxsize=queue_size)
        self._closed = False
        self._last_nanos = 0
        self._worker = threading.Thread(target=self._work, name="dds-event-recorder", daemon=True)
        self._worker.start()

    @classmethod
    def for_cluster(cls, api_client: client.ApiClient, reporting_instance: Optional[str] = None,
                    clock: Clock = time.time, **options: float) -> "KubeEventRecorder":
        return cls(KubeEventSink(api_client), reporting_instance, clock, **options)

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        if self._closed:
            return
        pending = _Pending(_Key(involved, event_type, reason, _truncate(message)), self._clock())
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            EVENTS_DROPPED.labels("queue_full").inc()
            log.debug("event queue full, dropped %s %s", involved.describe(), reason)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything emitted so far is written (or failed); False on timeout."""
        marker = _FlushMarker(threading.Event())
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to `timeout`), then stop the worker; later emits are ignored."""
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            log.warning("event recorder closed with a full queue: queued events are dropped")
            return
        self._worker.join(timeout)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, _FlushMarker):
                item.done.set()
            elif isinstance(item, _Pending):
                self.pause()
                self._write_safely(item)

    def _write_safely(self, pending: _Pending) -> None:
        try:
            self._write(pending)
        except Exception as error:  # the recorder must survive any API or encoding failure
            EVENTS_DROPPED.labels("api_error").inc()
            key = pending.key
            log.warning("could not write Event %s %s on %s: %s", key.event_type, key.reason, key.involved.describe(),
                        _short(error))

    def _write(self, pending: _Pending) -> None:
        key = pending.key
        previous = self._written.get(key)
        if previous is not None and pending.at - previous.last_seen <= self._window:
            try:
                self._sink.patch(previous.namespace, previous.name, _repeat_patch(previous.count + 1, pending.at))
            except EventGone:
                previous = None
            else:
                previous.count += 1
                previous.last_seen = pending.at
                self._written.move_to_end(key)
                return
        namespace = key.involved.namespace or _CLUSTER_SCOPED_EVENT_NAMESPACE
        name = self._unique_name(key.involved.name, pending.at)
        self._sink.create(namespace, self._new_event(namespace, name, pending))
        self._remember(key, _Written(namespace, name, count=1, last_seen=pending.at))

    def _unique_name(self, object_name: str, at: float) -> str:
        # client-go's scheme: <object>.<unix nanoseconds in hex>. Strictly increasing here, so two Events this
        # recorder writes in the same clock tick (a coarse or fake clock) never collide on the name.
        self._last_nanos = max(int(at * 1e9), self._last_nanos + 1)
        suffix = f".{self._last_nanos:x}"
        return object_name[: _MAX_NAME_LENGTH - len(suffix)] + suffix

    def _remember(self, key: _Key, written: _Written) -> None:
        self._written[key] = written
        self._written.move_to_end(key)
        while len(self._written) > self._cache_size:
            self._written.popitem(last=False)

    def _new_event(self, namespace: str, name: str, pending: _Pending) -> dict:
        key, involved = pending.key, pending.key.involved
        reference = {"kind": involved.kind, "name": involved.name, "apiVersion": involved.api_version}
        if involved.namespace:
            reference["namespace"] = involved.namespace
        if involved.uid:
            reference["uid"] = involved.uid
        timestamp = _time(pending.at)
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": reference,
            "type": key.event_type,
            "reason": key.reason,
            "message": key.message,
            "count": 1,
            "firstTimestamp": timestamp,
            "lastTimestamp": timestamp,
            "source": {"component": SOURCE_COMPONENT},
            "reportingComponent": REPORTING_CONTROLLER,
            "reportingInstance": self._instance,
        }


def _repeat_patch(count: int, at: float) -> dict:
    return {"count": count, "lastTimestamp": _time(at)}


def _time(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _truncate(message: str) -> str:
    if len(message) <= MAX_MESSAGE_LENGTH:
        return message
    return message[: MAX_MESSAGE_LENGTH - 3] + "..."


def _short(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"API error {error.status} {error.reason}: {(error.body or '')[:300]}"
    return f"{type(error).__name__}: {error}"
