"""The operations endpoint: `/metrics` (Prometheus), `/healthz` (liveness) and `/readyz` (readiness).

One small threaded HTTP server on `settings.metrics_listen`, separate from the gRPC port so that probes and scrapes
never compete with cluster-autoscaler's calls.

- `/healthz` answers 200 while the process can answer HTTP at all: a liveness probe that fails means "restart me".
- `/readyz` runs the readiness checks the application registered (`add_ready_check("node-groups", ...)`) and answers
  200 only when every check passes, 503 otherwise, listing each check the way kube-apiserver's `/readyz?verbose` does.
  Checks run on the probe's thread, so they must read state the application already holds (a flag, a timestamp of the
  last successful fabric call), never do network I/O themselves: a slow check would time the probe out.
- `/metrics` serves the prometheus_client default registry (every metric is defined in dds/metrics.py), in the text or
  OpenMetrics format the scraper's Accept header asks for.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional
from urllib.parse import parse_qs, urlsplit

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

# A readiness check: True when ready. False, or an exception (its message becomes the reason), means not ready.
ReadyCheck = Callable[[], bool]
# An extra page: the query string's parameters -> (body, content type).
Page = Callable[[dict[str, list[str]]], tuple[bytes, str]]


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    reason: str = ""

    def line(self) -> str:
        if self.ok:
            return f"[+]{self.name} ok"
        return f"[-]{self.name} failed: {self.reason or 'not ready'}"


def parse_listen(address: str) -> tuple[str, int]:
    """Split "host:port", "[v6]:port" or ":port" (all interfaces) into a bindable (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"metrics_listen {address!r}: expected host:port, e.g. 0.0.0.0:8087 or [::]:8087")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"metrics_listen {address!r}: port {port} is out of range 0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", port


class OpsServer:
    """Serves /metrics, /healthz and /readyz until `stop()`. Thread-safe registration of readiness checks."""

    def __init__(self, listen: str, registry: CollectorRegistry = REGISTRY) -> None:
        self._host, self._requested_port = parse_listen(listen)
        self._registry = registry
        self._checks: dict[str, ReadyCheck] = {}
        self._pages: dict[str, Page] = {}
        self._lock = threading.Lock()
        self._shutting_down = False
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    def add_ready_check(self, name: str, check: ReadyCheck) -> None:
        """Register (or replace) a named readiness check, e.g. "node-groups" or "fabric"."""
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"readiness check name {name!r}: must be a non-empty word without spaces")
        with self._lock:
            self._checks[name] = check

    def add_page(self, path: str, page: "Page") -> None:
        """Serve `page(query) -> (body, content type)` at `path` (e.g. /decisions); like the checks, a page must only
        read state the application already holds."""
        if not path.startswith("/") or path in ("/metrics", "/healthz", "/livez", "/readyz"):
            raise ValueError(f"page path {path!r}: must start with / and not shadow a built-in endpoint")
        with self._lock:
            self._pages[path.rstrip("/")] = page

    def page(self, path: str) -> Optional["Page"]:
        with self._lock:
            return self._pages.get(path)

    def remove_ready_check(self, name: str) -> None:
        with self._lock:
            self._checks.pop(name, None)

    def begin_shutdown(self) -> None:
        """Fail /readyz from now on (while /healthz still passes), so endpoints drop this pod before it stops."""
        self._shutting_down = True

    def readiness(self) -> list[CheckResult]:
        with self._lock:
            checks = list(self._checks.items())
        results = [_run_check(name, check) for name, check in sorted(checks)]
        if self._shutting_down:
            results.append(CheckResult("shutdown", False, "the process is shutting down"))
        return results

    def start(self) -> int:
        """Bind and serve in a daemon thread; returns the bound port (useful with port 0)."""
        if self._server is not None:
            raise RuntimeError("the operations server is already running")
        server = ThreadingHTTPServer((self._host, self._requested_port), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        # A short poll interval bounds how long stop() waits for the serving loop to notice the shutdown.
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="dds-ops-http", daemon=True)
        self._thread.start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self._host, self.port)
        return self.port

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the operations server is not running")
        return int(self._server.server_address[1])

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def metrics_payload(self, accept_header: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept_header)
        return encoder(self._registry), content_type


def _run_check(name: str, check: ReadyCheck) -> CheckResult:
    try:
        ok = bool(check())
    except Exception as error:  # a broken check must mark the process unready, not kill the probe handler
        return CheckResult(name, False, f"{type(error).__name__}: {error}")
    return CheckResult(name, ok)


def _handler_for(ops: OpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "dds-ops"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = urlsplit(self.path).path.rstrip("/") or "/"
            if path == "/metrics":
                body, content_type = ops.metrics_payload(self.headers.get("Accept", ""))
                self._reply(HTTPStatus.OK, body, content_type)
            elif path == "/healthz" or path == "/livez":
                self._reply(HTTPStatus.OK, b"ok\n")
            elif path == "/readyz":
                self._reply_readiness()
            elif (page := ops.page(path)) is not None:
                body, content_type = page(parse_qs(urlsplit(self.path).query))
                self._reply(HTTPStatus.OK, body, content_type)
            else:
                self._reply(HTTPStatus.NOT_FOUND, b"not found: try /metrics, /healthz or /readyz\n")

        def _reply_readiness(self) -> None:
            results = ops.readiness()
            ready = all(r.ok for r in results)
            lines = [r.line() for r in results]
            lines.append("readyz check passed" if ready else "readyz check failed")
            status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
            self._reply(status, ("\n".join(lines) + "\n").encode())

        def _reply(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (signature of the base class)
            # Probes and scrapes arrive every few seconds: keep them out of the INFO log.
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
