"""settings.node_backend picks the provisioner, and for kwok the infrastructure provider that goes with it."""

from __future__ import annotations

import pytest
from kubernetes import client

from dds.config import NodeBackend, Settings
from dds.nodes.factory import build_node_backend
from dds.nodes.kwok import KwokInfrastructure
from dds.nodes.machineset import MachineSetProvisioner
from dds.nodes.memory import MemoryProvisioner


def test_memory_needs_no_cluster() -> None:
    parts = build_node_backend(Settings(node_backend=NodeBackend.MEMORY), clock=lambda: 0.0)
    assert isinstance(parts.provisioner, MemoryProvisioner) and parts.infrastructure is None


def test_machineset_scales_machinesets_only() -> None:
    parts = build_node_backend(Settings(), clock=lambda: 0.0, api_client=client.ApiClient())
    assert isinstance(parts.provisioner, MachineSetProvisioner) and parts.infrastructure is None


def test_kwok_adds_the_infrastructure_provider_with_its_settings() -> None:
    settings = Settings(node_backend=NodeBackend.KWOK, kwok={"provisioning_delay_seconds": 3})
    parts = build_node_backend(settings, clock=lambda: 0.0, api_client=client.ApiClient())
    assert isinstance(parts.provisioner, MachineSetProvisioner)
    assert isinstance(parts.infrastructure, KwokInfrastructure)
    assert parts.infrastructure.provisioning_delay_seconds == 3


@pytest.mark.parametrize("backend", [NodeBackend.MACHINESET, NodeBackend.KWOK])
def test_a_cluster_backend_without_a_cluster_is_a_clear_error(backend: NodeBackend) -> None:
    with pytest.raises(ValueError, match=f"node_backend {backend.value} needs a cluster"):
        build_node_backend(Settings(node_backend=backend), clock=lambda: 0.0)
