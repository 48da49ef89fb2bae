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

Who may read: `/metrics` and the pages (`/decisions`) tell how the cluster is used, so they are served either on a
loopback address only, plainly (the default: tests, benchmarks, `kubectl port-forward`), or with `metrics_secure`
over TLS to callers whose bearer token the apiserver authenticates and authorizes for `get` on the path
(dds/kube/authn.py). A non-loopback address without `metrics_secure` is refused at start (`check_metrics_settings`).
The probes (`/healthz`, `/livez`, `/readyz`) stay open either way: the kubelet sends no token.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional, Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from dds.config import Settings
from dds.kube.authn import Access, ReviewUnavailable

log = logging.getLogger(__name__)

# The endpoints the kubelet probes: never behind authentication (it sends no token).
PROBE_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
# A client that connects and sends nothing must not hold a serving thread for ever.
REQUEST_TIMEOUT_SECONDS = 30.0

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


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost); 0.0.0.0 is every interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name: it may resolve to any interface
        return False


class MetricsSettingsError(ValueError):
    """The operations endpoint's settings would expose /metrics and /decisions unprotected, or are incomplete."""


def check_metrics_settings(settings: Settings) -> None:
    """Refuse a configuration that would serve /metrics and /decisions to anyone on the network."""
    host, _ = parse_listen(settings.metrics_listen)
    if not settings.metrics_secure and not is_loopback(host):
        raise MetricsSettingsError(
            f"metrics_listen {settings.metrics_listen!r} is not a loopback address and metrics_secure is false: "
            f"/metrics and /decisions would be open to anyone who can reach it. Set metrics_secure: true (TLS, "
            f"callers authorized by the apiserver) or listen on 127.0.0.1 (docs/operations.md \"Who may scrape\")")
    if settings.metrics_secure:
        metrics_serving_pair(settings)


def metrics_serving_pair(settings: Settings) -> tuple[Path, Path]:
    """The certificate and key of metrics_secure: metrics_tls_cert/metrics_tls_key, else the gRPC server's pair."""
    if (settings.metrics_tls_cert is None) != (settings.metrics_tls_key is None):
        raise MetricsSettingsError("metrics_tls_cert and metrics_tls_key go together: set both, or neither to serve "
                                   "with the gRPC server's tls_cert and tls_key")
    if settings.metrics_tls_cert is not None and settings.metrics_tls_key is not None:
        return settings.metrics_tls_cert, settings.metrics_tls_key
    if settings.tls_cert is None or settings.tls_key is None:
        raise MetricsSettingsError("metrics_secure needs a serving certificate: set metrics_tls_cert and "
                                   "metrics_tls_key, or tls_cert and tls_key (the gRPC server's, used by default)")
    return settings.tls_cert, settings.tls_key


class ServingCertificate:
    """A TLS server context for a certificate and key on disk, reloaded when the files change (a renewed Secret is
    swapped in under the mount without restarting DDS; connections already open keep the pair they began with)."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._cert, self._key = Path(cert), Path(key)
        self._lock = threading.Lock()
        self._loaded: Optional[tuple[Any, ...]] = None
        self.context = self._load()

    def _stamp(self) -> tuple[Any, ...]:
        stats = [os.stat(path) for path in (self._cert, self._key)]  # follows the Secret volume's symbolic links
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def _load(self) -> ssl.SSLContext:
        try:
            stamp = self._stamp()
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(self._cert, self._key)
        except (OSError, ssl.SSLError) as error:
            raise MetricsSettingsError(f"metrics serving certificate {self._cert} / key {self._key}: {error}"
                                       ) from error
        self._loaded = stamp
        return context

    def refresh(self) -> None:
        """Load the pair again if either file changed; a pair that does not load yet (half written) keeps the old."""
        with self._lock:
            try:
                if self._stamp() == self._loaded:
                    return
                self.context = self._load()
            except (OSError, MetricsSettingsError) as error:
                log.warning("keeping the current metrics serving certificate: %s", error)
                return
        log.info("reloaded the metrics serving certificate %s", self._cert)


class RequestAuthorizer(Protocol):
    def check(self, token: Optional[str], verb: str, path: str, source: str = "") -> Access:
        """200, 401, 403 or 429 (too many reviews from `source`, the caller's address) for the bearer of `token`;
        raises ReviewUnavailable when it cannot tell."""


def build_ops_server(settings: Settings, authorizer: Callable[[], RequestAuthorizer]) -> "OpsServer":
    """The server `settings` describe; `authorizer()` is called only with metrics_secure."""
    check_metrics_settings(settings)
    if not settings.metrics_secure:
        return OpsServer(settings.metrics_listen)
    cert, key = metrics_serving_pair(settings)
    return OpsServer(settings.metrics_listen, tls=ServingCertificate(cert, key), authorizer=authorizer())


class OpsServer:
    """Serves /metrics, /healthz and /readyz until `stop()`. Thread-safe registration of readiness checks.

    With `tls` and `authorizer`, every path but the probes needs a bearer token the authorizer allows."""

    def __init__(self, listen: str, registry: CollectorRegistry = REGISTRY, *, tls: Optional[ServingCertificate] = None,
                 authorizer: Optional[RequestAuthorizer] = None) -> None:
        if authorizer is not None and tls is None:
            raise MetricsSettingsError("an authenticated operations endpoint needs TLS: bearer tokens must not cross "
                                       "the network in the clear")
        self._host, self._requested_port = parse_listen(listen)
        self._registry = registry
        self.tls = tls
        self.authorizer = authorizer
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
        server_class = ThreadingHTTPServer if self.tls is None else _tls_server_class(self.tls)
        server = server_class((self._host, self._requested_port), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        # A short poll interval bounds how long stop() waits for the serving loop to notice the shutdown.
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="dds-ops-http", daemon=True)
        self._thread.start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d (%s)", self._host, self.port,
                 "plain HTTP, no authentication" if self.tls is None else
                 "TLS, callers authorized by the apiserver" if self.authorizer is not None else "TLS")
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


def _tls_server_class(tls: ServingCertificate) -> type[ThreadingHTTPServer]:
    class TlsServer(ThreadingHTTPServer):
        def get_request(self) -> tuple[socket.socket, Any]:
            connection, address = self.socket.accept()
            tls.refresh()
            # The handshake happens on the request's own thread (finish_request), so a slow or silent client cannot
            # stall the accept loop.
            wrapped = tls.context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
            return wrapped, address

        def finish_request(self, request: Any, client_address: Any) -> None:
            try:
                request.settimeout(REQUEST_TIMEOUT_SECONDS)
                request.do_handshake()
            except (ssl.SSLError, OSError) as error:  # plain HTTP on the TLS port, a scanner, a dropped connection
                log.debug("TLS handshake with %s failed: %s", client_address, error)
                return
            super().finish_request(request, client_address)

    return TlsServer


def _bearer_token(authorization: Optional[str]) -> Optional[str]:
    scheme, _, token = (authorization or "").strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def _handler_for(ops: OpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "dds-ops"
        timeout = REQUEST_TIMEOUT_SECONDS

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = urlsplit(self.path).path.rstrip("/") or "/"
            if path not in PROBE_PATHS and not self._authorized(path):
                return
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

        def _authorized(self, path: str) -> bool:
            """True when no authorizer is set or it allows the caller; otherwise the refusal has been sent."""
            if ops.authorizer is None:
                return True
            try:
                access = ops.authorizer.check(_bearer_token(self.headers.get("Authorization")), "get", path,
                                              source=self.client_address[0])
            except ReviewUnavailable as error:
                log.warning("cannot authorize a request for %s from %s: %s", path, self.address_string(), error)
                self._reply(HTTPStatus.SERVICE_UNAVAILABLE, f"cannot check the caller's token: {error}\n".encode())
                return False
            if access.allowed:
                return True
            log.debug("refused %s to %s (%s): %s", path, access.user or "an unauthenticated caller",
                      self.address_string(), access.reason)
            headers = {"WWW-Authenticate": 'Bearer realm="dds"'} if access.status == HTTPStatus.UNAUTHORIZED else {}
            self._reply(HTTPStatus(access.status), f"{access.reason}\n".encode(), headers=headers)
            return False

        def _reply_readiness(self) -> None:
            results = ops.readiness()
            ready = all(r.ok for r in results)
            lines = [r.line() for r in results]
            lines.append("readyz check passed" if ready else "readyz check failed")
            status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
            self._reply(status, ("\n".join(lines) + "\n").encode())

        def _reply(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8",
                   headers: Optional[dict[str, str]] = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
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
