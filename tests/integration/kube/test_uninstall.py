"""`dds uninstall` on a real apiserver, as the administrator who runs it: a dry run lists DDS's finalizer, taints,
labels and annotations on Nodes and changes nothing; --yes removes exactly those (a deleted Node held by the finalizer
then goes), and is refused while DDS's leader Lease is being renewed."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.cli import main
from tests.integration.nodes.harness import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def marked_node(control_plane: Any, namespace: str) -> Iterator[str]:
    core = client.CoreV1Api(control_plane.api_client())
    name = f"{namespace}-marked"
    core.create_node({"metadata": {
        "name": name, "finalizers": ["dds.cdi.dev/fabric-devices", "example.com/keep-me"],
        "labels": {"dds.cdi.dev/node-group": "gpu-workers", "team": "ml"},
        "annotations": {"dds.cdi.dev/initial-gpus-attached": "true", "note": "kept"}},
        "spec": {"taints": [{"key": "dds.cdi.dev/removing", "effect": "NoSchedule"},
                            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}})
    yield name
    try:
        # A JSON patch: a strategic merge patch merges finalizer lists, so an empty one would leave the node
        # Terminating (and still labelled as a DDS group's) for every later test on this control plane.
        core.patch_node(name, [{"op": "replace", "path": "/metadata/finalizers", "value": []}])
        core.delete_node(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def test_uninstall_dry_run_lists_and_yes_removes_only_ddss_marks(control_plane: Any, namespace: str,
                                                                  marked_node: str, capsys) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    kubeconfig = str(control_plane.kubeconfig)
    args = ["uninstall", "--kubeconfig", kubeconfig, "--namespace", namespace]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (f"node {marked_node}: finalizer dds.cdi.dev/fabric-devices; taints dds.cdi.dev/removing; labels "
            "dds.cdi.dev/node-group; annotations dds.cdi.dev/initial-gpus-attached") in out
    assert "dry run: nothing changed" in out
    assert "dds.cdi.dev/fabric-devices" in core.read_node(marked_node).metadata.finalizers

    assert main([*args, "--yes"]) == 0
    assert f"removed from node {marked_node}: finalizer" in capsys.readouterr().out
    node = core.read_node(marked_node)
    assert node.metadata.finalizers == ["example.com/keep-me"]
    assert node.metadata.labels.get("team") == "ml" and "dds.cdi.dev/node-group" not in node.metadata.labels
    assert node.metadata.annotations.get("note") == "kept"
    assert not any(k.startswith("dds.cdi.dev/") for k in node.metadata.annotations)
    assert [(t.key, t.value) for t in node.spec.taints] == [("dedicated", "gpu")]


def test_a_deleted_node_held_by_ddss_finalizer_goes_once_uninstalled(control_plane: Any, namespace: str,
                                                                      capsys) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    name = f"{namespace}-held"
    core.create_node({"metadata": {"name": name, "finalizers": ["dds.cdi.dev/fabric-devices"]}})
    core.delete_node(name)
    assert core.read_node(name).metadata.deletion_timestamp is not None  # held by the finalizer
    assert main(["uninstall", "--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace,
                 "--yes"]) == 0

    def gone() -> bool:
        try:
            core.read_node(name)
            return False
        except client.ApiException as exc:
            return exc.status == 404

    wait_for(f"node {name} deleted", gone, timeout=30)


def test_uninstall_is_refused_while_dds_renews_its_lease(control_plane: Any, namespace: str, marked_node: str,
                                                         capsys) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    client.CoordinationV1Api(control_plane.api_client()).create_namespaced_lease(namespace, {
        "metadata": {"name": "dds-leader"},
        "spec": {"holderIdentity": "dds-7f9c-x2", "leaseDurationSeconds": 15, "renewTime": now.isoformat()}})
    args = ["uninstall", "--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    assert main(args) == 0
    assert "DDS still runs, dds-7f9c-x2 holds its Lease" in capsys.readouterr().out
    assert main([*args, "--yes"]) == 2
    err = capsys.readouterr().err
    assert f"DDS still runs: dds-7f9c-x2 renews the Lease {namespace}/dds-leader" in err and "scale deployment" in err
    node = client.CoreV1Api(control_plane.api_client()).read_node(marked_node)
    assert "dds.cdi.dev/fabric-devices" in node.metadata.finalizers  # nothing removed
