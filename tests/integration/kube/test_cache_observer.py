"""DDS's decisions on the watch cache: once it is synced, CA's IncreaseSize, the control loop and the registry's view of
nodes read the cache (no LIST reaches the apiserver), and the snapshot they plan on is the one a LIST per call gives."""

from __future__ import annotations

from typing import Any

import pytest

from dds.controller.observe import ClusterObserver, Observation
from dds.controller.idle import IdleTracker
from dds.fabric.base import OperationKind
from dds.kube.controller_ports import KubeClusterReader
from dds.kube.requests import instrument
from dds.scaling.instances import InstanceKind
from tests.integration.controller.harness import ControllerHarness
from tests.integration.nodes.harness import wait_for

pytestmark = pytest.mark.integration


def start_cache(dds: ControllerHarness) -> None:
    assert dds.app.cache is not None, "watch_cache is on by default"
    dds.app.cache.start()
    assert dds.app.cache.wait_synced(60)


def lists_sent(dds: ControllerHarness) -> int:
    return instrument(dds.dds_api).snapshot().get("LIST", 0)  # build_app instrumented this client: the same counts


def comparable(observation: Observation) -> tuple[Any, ...]:
    """What the planner reads, without what only a long-lived observer knows (idle times)."""
    snapshot = observation.snapshot
    nodes = sorted((n.name, n.group_id, n.ready, n.allocatable, n.taints, n.being_deleted, n.devices)
                   for n in snapshot.nodes)
    return (nodes, sorted(snapshot.pods, key=lambda p: p.key), dict(snapshot.upcoming_nodes),
            dict(observation.unschedulable_since), observation.machines, dict(observation.replicas))


def test_increase_size_and_the_loop_decide_from_the_cache_without_listing(dds: ControllerHarness) -> None:
    group = dds.create_group("workers", replicas=1)
    [node] = dds.node_names()
    start_cache(dds)
    dds.create_pod("train-0", gpus=1)
    dds.wait_unschedulable("train-0")
    observer = dds.app.controller.observer
    wait_for("the cache to hear that train-0 is unschedulable",
             lambda: f"{dds.namespace}/train-0" in observer.observe().unschedulable_since, timeout=30)

    before = lists_sent(dds)
    instances = dds.app.scale_up.increase(group, 1, "ca-request-1")
    dds.run_once()
    dds.app.registry.view(group)  # what CA's NodeGroupTargetSize / NodeGroupNodes read
    assert lists_sent(dds) == before, "a decision after the sync listed the cluster"

    assert [i.kind for i in instances] == [InstanceKind.GPU]
    [attach] = dds.operations()
    assert (attach.kind, attach.node, attach.requested) == (OperationKind.ATTACH, node, 1)


def test_the_cached_snapshot_is_the_one_a_list_gives(dds: ControllerHarness) -> None:
    dds.create_group("workers", replicas=2)
    start_cache(dds)
    dds.create_pod("train-0", gpus=1)
    dds.create_pod("small", memory="1Gi")
    dds.wait_unschedulable("train-0")
    dds.wait_running("small")
    cached = dds.app.controller.observer
    listing = ClusterObserver(KubeClusterReader(dds.dds_api, dds.settings.machineset_namespaces), dds.app.fabric,
                              dds.app.catalog.groups, dds.clock, IdleTracker(), dds.settings.gpu_label)
    wait_for("the cached snapshot to equal the listed one",
             lambda: comparable(cached.observe()) == comparable(listing.observe()), timeout=30)


def test_a_node_dds_has_just_asked_for_counts_before_the_watch_brings_the_machinesets_change(
        dds: ControllerHarness) -> None:
    """A MachineSet patch and its watch event are apart by a moment; a decision in that moment must not see the old
    replicas, or it would ask for the same node again. The stores are filled by one LIST here and never watched, so
    only the write itself can make the new replicas visible."""
    group = dds.create_group("workers", replicas=1, max_size=4)
    with dds.nodes.machines_paused("workers"):  # Cluster API would make the Machine: the replica stays without one
        cache = dds.app.cache
        assert cache is not None and cache.machinesets is not None
        cache.list_once()
        observer = dds.app.controller.observer
        assert observer.observe().snapshot.upcoming_nodes.get(group.id, 0) == 0

        dds.app.controller.executor.nodes.provisioner.add_nodes(group, 1, "ca-request-1")

        assert observer.machineset_replicas()[group.id] == 2
        assert observer.observe().snapshot.upcoming_nodes.get(group.id, 0) == 1
