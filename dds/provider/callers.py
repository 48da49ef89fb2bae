"""Who may call: only a client whose certificate names one of the identities in `grpc_allowed_clients`.

Mutual TLS alone proves that the CA of `tls_ca` signed the caller's certificate, not who the caller is: any workload
holding any certificate of that CA could scale the cluster. The gate compares the names the certificate's Subject
Alternative Names carry — SAN DNS names and SAN URIs (a SPIFFE ID, for instance) — with the configured identities,
and answers every other caller PERMISSION_DENIED naming what it saw and the setting that would let it in. The subject
CommonName is never an identity (RFC 6125 deprecates it; a CN beside SANs was a second, unchecked name), and the
certificate must carry the clientAuth extended key usage: a server certificate, or one made for no purpose, is not a
client's.

Refusals cost little and say little at a flood: a certificate refused `DENIAL_BURST` times in a row is then refused at
once (not parsed again, its names not echoed) except for one full check per `DENIAL_INTERVAL_SECONDS`, and the log names
each refused identity at most once per `DENIAL_LOG_INTERVAL_SECONDS`, with how many refusals it left out. The count is
per certificate, so an allowed client sharing an address with a refused one is not slowed down.

It runs first, before the leader gate, so an unknown caller learns nothing, not even who the leader is.

The gate also sees what expires on the client's side: cluster-autoscaler reads its client certificate once at start,
and DDS never reads CA's files. `ClientCertificates` keeps, per allowed identity, the newest certificate it presented
(a renewal has the later notAfter) and publishes the soonest of those as
`dds_certificate_expiry_seconds{certificate="client"}`: a CA still presenting a certificate its Secret has renewed
long ago shows there, and DDSCertificateExpiresSoon fires before the handshakes start failing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import grpc
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dds.metrics import CERTIFICATE_EXPIRY

log = logging.getLogger(__name__)

SETTING = "grpc_allowed_clients"
_KNOWN_CERTIFICATES = 64  # allowed client certificates remembered (a few per CA replica and rotation)
DENIAL_BURST = 20  # refusals of one certificate given the full check before it is slowed down
DENIAL_INTERVAL_SECONDS = 1.0  # then at most one full check per this long; the others are refused at once
DENIAL_LOG_INTERVAL_SECONDS = 60.0  # one log line per refused identity per this long
_TRACKED_CALLERS = 1024  # certificates (and identities) whose refusals are counted; more start the count over


@dataclass(frozen=True)
class CallerIdentity:
    """The names a client certificate carries, as the gate compares them."""

    common_names: tuple[str, ...] = ()  # shown in refusals, never compared
    dns_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    client_auth: bool = True  # the certificate's extended key usage includes clientAuth
    not_after: float = float("nan")  # the certificate's notAfter, Unix seconds

    @property
    def names(self) -> tuple[str, ...]:
        """The names that can be an allowed identity: the SANs only."""
        return self.dns_names + self.uris

    def describe(self) -> str:
        parts = [f"CN={n}" for n in self.common_names] + [f"DNS:{n}" for n in self.dns_names]
        parts += [f"URI:{n}" for n in self.uris]
        return ", ".join(parts) or "no subject CommonName and no SAN DNS name or URI"


def identity_of(pem_certificate: bytes) -> CallerIdentity:
    """The CommonName(s), SAN DNS names and SAN URIs of a PEM certificate, and whether it is made for clients."""
    certificate = x509.load_pem_x509_certificate(pem_certificate)
    common_names = tuple(str(a.value) for a in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME))
    client_auth = has_usage(certificate, ExtendedKeyUsageOID.CLIENT_AUTH)
    not_after = certificate.not_valid_after_utc.timestamp()
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return CallerIdentity(common_names=common_names, client_auth=client_auth, not_after=not_after)
    return CallerIdentity(common_names=common_names,
                          dns_names=tuple(sans.get_values_for_type(x509.DNSName)),
                          uris=tuple(sans.get_values_for_type(x509.UniformResourceIdentifier)),
                          client_auth=client_auth, not_after=not_after)


def has_usage(certificate: x509.Certificate, usage: x509.ObjectIdentifier) -> bool:
    """Whether the certificate's extended key usage names `usage`. No EKU at all is no: DDS asks for the purpose to
    be stated (a certificate for any purpose is what a leaked server or code-signing key would also be)."""
    try:
        return usage in certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False


class ClientCertificates:
    """The newest certificate each allowed identity presented, and the soonest notAfter among them as
    `dds_certificate_expiry_seconds{certificate="client"}` (no series before the first allowed call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._newest: dict[tuple[str, ...], float] = {}  # identity (its SANs) -> latest notAfter presented

    def presented(self, identity: CallerIdentity) -> None:
        with self._lock:
            if identity.names not in self._newest and len(self._newest) >= _KNOWN_CERTIFICATES:
                self._newest.clear()  # identities piled up (each replica its own SANs?): start over rather than grow
            if identity.not_after > self._newest.get(identity.names, float("-inf")):
                self._newest[identity.names] = identity.not_after
            soonest = min(self._newest.values())
        CERTIFICATE_EXPIRY.labels("client").set(soonest)


class CallerGate(grpc.ServerInterceptor):
    """PERMISSION_DENIED for a caller whose certificate names none of `allowed`; every method, health included."""

    def __init__(self, allowed: Sequence[str], clock: Callable[[], float] = time.monotonic) -> None:
        if not allowed:
            raise ValueError(f"{SETTING} is empty: no client could call DDS; list the identity of cluster-autoscaler's "
                             "client certificate (its CommonName, a SAN DNS name or a SAN URI)")
        self._allowed = frozenset(allowed)
        self._clock = clock
        self._lock = threading.Lock()
        self._denials: dict[bytes, tuple[int, float]] = {}  # certificate -> (refusals in a row, last full check)
        self._logged: dict[CallerIdentity, tuple[float, int]] = {}  # identity -> (last logged, refusals left out)
        # The verdict per certificate: CA sends the same one on every call of a connection (thousands a scan), and
        # parsing it was most of what a call cost. Only allowed ones are kept, and at most _KNOWN_CERTIFICATES of them.
        self._allowed_certificates: dict[bytes, CallerIdentity] = {}
        self._presented = ClientCertificates()  # parsed once per certificate, as the verdicts are

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED itself
            return None
        return _guarded(handler, self._check)

    def _check(self, context: grpc.ServicerContext) -> None:
        """Abort the call unless the peer's certificate names an allowed identity."""
        pem = next(iter(context.auth_context().get("x509_pem_cert", ())), None)
        if pem is not None and pem in self._allowed_certificates:
            return
        caller = pem if pem is not None else context.peer().encode()  # no certificate: by address
        if self._slowed_down(caller):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"caller not allowed: refused {DENIAL_BURST} times in a row; refused at once for now")
        identity = self._identity(pem)
        if identity is not None and identity.client_auth and self._allowed.intersection(identity.names):
            self._remember(pem, identity)  # type: ignore[arg-type]  # an identity comes only from a certificate
            return
        self._count_denial(caller)
        seen = identity.describe() if identity is not None else "no client certificate"
        if identity is not None and not identity.client_auth:
            reason = (f"its certificate ({seen}) does not carry the clientAuth extended key usage; DDS accepts only "
                      f"client certificates")
        else:
            reason = (f"its certificate names {seen}; DDS accepts only SAN DNS names or URIs "
                      f"{', '.join(sorted(self._allowed))} (add one of the caller's SANs to the DDS setting "
                      f"{SETTING} to let it call; a subject CommonName is not an identity)")
        self._log_refusal(identity, context.peer(), reason)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, f"caller not allowed: {reason}")

    def _slowed_down(self, caller: bytes) -> bool:
        """True when `caller` was refused DENIAL_BURST times in a row and had its full check less than
        DENIAL_INTERVAL_SECONDS ago: refused again without reading its certificate."""
        now = self._clock()
        with self._lock:
            count, last = self._denials.get(caller, (0, float("-inf")))
            return count >= DENIAL_BURST and now - last < DENIAL_INTERVAL_SECONDS

    def _count_denial(self, caller: bytes) -> None:
        with self._lock:
            if caller not in self._denials and len(self._denials) >= _TRACKED_CALLERS:
                self._denials.clear()  # many callers refused: start counting over rather than grow
            count, _ = self._denials.get(caller, (0, 0.0))
            self._denials[caller] = (count + 1, self._clock())

    def _remember(self, pem: bytes, identity: CallerIdentity) -> None:
        with self._lock:
            if len(self._allowed_certificates) >= _KNOWN_CERTIFICATES:
                self._allowed_certificates.clear()  # rotations piled up: start over rather than grow
            self._allowed_certificates[pem] = identity
        self._presented.presented(identity)

    @staticmethod
    def _identity(pem: Optional[bytes]) -> Optional[CallerIdentity]:
        if pem is None:
            return None
        try:
            return identity_of(pem)
        except ValueError:  # BoringSSL verified it, so this is not expected; refuse rather than guess
            return None

    def _log_refusal(self, identity: Optional[CallerIdentity], peer: str, reason: str) -> None:
        # At most once per identity per DENIAL_LOG_INTERVAL_SECONDS: a misconfigured or hostile client retrying must
        # not flood the log; the line says how many refusals it stands for.
        key = identity or CallerIdentity()
        now = self._clock()
        with self._lock:
            last, left_out = self._logged.get(key, (float("-inf"), 0))
            if now - last < DENIAL_LOG_INTERVAL_SECONDS:
                self._logged[key] = (last, left_out + 1)
                return
            if key not in self._logged and len(self._logged) >= _TRACKED_CALLERS:
                self._logged.clear()
            self._logged[key] = (now, 0)
        more = f" ({left_out} more refusals of it since the last line)" if left_out else ""
        log.warning("refused a gRPC caller from %s: %s%s", peer, reason, more)


def _guarded(handler: grpc.RpcMethodHandler, check: Callable[[grpc.ServicerContext], None]) -> grpc.RpcMethodHandler:
    """The same handler, with `check(context)` run before the method (it aborts the call to refuse it)."""
    serializers = {"request_deserializer": handler.request_deserializer,
                   "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_before(check, handler.unary_unary), **serializers)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_before(check, handler.unary_stream), **serializers)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_before(check, handler.stream_unary), **serializers)
    return grpc.stream_stream_rpc_method_handler(_before(check, handler.stream_stream), **serializers)


def _before(check: Callable[[grpc.ServicerContext], None], method: Callable[[Any, grpc.ServicerContext], Any]
            ) -> Callable[[Any, grpc.ServicerContext], Any]:
    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        check(context)
        return method(request, context)

    return guarded
