"""harness/rbac.py gives DDS and cluster-autoscaler exactly the RBAC manifests/ renders (not a copy of it), and moves
DDS's Role to another namespace without changing who it is for."""

from __future__ import annotations

from harness import rbac
from harness.audit import Grant
from harness.kustomize import render


def test_each_identity_applies_the_rbac_objects_its_kustomization_renders() -> None:
    for identity in rbac.IDENTITIES:
        rendered = [o for o in render(identity.manifests) if o["kind"] in rbac.RBAC_KINDS]
        assert identity.objects() == rendered
        assert {o["kind"] for o in rendered} == set(rbac.RBAC_KINDS)


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
    assert [(o["kind"], o["metadata"]["namespace"]) for o in moved] == [("Role", "test-1234"),
                                                                       ("RoleBinding", "test-1234")]
    [binding] = [o for o in moved if o["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dds", "namespace": "dds-system"}]
    assert all(o["metadata"]["namespace"] == "dds-system" for o in rbac.DDS.objects()
               if o["kind"] in rbac.NAMESPACED_ROLE_KINDS), "the rendered manifests are not changed"


def test_the_kubeconfig_names_the_service_account_user() -> None:
    document = rbac.kubeconfig_document("https://127.0.0.1:6443", b"CA", rbac.AUTOSCALER, "t0ken")
    assert document["users"] == [{"name": "system:serviceaccount:dds-system:cluster-autoscaler",
                                  "user": {"token": "t0ken"}}]
