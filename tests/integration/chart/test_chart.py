"""charts/dds checked by the real tools: `helm lint` and `helm template` (helm built from its Go module by
hack/build-tools.sh) for several value sets, the rendered objects applied with a server-side dry run to the test
apiserver, and manifests/ (what `kubectl apply -k manifests/` installs) generated from the chart by
hack/gen-manifests.py, its kustomize render kept equal to the chart's.

Documented differences between the chart and kustomize (docs/install.md "Chart and manifests"): what the generator
leaves out of manifests/, the only ones the agreement test forgives:
- Helm's labels (helm.sh/chart, app.kubernetes.io/managed-by, instance, version) on every object and pod template;
- the pod templates' checksum/settings and checksum/client-tls annotations (a settings change restarts DDS, a changed
  client certificate Secret cluster-autoscaler);
- helm.sh/resource-policy: keep on the CRDs (uninstalling never deletes MachineSets);
- settings.yaml compared as parsed YAML, with the chart's required `fabric` and `pools` left out (the kustomize base
  leaves the fabric commented out for the user to choose, and a real fabric's pools are the user's to declare).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from dds.config import FabricBackend, NodeBackend, Settings
from dds.kube.leader_label import LEADER_LABEL, LEADER_VALUE
from harness import rbac
from harness.controlplane import ControlPlane
from harness.dry_run import dry_run_apply as check_by_dry_run
from harness.kustomize import render
from harness.pytest_plugin import own_control_plane
from tests.integration.chart.tools import CHART, KUBE_VERSION, ROOT, helm_template, run, set_args

MANIFESTS = ROOT / "manifests"
FIELD_MANAGER = "dds-chart-test"
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version")

# A real fabric's pools, which DDS (and so the chart) refuses to start without.
POOLS = {"settings.pools[0].name": "rack-1", "settings.pools[0].devices.A100": "16"}


def as_set_values(node: Any, path: str = "") -> dict[str, str]:
    """A values file as `--set path=value` pairs (lists by index, as helm's --set writes them)."""
    if isinstance(node, dict):
        return {k: v for key, child in node.items()
                for k, v in as_set_values(child, f"{path}.{key}" if path else key).items()}
    if isinstance(node, list):
        return {k: v for index, child in enumerate(node) for k, v in as_set_values(child, f"{path}[{index}]").items()}
    return {path: str(node).lower() if isinstance(node, bool) else str(node)}


# The choices manifests/ makes, as chart values: the file hack/gen-manifests.py renders manifests/ with.
AS_KUSTOMIZE = as_set_values(yaml.safe_load((ROOT / "hack" / "manifests-values.yaml").read_text()))
# Every optional object on: cert-manager TLS, the Prometheus Operator objects, the dashboard, a budget, Redfish.
EVERYTHING = {
    "fabric.backend": "redfish", **POOLS, "fabric.settings.endpoint": "https://redfish.example:8443",
    "fabric.settings.username": "dds", "fabric.redfish.passwordSecret": "redfish-password",
    "fabric.redfish.caSecret": "redfish-ca", "tls.certManager.enabled": "true",
    "tls.certManager.issuerRef.name": "dds-ca", "tls.certManager.clientIssuerRef.name": "dds-client-ca",
    "serviceMonitor.enabled": "true", "podMonitor.enabled": "true",
    "prometheusRule.enabled": "true", "dashboard.enabled": "true", "podDisruptionBudget.enabled": "true",
    "metricsReaderBinding.subjects[0].name": "prometheus-k8s",
    "metricsReaderBinding.subjects[0].namespace": "monitoring",
}
# A kwok test cluster: the simulated fabric, no cluster-autoscaler, CRDs installed by someone else. (Not plain metrics:
# the chart binds them to the pod's address, where DDS refuses them without metrics_secure: test_settings_refusals.py.)
MINIMAL = {"fabric.backend": "simulated", "clusterAutoscaler.enabled": "false", "crds.clusterApi": "false",
           "crds.composability": "false", "settings.node_backend": "machineset",
           "serviceMonitor.enabled": "true", "replicaCount": "1"}
# cert-manager with the chart's own CAs (a self-signed bootstrap) instead of issuers of the user's.
SELF_SIGNED = {**{k: v for k, v in EVERYTHING.items() if "IssuerRef" not in k and "issuerRef" not in k},
               "tls.certManager.issuerMode": "selfSigned"}
VALUE_SETS = {"as-kustomize": AS_KUSTOMIZE, "everything": EVERYTHING, "minimal": MINIMAL, "self-signed": SELF_SIGNED,
              "defaults": {"fabric.backend": "composability-request", **POOLS}}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def settings_of(objects: list[dict[str, Any]], name: str = "dds-settings") -> dict[str, Any]:
    return yaml.safe_load(find(objects, "ConfigMap", name)["data"]["settings.yaml"])


# --- helm lint and helm template (no cluster) ---

@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_passes(values: dict[str, str]) -> None:
    result = run("helm", "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, *set_args(values))
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_rendered_settings_are_settings_dds_accepts(values: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(settings_of(helm_template(values))))
    settings = Settings.load(path)  # raises on an unknown key or a malformed value, naming it
    assert settings.fabric == FabricBackend(values["fabric.backend"])
    assert settings.in_cluster and settings.namespace == "dds-system" and settings.lease_name == "dds-leader"


def test_a_missing_fabric_is_refused_with_the_choices() -> None:
    refused = helm_template({}, check=False)
    assert refused.returncode != 0
    assert "fabric.backend is required" in refused.stderr and "composability-request, redfish or simulated" in \
        refused.stderr, refused.stderr
    unknown = helm_template({"fabric.backend": "infiniband"}, check=False)  # values.schema.json
    assert unknown.returncode != 0 and "at '/fabric/backend': value must be one of" in unknown.stderr, unknown.stderr


def test_a_misspelt_value_is_refused_instead_of_ignored() -> None:
    refused = helm_template({"fabric.backend": "simulated", "replicas": "3"}, check=False)
    assert refused.returncode != 0 and "additional properties 'replicas' not allowed" in refused.stderr, \
        refused.stderr


def test_settings_the_chart_decides_cannot_be_overridden() -> None:
    refused = helm_template({"fabric.backend": "simulated", "settings.listen": "0.0.0.0:9000"}, check=False)
    assert refused.returncode != 0 and "settings.listen is set by the chart" in refused.stderr, refused.stderr


def test_the_release_name_and_namespace_name_everything() -> None:
    objects = helm_template({"fabric.backend": "simulated"}, namespace="gpu-scaling", release="edge")
    settings = settings_of(objects, "edge-dds-settings")
    assert settings["namespace"] == "gpu-scaling" and settings["lease_name"] == "edge-dds-leader"
    role = find(objects, "Role", "edge-dds")
    assert {"resourceNames": ["edge-dds-leader"]}.items() <= role["rules"][1].items()
    assert all(o["metadata"].get("namespace", "gpu-scaling") == "gpu-scaling" for o in objects)
    assert "--namespace=gpu-scaling" in find(objects, "Deployment", "cluster-autoscaler")["spec"]["template"][
        "spec"]["containers"][0]["command"]


def test_redfish_credentials_are_mounted_where_the_settings_point() -> None:
    objects = helm_template(EVERYTHING)
    settings = settings_of(objects)
    assert settings["redfish"] == {"endpoint": "https://redfish.example:8443", "username": "dds",
                                   "password_file": "/etc/dds/redfish/password/password",
                                   "ca_file": "/etc/dds/redfish/ca/ca.crt"}
    pod = find(objects, "Deployment", "dds")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["redfish-password"] == "/etc/dds/redfish/password" and mounts["redfish-ca"] == "/etc/dds/redfish/ca"
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets["redfish-password"] == "redfish-password" and secrets["redfish-ca"] == "redfish-ca"


def test_cert_manager_issues_both_ends_of_the_mutual_tls() -> None:
    objects = helm_template(EVERYTHING)
    server = find(objects, "Certificate", "dds")["spec"]
    assert "dds.dds-system.svc" in server["dnsNames"] and server["secretName"] == "dds-tls"
    client_cert = find(objects, "Certificate", "cluster-autoscaler-client")["spec"]
    # The client's name is the identity DDS admits (grpc_allowed_clients).
    assert client_cert["commonName"] in settings_of(objects)["grpc_allowed_clients"]
    cloud_config = yaml.safe_load(find(objects, "ConfigMap", "cluster-autoscaler-cloud-config")["data"][
        "cloud-config.yaml"])
    assert cloud_config["address"] == "dds.dds-system.svc:8086" and cloud_config["cert"] == "/config/tls/tls.crt"
    volumes = find(objects, "Deployment", "cluster-autoscaler")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "client-tls", "secret": {"secretName": "cluster-autoscaler-client-tls", "defaultMode": 0o440}} \
        in volumes


def mounted_file(pod: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret, key) behind a file path of the pod's first container."""
    folder, _, name = path.rpartition("/")
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == folder)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    keys = {item["path"]: item["key"] for item in volume["secret"].get("items", [])} or {name: name}
    return volume["secret"]["secretName"], keys[name]


def test_cert_manager_issues_the_client_from_another_ca_and_each_end_trusts_only_the_others_ca() -> None:
    objects = helm_template(EVERYTHING)
    server = find(objects, "Certificate", "dds")["spec"]
    client_cert = find(objects, "Certificate", "cluster-autoscaler-client")["spec"]
    assert server["issuerRef"]["name"] == "dds-ca" and client_cert["issuerRef"]["name"] == "dds-client-ca"
    assert "server auth" in server["usages"] and "client auth" in client_cert["usages"]
    # DDS verifies callers with the client certificate's CA, mounted without the client's key ...
    dds_pod = find(objects, "Deployment", "dds")["spec"]["template"]["spec"]
    assert mounted_file(dds_pod, settings_of(objects)["tls_ca"]) == (client_cert["secretName"], "ca.crt")
    # ... and cluster-autoscaler verifies DDS with the server certificate's CA, mounted without DDS's key.
    ca_pod = find(objects, "Deployment", "cluster-autoscaler")["spec"]["template"]["spec"]
    cloud_config = yaml.safe_load(find(objects, "ConfigMap", "cluster-autoscaler-cloud-config")["data"][
        "cloud-config.yaml"])
    assert mounted_file(ca_pod, cloud_config["cacert"]) == (server["secretName"], "ca.crt")


def test_a_self_signed_bootstrap_makes_two_cas_of_the_release_and_issues_each_end_from_its_own() -> None:
    objects = helm_template(SELF_SIGNED)
    assert find(objects, "Issuer", "dds-selfsigned")["spec"] == {"selfSigned": {}}
    issued_by = {}
    for ca in ("dds-server-ca", "dds-client-ca"):
        certificate = find(objects, "Certificate", ca)["spec"]
        assert certificate["isCA"] and certificate["issuerRef"] == {"name": "dds-selfsigned", "kind": "Issuer",
                                                                    "group": "cert-manager.io"}
        assert certificate["privateKey"]["rotationPolicy"] == "Never"  # a renewed CA still verifies what it issued
        assert find(objects, "Issuer", ca)["spec"] == {"ca": {"secretName": certificate["secretName"]}}
        issued_by[ca] = {"name": ca, "kind": "Issuer", "group": "cert-manager.io"}
    assert find(objects, "Certificate", "dds")["spec"]["issuerRef"] == issued_by["dds-server-ca"]
    assert find(objects, "Certificate", "cluster-autoscaler-client")["spec"]["issuerRef"] == issued_by["dds-client-ca"]
    # Without the chart's cluster-autoscaler there is no client certificate to issue: one CA, the server's.
    alone = helm_template({**SELF_SIGNED, "clusterAutoscaler.enabled": "false",
                           "tls.certManager.clientCaSecret": "callers-ca"})
    assert {o["metadata"]["name"] for o in alone if o["kind"] == "Issuer"} == {"dds-selfsigned", "dds-server-ca"}
    # The default keeps the issuers the user names, and the chart makes none.
    assert not [o for o in helm_template(EVERYTHING) if o["kind"] == "Issuer"]


def test_a_self_signed_bootstrap_refuses_issuers_named_beside_it() -> None:
    refused = helm_template({**SELF_SIGNED, "tls.certManager.issuerRef.name": "dds-ca"}, check=False)
    assert refused.returncode != 0 and "leave tls.certManager.issuerRef.name" in refused.stderr, refused.stderr


@pytest.mark.parametrize("values,message", [
    ({"tls.certManager.clientIssuerRef.name": ""}, "tls.certManager.clientIssuerRef.name: name a second CA issuer"),
    ({"tls.certManager.clientIssuerRef.name": "dds-ca"}, "must be another issuer than issuerRef"),
    ({"clusterAutoscaler.enabled": "false"}, "tls.certManager.clientCaSecret"),
], ids=["no-client-issuer", "the-server-issuer", "no-client-ca-without-the-autoscaler"])
def test_cert_manager_refuses_one_ca_for_both_ends(values: dict[str, str], message: str) -> None:
    refused = helm_template({**EVERYTHING, **values}, check=False)
    assert refused.returncode != 0 and message in refused.stderr, refused.stderr


def test_defaults_follow_cluster_autoscalers_chart() -> None:
    objects = helm_template({"fabric.backend": "composability-request", **POOLS})
    for name in ("dds", "cluster-autoscaler"):
        assert find(objects, "Deployment", name)["spec"]["template"]["spec"]["priorityClassName"] == \
            "system-cluster-critical"
    assert find(objects, "PodDisruptionBudget", "cluster-autoscaler")["spec"]["maxUnavailable"] == 1



def test_every_replica_ready_upgrades_one_at_a_time_and_the_service_selects_the_leader() -> None:
    """Every replica is Ready once it can serve: a rolling update never has fewer Ready replicas than asked for, a
    budget lets a drain take one at a time, and cluster-autoscaler's Service selects the leader's label only."""
    for objects in (helm_template({"fabric.backend": "composability-request", **POOLS}), render(MANIFESTS)):
        assert find(objects, "Deployment", "dds")["spec"]["strategy"] == \
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        assert find(objects, "PodDisruptionBudget", "dds")["spec"]["maxUnavailable"] == 1
        assert find(objects, "Service", "dds")["spec"]["selector"] == \
            {"app.kubernetes.io/name": "dds", LEADER_LABEL: LEADER_VALUE}


def test_manifests_are_generated_from_the_chart() -> None:
    """manifests/' DDS and cluster-autoscaler objects, RBAC and CRDs are hack/gen-manifests.py's output: the chart
    rendered with hack/manifests-values.yaml, and the chart's files/ (one source, docs/install.md "Chart and
    manifests")."""
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "gen-manifests.py"), "--check"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# One value set per fabric, and reservations on with one of them: `helm template` takes a second or two each.
GRANT_CHOICES = [(backend.value, False) for backend in FabricBackend] + [(FabricBackend.SIMULATED.value, True)]


@pytest.mark.parametrize("fabric, reservations", GRANT_CHOICES, ids=lambda v: str(v))
def test_the_chart_grants_dds_what_its_fabric_and_features_ship_with(fabric: str, reservations: bool) -> None:
    """The chart renders the same files as manifests/rbac/<fabric> (and reservations'), picked by its values: what
    DDS may do is what an e2e stack of that fabric runs under (harness/rbac.py dds_for), nothing of another fabric."""
    pools = POOLS if fabric != FabricBackend.SIMULATED.value else {}
    objects = helm_template({"fabric.backend": fabric, **pools, "settings.reservations": str(reservations).lower()})
    assert rbac.grants_of(objects, "dds", "dds-system") == rbac.granted(rbac.dds_for(fabric, reservations=reservations))
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    assert policies == {"dds-node-writes", "dds-resourceslice-writes", "dds-own-pod-writes"} | \
        ({"dds-pod-writes"} if reservations else set())


def test_the_admission_policies_and_state_configmaps_follow_the_release() -> None:
    objects = helm_template({"fabric.backend": "simulated", "settings.reservations": "true",
                             "fabric.settings.state_configmap": "edge-fabric"}, namespace="gpu-scaling", release="edge")
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    assert set(policies) == {"edge-dds-node-writes", "edge-dds-resourceslice-writes", "edge-dds-pod-writes",
                             "edge-dds-own-pod-writes"}
    for policy in policies.values():
        condition = policy["spec"]["matchConditions"][0]
        assert condition["expression"] == "request.userInfo.username == 'system:serviceaccount:gpu-scaling:edge-dds'"
    # DDS's own namespace is the ServiceAccount's, whichever the release's: no namespace written in the expression.
    assert [c["name"] for c in policies["edge-dds-own-pod-writes"]["spec"]["matchConditions"]] == \
        ["dds-service-account", "own-namespace"]
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(policies)
    state = find(objects, "Role", "edge-dds-simulated")
    assert [rule["resourceNames"] for rule in state["rules"]] == [["edge-fabric"]]


def test_the_network_policies_bound_egress_and_cluster_autoscalers_metrics() -> None:
    def egress_ports(policy: dict[str, Any]) -> set[int]:
        return {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]}

    redfish = helm_template(EVERYTHING)  # fabric.settings.endpoint https://redfish.example:8443
    assert 8443 in egress_ports(find(redfish, "NetworkPolicy", "dds"))
    autoscaler = find(redfish, "NetworkPolicy", "cluster-autoscaler")
    assert autoscaler["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert [peer for rule in autoscaler["spec"]["ingress"] for peer in rule["from"]] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    composability = helm_template({"fabric.backend": "composability-request", **POOLS})
    assert egress_ports(find(composability, "NetworkPolicy", "dds")) == {53, 443, 6443}
    narrowed = helm_template({"fabric.backend": "redfish", **POOLS, "networkPolicy.apiServer.cidrs[0]": "10.0.0.1/32",
                              "networkPolicy.fabricEndpoints[0].cidrs[0]": "10.1.0.5/32",
                              "networkPolicy.fabricEndpoints[0].port": "8000"})
    rules = find(narrowed, "NetworkPolicy", "dds")["spec"]["egress"]
    assert [rule["to"] for rule in rules[1:]] == [[{"ipBlock": {"cidr": "10.0.0.1/32"}}],
                                                  [{"ipBlock": {"cidr": "10.1.0.5/32"}}]]
    assert rules[2]["ports"] == [{"port": 8000, "protocol": "TCP"}]


def test_crds_are_left_out_when_cluster_api_or_the_operator_brings_them() -> None:
    def crd_groups(values: dict[str, str]) -> set[str]:
        return {o["spec"]["group"] for o in helm_template(values) if o["kind"] == "CustomResourceDefinition"}

    base = {"fabric.backend": "composability-request", **POOLS, "crds.clusterApi": "true", "crds.composability": "true"}
    assert crd_groups(base) == {"cluster.x-k8s.io", "cro.hpsys.ibm.ie.com"}
    assert crd_groups({**base, "crds.clusterApi": "false"}) == {"cro.hpsys.ibm.ie.com"}
    assert crd_groups({**base, "crds.clusterApi": "false", "crds.composability": "false"}) == set()


# --- the chart and kustomize agree ---

def normalised(objects: list[dict[str, Any]], from_helm: bool) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for original in objects:
        obj = copy.deepcopy(original)
        metadatas = [obj["metadata"]]
        template = (obj.get("spec") or {}).get("template")
        if obj["kind"] in ("Deployment",) and template:
            metadatas.append(template["metadata"])
        for metadata in metadatas:
            for label in HELM_LABELS if from_helm else ():
                (metadata.get("labels") or {}).pop(label, None)
            annotations = metadata.get("annotations") or {}
            for annotation in ("checksum/settings", "checksum/client-tls", "helm.sh/resource-policy") if from_helm else ():
                annotations.pop(annotation, None)
            if "annotations" in metadata and not annotations:
                del metadata["annotations"]
        if obj["kind"] == "ConfigMap" and "settings.yaml" in obj.get("data", {}):
            settings = yaml.safe_load(obj["data"]["settings.yaml"])
            settings.pop("fabric", None)
            settings.pop("pools", None)
            obj["data"]["settings.yaml"] = settings
        out[(obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj
    return out


def test_the_chart_renders_what_kustomize_renders_for_the_same_choices() -> None:
    from_kustomize = normalised(render(MANIFESTS), from_helm=False)
    from_helm = normalised(helm_template(AS_KUSTOMIZE), from_helm=True)
    assert sorted(from_helm) == sorted(from_kustomize)
    for key, expected in from_kustomize.items():
        assert from_helm[key] == expected, f"{key}: the chart and manifests/ differ"


# --- the test apiserver accepts every rendered object (server-side apply, dryRun=All) ---

def dry_run_apply(dynamic: DynamicClient, objects: list[dict[str, Any]]) -> list[str]:
    return check_by_dry_run(dynamic, objects, FIELD_MANAGER)


# The Prometheus Operator's and cert-manager's CRDs, vendored with their origin noted (harness/crds/README-chart.md).
FOREIGN_CRDS = [ROOT / "harness" / "crds" / "prometheus-operator", ROOT / "harness" / "crds" / "cert-manager"]


@pytest.fixture(scope="module")
def plane_without_cluster_api(request: pytest.FixtureRequest,
                              tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """An apiserver of this module's own, with DDS's CRD copies and no Cluster API: the copies the chart can render
    (`crds.clusterApi`) are for clusters without Cluster API, and must not be applied over its own CRDs, which the
    session's control plane runs."""
    yield from own_control_plane(request, tmp_path_factory, scheduler=False, kwok=False)


@pytest.fixture(scope="module")
def dynamic(plane_without_cluster_api: ControlPlane) -> DynamicClient:
    plane_without_cluster_api.install_crds(FOREIGN_CRDS)
    api = plane_without_cluster_api.api_client()
    for namespace in ("dds-system", "gpu-scaling"):  # namespaced dry-runs need the namespace to exist for real
        try:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        except client.ApiException as error:
            if error.status != 409:
                raise
    return DynamicClient(api)


@pytest.mark.integration
@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_accepted_by_the_apiserver(dynamic: DynamicClient, values: dict[str, str]) -> None:
    objects = helm_template(values)
    assert dry_run_apply(dynamic, objects) == []


@pytest.mark.integration
def test_a_release_in_another_namespace_is_accepted(dynamic: DynamicClient) -> None:
    objects = helm_template({"fabric.backend": "simulated"}, namespace="gpu-scaling", release="edge")
    assert dry_run_apply(dynamic, objects) == []


def test_every_value_set_renders_the_deployment_dds_runs() -> None:
    for name, values in VALUE_SETS.items():
        deployment = find(helm_template(values), "Deployment", "dds")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["args"] == \
            ["serve", "--config", "/etc/dds/settings.yaml"], name
    minimal = find(helm_template(MINIMAL), "Deployment", "dds")["spec"]["template"]["spec"]["containers"][0]
    assert minimal["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"  # metrics_secure: the only choice on a pod address
    assert settings_of(helm_template(MINIMAL))["node_backend"] == NodeBackend.MACHINESET.value


@pytest.mark.integration
def test_the_dry_run_refuses_a_misspelt_field(dynamic: DynamicClient) -> None:
    """The check above is not vacuous: an object the apiserver would not store as written is reported."""
    monitor = find(helm_template(EVERYTHING), "ServiceMonitor", "dds")
    monitor["spec"]["endpoints"][0]["intervall"] = monitor["spec"]["endpoints"][0].pop("interval")
    [problem] = dry_run_apply(dynamic, [monitor])
    assert "intervall" in problem, problem
