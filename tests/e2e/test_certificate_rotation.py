"""DDS's server certificate rotated under the real cluster-autoscaler: no DDS restart, CA keeps calling.

The stack's DDS (`dds serve`, mutual TLS, files from `dds certs`) serves CA. Its server pair is replaced on disk by one
the same CA signed — what renewing a Secret's certificate does — and then:
1. a new TLS connection is served the new certificate (the files were re-read, the process is the same one);
2. CA's calls go on and none fails: its channel was not broken and its trust (the same CA) still holds.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dds import certs
from harness.stack import Stack, StackOptions, start_stack, tail

pytestmark = pytest.mark.e2e

CALLS = "dds_grpc_request_duration_seconds_count"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with start_stack(tmp_path_factory.mktemp("rotation"), StackOptions(workers=1)) as started:
        yield started


def total(metrics: dict[str, float], name: str) -> float:
    return sum(value for key, value in metrics.items() if key.startswith(name + "{") or key == name)


def renewed_server_pair(tls_dir: Path) -> certs.KeyPair:
    """A new server certificate and key for the same names, signed by the stack's CA (its key is in the directory)."""
    ca_cert = x509.load_pem_x509_certificate((tls_dir / certs.CA_CERT).read_bytes())
    ca_key = serialization.load_pem_private_key((tls_dir / certs.CA_KEY).read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, certs.SERVER_COMMON_NAME)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return certs.KeyPair(cert.public_bytes(serialization.Encoding.PEM),
                         key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


def replace_file(path: Path, content: bytes) -> None:
    staged = path.with_name(path.name + ".new")
    staged.write_bytes(content)
    os.chmod(staged, 0o600)
    os.replace(staged, path)


def served_serial(stack: Stack) -> int:
    """The serial of the certificate DDS presents to a new connection (CA's client pair, as CA would connect)."""
    context = ssl.create_default_context(cafile=str(stack.tls_dir / certs.CA_CERT))
    context.load_cert_chain(stack.tls_dir / certs.CLIENT_CERT, stack.tls_dir / certs.CLIENT_KEY)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", stack.grpc_port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_a_renewed_server_certificate_is_served_without_a_restart_and_ca_keeps_calling(stack: Stack):
    assert stack.dds is not None
    process = stack.dds.process.pid
    stack.wait_for("cluster-autoscaler calling DDS", lambda: total(stack.dds.metrics(), CALLS) > 0, timeout=90)
    before = served_serial(stack)

    assert stack.autoscaler is not None
    ca_log_offset = stack.autoscaler.log_path.stat().st_size
    renewed = renewed_server_pair(stack.tls_dir)
    replace_file(stack.tls_dir / certs.SERVER_KEY, renewed.key_pem)
    replace_file(stack.tls_dir / certs.SERVER_CERT, renewed.cert_pem)
    calls = total(stack.dds.metrics(), CALLS)

    new_serial = renewed.certificate.serial_number
    stack.wait_for("a new connection served the renewed certificate", lambda: served_serial(stack) == new_serial,
                   timeout=10, describe=lambda: f"still served serial {served_serial(stack)} (before: {before})")
    assert stack.dds.process.pid == process and stack.dds.running, "DDS was restarted"
    assert "TLS files changed" in stack.dds.log_path.read_text(), tail(stack.dds.log_path)

    # CA scans every 2 s here: a few scans' worth of calls reach DDS, and its log shows no failed TLS handshake.
    stack.wait_for("cluster-autoscaler's calls after the rotation",
                   lambda: total(stack.dds.metrics(), CALLS) >= calls + 5, timeout=30)
    assert stack.autoscaler.running()
    with stack.autoscaler.log_path.open("rb") as ca_log:
        ca_log.seek(ca_log_offset)
        since_rotation = ca_log.read().decode(errors="replace")
    assert "handshake" not in since_rotation and "x509" not in since_rotation, since_rotation[-3000:]
