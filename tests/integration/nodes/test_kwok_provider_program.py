"""`python -m harness.kwok_provider` as hack/kind-up.sh runs it, against a cluster whose Cluster API is already there
(`clusterctl init` on kind; Cluster API's own manager here): given a kubeconfig, an admin token and the example
MachineSet, it installs itself, makes the workload cluster and the group's KwokMachineTemplate, creates the MachineSet on
kwok hosts, and Cluster API's manager turns its replica into a Machine whose kwok Node is shaped as DDS's template."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from kubernetes import client

from harness.capi import ClusterApiManager
from harness.capi_stack import control_plane  # noqa: F401 (a fixture: a plane of this module's own)
from harness.controlplane import REPO_ROOT
from tests.integration.nodes.harness import wait_for

pytestmark = pytest.mark.integration

EXAMPLE = REPO_ROOT / "manifests" / "examples" / "machineset-gpu-workers.yaml"
# Cluster API copies no Machine label to its Node but its own prefixes: the group's hosts carry DDS's group label.
GROUP_LABEL = "dds.cdi.dev/node-group=MachineSet.default.gpu-workers"


def host_up(api: client.ApiClient) -> Optional[tuple[client.V1Node, dict[str, Any]]]:
    """The group's Ready node and the Machine whose nodeRef names it, once both are there."""
    nodes = [n for n in client.CoreV1Api(api).list_node(label_selector=GROUP_LABEL).items
             if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or ())]
    machines = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", "default", "machines")["items"]
    return next(((n, m) for n in nodes for m in machines
                 if ((m.get("status") or {}).get("nodeRef") or {}).get("name") == n.metadata.name), None)


def test_the_provider_program_brings_the_example_machineset_up_on_cluster_apis_manager(
        control_plane: Any, tmp_path: Path) -> None:
    manager = ClusterApiManager(control_plane).start()
    token = tmp_path / "token"
    token.write_text(control_plane.token)
    log = tmp_path / "kwok-provider.log"
    try:
        with log.open("wb") as out:
            program = subprocess.Popen(
                [sys.executable, "-m", "harness.kwok_provider", "--kubeconfig", str(control_plane.kubeconfig),
                 "--token-file", str(token), "--workload-server", control_plane.server, "--machineset", str(EXAMPLE),
                 "--provisioning-delay", "0"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        try:
            with control_plane.api_client() as api:
                node, machine = wait_for(
                    f"the example's replica as a Machine with a Ready kwok node (log: {log})",
                    lambda: host_up(api) or (program.poll() is not None and (None, None)), timeout=120)
                assert node is not None, f"the program exited with {program.returncode}: {log.read_text()[-2000:]}"
        finally:
            program.terminate()
            program.wait(10)
    finally:
        manager.stop()
    assert machine["spec"]["providerID"] == node.spec.provider_id == f"kwok://{node.metadata.name}"
    # The host is shaped as the group's template node, which CA simulates with: its instance type, its 64Gi, no GPU yet.
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "cdi-16c64g"
    assert node.status.allocatable["memory"] == str(64 * 2**30) and node.status.allocatable["nvidia.com/gpu"] == "0"
