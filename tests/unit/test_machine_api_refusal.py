"""OpenShift's Machine API (machine.openshift.io) is no node-group source: where a user meets it, DDS says so and why.

- the `capi_group` setting (cluster-autoscaler's clusterapi provider takes the group from CAPI_GROUP): from the settings
  file or DDS_CAPI_GROUP, machine.openshift.io stops `dds serve` with the reason, before any request to a cluster;
- a cluster that serves the Machine API's MachineSets and not Cluster API's: the start's missing-CRD problem names the
  Machine API and why, instead of telling the user to install Cluster API's CRDs (dds/kube/preflight.py); the same
  against a real apiserver is tests/integration/kube/test_machine_api_refusal.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pytest
import yaml
from pydantic import ValidationError

from dds.cli import main
from dds.commands.failures import EXIT_USAGE
from dds.config import CLUSTER_API_GROUP, MACHINE_API_FIX, Settings
from dds.kube import preflight
from dds.kube.preflight import (CLUSTER_API_KINDS, COMPOSABILITY_KINDS, OPENSHIFT_MACHINESETS, ProblemKind,
                                ServedKind, crds_problem)

REASON = "machine.openshift.io (OpenShift's Machine API) is not supported"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DDS_CAPI_GROUP", "DDS_FABRIC", "DDS_LOG_FORMAT", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)


def serve(tmp_path: Path, **settings: Any) -> int:
    path = tmp_path / "dds.yaml"
    path.write_text(yaml.safe_dump({"fabric": "simulated", **settings}))
    # A kubeconfig that names no reachable cluster: a refused setting must stop the start before any request.
    return main(["serve", "--config", str(path), "--kubeconfig", str(tmp_path / "absent"), "--insecure"])


def test_cluster_api_is_the_default_and_the_only_group() -> None:
    assert Settings().capi_group == CLUSTER_API_GROUP == Settings(capi_group="cluster.x-k8s.io").capi_group
    with pytest.raises(ValidationError, match="'cluster.k8s.io' is not an API group DDS reads MachineSets from"):
        Settings(capi_group="cluster.k8s.io")


@pytest.mark.parametrize("value", ["machine.openshift.io", " Machine.OpenShift.io "])
def test_the_machine_api_in_the_settings_file_stops_the_start_with_why(tmp_path: Path, value: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert serve(tmp_path, capi_group=value) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "capi_group" in err and REASON in err and "pre-terminate hook" in err and MACHINE_API_FIX in err, err
    assert "Traceback" not in err and "absent" not in err  # refused before the kubeconfig was looked at


def test_the_machine_api_from_ddss_environment_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DDS_CAPI_GROUP", "machine.openshift.io")  # as CA's CAPI_GROUP would be set
    assert serve(tmp_path) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "capi_group (from DDS_CAPI_GROUP)" in err and REASON in err, err


def served_only(monkeypatch: pytest.MonkeyPatch, served: Sequence[ServedKind]) -> None:
    """Discovery as a cluster serving `served` would answer it."""
    monkeypatch.setattr(preflight, "missing_kinds",
                        lambda api, wanted: [kind for kind in wanted if kind not in served])


def test_a_cluster_with_only_the_machine_api_is_told_why_not_to_install_crds(monkeypatch: pytest.MonkeyPatch) -> None:
    served_only(monkeypatch, (OPENSHIFT_MACHINESETS, *COMPOSABILITY_KINDS))
    problem = crds_problem(object(), list(CLUSTER_API_KINDS))
    assert problem.kind is ProblemKind.MISSING_API
    assert problem.message.startswith("the cluster serves machinesets.machine.openshift.io, not Cluster API's "
                                      "machinesets.cluster.x-k8s.io: " + REASON), problem.message
    assert problem.fix == MACHINE_API_FIX and "kubectl apply" not in problem.fix


def test_without_the_machine_api_a_missing_crd_is_one_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    served_only(monkeypatch, ())
    problem = crds_problem(object(), list(CLUSTER_API_KINDS))
    assert problem.fix == "install the CRDs: kubectl apply -k manifests/crds/cluster-api"
    served_only(monkeypatch, (OPENSHIFT_MACHINESETS, *CLUSTER_API_KINDS))  # only the operator's CRDs are missing
    assert crds_problem(object(), list(COMPOSABILITY_KINDS)).fix.startswith("install the CRDs")
