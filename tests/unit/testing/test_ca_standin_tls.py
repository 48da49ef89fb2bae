"""The stand-in dials with mutual TLS exactly when the cloud-config has `cert`, checking the server's IP SAN."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from dds.certs import CloudConfigOptions, generate_bundle, write_bundle
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from dds.testing.ca_standin import AutoscalerStandIn, StandInOptions

from .conftest import FakeCluster, FakeProvider


@pytest.fixture
def tls_server(tmp_path):
    bundle = generate_bundle(dns_names=[], ip_addresses=["127.0.0.1"], days=1)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    fake = FakeProvider()
    pb_grpc.add_CloudProviderServicer_to_server(fake, server)
    credentials = grpc.ssl_server_credentials([(bundle.server.key_pem, bundle.server.cert_pem)],
                                              root_certificates=bundle.ca.cert_pem, require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    write_bundle(tmp_path, bundle, CloudConfigOptions(address=f"127.0.0.1:{port}", files_dir=str(tmp_path)))
    yield fake, port, tmp_path / "cloud-config.yaml"
    server.stop(grace=None)


def run_once(cloud_config):
    standin = AutoscalerStandIn(FakeCluster(), cloud_config, scan_interval=10, max_node_provision_time=60,
                                options=StandInOptions())
    try:
        return standin.run_once()
    finally:
        standin._channel.close()


def test_mutual_tls_from_the_cloud_config(tls_server):
    fake, _, cloud_config = tls_server
    result = run_once(cloud_config)
    assert result.outcome == "ok" and [c.method for c in result.calls] == ["Refresh", "NodeGroups"]


def test_plaintext_client_cannot_talk_to_a_tls_server(tls_server, tmp_path):
    _, port, _ = tls_server
    plaintext = tmp_path / "plain.yaml"
    plaintext.write_text(f"address: 127.0.0.1:{port}\ngrpc_timeout: 2s\n")
    result = run_once(plaintext)
    assert result.outcome.startswith("aborted: Refresh failed") and "UNAVAILABLE" in result.calls[0].status
