"""Security of the gRPC endpoint and of what DDS logs.

- Mutual TLS is the default: `dds serve` refuses to start without TLS material unless `insecure` is set, and refuses
  before it touches a cluster. Certificates from `dds certs` (dds/certs.py): a client without a certificate, or with
  one from another CA, is refused; cluster-autoscaler's client certificate is served.
- No secret reaches the logs at DEBUG level: the Redfish password and session token, a kubeconfig bearer token, TLS
  private keys, through startup and a full request cycle.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import grpc
import pytest
import yaml

from dds import certs
from dds.commands.serve import load_settings, no_cluster_parts
from dds.config import Settings
from dds.fabric.base import AttachRequest, DetachRequest, FabricError
from dds.fabric.factory import build_fabric
from dds.kube.client import api_client
from dds.kube.machinesets import MachineSetLister
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc
from dds.scaling.requests import FAKE_NODE_REASON
from dds.provider.server import ServerConfigError, build_server, check_tls_material
from harness.redfish_emulator import EmulatedSystem, EmulatorConfig, RedfishEmulator
from tests.unit.provider.conftest import Provider, make_group, start_provider
from tests.unit.provider.test_tls_and_serve import _free_port, _wait_serving

REPO = Path(__file__).resolve().parents[3]
GROUP = "MachineSet/default/gpu-workers"
TIMEOUT = 5


# --- certificates from `dds certs` ---

@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """Two independent bundles: "ours" (what DDS and CA are given) and "other" (another CA altogether)."""
    dirs = {}
    for name in ("ours", "other"):
        directory = tmp_path_factory.mktemp(name)
        bundle = certs.generate_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"], days=1)
        certs.write_bundle(directory, bundle, certs.CloudConfigOptions(address="127.0.0.1:8086",
                                                                        files_dir=str(directory)))
        dirs[name] = directory
    return dirs


def tls_settings(directory: Path, **extra: object) -> Settings:
    return Settings(listen="127.0.0.1:0", tls_cert=directory / certs.SERVER_CERT, tls_key=directory / certs.SERVER_KEY,
                    tls_ca=directory / certs.CLIENT_CA_CERT, **extra)


def client_credentials(trust: Path, identity: Path | None, role: str = "client") -> grpc.ChannelCredentials:
    """Trusting `trust`'s CA for the server; presenting `identity`'s `role` pair (none when identity is None)."""
    root = (trust / certs.CA_CERT).read_bytes()
    if identity is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(root_certificates=root,
                                        private_key=(identity / f"{role}.key").read_bytes(),
                                        certificate_chain=(identity / f"{role}.crt").read_bytes())


@pytest.fixture
def tls_provider(pki) -> Iterator:
    started: list[Provider] = []

    def start(credentials: grpc.ChannelCredentials) -> Provider:
        provider = start_provider([make_group()], settings=tls_settings(pki["ours"]), channel_credentials=credentials)
        started.append(provider)
        return provider

    yield start
    for provider in started:
        provider.channel.close()
        provider.server.stop(grace_seconds=0)


def test_cluster_autoscaler_client_certificate_is_served(tls_provider, pki) -> None:
    provider = tls_provider(client_credentials(pki["ours"], pki["ours"]))
    groups = provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT).nodeGroups
    assert [g.id for g in groups] == [GROUP]


@pytest.mark.parametrize("identity, role", [
    pytest.param(None, "client", id="no-client-certificate"),
    pytest.param("other", "client", id="client-certificate-from-another-ca"),
    pytest.param("other", "server", id="server-certificate-from-another-ca"),
    # Signed by our CA but made for the server (extended key usage serverAuth only): a stolen server key cannot
    # pose as cluster-autoscaler.
    pytest.param("ours", "server", id="our-server-certificate-used-as-a-client"),
])
def test_client_without_a_certificate_of_our_ca_is_refused(tls_provider, pki, identity, role) -> None:
    provider = tls_provider(client_credentials(pki["ours"], pki[identity] if identity else None, role))
    with pytest.raises(grpc.RpcError) as info:
        provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake failed: no RPC reached DDS
    assert provider.tracker.list() == ()


def test_plaintext_client_is_refused_by_a_tls_server(pki) -> None:
    provider = start_provider([make_group()], settings=tls_settings(pki["ours"]))
    try:
        with pytest.raises(grpc.RpcError) as info:
            provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=1), timeout=TIMEOUT)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert provider.tracker.list() == ()
    finally:
        provider.channel.close()
        provider.server.stop(grace_seconds=0)


def test_a_server_with_the_wrong_ca_is_refused_by_the_client(pki) -> None:
    """The other direction: cluster-autoscaler (trusting our CA) does not talk to a server of another CA."""
    provider = start_provider([make_group()], settings=tls_settings(pki["other"]),
                              channel_credentials=client_credentials(pki["ours"], pki["ours"]))
    try:
        with pytest.raises(grpc.RpcError) as info:
            provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        provider.channel.close()
        provider.server.stop(grace_seconds=0)


# --- TLS material checked before serving ---

@pytest.mark.parametrize("change, fragment", [
    pytest.param({"tls_cert": None}, "tls_cert is not set", id="no-cert"),
    pytest.param({"tls_key": None}, "tls_key is not set", id="no-key"),
    pytest.param({"tls_ca": None}, "tls_ca is not set", id="no-client-ca"),
    pytest.param({"tls_key": "missing.key"}, "cannot read", id="unreadable-key"),
    pytest.param({"tls_cert": "garbage"}, "not a PEM certificate", id="garbage-cert"),
    pytest.param({"tls_key": "garbage"}, "not an unencrypted PEM private key", id="garbage-key"),
    pytest.param({"tls_key": "other-key"}, "is not the key of tls_cert", id="key-of-another-cert"),
    pytest.param({"tls_ca": "garbage"}, "not PEM certificates", id="garbage-ca"),
])
def test_bad_tls_material_is_named_and_its_content_never_shown(pki, tmp_path: Path, change, fragment) -> None:
    secret_line = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg-not-really-a-key"
    (tmp_path / "garbage").write_text(f"-----BEGIN PRIVATE KEY-----\n{secret_line}\n-----END PRIVATE KEY-----\n")
    paths = {"garbage": tmp_path / "garbage", "missing.key": tmp_path / "missing.key",
             "other-key": pki["other"] / certs.SERVER_KEY, None: None}
    settings = tls_settings(pki["ours"]).model_copy(update={k: paths[v] for k, v in change.items()})
    with pytest.raises(ServerConfigError) as info:
        check_tls_material(settings)
    message = str(info.value)
    assert fragment in message and change and next(iter(change)) in message
    assert secret_line not in message and "BEGIN" not in message
    assert (pki["other"] / certs.SERVER_KEY).read_text().splitlines()[1] not in message


def test_insecure_needs_no_material() -> None:
    check_tls_material(Settings(listen="127.0.0.1:0", insecure=True))


# --- `dds serve` as a user runs it ---

def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DDS_")}


def test_dds_serve_in_cluster_mode_refuses_plaintext_before_touching_the_cluster(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(_kubeconfig("https://127.0.0.1:1", "token-never-used")))
    result = subprocess.run([sys.executable, "-m", "dds", "serve", "--listen", "127.0.0.1:0", "--kubeconfig",
                             str(kubeconfig)], cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "tls_cert is not set" in result.stderr and "--insecure" in result.stderr
    assert "Traceback" not in result.stderr and "127.0.0.1:1" not in result.stderr  # it did not try the cluster


def test_dds_serve_config_file_with_insecure_false_refuses_plaintext(tmp_path: Path) -> None:
    config = tmp_path / "dds.yaml"
    config.write_text("insecure: false\nnode_groups_file: examples/node-groups.yaml\n")
    result = subprocess.run([sys.executable, "-m", "dds", "serve", "--listen", "127.0.0.1:0", "--config", str(config)],
                            cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "tls_cert is not set" in result.stderr, result.stderr


def test_dds_serve_with_mutual_tls_from_dds_certs(pki, tmp_path: Path) -> None:
    """The files `dds certs` writes, in a settings file: CA's client is served, a client without one is not."""
    ours = pki["ours"]
    port = _free_port()
    config = tmp_path / "dds.yaml"
    config.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "node_groups_file": "examples/node-groups.yaml",
                                      "tls_cert": str(ours / certs.SERVER_CERT), "tls_key": str(ours / certs.SERVER_KEY),
                                      "tls_ca": str(ours / certs.CLIENT_CA_CERT)}))
    process = subprocess.Popen([sys.executable, "-m", "dds", "serve", "--config", str(config)], cwd=REPO,
                               env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.secure_channel(f"127.0.0.1:{port}", client_credentials(ours, ours)) as channel:
            _wait_serving(channel, process)
            stub = externalgrpc_pb2_grpc.CloudProviderStub(channel)
            assert [g.id for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT).nodeGroups] == [GROUP]
        for credentials in (client_credentials(ours, None), client_credentials(ours, pki["other"])):
            with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
                with pytest.raises(grpc.RpcError) as info:
                    externalgrpc_pb2_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(),
                                                                                timeout=TIMEOUT)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError):
                externalgrpc_pb2_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "WITHOUT TLS" not in stderr


# --- no secrets in logs ---

def _kubeconfig(server: str, token: str) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}


class _ApiserverWithoutClusterApi(BaseHTTPRequestHandler):
    """Answers every request 404 (Cluster API not installed) and records the Authorization header it was sent, to
    prove the token really went over the wire during the cycle the logs are checked for."""

    seen_authorization: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        type(self).seen_authorization.append(self.headers.get("Authorization", ""))
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "code": 404, "message": "the server could not find the requested resource"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def apiserver() -> Iterator[str]:
    _ApiserverWithoutClusterApi.seen_authorization = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiserverWithoutClusterApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_no_secret_reaches_the_logs_at_debug_level(pki, tmp_path: Path, apiserver: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    ours = pki["ours"]
    password = "redfish-Pa55word-7f3a9c"
    wrong_password = "not-the-Pa55word-b81d2e"
    bearer = "kube-bearer-token-0c4e5d7a9b"
    (tmp_path / "redfish-password").write_text(password + "\n")
    emulator = RedfishEmulator(EmulatorConfig(systems=[EmulatedSystem("sys-1", "node-a")], gpus={"default": {"A30": 2}},
                                              composition_latency_s=0.05, decomposition_latency_s=0.05,
                                              username="dds", password=password))
    emulator.start()
    config = tmp_path / "dds.yaml"
    config.write_text(yaml.safe_dump({
        "listen": "127.0.0.1:0", "node_groups_file": str(REPO / "examples/node-groups.yaml"), "log_level": "DEBUG",
        "tls_cert": str(ours / certs.SERVER_CERT), "tls_key": str(ours / certs.SERVER_KEY),
        "tls_ca": str(ours / certs.CLIENT_CA_CERT), "fabric": "redfish",
        "redfish": {"endpoint": emulator.url, "username": "dds", "password_file": str(tmp_path / "redfish-password"),
                    "timeout_seconds": 5},
        "simulated_fabric": {"pools": [{"name": "default", "devices": {"A30": 2}}]}}))
    try:
        # startup, as `dds serve --config` does it
        settings = load_settings(argparse.Namespace(config=config, **{name: None for name in (
            "listen", "node_groups_file", "insecure", "tls_cert", "tls_key", "tls_ca", "gpu_label", "log_level",
            "kubeconfig", "in_cluster", "metrics_listen", "leader_election", "identity")}))
        check_tls_material(settings)
        parts = no_cluster_parts(settings)
        server = build_server(settings, parts.registry, parts.scale_up, parts.scale_down)
        server.start()
        try:
            _grpc_cycle(f"127.0.0.1:{server.port}", client_credentials(ours, ours))
        finally:
            server.stop(grace_seconds=0)
        session_token = _fabric_cycle(settings)
        (tmp_path / "wrong-password").write_text(wrong_password)
        _fabric_cycle(settings.model_copy(update={"redfish": settings.redfish.model_copy(
            update={"password_file": tmp_path / "wrong-password"})}), expect_failure=True)
        _kube_cycle(tmp_path, apiserver, bearer)
    finally:
        emulator.stop()

    assert session_token, "the Redfish login did not create a session: the token check below would prove nothing"
    assert _ApiserverWithoutClusterApi.seen_authorization == [f"Bearer {bearer}"] * 2  # v1beta2, v1beta1
    secrets = {"Redfish password": password, "wrong Redfish password": wrong_password,
               "Redfish session token": session_token, "bearer token": bearer}
    for name in (certs.SERVER_KEY, certs.CLIENT_KEY, certs.CA_KEY, certs.CLIENT_CA_KEY):
        body = [line for line in (ours / name).read_text().splitlines() if not line.startswith("-----")]
        secrets.update({f"{name} line {i}": line for i, line in enumerate(body)})
    logged = caplog.text + "\n".join(str(r.args) for r in caplog.records)
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) > 10, "DEBUG logging was not on"
    leaked = [name for name, secret in secrets.items() if secret in logged]
    assert leaked == [], f"secrets in the logs: {leaked}"


def _grpc_cycle(address: str, credentials: grpc.ChannelCredentials) -> None:
    with grpc.secure_channel(address, credentials) as channel:
        stub = externalgrpc_pb2_grpc.CloudProviderStub(channel)
        stub.Refresh(pb.RefreshRequest(), timeout=TIMEOUT)
        stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT)
        stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=2), timeout=TIMEOUT)
        instances = stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=GROUP), timeout=TIMEOUT).instances
        stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=GROUP), timeout=TIMEOUT)
        stub.NodeGroupGetOptions(pb.NodeGroupAutoscalingOptionsRequest(
            id=GROUP, defaults=pb.NodeGroupAutoscalingOptions(scaleDownUtilizationThreshold=0.5)), timeout=TIMEOUT)
        stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=GROUP, nodes=[pb.ExternalGrpcNode(
            name=instances[0].id, providerID=instances[0].id, annotations={FAKE_NODE_REASON: "create-error"})]),
            timeout=TIMEOUT)
        stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=GROUP, delta=-1), timeout=TIMEOUT)
        with pytest.raises(grpc.RpcError):
            stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="MachineSet/x/unknown"), timeout=TIMEOUT)
        stub.Cleanup(pb.CleanupRequest(), timeout=TIMEOUT)


def _fabric_cycle(settings: Settings, expect_failure: bool = False) -> str:
    """Log in to Redfish, attach a GPU and detach it again; returns the session token the fabric was given."""
    fabric = build_fabric(settings, clock=time.time)
    try:
        token = fabric._http.headers.get("X-Auth-Token", "")  # the secret to look for; no public accessor by design
        request = AttachRequest(key="attach-1", node="node-a", pool="default", model="A30", count=1)
        if expect_failure:  # refused credentials: the service answers 401 and the attach is refused with it
            with pytest.raises(FabricError, match="401"):
                fabric.attach(request)
            return token
        operation = fabric.attach(request)
        deadline = time.monotonic() + 10
        while not operation.state.done and time.monotonic() < deadline:
            time.sleep(0.05)
            fabric.tick()
            operation = fabric.operation("attach-1") or operation
        assert operation.state.done and operation.error is None, operation
        detach = fabric.detach(DetachRequest(key="detach-1", node="node-a", device_ids=operation.devices))
        while not detach.state.done and time.monotonic() < deadline:
            time.sleep(0.05)
            fabric.tick()
            detach = fabric.operation("detach-1") or detach
        return token
    finally:
        fabric.close()


def _kube_cycle(tmp_path: Path, server: str, token: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(_kubeconfig(server, token)))
    lister = MachineSetLister(api_client(kubeconfig))
    assert lister.list() == []  # Cluster API not installed: no MachineSets, no error
