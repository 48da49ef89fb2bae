"""harness/rbac.py gives DDS and cluster-autoscaler exactly the RBAC manifests/ renders (not a copy of it), and moves
DDS's Role to another namespace without changing who it is for."""

from __future__ import annotations

from harness import rbac
from harness.audit import Grant
from harness.kustomize import render


def test_each_identity_applies_the_rbac_objects_its_kustomization_renders() -> None:
    for identity in rbac.IDENTITIES:
        rendered = render(identity.manifests)
        for feature in identity.features:
            rendered += render(rbac.FEATURE_MANIFESTS / feature)
        installed = [o for o in rendered if o["kind"] in rbac.RBAC_KINDS + rbac.ADMISSION_KINDS]
        assert identity.objects() == installed
        assert set(rbac.RBAC_KINDS) <= {o["kind"] for o in installed}
    assert {o["kind"] for o in rbac.DDS.objects()} == set(rbac.RBAC_KINDS + rbac.ADMISSION_KINDS)


def test_each_fabric_gets_only_its_own_grants() -> None:
    """What an e2e stack installs for one fabric (harness/stack.py) holds nothing only another fabric needs, and pod
    writes beyond DDS's own namespace (its Role: the leader's Pod label) only with reservations."""
    nodes_status = Grant("patch", "nodes", "status", "")
    requests = Grant("create", "composabilityrequests", "", "cro.hpsys.ibm.ie.com")
    pod_patch = Grant("patch", "pods", "", "")
    assert nodes_status in rbac.granted(rbac.dds_for("simulated"))
    for fabric in ("composability-request", "redfish"):
        assert nodes_status not in rbac.granted(rbac.dds_for(fabric)), fabric
    assert requests in rbac.granted(rbac.dds_for("composability-request"))
    assert requests not in rbac.granted(rbac.dds_for("simulated"))
    def cluster_wide(identity: rbac.Identity) -> set[Grant]:
        return set().union(*(rbac.rule_grants(rule) for obj in identity.objects() if obj["kind"] == "ClusterRole"
                             for rule in obj.get("rules", [])))

    for fabric in rbac.FABRIC_FEATURES:
        assert pod_patch in rbac.granted(rbac.dds_for(fabric)), fabric  # the Role in dds-system
        assert pod_patch not in cluster_wide(rbac.dds_for(fabric)), fabric
        assert pod_patch in cluster_wide(rbac.dds_for(fabric, reservations=True)), fabric
    assert rbac.granted(rbac.DDS) == set().union(*(rbac.granted(rbac.dds_for(f, reservations=True))
                                                   for f in rbac.FABRIC_FEATURES))


def test_dra_pool_mode_may_write_claims_and_their_status() -> None:
    granted = rbac.granted(rbac.DDS)
    assert Grant("patch", "resourceclaims", "", "resource.k8s.io") in granted
    assert Grant("update", "resourceclaims", "status", "resource.k8s.io") in granted


def test_only_roles_bound_to_the_service_account_count() -> None:
    # dds-metrics-reader ships with DDS's manifests but is for scrapers: bound to nobody, granted to no one here.
    assert not any(g.resource == "" for g in rbac.granted(rbac.DDS))
    assert Grant("get", "secrets", "", "") not in rbac.granted(rbac.DDS)


def test_the_role_moved_to_a_test_namespace_still_names_dds_service_account() -> None:
    moved = rbac.namespaced_objects(rbac.DDS, "test-1234")
    # DDS's own Role, and the Roles of the fabrics whose state ConfigMaps live there (manifests/rbac/<fabric>).
    assert [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in moved] == [
        (kind, name, "test-1234") for name in ("dds", "dds-redfish", "dds-simulated") for kind in ("Role", "RoleBinding")]
    for binding in (o for o in moved if o["kind"] == "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dds", "namespace": "dds-system"}]
    assert all(o["metadata"]["namespace"] == "dds-system" for o in rbac.DDS.objects()
               if o["kind"] in rbac.NAMESPACED_ROLE_KINDS), "the rendered manifests are not changed"


def test_the_kubeconfig_names_the_service_account_user() -> None:
    document = rbac.kubeconfig_document("https://127.0.0.1:6443", b"CA", rbac.AUTOSCALER, "t0ken")
    assert document["users"] == [{"name": "system:serviceaccount:dds-system:cluster-autoscaler",
                                  "user": {"token": "t0ken"}}]
