"""Gang objects through the watch cache on a real kube-apiserver with the Workload API on: the kind the control plane
serves (1.35: Workloads scheduling.k8s.io/v1alpha1; 1.36: PodGroups scheduling.k8s.io/v1alpha2) is found by discovery,
watched, and a decision reads a gang's minimum from the cache without a LIST (dds/kube/podgroups.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from dds.kube.cache import cluster_cache
from dds.kube.podgroups import PODGROUPS_V1ALPHA2, WORKLOADS_V1ALPHA1, PodGroupReader
from dds.kube.requests import instrument
from harness import versions
from harness.controlplane import ControlPlane, start_control_plane

pytestmark = pytest.mark.integration

ON_1_36 = versions.active_profile().at_least(1, 36)
KIND = PODGROUPS_V1ALPHA2 if ON_1_36 else WORKLOADS_V1ALPHA1
NAMESPACE = "default"


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Iterator[ControlPlane]:
    plane = start_control_plane(tmp_path_factory.mktemp("gang-cache"), scheduler=False, kwok=False, crds=False,
                                feature_gates={"GenericWorkload": True, "GangScheduling": True},
                                runtime_config=(f"scheduling.k8s.io/{KIND.version}=true",))
    try:
        yield plane
    finally:
        plane.stop()


def create_gang_object(api: client.ApiClient, name: str, min_count: int) -> None:
    """A 1.35 Workload with a gang pod group; on 1.36 a PodGroup, after the Workload it names (admission refuses a
    PodGroup whose Workload does not exist)."""
    gang = {"gang": {"minCount": min_count}}
    custom = client.CustomObjectsApi(api)
    if KIND is WORKLOADS_V1ALPHA1:
        custom.create_namespaced_custom_object(KIND.group, KIND.version, NAMESPACE, "workloads", {
            "apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"podGroups": [{"name": "workers", "policy": gang}]}})
        return
    custom.create_namespaced_custom_object(KIND.group, KIND.version, NAMESPACE, "workloads", {
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "Workload", "metadata": {"name": name},
        "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": gang}]}})
    custom.create_namespaced_custom_object(KIND.group, KIND.version, NAMESPACE, "podgroups", {
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"podGroupTemplateRef": {"workload": {"workloadName": name, "podGroupTemplateName": "workers"}},
                 "schedulingPolicy": gang}})


def test_the_served_gang_kind_is_watched_and_read_without_a_list(plane: ControlPlane) -> None:
    api = plane.api_client()
    cache = cluster_cache(api)
    assert cache.gangs is not None and list(cache.gangs) == [KIND], cache.gangs
    cache.start()
    try:
        assert cache.wait_synced(60)
        create_gang_object(api, "train", 4)
        reader_api = plane.api_client()
        counts = instrument(reader_api)
        reader = PodGroupReader(reader_api, cached=cache.gangs)
        deadline = time.monotonic() + 30
        while True:
            groups = reader.read([NAMESPACE], (KIND,))
            found = groups.scheduling_groups if ON_1_36 else groups.workload_gangs
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        expected = {"default/train": 4} if ON_1_36 else {"default/train": {"workers": 4}}
        assert found == expected
        assert counts.snapshot().get("LIST", 0) == 0, counts.snapshot()
    finally:
        cache.stop()
