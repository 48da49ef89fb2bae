"""No simulated GPUs on a real cluster by accident: `dds serve` with the simulated fabric refuses a cluster whose DDS
nodes are not kwok nodes, naming the setting that would allow it, and the capacity writer refuses such a node that
joins later. Real apiserver; DDS runs as its ServiceAccount."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.kube.nodes import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, NotAKwokNode, gpu_capacity_hook
from dds.model.groups import LABEL_NODE_GROUP

pytestmark = pytest.mark.integration

SETTING = "simulated_fabric.allow_non_kwok_nodes"


@pytest.fixture
def real_node(control_plane: Any, namespace: str) -> Iterator[str]:
    """A Node of a DDS group without kwok's annotation: what a real machine's Node looks like to DDS."""
    core = client.CoreV1Api(control_plane.api_client())
    name = f"{namespace}-real"
    core.create_node({"metadata": {"name": name, "labels": {LABEL_NODE_GROUP: "gpu-workers"}}})
    yield name
    core.delete_node(name)


@pytest.fixture
def kwok_node(control_plane: Any, namespace: str) -> Iterator[str]:
    core = client.CoreV1Api(control_plane.api_client())
    name = f"{namespace}-kwok"
    core.create_node({"metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE}}})
    yield name
    core.delete_node(name)


def serve(config: Path, kubeconfig: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dds", "serve", "--config", str(config), "--kubeconfig",
                           str(kubeconfig), "--insecure", "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=60)


def test_dds_serve_refuses_the_simulated_fabric_on_a_node_kwok_does_not_manage(real_node, namespace, dds_kubeconfig,
                                                                                tmp_path):
    config = tmp_path / "dds.yaml"
    config.write_text(yaml.safe_dump({"fabric": "simulated", "namespace": namespace,
                                      "metrics_listen": "127.0.0.1:0"}))
    result = serve(config, dds_kubeconfig)
    assert result.returncode == 2, result.stderr
    assert real_node in result.stderr and SETTING in result.stderr, result.stderr


def test_simulated_capacity_is_written_to_a_kwok_node_and_refused_on_another(real_node, kwok_node, dds_api, admin_api):
    publish = gpu_capacity_hook(dds_api, "nvidia.com/gpu", kwok_only=f"set {SETTING}: true to allow it")
    publish(kwok_node, {"A30": 2})
    core = client.CoreV1Api(admin_api)
    assert core.read_node(kwok_node).status.capacity["nvidia.com/gpu"] == "2"
    with pytest.raises(NotAKwokNode, match=SETTING) as refused:
        publish(real_node, {"A30": 2})
    assert real_node in str(refused.value)
    assert "nvidia.com/gpu" not in (core.read_node(real_node).status.capacity or {})


@pytest.fixture
def admin_api(control_plane: Any) -> Any:
    return control_plane.api_client()
