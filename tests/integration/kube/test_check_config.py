"""`dds check-config --kubeconfig` on a real apiserver, as DDS's ServiceAccount: the CRDs, the RBAC the manifests ship
and the simulated fabric pass; an opted-in MachineSet with a bad annotation is named with what to fix; without
--config the cluster's own dds-settings ConfigMap is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.cli import main
from tests.integration.nodes.harness import GROUP, machineset_manifest

pytestmark = pytest.mark.integration


def test_check_config_on_a_cluster_names_the_broken_machineset(control_plane: Any, namespace: str,
                                                              dds_kubeconfig: Path, capsys) -> None:
    objects = client.CustomObjectsApi(control_plane.api_client())
    good, bad = machineset_manifest("gpu-good"), machineset_manifest("gpu-bad")
    bad["metadata"]["annotations"]["dds.cdi.dev/max-gpus-per-node"] = "lots"
    for manifest in (good, bad):
        objects.create_namespaced_custom_object(GROUP, "v1beta2", namespace, "machinesets", manifest)
    settings = {"in_cluster": True, "namespace": namespace, "machineset_namespaces": [namespace],
                "node_group_namespaces": {namespace: {"pools": ["*"]}},
                "fabric": "simulated", "insecure": True}
    client.CoreV1Api(control_plane.api_client()).create_namespaced_config_map(
        namespace, {"metadata": {"name": "dds-settings"}, "data": {"settings.yaml": yaml.safe_dump(settings)}})

    code = main(["check-config", "--kubeconfig", str(dds_kubeconfig), "--cluster-settings",
                 f"{namespace}/dds-settings", "--json"])
    found = json.loads(capsys.readouterr().out)["findings"]
    by_area = {area: [f for f in found if f["area"] == area] for area in {f["area"] for f in found}}
    assert code == 4, found
    assert by_area["settings"][0]["message"] == f"read from ConfigMap {namespace}/dds-settings"
    assert [f["level"] for f in by_area["cluster"] + by_area["crds"] + by_area["rbac"]] == ["ok", "ok", "ok"], found
    failed = [f for f in by_area["machinesets"] if f["level"] == "fail"]
    assert len(failed) == 1 and "gpu-bad" in failed[0]["message"] and "max-gpus-per-node" in failed[0]["message"]
    assert "annotations" in failed[0]["fix"]
    served = [f for f in by_area["machinesets"] if f["level"] == "ok"]
    assert served and f"MachineSet/{namespace}/gpu-good" in served[0]["message"], found
    assert by_area["fabric"][0]["level"] in ("ok", "warn") and "answers" in by_area["fabric"][0]["message"]
