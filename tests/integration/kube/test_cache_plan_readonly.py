"""`dds plan --kubeconfig` reads the cluster with one LIST per kind (the cache's decoder) and writes nothing: not the
simulated fabric's state ConfigMap, not anywhere. It runs as DDS's ServiceAccount (harness/rbac.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubernetes import client

import dds.kube.client
from dds.cli import main
from dds.kube.requests import RequestCounts, instrument
from tests.integration.nodes.harness import NodeGroupHarness, one_node_and_a_pending_gpu_pod

pytestmark = pytest.mark.integration

READS = {"GET", "LIST"}


@pytest.mark.parametrize("watch_cache", [True, False], ids=["cache-decoder", "list-per-call"])
def test_plan_on_a_live_cluster_sends_only_reads(control_plane: Any, namespace: str, tmp_path: Any, capsys: Any,
                                                 monkeypatch: pytest.MonkeyPatch, watch_cache: bool,
                                                 dds_kubeconfig: Any, dds_api: Any) -> None:
    harness = NodeGroupHarness(control_plane, namespace, dds_api=dds_api)
    try:
        node = one_node_and_a_pending_gpu_pod(harness, namespace)
        core = client.CoreV1Api(control_plane.api_client())

        counts = RequestCounts()
        make_client = dds.kube.client.api_client

        def counted_client(*args: Any, **kwargs: Any) -> client.ApiClient:
            api = make_client(*args, **kwargs)
            instrument(api, counts)
            return api

        monkeypatch.setattr(dds.kube.client, "api_client", counted_client)
        # The fabric's state ConfigMap would live in the test's namespace (where DDS's Role is bound): never created.
        config = tmp_path / "dds.yaml"
        config.write_text(yaml.safe_dump({"fabric": "simulated", "namespace": namespace,
                                          "machineset_namespaces": [namespace], "watch_cache": watch_cache,
                                          "node_group_namespaces": {namespace: {"pools": ["*"]}}}))
        code = main(["plan", "--kubeconfig", str(dds_kubeconfig), "--config", str(config), "--json"])
        out = json.loads(capsys.readouterr().out)

        assert code == 0
        attaches = [a for a in out["scale_up"]["attaches"] if a["node"] == node]
        assert [a["count"] for a in attaches] == [1], out["scale_up"]
        sent = counts.snapshot()
        assert sent and set(sent) <= READS, sent
        assert not core.list_namespaced_config_map(namespace).items
    finally:
        harness.close()
