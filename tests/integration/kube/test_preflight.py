"""What `dds serve` (and `dds check-config`) ask a real apiserver before starting: credentials refused, RBAC denying
what DDS needs and a CRD not installed each end the start with one line and their exit code; the RBAC manifests/ ships
passes. DDS runs as its ServiceAccount."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dds.cli import main
from dds.commands.failures import EXIT_CLUSTER_NOT_READY, EXIT_NO_CLUSTER, Failure
from dds.config import Settings
from dds.kube.preflight import (CLUSTER_API_KINDS, COMPOSABILITY_KINDS, ClusterUnusable, ServedKind, missing_kinds,
                                require, require_for_serving)

pytestmark = pytest.mark.integration


def settings_file(tmp_path: Path, **settings: Any) -> str:
    path = tmp_path / "dds.yaml"
    path.write_text(yaml.safe_dump({"fabric": "simulated", "metrics_listen": "127.0.0.1:0", **settings}))
    return str(path)


def serve(config: str, kubeconfig: Path) -> int:
    return main(["serve", "--config", config, "--kubeconfig", str(kubeconfig), "--insecure",
                 "--listen", "127.0.0.1:0"])


def test_refused_credentials_are_one_line_and_exit_3(dds_kubeconfig: Path, tmp_path: Path, capsys) -> None:
    document = yaml.safe_load(dds_kubeconfig.read_text())
    document["users"][0]["user"]["token"] = "not-a-token"
    wrong = tmp_path / "kubeconfig"
    wrong.write_text(yaml.safe_dump(document))
    assert serve(settings_file(tmp_path), wrong) == EXIT_NO_CLUSTER
    err = capsys.readouterr().err
    assert "refused the credentials (401 Unauthorized" in err and "kubectl auth whoami" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_rbac_missing_in_the_state_namespace_is_named_and_exit_4(dds_kubeconfig: Path, namespace: str,
                                                                 tmp_path: Path, capsys) -> None:
    elsewhere = f"{namespace}-no-role"  # DDS's Role is granted in `namespace` only
    config = settings_file(tmp_path, namespace=elsewhere, leader_election=True)
    assert serve(config, dds_kubeconfig) == EXIT_CLUSTER_NOT_READY
    err = capsys.readouterr().err
    assert "DDS's credentials may not: " in err and f"get configmaps dds-instances in namespace {elsewhere}" in err, err
    assert "manifests/dds/rbac.yaml" in err and len(err.strip().splitlines()) == 1


def test_the_shipped_rbac_and_crds_pass(dds_api: Any, namespace: str) -> None:
    for fabric in ("simulated", "composability-request"):
        require_for_serving(dds_api, Settings(fabric=fabric, namespace=namespace, leader_election=True))


def test_a_crd_not_installed_is_found_by_discovery(dds_api: Any) -> None:
    assert missing_kinds(dds_api, CLUSTER_API_KINDS + COMPOSABILITY_KINDS) == []
    absent = ServedKind("widgets.dds.test", ("v1", "v1beta1"), "widgets", "manifests/crds/widgets")
    served_elsewhere = ServedKind("cluster.x-k8s.io", ("v1beta2", "v1beta1"), "gizmos", "manifests/crds/gizmos")
    assert missing_kinds(dds_api, (absent, CLUSTER_API_KINDS[0], served_elsewhere)) == [absent, served_elsewhere]


def test_a_missing_crd_stops_the_start_with_the_command_that_installs_it(dds_api: Any) -> None:
    absent = ServedKind("widgets.dds.test", ("v1",), "widgets", "manifests/crds/widgets")
    with pytest.raises(ClusterUnusable) as caught:
        require(dds_api, (), (absent,))
    failure = Failure.of(caught.value.problem)
    assert failure.exit_code == EXIT_CLUSTER_NOT_READY
    assert failure.message == "the cluster does not serve widgets.widgets.dds.test (CRD not installed)"
    assert failure.fix == "install the CRDs: kubectl apply -k manifests/crds/widgets"
