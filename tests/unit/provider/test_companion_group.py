"""The companion group `G#live` of a spec-fixed group G, over a real gRPC channel as cluster-autoscaler calls it: it holds
G's live nodes at min = max = target (so CA caches their NodeGroupForNode answer and never scales them), G keeps no live
node (its template stays the one with every GPU slot filled), and every change CA could ask of it is refused."""

from __future__ import annotations

import grpc
import pytest

from dds.groups.schema import GroupInput, parse_group
from dds.model.groups import SourceRef
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.k8s import core_v1_pb2
from dds.scaling.requests import LiveNode

from .conftest import annotations, make_group
from .test_servicer_grpc import node, status_of, target

GROUP = "MachineSet/default/gpu-workers"  # spec-fixed, max 4
LIVE = f"{GROUP}#live"
OBSERVED = "MachineSet/default/cpu-workers"
EMPTY = "MachineSet/default/empty-workers"  # spec-fixed, no live node


def gpu_node(i: int) -> LiveNode:
    return LiveNode(f"gpu-{i}", f"kwok://gpu-{i}", GROUP, True)


@pytest.fixture
def provider(provider_factory):
    """Two live nodes of the spec-fixed group, one of the observed group, a spec-fixed group with none."""
    groups = [make_group(), make_group(EMPTY),
              make_group(OBSERVED, mode="observed", max="3", max_gpus="0", gpu_count="0", models="")]
    nodes = [gpu_node(1), gpu_node(2), LiveNode("cpu-1", "kwok://cpu-1", OBSERVED, True)]
    return provider_factory(groups, nodes)


def served(provider) -> dict[str, tuple[int, int]]:
    return {g.id: (g.minSize, g.maxSize) for g in provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups}


def group_of(provider, request_node: pb.ExternalGrpcNode) -> pb.NodeGroup:
    return provider.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=request_node), timeout=5).nodeGroup


# --- listing and sizes ---

def test_only_a_spec_fixed_group_with_live_nodes_has_a_companion_listed_after_it(provider):
    ids = [g.id for g in provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups]
    assert ids.index(LIVE) == ids.index(GROUP) + 1
    assert f"{EMPTY}#live" not in ids and f"{OBSERVED}#live" not in ids


def test_the_companion_is_held_at_its_live_nodes_and_the_group_keeps_only_its_room_to_grow(provider):
    assert served(provider)[LIVE] == (2, 2) and target(provider, LIVE) == 2
    assert served(provider)[GROUP] == (0, 2) and target(provider, GROUP) == 0  # max 4 minus 2 live nodes
    listed = provider.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=LIVE), timeout=5).instances
    assert [(i.id, i.status.instanceState) for i in listed] == [("kwok://gpu-1", pb.InstanceStatus.instanceRunning),
                                                                ("kwok://gpu-2", pb.InstanceStatus.instanceRunning)]
    assert provider.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=GROUP), timeout=5).instances == []


def test_an_increase_of_the_group_counts_in_the_group_not_in_its_companion(provider):
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=2), timeout=5)
    assert (target(provider, GROUP), target(provider, LIVE)) == (2, 2)
    code, message = status_of(provider.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "exceeds max size 2" in message


def test_a_node_joining_or_leaving_moves_the_companion_and_the_groups_max_at_once(provider):
    assert group_of(provider, node("gpu-1", "kwok://gpu-1")).maxSize == 2
    provider.cluster.set_nodes([gpu_node(1), gpu_node(2), gpu_node(3)])
    assert served(provider)[LIVE] == (3, 3) and served(provider)[GROUP] == (0, 1)
    assert group_of(provider, node("gpu-3", "kwok://gpu-3")).id == LIVE
    # The answer CA caches per node carries the new sizes at once (it is built once per change, not per call).
    assert (group_of(provider, node("gpu-1", "kwok://gpu-1")).minSize,
            group_of(provider, node("gpu-1", "kwok://gpu-1")).maxSize) == (3, 3)
    provider.cluster.set_nodes([])
    assert LIVE not in served(provider) and served(provider)[GROUP] == (0, 4)
    assert group_of(provider, node("gpu-3", "kwok://gpu-3")).id == ""
    # CA read NodeGroups before the last node went: its TargetSize of the companion is an answer, not an error
    # (an error there aborts CA's whole loop).
    assert target(provider, LIVE) == 0
    assert provider.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=LIVE), timeout=5).instances == []


# --- membership ---

def test_live_nodes_of_the_spec_fixed_group_map_to_its_companion_with_its_sizes(provider):
    answer = group_of(provider, node("gpu-1", "kwok://gpu-1"))
    assert (answer.id, answer.minSize, answer.maxSize) == (LIVE, 2, 2)
    assert GROUP in answer.debug and "live node" in answer.debug
    assert group_of(provider, node("", "kwok://gpu-2")).id == LIVE  # by providerID alone
    assert group_of(provider, node("gpu-2")).id == LIVE  # by name alone


def test_an_in_flight_instance_still_maps_to_the_group_itself(provider):
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=1), timeout=5)
    instance_id = provider.tracker.list(GROUP)[0].id
    assert group_of(provider, node(instance_id, instance_id)).id == GROUP


def test_a_labelled_spec_fixed_node_the_cluster_view_does_not_show_yet_is_in_no_group(provider):
    # The companion's target counts the view's nodes: a node outside it would be a unit CA cannot find listed.
    labelled = pb.ExternalGrpcNode(name="gpu-9", labels={"dds.cdi.dev/node-group": "MachineSet.default.gpu-workers"})
    assert group_of(provider, labelled).id == ""


# --- what CA may not do to it ---

@pytest.mark.parametrize("rpc, request_, fragment", [
    pytest.param("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=LIVE, delta=1),
                 "size increase by 1 of", id="increase"),
    pytest.param("NodeGroupDecreaseTargetSize", pb.NodeGroupDecreaseTargetSizeRequest(id=LIVE, delta=-1),
                 "target size decrease by 1 of", id="decrease"),
    pytest.param("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id=LIVE, nodes=[node("gpu-1", "kwok://gpu-1")]),
                 "deleting gpu-1", id="delete-nodes"),
])
def test_changes_to_the_companion_are_refused_and_say_who_scales_its_nodes(provider, rpc, request_, fragment):
    code, message = status_of(getattr(provider.stub, rpc), request_)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert fragment in message and LIVE in message
    assert "min = max = target = 2" in message and "DDS scales" in message
    assert provider.scale_down.calls == [] and provider.tracker.list(GROUP) == ()
    assert target(provider, LIVE) == 2


def test_options_of_the_companion_are_left_to_cluster_autoscalers_defaults(provider):
    request = pb.NodeGroupAutoscalingOptionsRequest(id=LIVE, defaults=pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5))
    code, message = status_of(provider.stub.NodeGroupGetOptions, request)
    assert code == grpc.StatusCode.UNIMPLEMENTED and "defaults apply" in message


def test_the_companions_template_is_its_groups_with_every_gpu_slot_filled(provider):
    answer = provider.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=LIVE), timeout=5)
    decoded = core_v1_pb2.Node.FromString(answer.nodeBytes)
    assert decoded.metadata.name.startswith("template-machineset-default-gpu-workers-")
    assert decoded.status.allocatable["nvidia.com/gpu"].string == "4"


@pytest.mark.parametrize("group_id, fragment", [
    pytest.param("MachineSet/default/nope#live", "'MachineSet/default/nope' is not served by DDS", id="unknown-group"),
    pytest.param(f"{OBSERVED}#live", "is in observed mode", id="observed-group"),
    pytest.param("#live", "not served", id="no-group-at-all"),
])
def test_a_companion_id_of_no_spec_fixed_group_is_not_found(provider, group_id, fragment):
    code, message = status_of(provider.stub.NodeGroupTargetSize, pb.NodeGroupTargetSizeRequest(id=group_id))
    assert code == grpc.StatusCode.NOT_FOUND and fragment in message


# --- cost: precomputed ---

def test_companion_answers_are_built_once_per_change_not_per_call(provider):
    served(provider)
    builds = provider.registry.membership.builds
    for _ in range(200):
        assert group_of(provider, node("gpu-1", "kwok://gpu-1")).id == LIVE
        target(provider, LIVE)
    assert provider.registry.membership.builds == builds


# --- the id is reserved ---

def test_a_group_id_holding_the_companion_separator_is_refused_with_the_reason():
    spec, errors = parse_group(GroupInput(id="gpu#live", annotations=annotations(),
                                          source=SourceRef(kind="File", name="test#gpu")))
    assert spec is None
    assert [(e.key, "must not contain '#'" in e.message) for e in errors] == [("id", True)]
