"""The settings manifests/ ships are safe on a real cluster as they are: they name no simulated fabric (the fabric is a
choice the operator makes, and DDS refuses to start without one) and let only cluster-autoscaler's identity call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dds import certs
from dds.config import FabricBackend, Settings
from dds.fabric.factory import build_fabric

REPO = Path(__file__).resolve().parents[3]
CONFIGMAP = REPO / "manifests" / "dds" / "configmap.yaml"


@pytest.fixture
def shipped(tmp_path: Path) -> Settings:
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(yaml.safe_load(CONFIGMAP.read_text())["data"]["settings.yaml"])
    return Settings.load(settings_file)


def test_the_shipped_configmap_names_no_simulated_fabric(shipped: Settings) -> None:
    assert shipped.fabric is not FabricBackend.SIMULATED
    assert not shipped.simulated_fabric.allow_non_kwok_nodes


def test_the_shipped_configmap_lets_in_the_client_dds_certs_issues(shipped: Settings) -> None:
    assert shipped.grpc_allowed_clients == [certs.CLIENT_COMMON_NAME]


def test_the_shipped_settings_build_no_fabric_until_one_is_chosen(shipped: Settings) -> None:
    with pytest.raises(ValueError, match="fabric is not set: choose one of simulated, composability-request, redfish"):
        build_fabric(shipped, clock=lambda: 0.0)


def test_dds_serve_in_a_cluster_refuses_to_start_without_a_fabric(tmp_path: Path) -> None:
    config = tmp_path / "dds.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0"}))
    # Refused before any request: the kubeconfig is never read.
    result = subprocess.run([sys.executable, "-m", "dds", "serve", "--config", str(config), "--insecure",
                             "--kubeconfig", str(tmp_path / "never-read")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "fabric is not set: choose one of simulated, composability-request, redfish" in result.stderr


def test_the_shipped_configmap_lets_no_namespace_have_node_groups_until_one_is_listed(shipped: Settings) -> None:
    # Whoever may edit a MachineSet must not be able to opt it in: the administrator lists namespaces and their pools.
    assert shipped.node_group_namespaces == {}
