"""settings.node_backend picks the provisioner; DDS never makes machines itself (Cluster API's controllers do)."""

from __future__ import annotations

import pytest
from kubernetes import client
from pydantic import ValidationError

from dds.config import NodeBackend, Settings
from dds.nodes.factory import build_node_backend
from dds.nodes.machineset import MachineSetProvisioner
from dds.nodes.memory import MemoryProvisioner


def test_memory_needs_no_cluster() -> None:
    assert isinstance(build_node_backend(Settings(node_backend=NodeBackend.MEMORY), clock=lambda: 0.0),
                      MemoryProvisioner)


def test_machineset_scales_machinesets_only() -> None:
    provisioner = build_node_backend(Settings(), clock=lambda: 0.0, api_client=client.ApiClient())
    assert isinstance(provisioner, MachineSetProvisioner)


def test_a_cluster_backend_without_a_cluster_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="node_backend machineset needs a cluster"):
        build_node_backend(Settings(node_backend=NodeBackend.MACHINESET), clock=lambda: 0.0)


@pytest.mark.parametrize("settings, refused", [
    ({"node_backend": "kwok"}, "node_backend kwok was removed: DDS no longer makes Machines and Nodes itself"),
    ({"kwok": {"provisioning_delay_seconds": 3}}, "the kwok section was removed"),
])
def test_the_removed_kwok_backend_is_refused_with_what_to_do_instead(settings: dict, refused: str) -> None:
    with pytest.raises(ValidationError, match=refused) as error:
        Settings(**settings)
    assert "Cluster API" in str(error.value)


def test_the_removed_kwok_backend_is_refused_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDS_NODE_BACKEND", "kwok")
    with pytest.raises(ValidationError, match="node_backend kwok was removed"):
        Settings()
