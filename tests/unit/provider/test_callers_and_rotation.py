"""Who may call DDS, and certificates rotated under a running server — over real gRPC channels with mutual TLS.

The certificates come from `dds certs` (dds/certs.py `generate_bundle`): the client pair it issues to cluster-autoscaler
is the identity the default `grpc_allowed_clients` lets in. Another client, with a certificate the same CA signed, is
who the identity check keeps out. The TLS files sit in a directory laid out as the kubelet mounts a Secret (files
that are symlinks through `..data`, swapped atomically on an update), so a rotation here is what a Secret update does.
"""

from __future__ import annotations

import datetime
import time
import os
from pathlib import Path
from typing import Iterator, Optional, Sequence

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from dds import certs
from dds.config import Settings
from dds.provider import callers
from dds.provider.callers import identity_of
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb

from .conftest import Provider, make_group

SECRET_KEYS = ("tls.crt", "tls.key", "ca.crt")


# --- a Secret volume, as the kubelet writes it ---

class SecretVolume:
    """`tls.crt`, `tls.key`, `ca.crt` -> `..data/<name>`, `..data` -> a timestamped directory; `update` swaps `..data`
    with one rename, as the kubelet's atomic writer does."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._generation = 0

    def update(self, cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> None:
        self._generation += 1
        payload = self.directory / f"..generation_{self._generation}"
        payload.mkdir()
        for name, content in zip(SECRET_KEYS, (cert_pem, key_pem, ca_pem)):
            (payload / name).write_bytes(content)
        staged = self.directory / "..data_tmp"
        staged.symlink_to(payload.name)
        os.replace(staged, self.directory / "..data")
        for name in SECRET_KEYS:
            link = self.directory / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")

    def settings(self, allowed: Sequence[str] = (certs.CLIENT_COMMON_NAME,)) -> Settings:
        return Settings(listen="127.0.0.1:0", tls_cert=self.directory / "tls.crt", tls_key=self.directory / "tls.key",
                        tls_ca=self.directory / "ca.crt", grpc_allowed_clients=list(allowed))


def server_bundle() -> certs.CertBundle:
    return certs.generate_bundle(["localhost"], ["127.0.0.1"], days=1)


def client_certificate(ca: certs.KeyPair, common_name: str, sans: Sequence[x509.GeneralName] = (),
                       usages: Optional[Sequence[x509.ObjectIdentifier]] = (ExtendedKeyUsageOID.CLIENT_AUTH,),
                       days: int = 1) -> certs.KeyPair:
    """A client pair signed by `ca`, with the identity the test wants (not one `dds certs` issues); `usages` None
    leaves out the extended key usage extension."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if usages is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return certs.KeyPair(cert.public_bytes(serialization.Encoding.PEM),
                         key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


def credentials(trusted_ca: certs.KeyPair, client: certs.KeyPair) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=trusted_ca.cert_pem, private_key=client.key_pem,
                                        certificate_chain=client.cert_pem)


@pytest.fixture
def volume(tmp_path: Path) -> SecretVolume:
    directory = tmp_path / "tls"
    directory.mkdir()
    return SecretVolume(directory)


@pytest.fixture
def channels() -> Iterator:
    opened: list[grpc.Channel] = []

    def open_channel(provider: Provider, creds: grpc.ChannelCredentials) -> grpc.Channel:
        # A channel of its own per call: gRPC would otherwise share one subchannel (one connection) between channels
        # with equal arguments, and a "new connection" would be the old one.
        channel = grpc.secure_channel(f"127.0.0.1:{provider.server.port}", creds,
                                      options=[("grpc.use_local_subchannel_pool", 1)])
        opened.append(channel)
        return channel

    yield open_channel
    for channel in opened:
        channel.close()


def node_groups(channel: grpc.Channel) -> list[str]:
    from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc

    stub = externalgrpc_pb2_grpc.CloudProviderStub(channel)
    return [g.id for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=10).nodeGroups]


def refusal(channel: grpc.Channel) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        node_groups(channel)
    return info.value


# --- who may call ---

def test_cluster_autoscalers_certificate_from_dds_certs_is_served(provider_factory, volume, channels):
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())
    assert node_groups(channels(provider, credentials(bundle.ca, bundle.client))) == ["MachineSet/default/gpu-workers"]


def test_a_certificate_of_another_identity_signed_by_the_same_ca_is_refused(provider_factory, volume, channels):
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())
    intruder = client_certificate(bundle.client_ca, "batch-job", [x509.DNSName("batch-job.default.svc")])
    error = refusal(channels(provider, credentials(bundle.ca, intruder)))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    # The message says who was seen and what to change.
    assert "CN=batch-job" in error.details() and "DNS:batch-job.default.svc" in error.details()
    assert "grpc_allowed_clients" in error.details() and "cluster-autoscaler" in error.details()


def test_callers_keep_their_verdicts_call_after_call_with_both_connected(provider_factory, volume, channels):
    """The gate remembers an allowed certificate (CA sends the same one thousands of times a scan); an intruder on a
    connection beside it is refused on every call all the same."""
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())
    allowed = channels(provider, credentials(bundle.ca, bundle.client))
    intruder = channels(provider, credentials(bundle.ca, client_certificate(bundle.client_ca, "batch-job")))
    for _ in range(5):
        assert node_groups(allowed) == ["MachineSet/default/gpu-workers"]
        assert refusal(intruder).code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_health_service_is_refused_to_an_unknown_caller_too(provider_factory, volume, channels):
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())
    health = health_pb2_grpc.HealthStub(channels(provider, credentials(bundle.ca, client_certificate(bundle.client_ca, "x"))))
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("allowed,sans", [
    pytest.param("spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler",
                 [x509.UniformResourceIdentifier("spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler")],
                 id="san-uri"),
    pytest.param("ca.kube-system.svc", [x509.DNSName("ca.kube-system.svc")], id="san-dns"),
])
def test_each_kind_of_name_on_a_certificate_can_be_the_allowed_identity(provider_factory, volume, channels,
                                                                        allowed, sans):
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings(allowed=[allowed]))
    caller = client_certificate(bundle.client_ca, "autoscaler-client", sans)
    assert node_groups(channels(provider, credentials(bundle.ca, caller))) == ["MachineSet/default/gpu-workers"]
    # and the client `dds certs` made is now the stranger
    assert refusal(channels(provider, credentials(bundle.ca, bundle.client))).code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("sans", [pytest.param([], id="no-sans"),
                                  pytest.param([x509.DNSName("other.example")], id="beside-other-sans")])
def test_a_common_name_is_never_an_identity(provider_factory, volume, channels, sans):
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings(allowed=["autoscaler-client"]))
    error = refusal(channels(provider, credentials(bundle.ca, client_certificate(bundle.client_ca, "autoscaler-client", sans))))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "CN=autoscaler-client" in error.details() and "a subject CommonName is not an identity" in error.details()


@pytest.mark.parametrize("usages,code", [
    # no EKU passes TLS (a certificate for any purpose): the gate refuses it, saying why
    pytest.param(None, grpc.StatusCode.PERMISSION_DENIED, id="no-eku"),
    # a server-only EKU is refused by the TLS handshake itself (BoringSSL: unsupported certificate purpose)
    pytest.param([ExtendedKeyUsageOID.SERVER_AUTH], grpc.StatusCode.UNAVAILABLE, id="server-auth-only"),
])
def test_a_certificate_not_made_for_clients_is_refused_whatever_it_names(provider_factory, volume, channels, usages,
                                                                         code):
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())
    stranger = client_certificate(bundle.client_ca, certs.CLIENT_COMMON_NAME, [x509.DNSName(certs.CLIENT_COMMON_NAME)], usages)
    error = refusal(channels(provider, credentials(bundle.ca, stranger)))
    assert error.code() == code
    if code == grpc.StatusCode.PERMISSION_DENIED:
        assert "clientAuth" in error.details()
    # the client `dds certs` issues, the same names with clientAuth, is served
    assert node_groups(channels(provider, credentials(bundle.ca, bundle.client))) == ["MachineSet/default/gpu-workers"]


def test_a_caller_refused_again_and_again_is_refused_at_once_and_logged_once(provider_factory, volume, channels,
                                                                              caplog):
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())
    channel = channels(provider, credentials(bundle.ca, client_certificate(bundle.client_ca, "batch-job",
                                                                           [x509.DNSName("batch-job")])))
    details = [refusal(channel).details() for _ in range(callers.DENIAL_BURST + 5)]
    assert all("batch-job" in d for d in details[:callers.DENIAL_BURST])
    assert "refused at once" in details[-1]  # no certificate read, no names echoed back
    refusal_lines = [r for r in caplog.records if r.name == "dds.provider.callers"]
    assert len(refusal_lines) == 1
    # the allowed client, from the same address, is not slowed down by its neighbour
    assert node_groups(channels(provider, credentials(bundle.ca, bundle.client))) == ["MachineSet/default/gpu-workers"]


def test_the_default_allowed_identity_is_the_client_dds_certs_issues():
    bundle = server_bundle()
    identity = identity_of(bundle.client.cert_pem)
    assert set(Settings().grpc_allowed_clients) <= set(identity.names)
    assert certs.CLIENT_COMMON_NAME in identity.common_names


@pytest.mark.parametrize("allowed", [[], [""], None])
def test_an_empty_list_of_allowed_callers_is_a_settings_error(allowed: Optional[list]):
    with pytest.raises(ValueError, match="grpc_allowed_clients"):
        Settings(grpc_allowed_clients=allowed)


def client_expiry() -> Optional[float]:
    return REGISTRY.get_sample_value("dds_certificate_expiry_seconds", {"certificate": "client"})


def test_the_client_certificate_callers_present_is_published_and_follows_a_renewal(provider_factory, volume,
                                                                                   channels):
    """cluster-autoscaler reads its client certificate once at start: what it presents is what expires. The gauge
    shows the newest certificate an allowed caller presented; a refused caller's never counts."""
    bundle = server_bundle()
    volume.update(bundle.server.cert_pem, bundle.server.key_pem, bundle.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings(allowed=["ca.example"]))
    names = [x509.DNSName("ca.example")]
    soon = client_certificate(bundle.client_ca, "ca", names, days=3)
    assert node_groups(channels(provider, credentials(bundle.ca, soon))) == ["MachineSet/default/gpu-workers"]
    assert client_expiry() == identity_of(soon.cert_pem).not_after

    intruder = client_certificate(bundle.client_ca, "batch-job", [x509.DNSName("batch-job.example")], days=2)
    refusal(channels(provider, credentials(bundle.ca, intruder)))
    assert client_expiry() == identity_of(soon.cert_pem).not_after

    renewed = client_certificate(bundle.client_ca, "ca", names, days=60)
    old_connection = channels(provider, credentials(bundle.ca, soon))
    node_groups(channels(provider, credentials(bundle.ca, renewed)))
    node_groups(old_connection)  # a connection from before the renewal still calls: the renewal has happened
    assert client_expiry() == identity_of(renewed.cert_pem).not_after > identity_of(soon.cert_pem).not_after


# --- rotation ---

def test_a_rotated_certificate_is_used_by_new_connections_while_an_open_one_keeps_working(provider_factory, volume,
                                                                                          channels):
    before = server_bundle()
    volume.update(before.server.cert_pem, before.server.key_pem, before.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())
    old_channel = channels(provider, credentials(before.ca, before.client))
    assert node_groups(old_channel) == ["MachineSet/default/gpu-workers"]

    # The Secret is replaced by one from a new CA: server pair, client CA, everything.
    after = server_bundle()
    volume.update(after.server.cert_pem, after.server.key_pem, after.client_ca.cert_pem)

    # A new connection is served the new certificate: a client trusting only the new CA gets in...
    assert node_groups(channels(provider, credentials(after.ca, after.client))) == ["MachineSet/default/gpu-workers"]
    # ...and one trusting only the old CA no longer does (the server's certificate is not the one it knows).
    assert refusal(channels(provider, credentials(before.ca, before.client))).code() == grpc.StatusCode.UNAVAILABLE
    # The connection opened before the rotation is not broken by it.
    assert node_groups(old_channel) == ["MachineSet/default/gpu-workers"]


def test_a_half_written_rotation_keeps_the_certificates_loaded_before(provider_factory, volume, channels, caplog):
    before = server_bundle()
    volume.update(before.server.cert_pem, before.server.key_pem, before.client_ca.cert_pem)
    provider = provider_factory([make_group()], settings=volume.settings())

    after = server_bundle()
    volume.update(after.server.cert_pem, before.server.key_pem, after.client_ca.cert_pem)  # new certificate, old key

    assert node_groups(channels(provider, credentials(before.ca, before.client))) == ["MachineSet/default/gpu-workers"]
    assert any("do not load" in r.getMessage() and "is not the key of tls_cert" in r.getMessage()
               for r in caplog.records)
    # Once the whole Secret is there, the next connection gets it.
    volume.update(after.server.cert_pem, after.server.key_pem, after.client_ca.cert_pem)
    assert node_groups(channels(provider, credentials(after.ca, after.client))) == ["MachineSet/default/gpu-workers"]


def test_an_open_connection_of_a_client_the_rotated_client_ca_no_longer_trusts_is_closed_within_the_maximum_age(
        provider_factory, volume, channels):
    before = server_bundle()
    volume.update(before.server.cert_pem, before.server.key_pem, before.client_ca.cert_pem)
    settings = volume.settings().model_copy(update={"grpc_max_connection_age_seconds": 1.0})
    provider = provider_factory([make_group()], settings=settings)
    open_channel = channels(provider, credentials(before.ca, before.client))
    assert node_groups(open_channel) == ["MachineSet/default/gpu-workers"]

    revoked = server_bundle().client_ca  # the client CA is rotated: the old client certificate is no longer trusted
    volume.update(before.server.cert_pem, before.server.key_pem, revoked.cert_pem)
    deadline = time.monotonic() + 60  # the bound is 1 s (+10 % jitter); the minute only absorbs a loaded machine
    while time.monotonic() < deadline:
        try:
            node_groups(open_channel)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE  # the new handshake is refused
            break
        time.sleep(0.2)
    else:
        pytest.fail("the connection opened before the client CA's rotation was still served a minute later")
