"""Mutual-TLS material for the DDS gRPC endpoint and its one client, cluster-autoscaler.

`generate_bundle` makes two private CAs — one signs DDS's server pair (SANs as given), the other cluster-autoscaler's
client pair — and `write_bundle` writes them with a ready `cloud-config.yaml` and the two Kubernetes Secrets the
manifests mount. `ca.crt` is the server CA (what cluster-autoscaler, Prometheus and curl trust; key `ca.crt` of both
Secrets, as cert-manager names the CA of `tls.crt`); `client-ca.crt` the client CA (DDS's `tls_ca`, key `client-ca.crt`
of Secret `dds-tls`).

Why these choices:
- cluster-autoscaler verifies the server against the *host of the cloud-config address* (Go's crypto/tls ignores the
  CommonName), so every name or IP it may dial must be a SAN; an IP needs an IP SAN, not a DNS SAN.
- ECDSA P-256 keys: accepted by Go's crypto/tls and by gRPC's BoringSSL, small and fast to generate.
- Two CAs, each may sign leaf certificates only (path length 0), and each leaf carries one extended key usage: a stolen
  server key cannot pose as a client (DDS trusts only the client CA for callers) nor a client key as the server.
- `write_bundle` never replaces an existing CA unless asked (`force`): a new CA silently breaks every certificate the
  old one signed. It never follows a symlink in the output folder (a link planted there would redirect a private key).
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
CA_CERT = "ca.crt"  # the server CA
CA_KEY = "ca.key"
CLIENT_CA_CERT = "client-ca.crt"
CLIENT_CA_KEY = "client-ca.key"
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
    ca: KeyPair  # the server CA: signs `server`, trusted by DDS's clients
    client_ca: KeyPair  # signs `client`, trusted by DDS for callers (tls_ca)
    server: KeyPair
    client: KeyPair


class ExistingCa(ValueError):
    """The output folder already holds a CA (or a link where DDS would write): replacing it needs `force`."""


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
    """A server CA and a client CA, and the server and client pairs they sign, valid for `days` from `now` (UTC)."""
    if not dns_names and not ip_addresses:
        raise ValueError("certs: give at least one --dns or --ip for the server certificate")
    if days < 1:
        raise ValueError(f"certs: --days must be at least 1, got {days}")
    ips = [_parse_ip(value) for value in ip_addresses]
    start = (now or datetime.datetime.now(datetime.timezone.utc)) - _BACKDATE
    end = start + _BACKDATE + datetime.timedelta(days=days)

    ca_cert, ca_key = _ca("dds-server-ca", start, end)
    client_ca_cert, client_ca_key = _ca("dds-client-ca", start, end)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    server = _leaf(SERVER_COMMON_NAME, sans, ExtendedKeyUsageOID.SERVER_AUTH, ca_cert, ca_key, start, end)
    client = _leaf(CLIENT_COMMON_NAME, [x509.DNSName(CLIENT_COMMON_NAME)], ExtendedKeyUsageOID.CLIENT_AUTH,
                   client_ca_cert, client_ca_key, start, end)
    return CertBundle(ca=KeyPair(_cert_pem(ca_cert), _key_pem(ca_key)),
                      client_ca=KeyPair(_cert_pem(client_ca_cert), _key_pem(client_ca_key)), server=server, client=client)


def _ca(common_name: str, start: datetime.datetime,
        end: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key.public_key(), start, end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


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
    """Two Secrets: the server pair, its CA and the client CA for DDS (the server CA under `ca.crt`, where a
    ServiceMonitor reads what verifies DDS), the client pair, the server CA and the cloud-config for
    cluster-autoscaler."""
    dds_data = {"tls.crt": bundle.server.cert_pem, "tls.key": bundle.server.key_pem, "ca.crt": bundle.ca.cert_pem,
                CLIENT_CA_CERT: bundle.client_ca.cert_pem}
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
                 names: SecretNames = SecretNames(), force: bool = False) -> list[Path]:
    """Write every file (keys and anything holding a key 0600, certificates 0644); returns the paths written.

    Raises `ExistingCa` (nothing written) when `out_dir` already holds a CA and `force` is not set, or when `out_dir`
    itself or a file DDS would write there is a symlink (a link is never followed, with `force` too)."""
    if out_dir.is_symlink():
        raise ExistingCa(f"certs: {out_dir} is a symlink; give the real folder (links are not followed)")
    out_dir.mkdir(parents=True, exist_ok=True)
    existing_ca = [name for name in (CA_CERT, CA_KEY, CLIENT_CA_CERT, CLIENT_CA_KEY) if os.path.lexists(out_dir / name)]
    if existing_ca and not force:
        raise ExistingCa(f"certs: {out_dir} already holds a CA ({', '.join(existing_ca)}); a new one breaks every "
                         f"certificate the old one signed (cluster-autoscaler's, DDS's): pass --force to replace it, "
                         f"or choose another --out")
    secrets_yaml = yaml.safe_dump_all(kubernetes_secrets(bundle, options, names), sort_keys=False).encode()
    files = [
        (CA_CERT, bundle.ca.cert_pem, 0o644),
        (CA_KEY, bundle.ca.key_pem, 0o600),
        (CLIENT_CA_CERT, bundle.client_ca.cert_pem, 0o644),
        (CLIENT_CA_KEY, bundle.client_ca.key_pem, 0o600),
        (SERVER_CERT, bundle.server.cert_pem, 0o644),
        (SERVER_KEY, bundle.server.key_pem, 0o600),
        (CLIENT_CERT, bundle.client.cert_pem, 0o644),
        (CLIENT_KEY, bundle.client.key_pem, 0o600),
        (CLOUD_CONFIG, yaml.safe_dump(cloud_config(options), sort_keys=False).encode(), 0o644),
        (SECRETS, secrets_yaml, 0o600),
    ]
    links = [name for name, _, _ in files if (out_dir / name).is_symlink()]
    if links:
        raise ExistingCa(f"certs: {', '.join(links)} in {out_dir} are symlinks; DDS does not write through links "
                         f"(remove them, or choose another --out)")
    written = []
    for name, content, mode in files:
        path = out_dir / name
        _write_private(path, content, mode)
        written.append(path)
    return written


def _write_private(path: Path, content: bytes, mode: int) -> None:
    # A new file created with its final mode, so a key is never readable by others, not even between write and chmod;
    # an old one is removed first (its mode and owner are not ours to keep). O_EXCL | O_NOFOLLOW: a link planted
    # between the check and the open fails the write instead of redirecting a key.
    if path.exists() and not path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    os.fchmod(fd, mode)  # the umask may have taken bits off a certificate's 0644
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)


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
