"""Every CloudProvider RPC over a real gRPC channel, with good and bad input, as cluster-autoscaler would call it."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.k8s import core_v1_pb2, meta_v1_pb2
from dds.scaling.instances import ERROR_CLASS_OUT_OF_RESOURCES
from dds.scaling.requests import FAKE_NODE_REASON, LiveNode, Placeholder

from .conftest import RefusingScaleUp, make_group

GROUP = "MachineSet/default/gpu-workers"
OBSERVED = "MachineSet/default/cpu-workers"


def status_of(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=5)
    return info.value.code(), info.value.details()


def target(provider, group_id: str = GROUP) -> int:
    return provider.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=group_id), timeout=5).targetSize


def node(name: str = "", provider_id: str = "", **annotations: str) -> pb.ExternalGrpcNode:
    return pb.ExternalGrpcNode(name=name, providerID=provider_id,
                               annotations={k.replace("_", "/"): v for k, v in annotations.items()})


def placeholder(instance_id: str, reason: str = "create-error") -> pb.ExternalGrpcNode:
    return pb.ExternalGrpcNode(name=instance_id, providerID=instance_id, annotations={FAKE_NODE_REASON: reason})


@pytest.fixture
def provider(provider_factory):
    """A spec-fixed group (1 live node of max 4) and an observed group (1 live node of max 3)."""
    groups = [make_group(), make_group(OBSERVED, mode="observed", max="3", max_gpus="0", gpu_count="0", models="")]
    nodes = [LiveNode("gpu-1", "kwok://gpu-1", GROUP, True), LiveNode("cpu-1", "kwok://cpu-1", OBSERVED, True),
             LiveNode("other-1", "kwok://other-1", None, True)]
    return provider_factory(groups, nodes)


# --- groups and membership ---

def test_node_groups_report_spec_fixed_and_observed_limits(provider):
    answer = provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
    limits = {g.id: (g.minSize, g.maxSize) for g in answer.nodeGroups}
    # spec-fixed: min 0, max = 4 - 1 live node, and its companion holds that node; observed: as configured
    assert limits == {GROUP: (0, 3), f"{GROUP}#live": (1, 1), OBSERVED: (1, 3)}
    assert all(g.debug for g in answer.nodeGroups)


@pytest.mark.parametrize("request_node, expected", [
    pytest.param(node("gpu-1", "kwok://gpu-1"), f"{GROUP}#live", id="live-node-of-spec-fixed-group-is-in-its-companion"),
    pytest.param(node("cpu-1", "kwok://cpu-1"), OBSERVED, id="live-node-of-observed-group"),
    pytest.param(node("other-1", "kwok://other-1"), "", id="node-of-no-group"),
    pytest.param(node("unknown", "aws:///i-123"), "", id="unknown-node"),
    pytest.param(placeholder(f"dds://{GROUP}/node/gone"), GROUP, id="placeholder-of-dropped-instance"),
    pytest.param(placeholder("dds://MachineSet/x/unknown/node/abc"), "", id="placeholder-of-unserved-group"),
    pytest.param(pb.ExternalGrpcNode(name="n", labels={"dds.cdi.dev/node-group": "MachineSet.default.cpu-workers"}),
                 OBSERVED, id="unlisted-node-labelled-with-observed-group"),
])
def test_node_group_for_node(provider, request_node, expected):
    answer = provider.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=request_node), timeout=5)
    assert answer.nodeGroup.id == expected


def test_node_group_for_node_maps_listed_instance_to_its_group(provider):
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=1), timeout=5)
    instance_id = provider.tracker.list(GROUP)[0].id
    answer = provider.stub.NodeGroupForNode(
        pb.NodeGroupForNodeRequest(node=node(instance_id, instance_id)), timeout=5)
    assert (answer.nodeGroup.id, answer.nodeGroup.maxSize) == (GROUP, 3)


@pytest.mark.parametrize("request_, fragment", [
    pytest.param(pb.NodeGroupForNodeRequest(), "node is missing", id="missing-node"),
    pytest.param(pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode()), "neither a name nor a providerID",
                 id="empty-node"),
])
def test_node_group_for_node_rejects_missing_fields(provider, request_, fragment):
    code, message = status_of(provider.stub.NodeGroupForNode, request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fragment in message


def test_gpu_label_and_types(provider):
    # CA's GPU label is DDS's own, kept true per node (docs/gpu-label.md), not the model label pods select on.
    assert provider.stub.GPULabel(pb.GPULabelRequest(), timeout=5).label == "dds.cdi.dev/attached-gpu"
    types = provider.stub.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest(), timeout=5).gpuTypes
    assert list(types) == ["A30"] and types["A30"].type_url == ""


def test_refresh_keeps_last_good_groups_when_the_source_fails(provider):
    from dds.groups.sources import SourceUnavailable

    provider.source.result = SourceUnavailable("apiserver unreachable")
    provider.stub.Refresh(pb.RefreshRequest(), timeout=5)  # no error: CA's loop must go on
    ids = [g.id for g in provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups]
    assert sorted(ids) == sorted([GROUP, f"{GROUP}#live", OBSERVED])


# --- sizes ---

@pytest.mark.parametrize("group_id, expected", [(GROUP, 0), (OBSERVED, 1)], ids=["spec-fixed", "observed"])
def test_target_size_at_rest(provider, group_id, expected):
    assert target(provider, group_id) == expected


@pytest.mark.parametrize("rpc, request_, code, fragment", [
    pytest.param("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="MachineSet/default/nope"),
                 grpc.StatusCode.NOT_FOUND, "'MachineSet/default/nope' is not served", id="target-unknown-group"),
    pytest.param("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(), grpc.StatusCode.INVALID_ARGUMENT,
                 "id is empty", id="target-missing-id"),
    pytest.param("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id="nope", delta=1),
                 grpc.StatusCode.NOT_FOUND, "not served", id="increase-unknown-group"),
    pytest.param("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=0),
                 grpc.StatusCode.INVALID_ARGUMENT, "must be positive, got delta 0", id="increase-zero"),
    pytest.param("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=-2),
                 grpc.StatusCode.INVALID_ARGUMENT, "got delta -2", id="increase-negative"),
    pytest.param("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=4),
                 grpc.StatusCode.INVALID_ARGUMENT, "target size 0 + delta 4 = 4 exceeds max size 3",
                 id="increase-oversized-spec-fixed"),
    pytest.param("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=OBSERVED, delta=3),
                 grpc.StatusCode.INVALID_ARGUMENT, "target size 1 + delta 3 = 4 exceeds max size 3",
                 id="increase-oversized-observed"),
    pytest.param("NodeGroupDecreaseTargetSize", pb.NodeGroupDecreaseTargetSizeRequest(id=GROUP, delta=1),
                 grpc.StatusCode.INVALID_ARGUMENT, "must be negative, got delta 1", id="decrease-positive"),
    pytest.param("NodeGroupDecreaseTargetSize", pb.NodeGroupDecreaseTargetSizeRequest(id=GROUP, delta=-1),
                 grpc.StatusCode.FAILED_PRECONDITION, "only 0 requested instance(s) have no node yet",
                 id="decrease-below-in-flight"),
    pytest.param("NodeGroupDecreaseTargetSize", pb.NodeGroupDecreaseTargetSizeRequest(id=OBSERVED, delta=-1),
                 grpc.StatusCode.FAILED_PRECONDITION, "1 live node(s)", id="decrease-would-remove-live-node"),
    pytest.param("NodeGroupNodes", pb.NodeGroupNodesRequest(id="nope"), grpc.StatusCode.NOT_FOUND, "not served",
                 id="nodes-unknown-group"),
    pytest.param("NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id="nope"),
                 grpc.StatusCode.NOT_FOUND, "not served", id="template-unknown-group"),
    pytest.param("NodeGroupGetOptions", pb.NodeGroupAutoscalingOptionsRequest(id=GROUP),
                 grpc.StatusCode.INVALID_ARGUMENT, "no defaults", id="options-missing-defaults"),
    pytest.param("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id=OBSERVED),
                 grpc.StatusCode.INVALID_ARGUMENT, "no nodes given", id="delete-no-nodes"),
    pytest.param("PricingNodePrice", pb.PricingNodePriceRequest(node=node("gpu-1")), grpc.StatusCode.UNIMPLEMENTED,
                 "no pricing model", id="node-price"),
    pytest.param("PricingPodPrice", pb.PricingPodPriceRequest(pod_bytes=b"\n\x00"), grpc.StatusCode.UNIMPLEMENTED,
                 "no pricing model", id="pod-price"),
])
def test_bad_requests_get_a_status_and_a_message(provider, rpc, request_, code, fragment):
    got_code, message = status_of(getattr(provider.stub, rpc), request_)
    assert got_code == code
    assert fragment in message


def test_increase_is_visible_in_target_size_and_nodes_before_the_answer(provider):
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=2), timeout=5)
    assert target(provider) == 2
    instances = provider.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=GROUP), timeout=5).instances
    assert [i.status.instanceState for i in instances] == [pb.InstanceStatus.instanceCreating] * 2
    assert all(i.id.startswith(f"dds://{GROUP}/node/") and not i.status.errorInfo.errorCode for i in instances)
    # the group's remaining room shrinks accordingly: 3 - 2 = 1 more
    code, message = status_of(provider.stub.NodeGroupIncreaseSize,
                              pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=2))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "target size 2 + delta 2 = 4 exceeds max size 3" in message


def test_observed_group_lists_live_nodes_as_running(provider):
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=OBSERVED, delta=1), timeout=5)
    assert target(provider, OBSERVED) == 2
    instances = provider.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=OBSERVED), timeout=5).instances
    states = {i.id: i.status.instanceState for i in instances}
    assert states["kwok://cpu-1"] == pb.InstanceStatus.instanceRunning
    assert sorted(states.values()) == sorted([pb.InstanceStatus.instanceRunning, pb.InstanceStatus.instanceCreating])


def test_refused_scale_up_is_resource_exhausted_with_the_reason(provider_factory):
    provider = provider_factory([make_group()], scale_up=RefusingScaleUp())
    code, message = status_of(provider.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "pool default is empty" in message
    assert target(provider) == 0


class NothingToAdd:
    """A scale-up whose capacity is already there (dds/controller/ca_requests.py: a stale call, or every pod of CA's
    atomic request fitting what is booked for it): success, no instance."""

    def increase(self, group, delta, request_key):
        return []


def test_an_increase_answered_with_nothing_to_add_succeeds_and_leaves_the_target_size(provider_factory):
    # CA registers the scale-up and, finding no upcoming node at its next loop, closes it as done (clusterstate.go,
    # updateScaleRequests): no backoff, unlike a refusal.
    provider = provider_factory([make_group()], scale_up=NothingToAdd())
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=1), timeout=5)
    assert target(provider) == 0
    assert list(provider.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=GROUP), timeout=5).instances) == []


def test_decrease_forgets_newest_instances(provider):
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=3), timeout=5)
    oldest = provider.tracker.list(GROUP)[0].id
    provider.stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=GROUP, delta=-2), timeout=5)
    assert target(provider) == 1 and [r.id for r in provider.tracker.list(GROUP)] == [oldest]


def test_failed_instance_carries_error_info_and_its_placeholder_drops_it(provider):
    provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=1), timeout=5)
    instance_id = provider.tracker.list(GROUP)[0].id
    provider.tracker.fail(instance_id, "OutOfResources", "pool default has no free A30", ERROR_CLASS_OUT_OF_RESOURCES)

    listed = provider.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=GROUP), timeout=5).instances[0]
    assert listed.status.instanceState == pb.InstanceStatus.instanceCreating
    assert (listed.status.errorInfo.errorCode, listed.status.errorInfo.errorMessage,
            listed.status.errorInfo.instanceErrorClass) == ("OutOfResources", "pool default has no free A30", 1)

    request = pb.NodeGroupDeleteNodesRequest(id=GROUP, nodes=[placeholder(instance_id)])
    provider.stub.NodeGroupDeleteNodes(request, timeout=5)
    assert target(provider) == 0
    (group_id, targets, key), = provider.scale_down.calls
    assert isinstance(targets[0], Placeholder) and targets[0].instance.id == instance_id
    # CA repeats the call every loop while it still has the placeholder: same answer, same key, nothing else dropped
    provider.stub.NodeGroupDeleteNodes(request, timeout=5)
    assert provider.scale_down.calls[1][2] == key and provider.scale_down.calls[1][1][0].instance is None


@pytest.mark.parametrize("group_id, victim, fragment", [
    pytest.param(OBSERVED, node("gpu-1", "kwok://gpu-1"), f"belongs to node group {GROUP}, not to {OBSERVED}",
                 id="node-of-another-group"),
    pytest.param(OBSERVED, node("other-1", "kwok://other-1"), "belongs to no DDS node group", id="node-of-no-group"),
    pytest.param(GROUP, node("gpu-1", "kwok://gpu-1"), "spec-fixed group", id="live-node-of-spec-fixed-group"),
    pytest.param(OBSERVED, placeholder(f"dds://{GROUP}/gpu/abc"), f"placeholder of node group {GROUP}",
                 id="placeholder-of-another-group"),
])
def test_delete_nodes_refuses_nodes_outside_the_group(provider, group_id, victim, fragment):
    code, message = status_of(provider.stub.NodeGroupDeleteNodes,
                              pb.NodeGroupDeleteNodesRequest(id=group_id, nodes=[victim]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and fragment in message
    assert victim.name in message
    assert provider.scale_down.calls == []


def test_delete_nodes_of_observed_group_reach_the_decider(provider):
    provider.stub.NodeGroupDeleteNodes(
        pb.NodeGroupDeleteNodesRequest(id=OBSERVED, nodes=[node("cpu-1", "kwok://cpu-1")]), timeout=5)
    (group_id, targets, key), = provider.scale_down.calls
    assert group_id == OBSERVED and [t.name for t in targets] == ["cpu-1"] and key.startswith("delete/")


# --- template and options ---

def test_template_fills_node_bytes_and_legacy_node_info_with_the_max_gpus(provider):
    answer = provider.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=GROUP), timeout=5)
    assert answer.nodeBytes and answer.nodeInfo.SerializeToString(deterministic=True) == answer.nodeBytes
    decoded = core_v1_pb2.Node.FromString(answer.nodeBytes)
    assert decoded.metadata.name.startswith("template-machineset-default-gpu-workers-")
    assert decoded.status.allocatable["nvidia.com/gpu"].string == "4"
    assert decoded.status.capacity["cpu"].string == "16"
    assert decoded.metadata.labels["nvidia.com/gpu.product"] == "A30"


def _duration(seconds: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds)


def test_options_echo_defaults_apply_overrides_and_fill_both_duration_fields(provider_factory):
    provider = provider_factory([make_group(gpu_threshold="0.2", unneeded="5m")])
    defaults = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5, scaleDownGpuUtilizationThreshold=0.5, ignoreDaemonSetsUtilization=True,
        scaleDownUnneededDuration=_duration(600), scaleDownUnreadyDuration=_duration(1200),
        MaxNodeProvisionDuration=_duration(900))
    answer = provider.stub.NodeGroupGetOptions(
        pb.NodeGroupAutoscalingOptionsRequest(id=GROUP, defaults=defaults), timeout=5).nodeGroupAutoscalingOptions
    assert (answer.scaleDownUtilizationThreshold, answer.scaleDownGpuUtilizationThreshold) == (0.5, 0.2)
    assert answer.ignoreDaemonSetsUtilization is True
    assert answer.scaleDownUnneededDuration.seconds == 300 and answer.scaleDownUnneededTime.duration == 300 * 10**9
    assert answer.scaleDownUnreadyDuration.seconds == 1200 and answer.scaleDownUnreadyTime.duration == 1200 * 10**9
    assert answer.MaxNodeProvisionDuration.seconds == 900 and answer.MaxNodeProvisionTime.duration == 900 * 10**9


def test_options_from_a_legacy_client_are_answered_in_both_fields(provider):
    legacy = pb.NodeGroupAutoscalingOptions(
        scaleDownUnneededTime=meta_v1_pb2.Duration(duration=600 * 10**9),
        scaleDownUnreadyTime=meta_v1_pb2.Duration(duration=1200 * 10**9),
        MaxNodeProvisionTime=meta_v1_pb2.Duration(duration=900 * 10**9))
    answer = provider.stub.NodeGroupGetOptions(
        pb.NodeGroupAutoscalingOptionsRequest(id=GROUP, defaults=legacy), timeout=5).nodeGroupAutoscalingOptions
    assert answer.MaxNodeProvisionDuration.seconds == 900  # the demo group has no override
    assert answer.HasField("scaleDownUnreadyTime") and answer.scaleDownUnreadyDuration.seconds == 1200


def test_cleanup_answers(provider):
    provider.stub.Cleanup(pb.CleanupRequest(), timeout=5)


def test_health_service_reports_serving(provider):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(provider.channel)
    for service in ("", "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
