"""Mutual-TLS material for the DDS gRPC endpoint and its one client, cluster-autoscaler.

`generate_bundle` makes a private CA, a server pair for DDS (SANs as given) and a client pair for cluster-autoscaler;
`write_bundle` writes them with a ready `cloud-config.yaml` and the two Kubernetes Secrets the manifests mount.

Why these choices:
- cluster-autoscaler verifies the server against the *host of the cloud-config address* (Go's crypto/tls ignores the
  CommonName), so every name or IP it may dial must be a SAN; an IP needs an IP SAN, not a DNS SAN.
- ECDSA P-256 keys: accepted by Go's crypto/tls and by gRPC's BoringSSL, small and fast to generate.
- The CA may sign leaf certificates only (path length 0) and each leaf carries one extended key usage, so a stolen client
  key cannot pose as the server or the other way round.
- The client's identity, CN and SAN DNS `cluster-autoscaler` (CLIENT_COMMON_NAME), is what DDS's `grpc_allowed_clients`
  lets in by default (dds/provider/callers.py): being signed by this CA is not enough to call DDS.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_COMMON_NAME = "dds"
CLIENT_COMMON_NAME = "cluster-autoscaler"
DEFAULT_GRPC_PORT = 8086
DEFAULT_GRPC_TIMEOUT = "10s"
# A clock skew allowance: a certificate made now is valid a little in the past too.
_BACKDATE = datetime.timedelta(minutes=5)

# File names in the output directory, also the keys of the Secrets.
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "server.crt"
SERVER_KEY = "server.key"
CLIENT_CERT = "client.crt"
CLIENT_KEY = "client.key"
CLOUD_CONFIG = "cloud-config.yaml"
SECRETS = "secrets.yaml"


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True, slots=True)
class CertBundle:
    ca: KeyPair
    server: KeyPair
    client: KeyPair


@dataclass(frozen=True, slots=True)
class CloudConfigOptions:
    """What goes into cluster-autoscaler's cloud-config and where CA will find the files."""

    address: str  # host:port that CA dials; the host must be one of the server SANs
    files_dir: str  # the directory the client files are mounted at in CA's container (or the local output dir)
    grpc_timeout: str = DEFAULT_GRPC_TIMEOUT  # a Go duration (metav1.Duration), e.g. "10s"


@dataclass(frozen=True, slots=True)
class SecretNames:
    dds_namespace: str = "dds-system"
    dds_secret: str = "dds-tls"
    autoscaler_namespace: str = "dds-system"
    autoscaler_secret: str = "cluster-autoscaler-cloud-config"


def generate_bundle(dns_names: Sequence[str], ip_addresses: Sequence[str], days: int,
                    now: datetime.datetime | None = None) -> CertBundle:
    """A CA plus server and client pairs, valid for `days` from `now` (UTC)."""
    if not dns_names and not ip_addresses:
        raise ValueError("certs: give at least one --dns or --ip for the server certificate")
    if days < 1:
        raise ValueError(f"certs: --days must be at least 1, got {days}")
    ips = [_parse_ip(value) for value in ip_addresses]
    start = (now or datetime.datetime.now(datetime.timezone.utc)) - _BACKDATE
    end = start + _BACKDATE + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dds-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), start, end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    server = _leaf(SERVER_COMMON_NAME, sans, ExtendedKeyUsageOID.SERVER_AUTH, ca_cert, ca_key, start, end)
    client = _leaf(CLIENT_COMMON_NAME, [x509.DNSName(CLIENT_COMMON_NAME)], ExtendedKeyUsageOID.CLIENT_AUTH,
                   ca_cert, ca_key, start, end)
    return CertBundle(ca=KeyPair(_cert_pem(ca_cert), _key_pem(ca_key)), server=server, client=client)


def cloud_config(options: CloudConfigOptions) -> dict[str, str]:
    """cluster-autoscaler's externalgrpc cloud-config: mutual TLS is on because `cert` is set."""
    files = options.files_dir.rstrip("/")
    return {
        "address": options.address,
        "cert": f"{files}/{CLIENT_CERT}",
        "key": f"{files}/{CLIENT_KEY}",
        "cacert": f"{files}/{CA_CERT}",
        "grpc_timeout": options.grpc_timeout,
    }


def kubernetes_secrets(bundle: CertBundle, options: CloudConfigOptions, names: SecretNames) -> list[dict]:
    """Two Secrets: the server pair for DDS, the client pair + cloud-config for cluster-autoscaler."""
    dds_data = {"tls.crt": bundle.server.cert_pem, "tls.key": bundle.server.key_pem, "ca.crt": bundle.ca.cert_pem}
    ca_data = {
        CLOUD_CONFIG: yaml.safe_dump(cloud_config(options), sort_keys=False).encode(),
        CLIENT_CERT: bundle.client.cert_pem,
        CLIENT_KEY: bundle.client.key_pem,
        CA_CERT: bundle.ca.cert_pem,
    }
    return [
        _secret(names.dds_secret, names.dds_namespace, "kubernetes.io/tls", dds_data),
        _secret(names.autoscaler_secret, names.autoscaler_namespace, "Opaque", ca_data),
    ]


def write_bundle(out_dir: Path, bundle: CertBundle, options: CloudConfigOptions,
                 names: SecretNames = SecretNames()) -> list[Path]:
    """Write every file (keys and anything holding a key 0600, certificates 0644); returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    secrets_yaml = yaml.safe_dump_all(kubernetes_secrets(bundle, options, names), sort_keys=False).encode()
    files = [
        (CA_CERT, bundle.ca.cert_pem, 0o644),
        (CA_KEY, bundle.ca.key_pem, 0o600),
        (SERVER_CERT, bundle.server.cert_pem, 0o644),
        (SERVER_KEY, bundle.server.key_pem, 0o600),
        (CLIENT_CERT, bundle.client.cert_pem, 0o644),
        (CLIENT_KEY, bundle.client.key_pem, 0o600),
        (CLOUD_CONFIG, yaml.safe_dump(cloud_config(options), sort_keys=False).encode(), 0o644),
        (SECRETS, secrets_yaml, 0o600),
    ]
    written = []
    for name, content, mode in files:
        path = out_dir / name
        _write_private(path, content, mode)
        written.append(path)
    return written


def _write_private(path: Path, content: bytes, mode: int) -> None:
    # Create with the final mode so a key is never readable by others, not even between write and chmod.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.chmod(path, mode)  # an existing file keeps its old mode through O_CREAT: set it explicitly


def _leaf(common_name: str, sans: list[x509.GeneralName], usage: x509.ObjectIdentifier, ca_cert: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey, start: datetime.datetime, end: datetime.datetime) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), start, end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             start: datetime.datetime, end: datetime.datetime) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign,
                         encipher_only=False, decipher_only=False)


def _parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"certs: --ip {value!r} is not an IP address (use --dns for host names)") from None


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8: what Go's tls.X509KeyPair and gRPC both read.
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _secret(name: str, namespace: str, secret_type: str, data: dict[str, bytes]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "dds"}},
        "type": secret_type,
        # stringData keeps the YAML readable PEM; the apiserver stores it as data.
        "stringData": {key: value.decode() for key, value in data.items()},
    }
