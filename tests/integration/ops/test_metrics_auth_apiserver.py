"""Who may read /metrics and /decisions, decided by the real apiserver (issue 25, item 5).

DDS is built by `build_app` with `metrics_secure` and runs as its ServiceAccount under the RBAC manifests/dds ships
(harness/rbac.py): its TokenReviews and SubjectAccessReviews pass only if that RBAC grants them. The scrapers are
ServiceAccounts of the test's namespace with tokens from the TokenRequest API; one is bound to the shipped ClusterRole
dds-metrics-reader, the other to nothing. The manifests' side (settings, probes, NetworkPolicy) is checked on the
rendered objects at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import requests
from kubernetes import client

from dds import certs
from dds.app import App, build_app
from dds.config import FabricBackend, NodeBackend, Settings
from dds.ops.http import check_metrics_settings
from harness import rbac
from harness.kustomize import render

ROOT = Path(__file__).resolve().parents[3]
READER_ROLE = "dds-metrics-reader"
GRANT_PROPAGATION_SECONDS = 30.0  # the apiserver's RBAC authorizer sees a new binding through its informer


def mint_token(core: client.CoreV1Api, namespace: str, name: str) -> str:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    return core.create_namespaced_service_account_token(name, namespace, request).status.token


@dataclass
class Endpoint:
    app: App
    ca_file: Path
    scraper_token: str
    stranger_token: str

    def get(self, path: str, token: Optional[str] = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.get(f"https://127.0.0.1:{self.app.ops.port}{path}", headers=headers,
                            verify=str(self.ca_file), timeout=10)

    def get_once_granted(self, path: str, token: str) -> requests.Response:
        """The answer once the binding the fixture made has reached the apiserver's authorizer."""
        deadline = time.monotonic() + GRANT_PROPAGATION_SECONDS
        response = self.get(path, token)
        while response.status_code == 403 and time.monotonic() < deadline:
            time.sleep(0.2)
            response = self.get(path, token)
        return response


@pytest.fixture
def endpoint(control_plane: Any, namespace: str, tmp_path: Path) -> Iterator[Endpoint]:
    admin = control_plane.api_client()
    core, rbac_api = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    dds_api = rbac.api_client(rbac.install(control_plane, rbac.DDS))  # applies the shipped ClusterRoles too
    scraper_token = mint_token(core, namespace, "scraper")
    stranger_token = mint_token(core, namespace, "stranger")
    binding = f"{namespace}-scraper"
    rbac_api.create_cluster_role_binding({
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}]})
    bundle = certs.generate_bundle(["localhost"], ["127.0.0.1"], days=1)
    files = {name: tmp_path / name for name in ("ca.crt", "tls.crt", "tls.key")}
    for name, content in (("ca.crt", bundle.ca.cert_pem), ("tls.crt", bundle.server.cert_pem),
                          ("tls.key", bundle.server.key_pem)):
        files[name].write_bytes(content)
    settings = Settings(listen="127.0.0.1:0", insecure=True, namespace=namespace, machineset_namespaces=[namespace],
                        node_backend=NodeBackend.MACHINESET, fabric=FabricBackend.SIMULATED,
                        metrics_listen="127.0.0.1:0", metrics_secure=True,
                        metrics_tls_cert=files["tls.crt"], metrics_tls_key=files["tls.key"])
    app = build_app(settings, dds_api)
    app.ops.start()
    try:
        yield Endpoint(app, files["ca.crt"], scraper_token, stranger_token)
    finally:
        app.stop()
        rbac_api.delete_cluster_role_binding(binding)


@pytest.mark.integration
def test_an_unauthenticated_scrape_is_refused(endpoint: Endpoint) -> None:
    missing = endpoint.get("/metrics")
    assert missing.status_code == 401 and "no bearer token" in missing.text, missing.text
    forged = endpoint.get("/metrics", token="not-a-token-the-apiserver-signed")
    assert forged.status_code == 401 and "TokenReview" in forged.text, forged.text


@pytest.mark.integration
def test_a_token_without_the_grant_is_refused(endpoint: Endpoint, namespace: str) -> None:
    for path in ("/metrics", "/decisions"):
        response = endpoint.get(path, endpoint.stranger_token)
        assert response.status_code == 403, response.text
        assert f'user "system:serviceaccount:{namespace}:stranger" may not get {path}' in response.text


@pytest.mark.integration
def test_an_authorized_token_is_served(endpoint: Endpoint) -> None:
    metrics = endpoint.get_once_granted("/metrics", endpoint.scraper_token)
    assert metrics.status_code == 200, metrics.text
    assert "dds_apiserver_requests_total" in metrics.text
    decisions = endpoint.get("/decisions?format=json", endpoint.scraper_token)
    assert decisions.status_code == 200 and decisions.headers["Content-Type"] == "application/json", decisions.text


@pytest.mark.integration
def test_probes_stay_open_to_the_kubelet(endpoint: Endpoint) -> None:
    assert endpoint.get("/healthz").status_code == 200
    assert endpoint.get("/readyz").status_code in (200, 503)  # answered (not started here), never 401


# --- what the manifests ship (rendered, no cluster needed) ---

@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render(ROOT / "manifests" / "dds") + render(ROOT / "manifests" / "cluster-autoscaler")


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [match] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return match


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


def test_scrapers_get_a_cluster_role_for_metrics_and_decisions(rendered: list[dict[str, Any]]) -> None:
    role = find(rendered, "ClusterRole", READER_ROLE)
    assert role["rules"] == [{"nonResourceURLs": ["/metrics", "/decisions"], "verbs": ["get"]}]


def test_the_shipped_settings_serve_metrics_authenticated_over_tls(rendered: list[dict[str, Any]],
                                                                   tmp_path: Path) -> None:
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(find(rendered, "ConfigMap", "dds-settings")["data"]["settings.yaml"])
    settings = Settings.load(settings_file)
    assert settings.metrics_secure and settings.metrics_listen == "0.0.0.0:8087"
    check_metrics_settings(settings)  # a serving certificate is named (the gRPC server's)
    dds = container(find(rendered, "Deployment", "dds"))
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert dds[probe]["httpGet"]["scheme"] == "HTTPS", probe


def test_the_network_policy_admits_only_the_autoscaler_and_monitoring(rendered: list[dict[str, Any]]) -> None:
    policy = find(rendered, "NetworkPolicy", "dds")
    dds_deployment = find(rendered, "Deployment", "dds")
    ca_deployment = find(rendered, "Deployment", "cluster-autoscaler")
    assert policy["metadata"]["namespace"] == dds_deployment["metadata"]["namespace"]
    labels = dds_deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    # Egress is limited too (cluster DNS, the apiserver, the fabric endpoints: docs/operations.md): every rule names
    # its ports, none is an open egress.
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] and all(rule.get("ports") for rule in policy["spec"]["egress"])
    ports = {p["name"]: p["containerPort"] for p in container(dds_deployment)["ports"]}
    admitted = {}
    for rule in policy["spec"]["ingress"]:
        [peer] = rule["from"]
        [port] = rule["ports"]
        assert port["port"] in ports, f"{port['port']} is not a port of DDS's container"
        admitted[port["port"]] = peer
    assert set(admitted) == {"grpc", "metrics"}
    autoscaler = admitted["grpc"]
    assert "namespaceSelector" not in autoscaler  # the policy's own namespace, where the autoscaler runs
    assert ca_deployment["metadata"]["namespace"] == policy["metadata"]["namespace"]
    assert autoscaler["podSelector"]["matchLabels"].items() <= \
        ca_deployment["spec"]["template"]["metadata"]["labels"].items()
    assert admitted["metrics"] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
