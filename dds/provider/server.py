"""The gRPC server cluster-autoscaler connects to: the CloudProvider servicer, the standard health service, and
mutual TLS (plaintext only when asked for with `insecure`) whose files are re-read when they change, with only the
client identities of `grpc_allowed_clients` let in (dds/provider/callers.py).

`build_server` takes already-built parts (registry, deciders), so the no-cluster mode (`dds serve --node-groups`)
and the cluster mode (fabric, planner, controller loop) share it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dds.config import Settings
from dds.metrics import CERTIFICATE_EXPIRY
from dds.scaling.requests import ScaleDownDecider, ScaleUpDecider
from dds.provider.gen.externalgrpc import externalgrpc_pb2
from dds.provider.callers import CallerGate, has_usage
from dds.provider.registry import Registry
from dds.provider.servicer import CloudProviderServicer, add_to_server

log = logging.getLogger(__name__)

SERVICE_NAME = externalgrpc_pb2.DESCRIPTOR.services_by_name["CloudProvider"].full_name
# Calls in progress when a connection reaches grpc_max_connection_age_seconds get this much longer (CA's calls have
# a 10 s grpc_timeout by default).
GRPC_MAX_CONNECTION_AGE_GRACE_SECONDS = 30.0


class ServerConfigError(ValueError):
    """Settings that cannot make a server (missing TLS files, bad listen address); the message names the setting."""


def _read(setting: str, path: Optional[Path]) -> bytes:
    if path is None:
        raise ServerConfigError(f"{setting} is not set: mutual TLS needs tls_cert, tls_key and tls_ca "
                                "(or pass --insecure for plaintext)")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ServerConfigError(f"{setting} {path}: cannot read: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class TlsMaterial:
    """The three PEM files of mutual TLS, read and checked together (a rotation writes them one after the other)."""

    cert: bytes
    key: bytes
    client_ca: bytes


def check_tls_material(settings: Settings) -> None:
    """Fail fast, before DDS touches a cluster: mutual TLS unless `insecure`, with files that hold what they claim
    (gRPC would only fail at bind time, with a message that names none of them). Messages name paths, never content."""
    if settings.insecure:
        return
    load_tls_material(settings)


def load_tls_material(settings: Settings) -> TlsMaterial:
    """Read tls_cert, tls_key and tls_ca and check that they hold what they claim: a certificate, its own unencrypted
    key, and CA certificates. Raises `ServerConfigError` naming the setting and path."""
    cert, key, client_ca = (_read(name, path) for name, path in (
        ("tls_cert", settings.tls_cert), ("tls_key", settings.tls_key), ("tls_ca", settings.tls_ca)))
    try:
        certificate = x509.load_pem_x509_certificate(cert)
    except ValueError:
        raise ServerConfigError(f"tls_cert {settings.tls_cert}: not a PEM certificate") from None
    try:
        private_key = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ServerConfigError(f"tls_key {settings.tls_key}: not an unencrypted PEM private key") from None
    if _spki(private_key.public_key()) != _spki(certificate.public_key()):
        raise ServerConfigError(f"tls_key {settings.tls_key} is not the key of tls_cert {settings.tls_cert}")
    if not has_usage(certificate, ExtendedKeyUsageOID.SERVER_AUTH):
        raise ServerConfigError(f"tls_cert {settings.tls_cert} does not carry the serverAuth extended key usage: "
                                f"issue DDS a server certificate (dds certs, or cert-manager usages: server auth)")
    try:
        x509.load_pem_x509_certificates(client_ca)
    except ValueError:
        raise ServerConfigError(f"tls_ca {settings.tls_ca}: not PEM certificates") from None
    return TlsMaterial(cert=cert, key=key, client_ca=client_ca)


def _spki(public_key: object) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER,  # type: ignore[attr-defined]
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def server_credentials(settings: Settings) -> grpc.ServerCredentials:
    """Mutual TLS: our certificate and key, and the CA that client certificates must be signed by (required). The
    files are re-read when they change (`CertificateReloader`), so a rotated Secret needs no restart."""
    reloader = CertificateReloader(settings)
    return grpc.dynamic_ssl_server_credentials(reloader.initial, reloader, require_client_authentication=True)


def _certificate_configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(material.key, material.cert)],
                                                     root_certificates=material.client_ca)


# What tells a changed file apart: a Secret update swaps the volume's `..data` symlink to a new directory, so the
# resolved file is a new inode; an edit in place changes its mtime or size.
_FileStamp = tuple[int, int, int, int]


class CertificateReloader:
    """gRPC's certificate configuration fetcher: called before every new TLS handshake, it returns new certificates
    when tls_cert, tls_key or tls_ca changed on disk, else None (keep the current ones). Connections already open keep
    the session they made, so cluster-autoscaler's channel is not broken by a rotation; its next connection gets the
    new certificate — at the latest when the open one reaches grpc_max_connection_age_seconds and is closed.

    A half-written rotation (a new certificate beside the old key) does not load: the previous certificates stay in
    use, the problem is logged once, and the next handshake looks again."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._paths = [Path(p) for p in (settings.tls_cert, settings.tls_key, settings.tls_ca) if p is not None]
        self._lock = threading.Lock()
        self._loaded = self._stamps()
        self._refused: Optional[tuple[_FileStamp, ...]] = None
        self.initial = _certificate_configuration(load_tls_material(settings))

    def __call__(self) -> Optional[grpc.ServerCertificateConfiguration]:
        try:
            stamps = self._stamps()
        except OSError:
            stamps = None  # a file missing for a moment during the swap: keep serving, look again next time
        with self._lock:
            if stamps is None or stamps == self._loaded or stamps == self._refused:
                return None
            try:
                material = load_tls_material(self._settings)
            except ServerConfigError as exc:
                self._refused = stamps
                log.error("TLS files changed but do not load (%s); still serving the certificates loaded before", exc)
                return None
            self._loaded, self._refused = stamps, None
        subject = x509.load_pem_x509_certificate(material.cert).subject.rfc4514_string()
        log.info("TLS files changed: new connections get the certificate of %s from %s", subject,
                 self._settings.tls_cert)
        return _certificate_configuration(material)

    def _stamps(self) -> tuple[_FileStamp, ...]:
        return tuple(_stamp(path.stat()) for path in self._paths)


def _stamp(stat: os.stat_result) -> _FileStamp:
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size


@dataclass
class ProviderServer:
    server: grpc.Server
    health: health.HealthServicer
    address: str
    port: int = 0
    _stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> int:
        self.server.start()
        for service in ("", SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("CloudProvider gRPC server listening on %s", self.address)
        return self.port

    def set_serving(self, serving: bool) -> None:
        """Health as probes and CA's channel see it (e.g. NOT_SERVING while this replica is a standby)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            self.health.set(service, status)

    def stop(self, grace_seconds: float = 5.0) -> None:
        """Report NOT_SERVING, let calls in progress finish for up to `grace_seconds`, then stop."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_seconds).wait()
        log.info("CloudProvider gRPC server stopped")

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self.server.wait_for_termination(timeout)


def build_server(settings: Settings, registry: Registry, scale_up: ScaleUpDecider, scale_down: ScaleDownDecider,
                 *, max_workers: int = 16, new_request_key: Optional[Callable[[], str]] = None,
                 interceptors: Sequence[grpc.ServerInterceptor] = ()) -> ProviderServer:
    """A server bound to `settings.listen` (port 0 = any free port; see `.port`), not yet started."""
    from concurrent import futures

    servicer = CloudProviderServicer(registry, scale_up, scale_down, settings.gpu_label, new_request_key)
    # Who the caller is comes first: an unknown caller is refused before any other interceptor answers it.
    gates = () if settings.insecure else (CallerGate(settings.grpc_allowed_clients),)
    # A maximum connection age: a connection's client was checked at its handshake only, so a rotation of tls_ca
    # reaches an open connection when it is closed and the client handshakes again.
    options = [("grpc.so_reuseport", 0),
               ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_seconds * 1000)),
               ("grpc.max_connection_age_grace_ms", int(GRPC_MAX_CONNECTION_AGE_GRACE_SECONDS * 1000))]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dds-grpc"),
                         options=options, interceptors=(*gates, *interceptors))
    add_to_server(servicer, server)  # lenient request decoding: a bad payload is INVALID_ARGUMENT, not INTERNAL
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    if ":" not in settings.listen:
        raise ServerConfigError(f"listen {settings.listen!r} is not host:port")
    if settings.insecure:
        log.warning("serving gRPC WITHOUT TLS on %s (--insecure): anyone who can reach it can scale the cluster",
                    settings.listen)
        port = _bind(settings.listen, lambda: server.add_insecure_port(settings.listen))
    else:
        credentials = server_credentials(settings)
        port = _bind(settings.listen, lambda: server.add_secure_port(settings.listen, credentials))
        publish_certificate_expiry(settings)
    host = settings.listen.rsplit(":", 1)[0]
    return ProviderServer(server=server, health=health_servicer, address=f"{host}:{port}", port=port)


def certificate_expiry(path: Path) -> float:
    """The soonest notAfter (Unix seconds) of the PEM certificates in `path` (a CA bundle may hold several); NaN, logged,
    when the file cannot be read or holds none (a Secret being swapped in: the next scrape reads it again)."""
    try:
        certificates = x509.load_pem_x509_certificates(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        log.warning("dds_certificate_expiry_seconds: cannot read the certificates of %s: %s", path, exc)
        return float("nan")
    return min(c.not_valid_after_utc.timestamp() for c in certificates)


def publish_certificate_expiry(settings: Settings) -> None:
    """dds_certificate_expiry_seconds for the server certificate and the client CA, read from their files at each
    scrape (the files are re-read on change for serving too, so the metric follows a renewal without a restart)."""
    for name, path in (("server", settings.tls_cert), ("client_ca", settings.tls_ca)):
        if path is not None:
            CERTIFICATE_EXPIRY.labels(name).set_function(lambda path=path: certificate_expiry(path))


def _bind(listen: str, add_port: Callable[[], int]) -> int:
    try:
        port = add_port()
    except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
        raise ServerConfigError(f"listen {listen}: cannot bind: {exc}") from exc
    if port == 0:
        raise ServerConfigError(f"listen {listen}: cannot bind (address in use or not local?)")
    return port
