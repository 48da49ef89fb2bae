"""A TCP port in front of several DDS replicas that forwards each new connection to a Ready one: what a Kubernetes
Service does for the Ready pods of the DDS Deployment, played on this machine where there is no kube-proxy.

cluster-autoscaler's cloud-config names one address. In a cluster that address is the DDS Service, and the Service routes
only to pods whose readiness probe passes and which carry the leader's label (dds/kube/leader_label.py). This forwarder
gives the e2e tests the same shape: CA dials the forwarder, the forwarder picks the first replica whose `ready` check
(readiness and, as the caller defines it, the label) passes *when the connection is opened*, and then copies bytes both ways (TLS stays end to end: CA verifies DDS's certificate,
DDS verifies CA's).

As with a Service:
- no Ready replica: the connection is closed at once (kube-proxy rejects connections to a Service without endpoints); the
  client retries with its own backoff;
- an open connection is not moved when readiness changes; it ends when either side closes it (a killed replica's
  connections break, and CA's gRPC channel reconnects through the forwarder to the new leader).

Every routed or refused connection is recorded in `routes` (time, backend name or None) for tests and logs.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

log = logging.getLogger(__name__)

_BUFFER = 64 * 1024
_CONNECT_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Backend:
    name: str
    host: str
    port: int
    ready: Callable[[], bool]  # asked for every new connection (a readiness probe at connection time)


@dataclass(frozen=True)
class Route:
    at: float  # time.monotonic()
    backend: Optional[str]  # None: refused, no backend was ready


class ReadyForwarder:
    """Listens on `host:port` (0: a free port); `backends()` is asked for the current replicas on every connection."""

    def __init__(self, backends: Callable[[], Sequence[Backend]], host: str = "127.0.0.1", port: int = 0) -> None:
        self._backends = backends
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(0.2)
        self.host, self.port = self._listener.getsockname()[:2]
        self.routes: list[Route] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "ReadyForwarder":
        thread = threading.Thread(target=self._accept_loop, name="ready-forwarder", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)

    def __enter__(self) -> "ReadyForwarder":
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def routed_to(self, name: str) -> int:
        """How many connections went to backend `name`."""
        with self._lock:
            return sum(1 for r in self.routes if r.backend == name)

    # --- internals ---
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                downstream, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed by stop()
            self._route(downstream)

    def _route(self, downstream: socket.socket) -> None:
        upstream, name = self._connect_ready()
        with self._lock:
            self.routes.append(Route(time.monotonic(), name))
        if upstream is None:
            log.info("forwarder: no ready backend, refusing a connection")
            _close(downstream)
            return
        log.info("forwarder: connection routed to %s", name)
        with self._lock:
            self._open.update((downstream, upstream))
            thread = threading.Thread(target=self._pump, args=(downstream, upstream), name=f"forward-{name}",
                                      daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _connect_ready(self) -> tuple[Optional[socket.socket], Optional[str]]:
        for backend in self._backends():
            try:
                if not backend.ready():
                    continue
                return socket.create_connection((backend.host, backend.port), _CONNECT_TIMEOUT_SECONDS), backend.name
            except OSError as exc:  # ready a moment ago, gone now: try the next one
                log.info("forwarder: %s is not reachable: %s", backend.name, exc)
        return None, None

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        """Copy bytes both ways until either side closes; then close both (the peer sees the connection end)."""
        peer = {a: b, b: a}
        with selectors.DefaultSelector() as selector:
            for sock in (a, b):
                sock.setblocking(True)
                selector.register(sock, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    for key, _ in selector.select(timeout=0.5):
                        data = key.fileobj.recv(_BUFFER)  # type: ignore[union-attr]
                        if not data:
                            return
                        peer[key.fileobj].sendall(data)  # type: ignore[index]
            except OSError:
                return  # reset by either side (a SIGKILLed replica)
            finally:
                with self._lock:
                    self._open.difference_update((a, b))
                _close(a)
                _close(b)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
