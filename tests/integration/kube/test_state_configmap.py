"""DDS's state in a ConfigMap on the real apiserver: instances survive a restart, a concurrent writer's change is never
lost (compare-and-swap on resourceVersion), and a corrupt document is handled as each user needs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from dds.app import INSTANCES_CONFIGMAP
from dds.config import SimulatedFabricSettings
from dds.fabric.state_configmap import ConfigMapFabricStateStore
from dds.kube.configmap import DATA_KEY, ConfigMapDocument, CorruptDocument
from dds.kube.state import ConfigMapStateStore
from dds.scaling.instances import InstanceFactory, InstanceKind, InstanceTracker
from tests.unit.provider.conftest import FakeClock, make_group

pytestmark = pytest.mark.integration


def records(count: int):
    ids = iter(range(1000))
    factory = InstanceFactory(FakeClock(), short_id=lambda: f"u{next(ids)}")
    return [factory(make_group(), InstanceKind.GPU, "1 more A30 on gpu-1", "increase/k1") for _ in range(count)]


def test_instances_survive_a_restart_and_keep_a_concurrent_writers_change(namespace: str, dds_api: Any) -> None:
    api = dds_api  # DDS's stores as its ServiceAccount (harness/rbac.py)
    name = INSTANCES_CONFIGMAP  # the name DDS's Role grants (the namespace is the test's own)
    first, second = records(2)
    tracker = InstanceTracker(ConfigMapStateStore(api, namespace, name))
    tracker.add(first)

    # Another writer (a second replica during a handover) writes between our read and our write.
    other = ConfigMapDocument(dds_api, namespace, name)
    document = ConfigMapDocument(api, namespace, name)
    interfered = []

    def mutate(doc: dict) -> None:
        if not interfered:
            interfered.append(True)
            other.update(lambda d: d.__setitem__("dds://other/gpu/x", {"id": "dds://other/gpu/x"}))
        doc[second.id] = second.to_json()

    document.update(mutate)
    stored = json.loads(client.CoreV1Api(api).read_namespaced_config_map(name, namespace).data[DATA_KEY])
    assert set(stored) == {first.id, second.id, "dds://other/gpu/x"}  # the other writer's change is kept
    restarted = InstanceTracker(ConfigMapStateStore(dds_api, namespace, name))
    assert restarted.get(first.id) == first and restarted.get(second.id) == second


def corrupt(api: Any, namespace: str, name: str) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(
        namespace, {"metadata": {"name": name}, "data": {DATA_KEY: "{not json"}})


def test_corrupt_instances_start_empty_and_are_overwritten(control_plane: Any, namespace: str, dds_api: Any) -> None:
    api = dds_api  # DDS's stores as its ServiceAccount (harness/rbac.py)
    name = INSTANCES_CONFIGMAP  # the name DDS's Role grants (the namespace is the test's own)
    corrupt(control_plane.api_client(), namespace, name)
    store = ConfigMapStateStore(api, namespace, name)
    assert store.load() == {}
    [record] = records(1)
    InstanceTracker(store).add(record)
    assert set(ConfigMapStateStore(api, namespace, name).load()) == {record.id}


def test_corrupt_fabric_state_is_an_error_never_a_reset(control_plane: Any, namespace: str, dds_api: Any) -> None:
    api = dds_api  # DDS's stores as its ServiceAccount (harness/rbac.py)
    name = SimulatedFabricSettings().state_configmap  # the name the simulated fabric's Role grants
    corrupt(control_plane.api_client(), namespace, name)
    with pytest.raises(CorruptDocument, match="is not JSON"):
        ConfigMapFabricStateStore(api, namespace, name).load()
