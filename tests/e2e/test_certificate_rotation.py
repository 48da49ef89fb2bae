"""DDS's server certificate rotated under the real cluster-autoscaler: no DDS restart, CA keeps calling.

The stack's DDS (`dds serve`, mutual TLS, files from `dds certs`) serves CA. Its server pair is replaced on disk by one
the same CA signed — what renewing a Secret's certificate does — and then:
1. a new TLS connection is served the new certificate (the files were re-read, the process is the same one);
2. CA's calls go on and none fails: its channel was not broken and its trust (the same CA) still holds.

Then every certificate, both CAs included, as cert-manager rotates a CA with trust bundles and the chart restarts CA
when its Secret changes (`checksum/client-tls`): the new CAs trusted beside the old, DDS's server pair and CA's client
pair moved to them, the old CAs dropped; CA's calls go on at every step and its scale-up still adds a node at the end.
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
from kubernetes import client

from dds import certs
from harness.stack import WORKLOAD_NAMESPACE, Stack, StackOptions, pod, start_stack, tail
from tests.e2e.cluster_facts import describe, pods_running

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


# --- every certificate, both CAs included ---

def restart_autoscaler(stack: Stack) -> None:
    """What a change of CA's Secret does under the chart: its pod template's checksum changes and it restarts."""
    assert stack.autoscaler is not None
    stack.autoscaler.stop()
    stack.start_autoscaler()


def calls_go_on(stack: Stack, step: str) -> None:
    """CA's calls reach DDS after `step` (a few scans' worth); CA's log since its start shows no failed handshake."""
    assert stack.dds is not None and stack.autoscaler is not None
    calls = total(stack.dds.metrics(), CALLS)
    stack.wait_for(f"cluster-autoscaler's calls after {step}", lambda: total(stack.dds.metrics(), CALLS) >= calls + 5,
                   timeout=60, describe=lambda: tail(stack.autoscaler.log_path))
    assert stack.autoscaler.running(), f"{step}: {tail(stack.autoscaler.log_path)}"
    text = stack.autoscaler.log_path.read_text(errors="replace")
    assert "handshake" not in text and "x509" not in text, f"{step}: {text[-3000:]}"


def client_expiry(stack: Stack) -> float:
    assert stack.dds is not None
    return stack.dds.metrics().get('dds_certificate_expiry_seconds{certificate="client"}', float("nan"))


def test_both_cas_rotated_through_trust_bundles_keep_cas_calls_and_scale_ups_working(stack: Stack):
    assert stack.dds is not None
    tls = stack.tls_dir
    old_ca, old_client_ca = (tls / certs.CA_CERT).read_bytes(), (tls / certs.CLIENT_CA_CERT).read_bytes()
    new = certs.generate_bundle(["localhost"], ["127.0.0.1"], days=30)  # 30 days: told apart from the stack's 1

    # 1. The new CAs trusted beside the old: DDS re-reads its client CA bundle; CA restarts on its server CA bundle.
    replace_file(tls / certs.CLIENT_CA_CERT, old_client_ca + new.client_ca.cert_pem)
    replace_file(tls / certs.CA_CERT, old_ca + new.ca.cert_pem)
    restart_autoscaler(stack)
    calls_go_on(stack, "both CAs trusted")

    # 2. DDS's server pair from the new server CA: re-read, no restart; CA's new connections verify it.
    replace_file(tls / certs.SERVER_KEY, new.server.key_pem)
    replace_file(tls / certs.SERVER_CERT, new.server.cert_pem)
    serial = new.server.certificate.serial_number
    stack.wait_for("the new server certificate served", lambda: served_serial(stack) == serial, timeout=10)
    calls_go_on(stack, "DDS's server pair renewed")

    # 3. CA's client pair from the new client CA (its Secret changed: restarted); DDS shows what CA now presents.
    replace_file(tls / certs.CLIENT_KEY, new.client.key_pem)
    replace_file(tls / certs.CLIENT_CERT, new.client.cert_pem)
    restart_autoscaler(stack)
    calls_go_on(stack, "CA's client pair renewed")
    assert client_expiry(stack) == new.client.certificate.not_valid_after_utc.timestamp()

    # 4. The old CAs dropped from both bundles: only the new pairs are left, and they are enough.
    replace_file(tls / certs.CLIENT_CA_CERT, new.client_ca.cert_pem)
    replace_file(tls / certs.CA_CERT, new.ca.cert_pem)
    restart_autoscaler(stack)
    calls_go_on(stack, "the old CAs dropped")

    # CA still scales up through DDS: two pods no live node holds together; the second gets a new node.
    core = client.CoreV1Api(stack.api)
    nodes_before = {n.metadata.name for n in core.list_node().items}
    for name in ("after-rotation-0", "after-rotation-1"):  # 40Gi each: one per 64Gi node
        core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod(name, memory_gib=40))
    names = ["after-rotation-0", "after-rotation-1"]
    stack.wait_for("both pods Running, one on a node CA's scale-up added after the rotation",
                   lambda: pods_running(stack, names), timeout=120, describe=lambda: describe(stack))
    hosts = {p.metadata.name: p.spec.node_name for p in stack.pods() if p.metadata.name in names}
    assert set(hosts.values()) - nodes_before, hosts
    triggered = [e for e in core.list_namespaced_event(WORKLOAD_NAMESPACE).items if e.reason == "TriggeredScaleUp"]
    assert triggered, "the node was not CA's scale-up"
    assert stack.dds.running, "DDS exited"
