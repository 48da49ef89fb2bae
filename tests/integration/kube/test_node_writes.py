"""DDS's taint and label writes keep what other writers do to the same Node, on the real apiserver.

DDS writes as its ServiceAccount (`dds_api`); the administrator and cluster-autoscaler are played by the admin client
with their own field managers (`kubectl cordon` patches as `kubectl-cordon`; CA updates the whole Node, tainting and —
with --cordon-node-before-terminating — cordoning it in one write). A writer that slips in between DDS's read and its
write is made deterministic by running it right after DDS's read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import pytest
from kubernetes import client

from dds.kube import nodes
from dds.kube.convert import TAINT_TO_BE_DELETED
from dds.kube.nodes import add_taint, label_node, remove_taint

pytestmark = pytest.mark.integration

REMOVAL_TAINT = "dds.cdi.dev/removing"
ADMIN_TAINT = "example.com/maintenance"


@pytest.fixture
def node(control_plane: Any, namespace: str) -> Iterator[str]:
    """A Node of its own (no kubelet, no kwok: nothing else writes it), named after the test's namespace."""
    core = client.CoreV1Api(control_plane.api_client())
    name = f"{namespace}-node"
    core.create_node({"metadata": {"name": name, "labels": {"team": "ml"}}})
    yield name
    core.delete_node(name)


@pytest.fixture
def admin(control_plane: Any) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.api_client())


def cordon_as_administrator(admin: client.CoreV1Api, name: str) -> None:
    admin.patch_node(name, {"spec": {"unschedulable": True}}, field_manager="kubectl-cordon")


def taint_as_cluster_autoscaler(admin: client.CoreV1Api, name: str, *, cordon: bool) -> None:
    """What CA's MarkToBeDeleted does: read the Node, add its taint (and cordon), update the whole object."""
    current = admin.read_node(name)
    current.spec.taints = [*(current.spec.taints or []),
                           client.V1Taint(key=TAINT_TO_BE_DELETED, value="1700000000", effect="NoSchedule")]
    if cordon:
        current.spec.unschedulable = True
    admin.replace_node(name, current, field_manager="cluster-autoscaler")


def taint_keys(admin: client.CoreV1Api, name: str) -> set[str]:
    return {t.key for t in admin.read_node(name).spec.taints or ()}


def cordoned(admin: client.CoreV1Api, name: str) -> bool:
    return bool(admin.read_node(name).spec.unschedulable)


@pytest.fixture
def after_dds_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], None]], None]:
    """`after_dds_reads(write)`: another writer's `write` runs once, right after DDS's next read of a Node — between the
    read and DDS's write that was computed from it."""

    def arm(write: Callable[[], None]) -> None:
        pending = [write]
        original = client.CoreV1Api.read_node

        def read_then_someone_writes(self: client.CoreV1Api, name: str, **kwargs: Any) -> Any:
            read = original(self, name, **kwargs)
            while pending:
                pending.pop()()
            return read

        monkeypatch.setattr(nodes.client.CoreV1Api, "read_node", read_then_someone_writes)

    return arm


def test_an_administrators_cordon_survives_dds_adding_and_removing_its_taint(dds_api, admin, node):
    cordon_as_administrator(admin, node)
    add_taint(dds_api, node, REMOVAL_TAINT, "true", "NoSchedule")
    assert REMOVAL_TAINT in taint_keys(admin, node)
    remove_taint(dds_api, node, REMOVAL_TAINT)
    assert REMOVAL_TAINT not in taint_keys(admin, node)
    assert cordoned(admin, node), "DDS lifted the administrator's cordon"


def test_keeping_a_node_ca_drained_leaves_an_administrators_earlier_cordon(dds_api, admin, node):
    cordon_as_administrator(admin, node)
    taint_as_cluster_autoscaler(admin, node, cordon=True)  # already cordoned: CA's write does not change it
    remove_taint(dds_api, node, TAINT_TO_BE_DELETED, uncordon_if_cordoned_with_it=True)
    assert TAINT_TO_BE_DELETED not in taint_keys(admin, node)
    assert cordoned(admin, node), "DDS lifted the administrator's cordon along with CA's taint"


def test_keeping_a_node_ca_drained_leaves_an_administrators_later_cordon(dds_api, admin, node):
    taint_as_cluster_autoscaler(admin, node, cordon=False)
    cordon_as_administrator(admin, node)
    remove_taint(dds_api, node, TAINT_TO_BE_DELETED, uncordon_if_cordoned_with_it=True)
    assert TAINT_TO_BE_DELETED not in taint_keys(admin, node)
    assert cordoned(admin, node)


def test_keeping_a_node_ca_tainted_and_cordoned_lifts_both(dds_api, admin, node):
    taint_as_cluster_autoscaler(admin, node, cordon=True)
    remove_taint(dds_api, node, TAINT_TO_BE_DELETED, uncordon_if_cordoned_with_it=True)
    assert TAINT_TO_BE_DELETED not in taint_keys(admin, node)
    assert not cordoned(admin, node), "CA's own cordon (made with its taint) outlived the drain DDS undid"


def test_a_taint_and_a_label_written_between_dds_read_and_write_survive_dds_adding_its_taint(
        dds_api, admin, node, after_dds_reads):
    after_dds_reads(lambda: admin.patch_node(node, {"metadata": {"labels": {"maintenance": "planned"}},
                                                    "spec": {"taints": [{"key": ADMIN_TAINT, "effect": "NoSchedule"}]}}))
    add_taint(dds_api, node, REMOVAL_TAINT, "true", "NoSchedule")
    assert taint_keys(admin, node) == {ADMIN_TAINT, REMOVAL_TAINT}
    assert admin.read_node(node).metadata.labels["maintenance"] == "planned"


def test_a_taint_written_between_dds_read_and_write_survives_dds_removing_its_taint(dds_api, admin, node,
                                                                                    after_dds_reads):
    add_taint(dds_api, node, REMOVAL_TAINT, "true", "NoSchedule")
    after_dds_reads(lambda: admin.patch_node(node, {"spec": {"taints": [
        *(admin.api_client.sanitize_for_serialization(t) for t in admin.read_node(node).spec.taints),
        {"key": ADMIN_TAINT, "effect": "NoExecute"}]}}))
    remove_taint(dds_api, node, REMOVAL_TAINT)
    assert taint_keys(admin, node) == {ADMIN_TAINT}


def test_dds_label_writes_keep_the_labels_of_other_writers(dds_api, admin, node):
    # DDS's label writes read nothing and name only DDS's keys (a merge patch): whenever another writer's label comes,
    # it is not overwritten.
    admin.patch_node(node, {"metadata": {"labels": {"maintenance": "planned"}}})
    label_node(dds_api, node, {"dds.cdi.dev/initial-gpus-done": "true"})
    labels = admin.read_node(node).metadata.labels
    assert labels["maintenance"] == "planned" and labels["team"] == "ml"
    assert labels["dds.cdi.dev/initial-gpus-done"] == "true"


def test_the_taint_already_there_is_not_written_again(dds_api, admin, node):
    add_taint(dds_api, node, REMOVAL_TAINT, "true", "NoSchedule")
    version = admin.read_node(node).metadata.resource_version
    add_taint(dds_api, node, REMOVAL_TAINT, "true", "NoSchedule")
    assert admin.read_node(node).metadata.resource_version == version
