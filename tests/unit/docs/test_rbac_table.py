"""docs/operations.md's RBAC table is the one manifests/dds renders (harness/rbac_table.py generates it): a rule
added, removed or changed in manifests/dds/rbac.yaml without regenerating the table fails here, and so does a rule
of DDS's roles without a comment naming the code path that needs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import rbac_table

ROLE = """apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: x
rules:
  # The snapshot reads nodes.
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get"]
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: x
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: x}
subjects: [{kind: ServiceAccount, name: dds, namespace: dds-system}]
"""


def test_the_documented_rbac_table_is_the_one_the_manifests_render() -> None:
    assert rbac_table.documented() == rbac_table.table(), (
        "docs/operations.md's RBAC table differs from manifests/dds: run `.venv/bin/python -m harness.rbac_table "
        "--write`")


def test_the_table_has_a_row_per_rule_of_the_roles_bound_to_dds() -> None:
    rows = rbac_table.table().splitlines()[2:]
    comments = rbac_table.rule_comments()
    assert len(rows) == len(comments[("ClusterRole", "dds")]) + len(comments[("Role", "dds")])


def test_a_rule_without_its_comment_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rbac.yaml").write_text(ROLE)
    (tmp_path / "kustomization.yaml").write_text("resources: [rbac.yaml]\n")
    with pytest.raises(rbac_table.TableError, match=r"ClusterRole x: rules \[1\]"):
        rbac_table.table(tmp_path, tmp_path / "rbac.yaml")
    (tmp_path / "rbac.yaml").write_text(ROLE.replace('  - apiGroups: [""]\n    resources: ["pods"]',
                                                     '  # DDS reads pods.\n  - apiGroups: [""]\n    resources: ["pods"]'))
    assert rbac_table.table(tmp_path, tmp_path / "rbac.yaml").splitlines()[2:] == [
        "| ClusterRole `x` | `core` nodes | get | The snapshot reads nodes. |",
        "| ClusterRole `x` | `core` pods | get | DDS reads pods. |"]


def test_the_documented_features_table_is_the_one_manifests_rbac_renders() -> None:
    documented = rbac_table.documented(begin=rbac_table.FEATURES_BEGIN, end=rbac_table.FEATURES_END)
    assert documented == rbac_table.features_table(), (
        "docs/operations.md's table of grants per fabric and feature differs from manifests/rbac: run "
        "`.venv/bin/python -m harness.rbac_table --write`")


def test_every_fabric_has_its_own_grants_directory() -> None:
    from dds.config import FabricBackend

    assert {d.name for d in rbac_table.FEATURES_DIR.iterdir() if d.is_dir()} == \
        {backend.value for backend in FabricBackend} | {"reservations"}
