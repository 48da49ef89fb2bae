"""manifests/: what a user applies. Rendered with the small kustomize walk of harness/kustomize.py, checked for the
promises the operations guide makes, and applied to the real apiserver with server-side dry-run (dryRun=All). The RBAC
rules themselves are checked against what the code sends (harness/rbac.py, tests/integration/ops/test_rbac_audit.py);
here, their wiring: who they are bound to, and that the ServiceAccount kubeconfigs the tests use are those identities."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from dds.commands import certs as certs_command
from dds.config import Settings
from harness import rbac
from harness.controlplane import ControlPlane
from harness.dry_run import dry_run_apply as check_by_dry_run
from harness.kustomize import render
from harness.pytest_plugin import own_control_plane

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "manifests"
FIELD_MANAGER = "dds-manifest-test"


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """DDS and cluster-autoscaler (the root kustomization without the CRDs, which are checked on their own below)."""
    return render(MANIFESTS / "dds") + render(MANIFESTS / "cluster-autoscaler")


def test_the_root_kustomization_includes_the_crds_and_both_deployments() -> None:
    objects = render(MANIFESTS)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("Deployment", "dds"), ("Deployment", "cluster-autoscaler"), ("Namespace", "dds-system")} <= kinds
    crd_groups = {o["spec"]["group"] for o in objects if o["kind"] == "CustomResourceDefinition"}
    assert {"cluster.x-k8s.io", "cro.hpsys.ibm.ie.com"} <= crd_groups


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


# --- what the rendered manifests promise (no cluster needed) ---

def test_the_dds_image_is_the_kustomize_placeholder(rendered: list[dict[str, Any]]) -> None:
    assert container(find(rendered, "Deployment", "dds"))["image"] == "ghcr.io/dds-project/dds:0.1.0"


def test_no_rbac_rule_uses_a_wildcard(rendered: list[dict[str, Any]]) -> None:
    for role in (o for o in rendered if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), f"{role['kind']} {role['metadata']['name']}: {rule}"


# What DDS's roles grant is checked against what the code does, not against a table: every integration and e2e test
# runs DDS under these rendered roles (harness/rbac.py), a 403 fails the test, and tests/integration/ops/
# test_rbac_audit.py compares the grants with the requests the audit log recorded. Here: the wiring around the rules.

@pytest.mark.parametrize("identity", [rbac.DDS, rbac.AUTOSCALER], ids=lambda i: i.name)
def test_each_deployment_runs_as_the_service_account_its_roles_are_bound_to(rendered: list[dict[str, Any]],
                                                                           identity: rbac.Identity) -> None:
    deployment = find(rendered, "Deployment", identity.name)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == identity.name
    assert find(rendered, "ServiceAccount", identity.name)["metadata"]["namespace"] == identity.namespace
    subjects = [(b["kind"], b["roleRef"]["kind"], s) for b in rendered if b["kind"].endswith("Binding")
                for s in b.get("subjects", ()) if s["name"] == identity.name]  # admission bindings have none
    assert {kind for kind, _, _ in subjects} == {"ClusterRoleBinding", "RoleBinding"}
    assert all(s == {"kind": "ServiceAccount", "name": identity.name, "namespace": identity.namespace}
               for _, _, s in subjects)
    assert rbac.granted(identity), "bound roles grant something"


def test_dds_role_names_the_lease_its_settings_use(rendered: list[dict[str, Any]]) -> None:
    settings = yaml.safe_load(find(rendered, "ConfigMap", "dds-settings")["data"]["settings.yaml"])
    role = find(rendered, "Role", "dds")
    assert role["metadata"]["namespace"] == settings["namespace"]
    named = [rule for rule in role["rules"] if "leases" in rule["resources"] and rule.get("resourceNames")]
    assert [rule["resourceNames"] for rule in named] == [[settings["lease_name"]]]


@pytest.mark.integration
@pytest.mark.parametrize("identity", [rbac.DDS, rbac.AUTOSCALER], ids=lambda i: i.name)
def test_the_service_account_kubeconfig_is_that_identity_and_holds_only_its_grants(control_plane: Any,
                                                                                  identity: rbac.Identity) -> None:
    with rbac.api_client(rbac.install(control_plane, identity)) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review({"apiVersion": "authentication.k8s.io/v1",
                                                                             "kind": "SelfSubjectReview"})
        assert review.status.user_info.username == identity.username
        assert "system:masters" not in (review.status.user_info.groups or [])

        def allowed(verb: str, resource: str, group: str = "", namespace: str = "") -> bool:
            answer = client.AuthorizationV1Api(api).create_self_subject_access_review({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                                "namespace": namespace}}})
            return bool(answer.status.allowed)

        assert allowed("list", "nodes") and allowed("create", "leases", "coordination.k8s.io", identity.namespace)
        assert not allowed("get", "secrets", namespace=identity.namespace)
        assert not allowed("delete", "pods", namespace="default")


def test_settings_config_map_is_valid_for_dds(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(find(rendered, "ConfigMap", "dds-settings")["data"]["settings.yaml"])
    settings = Settings.load(settings_file)
    assert settings.leader_election and settings.in_cluster
    assert settings.metrics_listen.endswith(":8087") and settings.listen.endswith(":8086")
    deployment = find(rendered, "Deployment", "dds")
    mounts = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}
    assert str(settings.tls_cert).startswith(mounts["tls"] + "/"), "the TLS paths point into the mounted Secret"


def test_dds_deployment_runs_two_hardened_replicas_with_probes(rendered: list[dict[str, Any]]) -> None:
    deployment = find(rendered, "Deployment", "dds")
    spec = deployment["spec"]["template"]["spec"]
    dds = container(deployment)
    assert deployment["spec"]["replicas"] == 2
    assert (dds["livenessProbe"]["httpGet"]["path"], dds["readinessProbe"]["httpGet"]["path"]) == ("/healthz", "/readyz")
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert dds["securityContext"]["readOnlyRootFilesystem"] is True
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in spec["volumes"]}["tls"] == "dds-tls"


def test_dds_service_exposes_grpc_and_metrics(rendered: list[dict[str, Any]]) -> None:
    ports = {p["name"]: p["port"] for p in find(rendered, "Service", "dds")["spec"]["ports"]}
    assert ports == {"grpc": 8086, "metrics": 8087}


def test_cluster_autoscaler_reads_the_cloud_config_dds_certs_writes(rendered: list[dict[str, Any]],
                                                                    tmp_path: Path) -> None:
    deployment = find(rendered, "Deployment", "cluster-autoscaler")
    ca = container(deployment)
    assert "--cloud-provider=externalgrpc" in ca["command"]
    assert "--cloud-config=/config/cloud-config.yaml" in ca["command"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    [mount] = [m for m in ca["volumeMounts"] if m["mountPath"] == "/config"]
    secret_name = volumes[mount["name"]]["secret"]["secretName"]

    _, ca_secret = certs_secrets(tmp_path)
    assert ca_secret["metadata"]["name"] == secret_name
    cloud_config = yaml.safe_load(ca_secret["stringData"]["cloud-config.yaml"])
    assert cloud_config["address"] == "dds.dds-system.svc:8086"
    for key in ("cert", "key", "cacert"):
        assert Path(cloud_config[key]).name in ca_secret["stringData"] and cloud_config[key].startswith("/config/")


def certs_secrets(out: Path) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser()
    certs_command.register(parser.add_subparsers())
    args = parser.parse_args(["certs", "--out", str(out), "--dns", "dds.dds-system.svc", "--files-dir", "/config"])
    assert args.func(args) == 0
    return list(yaml.safe_load_all((out / "secrets.yaml").read_text()))


# --- the real apiserver accepts every object (server-side apply, dryRun=All) ---

def dry_run_apply(dynamic: DynamicClient, objects: list[dict[str, Any]]) -> list[str]:
    return check_by_dry_run(dynamic, objects, FIELD_MANAGER)


def dynamic_client(plane: ControlPlane) -> DynamicClient:
    api = plane.api_client()
    namespace = yaml.safe_load((MANIFESTS / "dds" / "namespace.yaml").read_text())
    try:  # namespaced dry-runs need the namespace to exist for real
        client.CoreV1Api(api).create_namespace(namespace)
    except client.ApiException as error:
        if error.status != 409:
            raise
    return DynamicClient(api)


@pytest.fixture(scope="module")
def plane_without_cluster_api(request: pytest.FixtureRequest,
                              tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """An apiserver of this module's own, without Cluster API: the root kustomization carries DDS's CRD copies, which
    are for clusters without Cluster API (docs/install.md) and must not be applied over its own CRDs."""
    yield from own_control_plane(request, tmp_path_factory, scheduler=False, kwok=False)


@pytest.fixture(scope="module")
def dynamic(plane_without_cluster_api: ControlPlane) -> DynamicClient:
    return dynamic_client(plane_without_cluster_api)


@pytest.fixture(scope="module")
def beside_cluster_api(control_plane: ControlPlane) -> DynamicClient:
    """The session's control plane, which runs Cluster API's own manager and CRDs, as a kind cluster after
    `clusterctl init` does."""
    return dynamic_client(control_plane)


@pytest.mark.integration
def test_every_manifest_is_accepted_by_the_apiserver(dynamic: DynamicClient) -> None:
    assert dry_run_apply(dynamic, render(MANIFESTS)) == []


@pytest.mark.integration
def test_the_example_machineset_is_accepted_by_the_apiserver(dynamic: DynamicClient) -> None:
    assert dry_run_apply(dynamic, render(MANIFESTS / "examples")) == []


@pytest.mark.integration
def test_the_secrets_dds_certs_writes_are_accepted(dynamic: DynamicClient, tmp_path: Path) -> None:
    assert dry_run_apply(dynamic, certs_secrets(tmp_path)) == []


@pytest.mark.integration
def test_the_demo_pod_is_accepted(dynamic: DynamicClient) -> None:
    pod = yaml.safe_load((MANIFESTS / "examples" / "demo-pod.yaml").read_text())
    assert dry_run_apply(dynamic, [pod]) == []


@pytest.mark.integration
def test_the_kind_overlay_runs_dds_as_shipped_beside_cluster_api(beside_cluster_api: DynamicClient) -> None:
    """No node backend of its own on kind: Cluster API's controllers make the machines (hack/kind-up.sh), so DDS's
    Deployment is the base's, on the simulated fabric, and nothing grants it to create Machines or Nodes. The overlay
    leaves DDS's copies of Cluster API's CRDs out: applied over the ones `clusterctl init` installed, they would fail
    (their fields are the manager's) or, forced, drop the conversion webhook."""
    objects = render(MANIFESTS / "overlays" / "kind")
    assert not [o for o in objects if o["kind"] == "CustomResourceDefinition"
                and o["spec"]["group"] == "cluster.x-k8s.io"]
    env = {e["name"]: e.get("value") for e in container(find(objects, "Deployment", "dds"))["env"]}
    assert "DDS_NODE_BACKEND" not in env and Settings.model_fields["node_backend"].default.value == "machineset"
    assert env["DDS_FABRIC"] == "simulated"
    creates = {(group, resource) for o in objects if o["kind"] in ("ClusterRole", "Role")
               for rule in o["rules"] if "create" in rule.get("verbs", ())
               for group in rule.get("apiGroups", ()) for resource in rule.get("resources", ())}
    assert not creates & {("cluster.x-k8s.io", "machines"), ("", "nodes")}, creates
    assert dry_run_apply(beside_cluster_api, objects) == []


@pytest.mark.integration
@pytest.mark.parametrize("feature", sorted(d.name for d in (MANIFESTS / "rbac").iterdir() if d.is_dir()))
def test_each_fabrics_and_features_grants_are_accepted(dynamic: DynamicClient, feature: str) -> None:
    assert dry_run_apply(dynamic, render(MANIFESTS / "rbac" / feature)) == []


def test_the_root_kustomization_ships_the_composability_fabrics_grants_and_the_kind_overlay_the_simulated() -> None:
    def roles(objects: list[dict[str, Any]]) -> set[str]:
        return {o["metadata"]["name"] for o in objects if o["kind"] in ("ClusterRole", "Role")}

    assert {"dds-composability-request"} <= roles(render(MANIFESTS)) and "dds-simulated" not in roles(render(MANIFESTS))
    assert {"dds-simulated", "dds-composability-request"} <= roles(render(MANIFESTS / "overlays" / "kind"))
    # Reservations are on by default (issue 41), so their grant ships with the root kustomization and the overlay.
    assert "dds-reservations" in roles(render(MANIFESTS))
    assert "dds-reservations" in roles(render(MANIFESTS / "overlays" / "kind"))


def test_network_policies_bound_egress_and_who_reaches_each_metrics_port(rendered: list[dict[str, Any]]) -> None:
    dds, autoscaler = find(rendered, "NetworkPolicy", "dds"), find(rendered, "NetworkPolicy", "cluster-autoscaler")
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    for policy in (dds, autoscaler):
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        egress_ports = {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert {(53, "UDP"), (443, "TCP"), (6443, "TCP")} <= egress_ports
    assert autoscaler["spec"]["ingress"] == [{"from": monitoring, "ports": [{"port": "metrics", "protocol": "TCP"}]}]
    [to_dds] = [rule for rule in autoscaler["spec"]["egress"] if rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]]
    assert to_dds["to"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "dds"}}}]
