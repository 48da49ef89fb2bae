"""Mutual TLS (certificates made here with `cryptography`) and the `dds serve` command as a user runs it."""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dds.config import Settings
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc

from .conftest import make_group

REPO = Path(__file__).resolve().parents[3]


# --- certificates ---

def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _cert(subject: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool, server: bool = False) -> x509.Certificate:
    """A CA, or a leaf with its usage and SANs (DDS takes a caller's identity from SANs only, with clientAuth)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(obj) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("dds-test-ca", ca_key, _name("dds-test-ca"), ca_key, ca=True)
    files = {"ca.crt": _pem(ca)}
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        files[f"{role}.key"] = _pem(key)
        files[f"{role}.crt"] = _pem(_cert(f"dds-{role}", key, ca.subject, ca_key, ca=False, server=role == "server"))
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def _tls_settings(pki: Path) -> Settings:
    return Settings(listen="127.0.0.1:0", tls_cert=pki / "server.crt", tls_key=pki / "server.key",
                    tls_ca=pki / "ca.crt", grpc_allowed_clients=["dds-client"])  # the client certificate made above


def test_client_with_a_certificate_signed_by_the_ca_is_served(provider_factory, pki):
    credentials = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.crt").read_bytes(),
                                               private_key=(pki / "client.key").read_bytes(),
                                               certificate_chain=(pki / "client.crt").read_bytes())
    provider = provider_factory([make_group()], settings=_tls_settings(pki), channel_credentials=credentials)
    groups = provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
    assert [g.id for g in groups] == ["MachineSet/default/gpu-workers"]


def test_client_without_a_certificate_is_refused(provider_factory, pki):
    credentials = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.crt").read_bytes())
    provider = provider_factory([make_group()], settings=_tls_settings(pki), channel_credentials=credentials)
    with pytest.raises(grpc.RpcError) as info:
        provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_missing_tls_files_are_a_configuration_error(pki):
    from dds.provider.server import ServerConfigError, build_server

    settings = Settings(listen="127.0.0.1:0", tls_cert=pki / "server.crt", tls_key=pki / "server.key")
    with pytest.raises(ServerConfigError, match="tls_ca is not set"):
        build_server(settings, registry=None, scale_up=None, scale_down=None)  # type: ignore[arg-type]


# --- dds serve ---

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _dds(*args: str) -> list[str]:
    return [sys.executable, "-m", "dds", *args]


def _wait_serving(channel: grpc.Channel, process: subprocess.Popen, deadline_seconds: float = 30) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + deadline_seconds
    while True:
        assert process.poll() is None, process.communicate()[1]
        try:
            status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("dds serve did not report SERVING")
        time.sleep(0.2)


def test_dds_serve_without_a_cluster():
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDS_")}
    process = subprocess.Popen(_dds("serve", "--listen", f"127.0.0.1:{port}", "--node-groups",
                                    "examples/node-groups.yaml", "--insecure"),
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _wait_serving(channel, process)
            stub = externalgrpc_pb2_grpc.CloudProviderStub(channel)
            groups = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
            assert [(g.id, g.minSize, g.maxSize) for g in groups] == [("MachineSet/default/gpu-workers", 0, 4)]
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "WITHOUT TLS" in stderr


@pytest.mark.parametrize("args, fragment", [
    pytest.param(["--node-groups", "does-not-exist.yaml", "--insecure"], "cannot read", id="missing-file"),
    pytest.param(["--node-groups", "{wrong_file}", "--insecure"], "nodeGroups", id="not-a-node-groups-file"),
    pytest.param(["--node-groups", "examples/node-groups.yaml"], "tls_cert is not set", id="no-tls-no-insecure"),
    pytest.param(["--node-groups", "examples/node-groups.yaml", "--insecure", "--listen", "8086"], "host:port",
                 id="bad-listen"),
    pytest.param(["--no-such-flag"], "unrecognized arguments", id="unknown-flag"),
])
def test_dds_serve_bad_input_exits_2_with_a_message(tmp_path, args, fragment):
    wrong_file = tmp_path / "groups.yaml"
    wrong_file.write_text("groups: []\n")
    args = [a.format(wrong_file=wrong_file) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDS_")}
    result = subprocess.run(_dds("serve", "--listen", "127.0.0.1:0", *args), cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert fragment in result.stderr


def test_a_server_certificate_without_the_server_auth_usage_is_a_configuration_error(pki, tmp_path):
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("ca", ca_key, _name("ca"), ca_key, ca=True)
    client_only = _cert("dds-server", key, ca.subject, ca_key, ca=False)  # a leaf with clientAuth, not serverAuth
    (tmp_path / "server.crt").write_bytes(_pem(client_only))
    (tmp_path / "server.key").write_bytes(_pem(key))
    (tmp_path / "ca.crt").write_bytes(_pem(ca))
    from dds.provider.server import ServerConfigError, check_tls_material

    with pytest.raises(ServerConfigError, match="serverAuth"):
        check_tls_material(Settings(listen="127.0.0.1:0", tls_cert=tmp_path / "server.crt",
                                    tls_key=tmp_path / "server.key", tls_ca=tmp_path / "ca.crt"))
