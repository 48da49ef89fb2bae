"""The chart installs beside Cluster API and the CDI operator: by default it renders only DDS's own objects, never
another project's CRD (their trimmed copies only with the test-only values file ci/test-crds-values.yaml), and
`helm install` against a cluster that lacks a CRD DDS reads refuses, naming it and the project that installs it, instead
of a DDS that exits at start. Checked with `helm install --dry-run=server` (helm's `lookup` then reads the cluster) on
a bare control plane of its own, whose CRDs the test installs step by step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.controlplane import ControlPlane, start_control_plane
from tests.integration.chart.tools import CHART, ROOT, helm_template, run, set_args

POOLS = {"settings.pools[0].name": "rack-1", "settings.pools[0].devices.A100": "16"}
CHOICES = {"fabric.backend": "composability-request", **POOLS}
TEST_CRDS = CHART / "ci" / "test-crds-values.yaml"


def crd_groups(objects: list[dict[str, Any]]) -> set[str]:
    return {o["spec"]["group"] for o in objects if o["kind"] == "CustomResourceDefinition"}


def test_the_chart_installs_no_other_projects_crd_unless_the_test_values_ask() -> None:
    assert crd_groups(helm_template(CHOICES)) == set()
    test_values = yaml.safe_load(TEST_CRDS.read_text())["crds"]
    assert crd_groups(helm_template({**CHOICES, **{f"crds.{k}": str(v).lower() for k, v in test_values.items()}})) \
        == {"cluster.x-k8s.io", "cro.hpsys.ibm.ie.com"}


@pytest.fixture(scope="module")
def bare_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = start_control_plane(tmp_path_factory.mktemp("bare-plane"), scheduler=False, kwok=False, crds=False)
    try:
        yield plane
    finally:
        plane.stop()


def install_dry_run(plane: ControlPlane, values: dict[str, str], *files: Path) -> Any:
    return run("helm", "install", "dds", str(CHART), "--namespace", "dds-system", "--dry-run=server",
               "--kubeconfig", str(plane.kubeconfig), *[arg for f in files for arg in ("-f", str(f))],
               *set_args(values), check=False)


@pytest.mark.integration
def test_a_missing_crd_is_refused_naming_it_and_who_installs_it(bare_plane: ControlPlane) -> None:
    refused = install_dry_run(bare_plane, CHOICES)
    assert refused.returncode != 0
    assert "the CustomResourceDefinition composabilityrequests.cro.hpsys.ibm.ie.com is not installed" in \
        refused.stderr and "Install the CDI operator" in refused.stderr, refused.stderr

    # On a test cluster without either project the chart's own copies stand in.
    with_copies = install_dry_run(bare_plane, CHOICES, TEST_CRDS)
    assert with_copies.returncode == 0, with_copies.stderr

    bare_plane.install_crds([ROOT / "manifests" / "crds" / "composability"])  # the operator's, as it installs them
    refused = install_dry_run(bare_plane, CHOICES)
    assert refused.returncode != 0
    assert "machines.cluster.x-k8s.io is not installed" in refused.stderr and \
        "Install Cluster API (clusterctl init)" in refused.stderr, refused.stderr
    # The simulated fabric needs no operator, still Cluster API's MachineSets.
    simulated = install_dry_run(bare_plane, {"fabric.backend": "simulated"})
    assert simulated.returncode != 0 and ".cluster.x-k8s.io is not installed" in simulated.stderr, simulated.stderr

    # Why the copies are for test clusters only: beside the operator's own CRD, Helm refuses to take it over.
    beside = install_dry_run(bare_plane, CHOICES, TEST_CRDS)
    assert beside.returncode != 0 and "cannot be imported into the current release" in beside.stderr, beside.stderr

    bare_plane.install_crds([ROOT / "manifests" / "crds" / "cluster-api"])  # Cluster API's, as clusterctl installs them
    installed = install_dry_run(bare_plane, CHOICES)
    assert installed.returncode == 0, installed.stderr


def client_tls_checksum(result: Any) -> str:
    assert result.returncode == 0, result.stderr
    [deployment] = [d for d in yaml.safe_load_all(result.stdout.split("\nMANIFEST:\n", 1)[-1].split("\nNOTES:\n")[0])
                    if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "cluster-autoscaler"]
    return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/client-tls"]


@pytest.mark.integration
def test_a_changed_client_certificate_secret_restarts_cluster_autoscaler_at_the_next_upgrade(
        bare_plane: ControlPlane) -> None:
    """cluster-autoscaler reads its client pair once: the pod template carries the checksum of the Secret as the
    cluster holds it, so `helm upgrade` after a renewal rolls CA onto the new pair (and leaves it alone otherwise)."""
    from kubernetes import client

    core = client.CoreV1Api(bare_plane.api_client())
    try:
        core.create_namespace({"metadata": {"name": "dds-system"}})
    except client.ApiException as error:
        if error.status != 409:
            raise
    secret = "cluster-autoscaler-cloud-config"
    core.create_namespaced_secret("dds-system", {"metadata": {"name": secret},
                                                 "stringData": {"client.crt": "first", "client.key": "first"}})
    bare_plane.install_crds([ROOT / "manifests" / "crds" / "cluster-api"])  # the prerequisite, as clusterctl installs it
    values = {"fabric.backend": "simulated"}
    before = client_tls_checksum(install_dry_run(bare_plane, values))
    assert client_tls_checksum(install_dry_run(bare_plane, values)) == before  # unchanged: no restart
    core.patch_namespaced_secret(secret, "dds-system", {"stringData": {"client.crt": "renewed"}})
    assert client_tls_checksum(install_dry_run(bare_plane, values)) != before
