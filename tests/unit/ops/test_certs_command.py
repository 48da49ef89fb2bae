"""`dds certs`: the files it writes work for a real TLS handshake the way cluster-autoscaler does one."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
import yaml
from cryptography.exceptions import InvalidSignature
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from dds import certs
from dds.commands import certs as certs_command


def run_certs(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    certs_command.register(parser.add_subparsers())
    args = parser.parse_args(["certs", *argv])
    return args.func(args)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    assert run_certs("--out", str(directory), "--dns", "dds.dds-system.svc", "--ip", "127.0.0.1", "--days", "30") == 0
    return directory


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.mark.parametrize(("leaf", "ca", "other_ca"), [("server.crt", "ca.crt", "client-ca.crt"),
                                                     ("client.crt", "client-ca.crt", "ca.crt")])
def test_each_leaf_is_signed_by_its_own_ca_only(out: Path, leaf: str, ca: str, other_ca: str) -> None:
    load(out / leaf).verify_directly_issued_by(load(out / ca))
    with pytest.raises((ValueError, InvalidSignature)):  # a stolen server key cannot pose as a client, nor the reverse
        load(out / leaf).verify_directly_issued_by(load(out / other_ca))


def test_dds_trusts_the_client_ca_and_cluster_autoscaler_the_server_ca(out: Path) -> None:
    dds_secret, ca_secret = yaml.safe_load_all((out / "secrets.yaml").read_text())
    assert dds_secret["stringData"]["client-ca.crt"] == (out / "client-ca.crt").read_text()  # DDS's tls_ca
    assert dds_secret["stringData"]["ca.crt"] == ca_secret["stringData"]["ca.crt"] == (out / "ca.crt").read_text()


def test_a_folder_holding_a_ca_is_not_overwritten_without_force(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "tls"
    assert run_certs("--out", str(target), "--dns", "dds") == 0
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    assert run_certs("--out", str(target), "--dns", "dds") == 2
    error = capsys.readouterr().err
    assert "already holds a CA" in error and "--force" in error
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert run_certs("--out", str(target), "--dns", "dds", "--force") == 0
    assert (target / "ca.crt").read_bytes() != before["ca.crt"]


def test_symlinks_in_the_output_folder_are_never_followed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target, elsewhere = tmp_path / "tls", tmp_path / "attacker"
    target.mkdir()
    elsewhere.mkdir()
    (target / "server.key").symlink_to(elsewhere / "stolen.key")  # planted where DDS writes a private key
    assert run_certs("--out", str(target), "--dns", "dds", "--force") == 2
    assert "symlinks" in capsys.readouterr().err
    assert not (elsewhere / "stolen.key").exists()
    linked_out = tmp_path / "linked"
    linked_out.symlink_to(elsewhere)
    assert run_certs("--out", str(linked_out), "--dns", "dds") == 2
    assert list(elsewhere.iterdir()) == []


def test_server_certificate_carries_every_requested_san(out: Path) -> None:
    sans = load(out / "server.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["dds.dds-system.svc"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


@pytest.mark.parametrize(("leaf", "usage"), [("server.crt", ExtendedKeyUsageOID.SERVER_AUTH),
                                             ("client.crt", ExtendedKeyUsageOID.CLIENT_AUTH)])
def test_each_leaf_has_only_its_own_usage(out: Path, leaf: str, usage: x509.ObjectIdentifier) -> None:
    assert list(load(out / leaf).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [usage]


@pytest.mark.parametrize("name", ["ca.key", "client-ca.key", "server.key", "client.key", "secrets.yaml"])
def test_private_files_are_owner_only(out: Path, name: str) -> None:
    assert stat.S_IMODE((out / name).stat().st_mode) == 0o600


def test_cloud_config_matches_cluster_autoscaler_fields(out: Path) -> None:
    config = yaml.safe_load((out / "cloud-config.yaml").read_text())
    assert config == {
        "address": "dds.dds-system.svc:8086",
        "cert": f"{out.resolve()}/client.crt",
        "key": f"{out.resolve()}/client.key",
        "cacert": f"{out.resolve()}/ca.crt",
        "grpc_timeout": "10s",
    }


def test_secrets_yaml_holds_the_server_pair_and_the_autoscaler_files(out: Path) -> None:
    dds_secret, ca_secret = yaml.safe_load_all((out / "secrets.yaml").read_text())
    assert (dds_secret["metadata"]["name"], dds_secret["type"]) == ("dds-tls", "kubernetes.io/tls")
    assert dds_secret["stringData"]["tls.crt"] == (out / "server.crt").read_text()
    assert sorted(ca_secret["stringData"]) == ["ca.crt", "client.crt", "client.key", "cloud-config.yaml"]


def test_files_dir_points_cloud_config_at_the_mount(tmp_path: Path) -> None:
    assert run_certs("--out", str(tmp_path), "--dns", "dds.dds-system.svc", "--files-dir", "/config") == 0
    config = yaml.safe_load((tmp_path / "cloud-config.yaml").read_text())
    assert config["cert"] == "/config/client.crt" and config["cacert"] == "/config/ca.crt"


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--days", "30"], "at least one --dns or --ip"),
     (["--ip", "dds.local"], "not an IP address"),
     (["--dns", "dds.dds-system.svc", "--address", "10.0.0.1:8086"], "not among the server SANs"),
     (["--dns", "dds", "--days", "0"], "--days must be at least 1")],
    ids=["no-san", "name-as-ip", "address-outside-sans", "zero-days"],
)
def test_bad_flags_exit_2_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                            message: str) -> None:
    target = tmp_path / "tls"
    assert run_certs("--out", str(target), *argv) == 2
    assert message in capsys.readouterr().err
    assert not target.exists()


def serve_one_handshake(out: Path) -> tuple[int, threading.Thread, list[BaseException]]:
    """A TLS server requiring client certificates, like `dds serve` with --tls-ca; accepts one connection."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(out / "server.crt", out / "server.key")
    context.load_verify_locations(out / "client-ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))
    errors: list[BaseException] = []

    def accept() -> None:
        with listener:
            connection, _ = listener.accept()
            try:
                with context.wrap_socket(connection, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError) as error:
                errors.append(error)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, errors


def client_context(out: Path, with_client_cert: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(out / "ca.crt")
    if with_client_cert:
        context.load_cert_chain(out / "client.crt", out / "client.key")
    return context


def test_handshake_succeeds_with_the_client_pair(out: Path) -> None:
    port, thread, errors = serve_one_handshake(out)
    # Dial the IP, as a cloud-config address of 127.0.0.1:8086 would: the IP SAN must match.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with client_context(out, with_client_cert=True).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.recv(2) == b"ok"
    thread.join(10)
    assert errors == []


def test_handshake_fails_without_a_client_certificate(out: Path) -> None:
    port, thread, errors = serve_one_handshake(out)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client_context(out, with_client_cert=False).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                # TLS 1.3 reports the server's rejection of the missing certificate on the first read.
                tls.recv(2)
                raise AssertionError("the server answered a client without a certificate")
    thread.join(10)
    assert errors, "the server must reject the handshake"


def test_handshake_fails_for_a_host_outside_the_sans(out: Path) -> None:
    port, thread, _ = serve_one_handshake(out)
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|doesn't match"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            client_context(out, with_client_cert=True).wrap_socket(raw, server_hostname="dds.example.org")
    thread.join(10)


def test_generate_bundle_rejects_no_sans() -> None:
    with pytest.raises(ValueError, match="--dns or --ip"):
        certs.generate_bundle([], [], days=1)


def test_grpc_mutual_tls_with_the_generated_files(out: Path) -> None:
    """The same files through gRPC's own TLS stack (what `dds serve` and cluster-autoscaler use)."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    credentials = grpc.ssl_server_credentials([((out / "server.key").read_bytes(), (out / "server.crt").read_bytes())],
                                              root_certificates=(out / "client-ca.crt").read_bytes(),
                                              require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        def check(with_client_cert: bool) -> int:
            client_files = {}
            if with_client_cert:
                client_files = {"private_key": (out / "client.key").read_bytes(),
                                "certificate_chain": (out / "client.crt").read_bytes()}
            channel_credentials = grpc.ssl_channel_credentials(root_certificates=(out / "ca.crt").read_bytes(),
                                                               **client_files)
            with grpc.secure_channel(f"127.0.0.1:{port}", channel_credentials) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                return stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status

        assert check(with_client_cert=True) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as rejected:
            check(with_client_cert=False)
        assert rejected.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None)
