"""OpenShift's Machine API on a real apiserver, as `dds serve` and `dds check-config` meet it (DDS as its
ServiceAccount, asking API discovery only). The module's own control plane: it installs OpenShift's MachineSet CRD (as
openshift/api ships it, tests/integration/kube/crds) and then removes Cluster API's CRDs.

1. Both APIs served (an OpenShift cluster that runs Cluster API too): DDS starts, and says once that the
   machine.openshift.io MachineSets are no node groups, and why.
2. Only the Machine API served: the start stops with one line saying that API is not supported and why, and what to
   run instead, not "install the Cluster API CRDs"; `dds check-config` says the same.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.cli import main
from dds.commands.failures import EXIT_CLUSTER_NOT_READY
from dds.config import MACHINE_API_FIX, Settings
from dds.kube.preflight import CLUSTER_API_KINDS, OPENSHIFT_MACHINESETS, missing_kinds, require_for_serving
from harness import rbac
from harness.controlplane import ControlPlane
from harness.pytest_plugin import own_control_plane

pytestmark = pytest.mark.integration

CRDS = Path(__file__).resolve().parent / "crds"
REASON = "machine.openshift.io (OpenShift's Machine API) is not supported"


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own, serving OpenShift's MachineSets besides DDS's CRDs."""
    for plane in own_control_plane(request, tmp_path_factory):
        plane.install_crds([CRDS])
        yield plane


@pytest.fixture(scope="module")
def dds_kubeconfig(control_plane: ControlPlane) -> Path:
    return rbac.install(control_plane, rbac.DDS)


def settings_file(tmp_path: Path, namespace: str) -> str:
    path = tmp_path / "dds.yaml"
    path.write_text(yaml.safe_dump({"fabric": "simulated", "namespace": namespace, "metrics_listen": "127.0.0.1:0"}))
    return str(path)


def test_with_cluster_api_served_too_dds_starts_and_says_the_machine_api_is_not_read(
        dds_api: Any, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    assert missing_kinds(dds_api, (OPENSHIFT_MACHINESETS, *CLUSTER_API_KINDS)) == []
    with caplog.at_level(logging.WARNING, logger="dds.kube.preflight"):
        require_for_serving(dds_api, Settings(fabric="simulated", namespace=namespace))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "dds.kube.preflight"]
    assert "also serves machinesets.machine.openshift.io: those MachineSets are no node groups" in line, line
    assert REASON in line and "pre-terminate hook" in line


def test_with_only_the_machine_api_served_the_start_stops_with_why(control_plane: ControlPlane, dds_api: Any,
                                                                   dds_kubeconfig: Path, namespace: str,
                                                                   tmp_path: Path, capsys: Any) -> None:
    extensions = client.ApiextensionsV1Api(control_plane.api_client())
    for crd in extensions.list_custom_resource_definition().items:
        if crd.spec.group == "cluster.x-k8s.io":
            extensions.delete_custom_resource_definition(crd.metadata.name)
    deadline = time.monotonic() + 30.0
    while missing_kinds(dds_api, CLUSTER_API_KINDS) != list(CLUSTER_API_KINDS):
        assert time.monotonic() < deadline, "Cluster API's CRDs still served 30 s after their deletion"
        time.sleep(0.1)

    config = settings_file(tmp_path, namespace)
    assert main(["serve", "--config", config, "--kubeconfig", str(dds_kubeconfig), "--insecure",
                 "--listen", "127.0.0.1:0"]) == EXIT_CLUSTER_NOT_READY
    err = capsys.readouterr().err
    assert "the cluster serves machinesets.machine.openshift.io, not Cluster API's machinesets.cluster.x-k8s.io" \
        in err and REASON in err and MACHINE_API_FIX in err, err
    assert "kubectl apply -k manifests/crds/cluster-api" not in err and len(err.strip().splitlines()) == 1, err

    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump({"fabric": "simulated", "namespace": namespace, "insecure": True}))
    code = main(["check-config", "--json", "--config", str(path), "--kubeconfig", str(dds_kubeconfig)])
    found = json.loads(capsys.readouterr().out)["findings"]
    (crds,) = [f for f in found if f["area"] == "crds"]
    assert code == EXIT_CLUSTER_NOT_READY and crds["level"] == "fail" and REASON in crds["message"], found
    assert crds["fix"] == MACHINE_API_FIX
