"""The registry's precomputed node-to-group answers: built once per change of the live nodes or of the groups, never
per CA call, and never stale after a change (a node joins, leaves or moves group; a group appears or goes)."""

from __future__ import annotations

from dds.groups.catalog import NodeGroupCatalog
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.membership import Membership
from dds.provider.registry import Registry, StaticClusterView
from dds.scaling.instances import InstanceTracker
from dds.scaling.requests import LiveNode, RequestNode

from .conftest import RecordingEvents, StaticSource, make_group

GPU = "MachineSet/default/gpu-workers"
CPU = "MachineSet/default/cpu-workers"


def registry_over(nodes: list[LiveNode], groups=None) -> tuple[Registry, StaticClusterView, StaticSource]:
    source = StaticSource(groups if groups is not None else [
        make_group(GPU), make_group(CPU, mode="observed", max="5", max_gpus="0", gpu_count="0", models="")])
    catalog = NodeGroupCatalog(source=source, events=RecordingEvents())
    catalog.refresh()
    cluster = StaticClusterView(nodes)
    return Registry(catalog, cluster, InstanceTracker()), cluster, source


def asked(name: str, provider_id: str = "", **labels: str) -> RequestNode:
    return RequestNode(name=name, provider_id=provider_id, labels=labels, annotations={})


def group_id_for(registry: Registry, node: RequestNode) -> str:
    group = registry.group_for_node(node)
    return group.id if group is not None else ""


def test_thousands_of_calls_on_an_unchanged_cluster_build_the_index_once():
    nodes = [LiveNode(f"cpu-{i}", f"kwok://cpu-{i}", CPU, True) for i in range(2_000)]
    registry, _, _ = registry_over(nodes)
    for i in range(2_000):
        assert group_id_for(registry, asked(f"cpu-{i}", f"kwok://cpu-{i}")) == CPU
        registry.view(registry.require(CPU))
    registry.views()
    assert registry.membership.builds == 1
    assert registry.view(registry.require(CPU)).live_nodes == 2_000


def test_a_node_that_joins_leaves_or_moves_group_is_answered_from_the_new_view():
    registry, cluster, _ = registry_over([LiveNode("cpu-1", "kwok://cpu-1", CPU, True)])
    assert group_id_for(registry, asked("cpu-2", "kwok://cpu-2")) == ""
    cluster.set_nodes([LiveNode("cpu-1", "kwok://cpu-1", CPU, True), LiveNode("cpu-2", "kwok://cpu-2", CPU, True)])
    assert group_id_for(registry, asked("cpu-2", "kwok://cpu-2")) == CPU
    assert registry.view(registry.require(CPU)).live_nodes == 2
    cluster.set_nodes([LiveNode("cpu-2", "kwok://cpu-2", GPU, True)])  # cpu-1 gone, cpu-2 now in a spec-fixed group
    assert group_id_for(registry, asked("cpu-1", "kwok://cpu-1")) == ""
    assert group_id_for(registry, asked("cpu-2", "kwok://cpu-2")) == f"{GPU}#live"  # spec-fixed: its companion
    assert registry.view(registry.require(CPU)).live_nodes == 0
    assert [(v.id, v.max_size) for v in registry.views() if v.id.startswith(GPU)] == [(GPU, 3), (f"{GPU}#live", 1)]
    assert registry.membership.builds == 3


def test_a_group_that_appears_or_goes_on_refresh_changes_the_answers():
    registry, _, source = registry_over([LiveNode("cpu-1", "kwok://cpu-1", CPU, True)], groups=[make_group(GPU)])
    assert group_id_for(registry, asked("cpu-1", "kwok://cpu-1")) == ""
    source.result = type(source.result)((make_group(GPU), make_group(CPU, mode="observed", max="5", max_gpus="0",
                                                                      gpu_count="0", models="")))
    registry.refresh()
    assert group_id_for(registry, asked("cpu-1", "kwok://cpu-1")) == CPU
    builds = registry.membership.builds
    registry.refresh()  # the same groups read again: a new tuple of equal specs, no rebuild
    group_id_for(registry, asked("cpu-1", "kwok://cpu-1"))
    assert registry.membership.builds == builds
    source.result = type(source.result)((make_group(GPU),))
    registry.refresh()
    assert group_id_for(registry, asked("cpu-1", "kwok://cpu-1")) == ""


def test_lookups_keep_the_rules_of_the_linear_search():
    first, duplicate = LiveNode("a", "kwok://same", CPU, True), LiveNode("b", "kwok://same", None, True)
    membership = Membership.build([first, duplicate], [make_group(GPU)])
    assert membership.live("b", "kwok://same") is first  # providerID first, the first node holding it
    assert membership.live("b", "") is duplicate  # no providerID: by name
    assert membership.live("", "kwok://other") is None
    assert membership.groups_by_label["MachineSet.default.gpu-workers"].id == GPU


def test_an_unlisted_node_is_mapped_by_its_node_group_label(provider_factory):
    provider = provider_factory([make_group(CPU, mode="observed", max="5", max_gpus="0", gpu_count="0", models="")])
    answer = provider.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(
        name="new-1", labels={"dds.cdi.dev/node-group": "MachineSet.default.cpu-workers"})), timeout=5)
    assert answer.nodeGroup.id == CPU


def test_the_live_view_hands_over_the_same_tuple_until_a_node_changes():
    # The index is keyed on the view's tuple: a re-read that finds nothing new must not invalidate it.
    from dataclasses import replace

    from .test_observed_cluster_view import Observer, Record, machine, view_over

    a, b = Record("a", "kwok://a"), Record("b", "kwok://b")
    observer = Observer([a, b], (machine("a", CPU), machine("b", CPU)))
    view, clock = view_over(observer)
    first = view.nodes()
    clock.now += 5.0
    assert view.nodes() is first
    observer.records = [replace(a, ready=False), b]
    clock.now += 5.0
    changed = view.nodes()
    assert changed is not first and [n.ready for n in changed] == [False, True]
    observer.records = [b]
    clock.now += 5.0
    assert [n.name for n in view.nodes()] == ["b"]
