"""Who may call: only a client whose certificate names one of the identities in `grpc_allowed_clients`.

Mutual TLS alone proves that the CA of `tls_ca` signed the caller's certificate, not who the caller is: any workload
holding any certificate of that CA could scale the cluster. The gate compares the names the certificate carries — its
subject CommonName, its SAN DNS names and its SAN URIs (a SPIFFE ID, for instance) — with the configured identities,
and answers every other caller PERMISSION_DENIED naming what it saw and the setting that would let it in.

It runs first, before the leader gate, so an unknown caller learns nothing, not even who the leader is.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

log = logging.getLogger(__name__)

SETTING = "grpc_allowed_clients"
_KNOWN_CERTIFICATES = 64  # allowed client certificates remembered (a few per CA replica and rotation)


@dataclass(frozen=True)
class CallerIdentity:
    """The names a client certificate carries, as the gate compares them."""

    common_names: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return self.common_names + self.dns_names + self.uris

    def describe(self) -> str:
        parts = [f"CN={n}" for n in self.common_names] + [f"DNS:{n}" for n in self.dns_names]
        parts += [f"URI:{n}" for n in self.uris]
        return ", ".join(parts) or "no subject CommonName and no SAN DNS name or URI"


def identity_of(pem_certificate: bytes) -> CallerIdentity:
    """The CommonName(s), SAN DNS names and SAN URIs of a PEM certificate."""
    certificate = x509.load_pem_x509_certificate(pem_certificate)
    common_names = tuple(str(a.value) for a in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME))
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return CallerIdentity(common_names=common_names)
    return CallerIdentity(common_names=common_names,
                          dns_names=tuple(sans.get_values_for_type(x509.DNSName)),
                          uris=tuple(sans.get_values_for_type(x509.UniformResourceIdentifier)))


class CallerGate(grpc.ServerInterceptor):
    """PERMISSION_DENIED for a caller whose certificate names none of `allowed`; every method, health included."""

    def __init__(self, allowed: Sequence[str]) -> None:
        if not allowed:
            raise ValueError(f"{SETTING} is empty: no client could call DDS; list the identity of cluster-autoscaler's "
                             "client certificate (its CommonName, a SAN DNS name or a SAN URI)")
        self._allowed = frozenset(allowed)
        self._refused_seen: set[CallerIdentity] = set()
        self._lock = threading.Lock()
        # The verdict per certificate: CA sends the same one on every call of a connection (thousands a scan), and
        # parsing it was most of what a call cost. Only allowed ones are kept, and at most _KNOWN_CERTIFICATES of them.
        self._allowed_certificates: dict[bytes, CallerIdentity] = {}

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
        identity = self._identity(pem)
        if identity is not None and self._allowed.intersection(identity.names):
            self._remember(pem, identity)  # type: ignore[arg-type]  # an identity comes only from a certificate
            return
        seen = identity.describe() if identity is not None else "no client certificate"
        self._log_refusal(identity, context.peer(), seen)
        context.abort(grpc.StatusCode.PERMISSION_DENIED,
                      f"caller not allowed: its certificate names {seen}; DDS accepts only "
                      f"{', '.join(sorted(self._allowed))} (add one of the caller's names to the DDS setting "
                      f"{SETTING} to let it call)")

    def _remember(self, pem: bytes, identity: CallerIdentity) -> None:
        with self._lock:
            if len(self._allowed_certificates) >= _KNOWN_CERTIFICATES:
                self._allowed_certificates.clear()  # rotations piled up: start over rather than grow
            self._allowed_certificates[pem] = identity

    @staticmethod
    def _identity(pem: Optional[bytes]) -> Optional[CallerIdentity]:
        if pem is None:
            return None
        try:
            return identity_of(pem)
        except ValueError:  # BoringSSL verified it, so this is not expected; refuse rather than guess
            return None

    def _log_refusal(self, identity: Optional[CallerIdentity], peer: str, seen: str) -> None:
        # Once per identity: a misconfigured client retries every few seconds and must not flood the log.
        key = identity or CallerIdentity()
        with self._lock:
            if key in self._refused_seen:
                return
            self._refused_seen.add(key)
        log.warning("refused a gRPC caller from %s: its certificate names %s, none of %s", peer, seen, SETTING)


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
