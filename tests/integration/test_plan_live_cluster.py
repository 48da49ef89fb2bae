"""`dds plan --kubeconfig`: what DDS would do on a live cluster, read-only — the same observer and planner as the
controller, so the answer is the decision DDS itself would take."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.cli import main
from tests.integration.nodes.harness import NodeGroupHarness, one_node_and_a_pending_gpu_pod, unschedulable

pytestmark = pytest.mark.integration


def test_plan_on_a_live_cluster_attaches_a_gpu_for_a_pending_pod(control_plane: Any, namespace: str, tmp_path,
                                                                 capsys, dds_kubeconfig: Any, dds_api: Any) -> None:
    harness = NodeGroupHarness(control_plane, namespace, dds_api=dds_api)
    try:
        node = one_node_and_a_pending_gpu_pod(harness, namespace)
        core = client.CoreV1Api(control_plane.api_client())
        config = tmp_path / "dds.yaml"
        # The fabric's state ConfigMap lives in the test's namespace; only this namespace's MachineSets are groups.
        config.write_text(yaml.safe_dump({"namespace": namespace, "machineset_namespaces": [namespace],
                                           "node_group_namespaces": {namespace: {"pools": ["*"]}},
                                           "fabric": "simulated"}))
        snapshot_file = tmp_path / "snapshot.json"
        code = main(["plan", "--kubeconfig", str(dds_kubeconfig), "--config", str(config), "--json",
                     "--save-snapshot", str(snapshot_file)])
        out = json.loads(capsys.readouterr().out)
        assert code == 0
        decision = next(d for d in out["scale_up"]["decisions"] if d["pod"] == f"{namespace}/train-0")
        assert decision["node"] == node, decision
        attaches = [a for a in out["scale_up"]["attaches"] if a["node"] == node]
        assert [a["count"] for a in attaches] == [1] and not out["scale_up"]["new_nodes"], out["scale_up"]
        # Read-only: nothing was attached, the pod is still pending.
        assert unschedulable(core, namespace, "train-0")
        # The saved snapshot replays to the same plan.
        assert main(["plan", "--snapshot", str(snapshot_file), "--json"]) == 0
        replay = json.loads(capsys.readouterr().out)
        assert replay["scale_up"]["attaches"] == out["scale_up"]["attaches"]
    finally:
        harness.close()


def test_plan_says_why_when_the_cluster_cannot_be_read(tmp_path, capsys) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    assert main(["plan", "--kubeconfig", str(kubeconfig)]) == 3  # cannot reach the cluster (dds/commands/failures.py)
    err = capsys.readouterr().err
    assert "cannot reach the apiserver at https://127.0.0.1:1" in err and "to fix:" in err, err


def test_plan_reads_the_clusters_own_settings(control_plane: Any, namespace: str, tmp_path, capsys,
                                              dds_kubeconfig: Any, dds_api: Any) -> None:
    """Without --config, `dds plan --kubeconfig` plans with the settings the running DDS reads: its ConfigMap (here in
    the test's namespace, named with --cluster-settings), whose shipped `in_cluster: true` the flag beats."""
    core = client.CoreV1Api(control_plane.api_client())
    settings = {"in_cluster": True, "namespace": namespace, "machineset_namespaces": [namespace],
                "fabric": "simulated", "policy": "spread"}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "dds-settings"},
                                                  "data": {"settings.yaml": yaml.safe_dump(settings)}})
    where = f"{namespace}/dds-settings"
    assert main(["plan", "--kubeconfig", str(dds_kubeconfig), "--cluster-settings", where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scale_up"]["policy"] == "spread"
    # No such ConfigMap (gone: DDS's credentials may read only the one named dds-settings): one line saying where it
    # looked and what to pass instead.
    core.delete_namespaced_config_map("dds-settings", namespace)
    missing = where
    assert main(["plan", "--kubeconfig", str(dds_kubeconfig), "--cluster-settings", missing]) == 2
    err = capsys.readouterr().err
    assert f"the cluster has no ConfigMap {missing}" in err and "--config FILE" in err, err
