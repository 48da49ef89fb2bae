"""Bad input on the CloudProvider API, over a real gRPC channel to a running provider server.

Three campaigns, each counted in the figures printed at the end of the run (`figures.py`):
- a stateful one: random sequences of every RPC with random ids, deltas, node lists, labels and option defaults,
  against a model that predicts each answer; after every call the invariants CA relies on are checked;
- raw random bytes (and mutations of valid requests) as the payload of each method;
- sizes: huge node lists, huge ids, messages over the receive limit, concurrent scale-ups racing for the last room.

Whatever the input, the server never answers UNKNOWN or INTERNAL: a refusal has a specific code and a message that
names the bad field or value, and the server keeps serving.
"""

from __future__ import annotations

from concurrent import futures
from typing import Iterator, Optional

import grpc
import pytest
from google.protobuf import duration_pb2, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import event, given, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dds.model.groups import LABEL_NODE_GROUP
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.k8s import core_v1_pb2, meta_v1_pb2
from dds.scaling.instances import ERROR_CLASS_OTHER, ERROR_CLASS_OUT_OF_RESOURCES
from dds.scaling.requests import FAKE_NODE_REASON, LiveNode
from dds.provider.server import SERVICE_NAME
from tests.unit.provider.conftest import Provider, make_group, provider_factory, start_provider  # noqa: F401
from tests.unit.reliability import figures
from tests.unit.reliability.figures import FUZZ, STATEFUL, CountingStub, assert_clean_rejection

pytestmark = figures.SOAK_MARKS

GPU_LABEL = "nvidia.com/gpu.product"
SPEC_FIXED = "MachineSet/default/gpu-workers"  # max 4, one live node: CA may have 3 in flight
OBSERVED = "MachineSet/default/cpu-workers"  # min 1, max 3, one live node
FULL = "MachineSet/other/full"  # spec-fixed, max 1, its one node is live: no room at all
GROUPS = (SPEC_FIXED, OBSERVED, FULL)
LIVE = (LiveNode("gpu-1", "kwok://gpu-1", SPEC_FIXED, True), LiveNode("cpu-1", "kwok://cpu-1", OBSERVED, True),
        LiveNode("full-1", "kwok://full-1", FULL, True), LiveNode("other-1", "kwok://other-1", None, True))
MAX = {SPEC_FIXED: 3, OBSERVED: 3, FULL: 0}  # what NodeGroups reports as maxSize
# The companions of the two spec-fixed groups (dds/provider/membership.py): their one live node each, min = max = 1.
COMPANIONS = {f"{SPEC_FIXED}#live": "kwok://gpu-1", f"{FULL}#live": "kwok://full-1"}
LIVE_IN = {SPEC_FIXED: 0, OBSERVED: 1, FULL: 0}  # live nodes counted in TargetSize (observed groups only)
INT32 = (-2**31, 2**31 - 1)
INT64 = (-2**63, 2**63 - 1)
TIMEOUT = 10


def groups():
    return [make_group(SPEC_FIXED, models="A30,H100"),
            make_group(OBSERVED, mode="observed", max="3", max_gpus="0", gpu_count="0", models=""),
            make_group(FULL, min="0", max="1", models="L40S")]


# --- strategies ---

texts = st.text(max_size=40)
def half(usual: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`usual` half the time (`usual | odd` would flatten a one_of and make `usual` rarer)."""
    return st.booleans().flatmap(lambda pick: usual if pick else odd)


# Half the time a served group (so calls get past the id check), half the time something that only looks like one.
group_ids = half(st.sampled_from(GROUPS), st.one_of(
    st.just(""), texts, st.sampled_from(GROUPS).map(lambda g: g + " "), st.sampled_from(GROUPS).map(str.upper),
    st.sampled_from(GROUPS).map(lambda g: f"dds://{g}/node/x")))
deltas = half(st.integers(-4, 4), st.sampled_from([INT32[0], INT32[1], 2**30, -2**30]) | st.integers(*INT32))
gpu_types = st.one_of(st.sampled_from(["A30", "H100", "L40S", "", "a30", "nvidia-a100-80gb"]), texts)
label_maps = st.dictionaries(
    st.one_of(st.sampled_from([GPU_LABEL, LABEL_NODE_GROUP, "kubernetes.io/hostname"]), texts),
    st.one_of(gpu_types, st.sampled_from(["MachineSet.default.cpu-workers", "MachineSet.default.gpu-workers"])),
    max_size=4)
annotation_maps = st.dictionaries(st.one_of(st.just(FAKE_NODE_REASON), texts),
                                  st.sampled_from(["create-error", "unregistered", "", "x"]) | texts, max_size=3)
durations = st.builds(duration_pb2.Duration, seconds=st.integers(*INT64), nanos=st.integers(*INT32)) | st.builds(
    duration_pb2.Duration, seconds=st.integers(-10**6, 10**6), nanos=st.integers(0, 999_999_999))
legacy_durations = st.builds(meta_v1_pb2.Duration, duration=st.integers(*INT64))
floats = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def option_defaults(draw) -> Optional[pb.NodeGroupAutoscalingOptions]:
    if draw(st.integers(0, 9)) == 0:
        return None  # the field missing
    options = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=draw(floats), scaleDownGpuUtilizationThreshold=draw(floats),
        zeroOrMaxNodeScaling=draw(st.booleans()), ignoreDaemonSetsUtilization=draw(st.booleans()))
    for current, legacy in (("scaleDownUnneededDuration", "scaleDownUnneededTime"),
                            ("scaleDownUnreadyDuration", "scaleDownUnreadyTime"),
                            ("MaxNodeProvisionDuration", "MaxNodeProvisionTime")):
        if draw(st.booleans()):
            getattr(options, current).CopyFrom(draw(durations))
        if draw(st.booleans()):
            getattr(options, legacy).CopyFrom(draw(legacy_durations))
    return options


# --- the stateful campaign ---

class ProviderMachine(RuleBasedStateMachine):
    """One provider server per run; the model is the set of in-flight instance ids per group."""

    def __init__(self) -> None:
        super().__init__()
        self.provider: Provider = start_provider(groups(), LIVE)
        self.stub = CountingStub(self.provider.stub)
        self.checks = self.provider.stub  # invariant checks are not counted as fuzzed requests
        self.expected: dict[str, set[str]] = {g: set() for g in GROUPS}

    def teardown(self) -> None:
        self.provider.channel.close()
        self.provider.server.stop(grace_seconds=0)

    # helpers
    def call(self, rpc: str, request) -> tuple[Optional[object], Optional[grpc.RpcError], str]:
        try:
            answer = getattr(self.stub, rpc)(request, timeout=TIMEOUT)
        except grpc.RpcError as error:
            event(f"{rpc}: {error.code().name}")
            return None, error, assert_clean_rejection(error, rpc)
        event(f"{rpc}: OK")
        return answer, None, ""

    def tracked(self) -> dict[str, str]:
        return {r.id: r.group_id for r in self.provider.tracker.list()}

    def all_ids(self) -> list[str]:
        return sorted(set().union(*self.expected.values()))

    def known_names(self) -> list[str]:
        return self.all_ids() + [n.name for n in LIVE] + [n.provider_id for n in LIVE]

    def assert_unknown_or_empty(self, group_id: str, error: Optional[grpc.RpcError], message: str) -> bool:
        """For an id that is not a served group: NOT_FOUND naming it, or INVALID_ARGUMENT for an empty one."""
        if group_id in GROUPS:
            return False
        assert error is not None, f"{group_id!r} is not served, yet the call succeeded"
        if group_id:
            assert error.code() == grpc.StatusCode.NOT_FOUND and repr(group_id) in message, message
        else:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "id is empty" in message, message
        return True

    def node(self, draw_name: str, draw_pid: str, labels: dict, annotations: dict) -> pb.ExternalGrpcNode:
        return pb.ExternalGrpcNode(name=draw_name, providerID=draw_pid, labels=labels, annotations=annotations)

    # rules: sizes
    @rule(group_id=group_ids, delta=deltas)
    def increase(self, group_id: str, delta: int) -> None:
        before = self.tracked()
        _, error, message = self.call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=group_id,
                                                                                               delta=delta))
        if self.assert_unknown_or_empty(group_id, error, message):
            assert self.tracked() == before
            return
        room = MAX[group_id] - len(self.expected[group_id]) - LIVE_IN[group_id]
        if delta <= 0:
            assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, message
            assert f"delta {delta}" in message, message
        elif delta > room:
            assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, message
            assert f"delta {delta}" in message and "exceeds max size" in message, message
        else:
            assert error is None, message
            added = set(self.tracked()) - set(before)
            assert len(added) == delta and all(self.tracked()[i] == group_id for i in added)
            self.expected[group_id] |= added
            return
        assert self.tracked() == before  # a refused call changes nothing

    @rule(group_id=group_ids, delta=deltas)
    def decrease(self, group_id: str, delta: int) -> None:
        before = self.provider.tracker.list()
        _, error, message = self.call("NodeGroupDecreaseTargetSize",
                                      pb.NodeGroupDecreaseTargetSizeRequest(id=group_id, delta=delta))
        if self.assert_unknown_or_empty(group_id, error, message):
            assert self.provider.tracker.list() == before
            return
        in_flight = [r for r in before if r.group_id == group_id]
        if delta >= 0:
            assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, message
            assert f"delta {delta}" in message, message
        elif -delta > len(in_flight):
            assert error is not None and error.code() == grpc.StatusCode.FAILED_PRECONDITION, message
            assert f"by {-delta}" in message, message
        else:
            assert error is None, message
            removed = {r.id for r in before} - {r.id for r in self.provider.tracker.list()}
            assert len(removed) == -delta and removed <= self.expected[group_id]
            kept = [r for r in in_flight if r.id not in removed]
            newest_kept = max(((r.created_at, r.id) for r in kept), default=None)
            oldest_removed = min((r.created_at, r.id) for r in in_flight if r.id in removed)
            assert newest_kept is None or newest_kept < oldest_removed, "decrease must forget the newest first"
            self.expected[group_id] -= removed
            return
        assert self.provider.tracker.list() == before

    @rule(group_id=group_ids, data=st.data())
    def delete_nodes(self, group_id: str, data: st.DataObject) -> None:
        names = st.one_of(texts, st.sampled_from(self.known_names()))
        nodes = data.draw(st.lists(st.builds(self.node, names, names, label_maps, annotation_maps), max_size=12),
                          label="nodes")
        before = self.tracked()
        _, error, message = self.call("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id=group_id,
                                                                                             nodes=nodes))
        if self.assert_unknown_or_empty(group_id, error, message):
            assert self.tracked() == before
            return
        if error is not None:
            assert self.tracked() == before, "a refused DeleteNodes must not drop anything"
            if not nodes:
                assert "no nodes given" in message, message
            else:
                assert error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)
                assert any((n.name and n.name in message) or (n.providerID and n.providerID in message)
                           or "neither a name nor a providerID" in message for n in nodes), message
            return
        named = {(n.providerID if n.providerID in before else n.name) for n in nodes
                 if n.providerID in before or n.name in before}
        assert all(before[i] == group_id for i in named), "an instance of another group was accepted"
        assert set(before) - set(self.tracked()) == named
        self.expected[group_id] -= named

    # rules: what CA usually sends, so the state moves (random ids and deltas are mostly refused)
    @rule(group_id=st.sampled_from(GROUPS), data=st.data())
    def increase_near_the_room(self, group_id: str, data: st.DataObject) -> None:
        room = MAX[group_id] - len(self.expected[group_id]) - LIVE_IN[group_id]
        self.increase(group_id, data.draw(st.integers(1, max(1, room + 1)), label="delta"))

    @precondition(lambda self: any(self.expected.values()))
    @rule(data=st.data())
    def decrease_near_the_in_flight(self, data: st.DataObject) -> None:
        group_id = data.draw(st.sampled_from([g for g in GROUPS if self.expected[g]]), label="group")
        self.decrease(group_id, data.draw(st.integers(-len(self.expected[group_id]) - 1, -1), label="delta"))

    @precondition(lambda self: any(self.expected.values()))
    @rule(data=st.data(), reason=st.sampled_from(["create-error", "unregistered", ""]), others=st.integers(0, 3))
    def delete_placeholders(self, data: st.DataObject, reason: str, others: int) -> None:
        """What CA does for failed or never-registered instances: DeleteNodes with placeholders of them."""
        group_id = data.draw(st.sampled_from([g for g in GROUPS if self.expected[g]]), label="group")
        victims = data.draw(st.lists(st.sampled_from(sorted(self.expected[group_id])), min_size=1, unique=True),
                            label="instances")
        gone = [f"dds://{group_id}/node/gone{i}" for i in range(others)]  # placeholders of instances already dropped
        nodes = [pb.ExternalGrpcNode(name=i, providerID=i, annotations={FAKE_NODE_REASON: reason} if reason else {})
                 for i in victims + gone]
        _, error, message = self.call("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id=group_id, nodes=nodes))
        assert error is None, message
        assert not set(victims) & set(self.tracked())
        self.expected[group_id] -= set(victims)

    @precondition(lambda self: any(self.expected.values()))
    @rule(data=st.data(), out_of_resources=st.booleans())
    def fabric_fails_an_instance(self, data: st.DataObject, out_of_resources: bool) -> None:
        """Not an RPC: what a fabric failure does to an instance, so CA's placeholders appear in the requests."""
        instance_id = data.draw(st.sampled_from(self.all_ids()), label="failed instance")
        klass = ERROR_CLASS_OUT_OF_RESOURCES if out_of_resources else ERROR_CLASS_OTHER
        self.provider.tracker.fail(instance_id, "AttachFailed", "the fabric answered an error", klass)

    # rules: reads
    @rule(group_id=group_ids)
    def target_size(self, group_id: str) -> None:
        answer, error, message = self.call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group_id))
        if not self.assert_unknown_or_empty(group_id, error, message):
            assert answer.targetSize == len(self.expected[group_id]) + LIVE_IN[group_id]

    @rule(group_id=group_ids)
    def group_nodes(self, group_id: str) -> None:
        answer, error, message = self.call("NodeGroupNodes", pb.NodeGroupNodesRequest(id=group_id))
        if not self.assert_unknown_or_empty(group_id, error, message):
            assert {i.id for i in answer.instances} >= self.expected[group_id]

    @rule(data=st.data(), missing=st.booleans())
    def group_for_node(self, data: st.DataObject, missing: bool) -> None:
        names = st.one_of(texts, st.sampled_from(self.known_names()))
        node = data.draw(st.builds(self.node, names, names, label_maps, annotation_maps), label="node")
        request = pb.NodeGroupForNodeRequest() if missing else pb.NodeGroupForNodeRequest(node=node)
        answer, error, message = self.call("NodeGroupForNode", request)
        if missing:
            assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT and "node" in message
            return
        if not node.name and not node.providerID:
            assert error is not None and "neither a name nor a providerID" in message, message
            return
        assert error is None, message
        assert answer.nodeGroup.id in ("", *GROUPS, *COMPANIONS)
        owner = self.tracked().get(node.providerID) or self.tracked().get(node.name)
        if owner is not None:  # a listed instance always maps to its group, whatever else the node carries
            assert answer.nodeGroup.id == owner
        if answer.nodeGroup.id in COMPANIONS:
            assert answer.nodeGroup.minSize == answer.nodeGroup.maxSize == 1
        elif answer.nodeGroup.id:
            assert answer.nodeGroup.maxSize == MAX[answer.nodeGroup.id]

    @rule(group_id=group_ids)
    def template(self, group_id: str) -> None:
        answer, error, message = self.call("NodeGroupTemplateNodeInfo",
                                           pb.NodeGroupTemplateNodeInfoRequest(id=group_id))
        if not self.assert_unknown_or_empty(group_id, error, message):
            node = core_v1_pb2.Node.FromString(answer.nodeBytes)
            assert answer.nodeBytes and node.metadata.name and node.status.allocatable["cpu"].string

    @rule(group_id=group_ids, defaults=option_defaults())
    def options(self, group_id: str, defaults: Optional[pb.NodeGroupAutoscalingOptions]) -> None:
        request = pb.NodeGroupAutoscalingOptionsRequest(id=group_id)
        if defaults is not None:
            request.defaults.CopyFrom(defaults)
        answer, error, message = self.call("NodeGroupGetOptions", request)
        if self.assert_unknown_or_empty(group_id, error, message):
            return
        if defaults is None:
            assert error is not None and "no defaults" in message, message
            return
        if error is not None:  # only a duration no Go client can hold is refused, and the field is named
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, message
            assert "defaults." in message and "out of range" in message, message
            return
        options = answer.nodeGroupAutoscalingOptions
        for current, legacy in (("scaleDownUnneededDuration", "scaleDownUnneededTime"),
                                ("scaleDownUnreadyDuration", "scaleDownUnreadyTime"),
                                ("MaxNodeProvisionDuration", "MaxNodeProvisionTime")):
            assert options.HasField(current) and options.HasField(legacy)  # a 1.34 CA dereferences both
            assert getattr(options, current).ToNanoseconds() == getattr(options, legacy).duration

    @rule(rpc=st.sampled_from(["Refresh", "NodeGroups", "GPULabel", "GetAvailableGPUTypes", "Cleanup"]))
    def empty_request(self, rpc: str) -> None:
        request_type = message_factory.GetMessageClass(
            pb.DESCRIPTOR.services_by_name["CloudProvider"].methods_by_name[rpc].input_type)
        answer, error, message = self.call(rpc, request_type())
        assert error is None, message
        if rpc == "GetAvailableGPUTypes":
            assert set(answer.gpuTypes) == {"A30", "H100", "L40S"}
        if rpc == "GPULabel":
            assert answer.label == "dds.cdi.dev/attached-gpu"

    @rule(data=st.data(), pod_bytes=st.binary(max_size=64), timestamp=st.integers(*INT64))
    def pricing(self, data: st.DataObject, pod_bytes: bytes, timestamp: int) -> None:
        names = st.one_of(texts, st.sampled_from(self.known_names()))
        node = data.draw(st.builds(self.node, names, names, label_maps, annotation_maps), label="node")
        for rpc, request in (("PricingNodePrice", pb.PricingNodePriceRequest(node=node)),
                             ("PricingPodPrice", pb.PricingPodPriceRequest(pod_bytes=pod_bytes))):
            request.startTimestamp.seconds = timestamp
            _, error, message = self.call(rpc, request)
            assert error is not None and error.code() == grpc.StatusCode.UNIMPLEMENTED, message

    # invariants: what CA's arithmetic needs, after every call
    @invariant()
    def sizes_and_listings_agree(self) -> None:
        served = {g.id: g for g in self.checks.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT).nodeGroups}
        assert set(served) == set(GROUPS) | set(COMPANIONS)
        for companion_id, provider_id in COMPANIONS.items():
            target = self.checks.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=companion_id),
                                                     timeout=TIMEOUT).targetSize
            listed = self.checks.NodeGroupNodes(pb.NodeGroupNodesRequest(id=companion_id), timeout=TIMEOUT).instances
            assert served[companion_id].minSize == served[companion_id].maxSize == target == 1
            assert [(i.id, i.status.instanceState) for i in listed] == [(provider_id,
                                                                          pb.InstanceStatus.instanceRunning)]
        for group_id in GROUPS:
            target = self.checks.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=group_id),
                                                     timeout=TIMEOUT).targetSize
            assert 0 <= served[group_id].minSize <= served[group_id].maxSize == MAX[group_id]
            assert 0 <= target <= served[group_id].maxSize, f"{group_id}: target {target} outside 0..max"
            listed = self.checks.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group_id), timeout=TIMEOUT).instances
            assert len(listed) == target, f"{group_id}: {len(listed)} instance(s) listed for target {target}"
            in_flight = {i.id: i for i in listed if i.status.instanceState != pb.InstanceStatus.instanceRunning}
            assert set(in_flight) == self.expected[group_id], "an instance was lost or invented"
            for record in self.provider.tracker.list(group_id):
                assert in_flight[record.id].status.errorInfo.errorCode == record.error_code
        assert set(self.tracked()) == set(self.all_ids())


TestProviderUnderRandomCalls = ProviderMachine.TestCase
TestProviderUnderRandomCalls.settings = STATEFUL


# --- raw bytes as the payload ---

SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"]
METHODS = [m.name for m in SERVICE.methods]


def _valid_request(method: str) -> bytes:
    """A typical request of `method`, serialized: the seed the mutations below start from."""
    request = message_factory.GetMessageClass(SERVICE.methods_by_name[method].input_type)()
    fields = request.DESCRIPTOR.fields_by_name
    if "id" in fields:
        request.id = SPEC_FIXED
    if "delta" in fields:
        request.delta = 1 if method == "NodeGroupIncreaseSize" else -1
    if "node" in fields:
        request.node.name = "gpu-1"
        request.node.labels[GPU_LABEL] = "A30"
    if "nodes" in fields:
        request.nodes.add(name="gpu-1", providerID="kwok://gpu-1")
    if "defaults" in fields:
        request.defaults.scaleDownUnneededDuration.seconds = 600
    return request.SerializeToString()


@st.composite
def payloads(draw, method: str) -> bytes:
    seed = _valid_request(method)
    kind = draw(st.sampled_from(["random", "truncated", "garbage-suffix", "flipped", "bad-utf8", "wrong-wire-type"]))
    if kind == "random" or not seed:
        return draw(st.binary(max_size=256))
    if kind == "truncated":
        return seed[:draw(st.integers(0, len(seed)))]
    if kind == "garbage-suffix":
        return seed + draw(st.binary(min_size=1, max_size=32))
    if kind == "flipped":
        position = draw(st.integers(0, len(seed) - 1))
        return seed[:position] + bytes([seed[position] ^ draw(st.integers(1, 255))]) + seed[position + 1:]
    if kind == "bad-utf8":  # field 1 or 2 as a string that is not UTF-8 (ids, node names)
        tag = draw(st.sampled_from([0x0A, 0x12]))
        junk = draw(st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b)))
        return bytes([tag, len(junk)]) + junk
    field = draw(st.integers(1, 12))  # a known field number with a wire type it does not have
    return bytes([(field << 3) | draw(st.sampled_from([0, 1, 2, 5]))]) + draw(st.binary(max_size=16))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.fixture(scope="module")
def shared_provider() -> Iterator[Provider]:
    provider = start_provider(groups(), LIVE)
    yield provider
    provider.channel.close()
    provider.server.stop(grace_seconds=0)


def _still_serving(provider: Provider) -> None:
    health = health_pb2_grpc.HealthStub(provider.channel)
    for service in ("", SERVICE_NAME):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    served = provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT).nodeGroups
    assert {g.id for g in served} == set(GROUPS) | set(COMPANIONS)


@pytest.mark.parametrize("method", METHODS)
def test_raw_bytes_on_every_method_get_a_clean_answer(shared_provider: Provider, method: str) -> None:
    raw = shared_provider.channel.unary_unary(f"/{SERVICE_NAME}/{method}")  # no serializers: bytes in, bytes out

    @FUZZ
    @given(payload=payloads(method))
    def send(payload: bytes) -> None:
        note(f"payload {payload!r}")
        figures.count("raw", method)
        try:
            raw(payload, timeout=TIMEOUT)
        except grpc.RpcError as error:
            message = assert_clean_rejection(error, method)
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT and "protobuf" in message:
                assert SERVICE.methods_by_name[method].input_type.name in message, message
        _still_serving(shared_provider)

    send()


def test_a_payload_that_is_not_a_request_is_invalid_argument_naming_the_message(shared_provider: Provider) -> None:
    raw = shared_provider.channel.unary_unary(f"/{SERVICE_NAME}/NodeGroupIncreaseSize")
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\x12\x05\xff\xfe\xfd\xfc\xfb", timeout=TIMEOUT)  # field 2 (id) with bytes that are not UTF-8
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "NodeGroupIncreaseSizeRequest" in info.value.details()
    _still_serving(shared_provider)


# --- sizes ---

def test_huge_node_list_is_refused_by_the_first_stranger_and_nothing_is_dropped(shared_provider: Provider) -> None:
    shared_provider.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=SPEC_FIXED, delta=1),
                                               timeout=TIMEOUT)
    instance = shared_provider.tracker.list(SPEC_FIXED)[-1].id
    strangers = [pb.ExternalGrpcNode(name=f"node-{i}", providerID=f"aws:///i-{i:08d}") for i in range(50_000)]
    request = pb.NodeGroupDeleteNodesRequest(id=SPEC_FIXED, nodes=[
        pb.ExternalGrpcNode(name=instance, providerID=instance, annotations={FAKE_NODE_REASON: "create-error"}),
        *strangers])
    figures.count("grpc", "NodeGroupDeleteNodes (50,001 nodes)")
    with pytest.raises(grpc.RpcError) as info:
        shared_provider.stub.NodeGroupDeleteNodes(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "node-0" in info.value.details() and len(info.value.details()) < 4096
    assert shared_provider.tracker.get(instance) is not None, "a refused call dropped an instance"
    shared_provider.stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=SPEC_FIXED, delta=-1),
                                                     timeout=TIMEOUT)
    _still_serving(shared_provider)


def test_huge_node_list_of_placeholders_is_served(shared_provider: Provider) -> None:
    """CA repeats DeleteNodes for every placeholder it still has: 20,000 of them in one call are answered."""
    placeholders = [pb.ExternalGrpcNode(name=f"dds://{SPEC_FIXED}/node/gone{i}", providerID=f"dds://{SPEC_FIXED}/node/gone{i}",
                                        annotations={FAKE_NODE_REASON: "unregistered"}) for i in range(20_000)]
    figures.count("grpc", "NodeGroupDeleteNodes (20,000 placeholders)")
    shared_provider.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=SPEC_FIXED, nodes=placeholders),
                                              timeout=60)
    _still_serving(shared_provider)


def test_message_over_the_receive_limit_is_resource_exhausted(shared_provider: Provider) -> None:
    nodes = [pb.ExternalGrpcNode(name="n" * 200, providerID=f"aws:///{i}") for i in range(25_000)]  # ~5.5 MB
    figures.count("grpc", "NodeGroupDeleteNodes (over 4 MiB)")
    with pytest.raises(grpc.RpcError) as info:
        shared_provider.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=SPEC_FIXED, nodes=nodes),
                                                  timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.details()
    _still_serving(shared_provider)


@pytest.mark.parametrize("rpc, request_", [
    pytest.param("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="x" * 1_000_000), id="target-size"),
    pytest.param("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id="x" * 1_000_000, delta=1),
                 id="increase"),
    pytest.param("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id=SPEC_FIXED, nodes=[
        pb.ExternalGrpcNode(name="y" * 1_000_000)]), id="delete-node-name"),
    pytest.param("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(
        providerID="z" * 1_000_000)), id="node-group-for-node"),
])
def test_megabyte_ids_get_a_bounded_message(shared_provider: Provider, rpc: str, request_) -> None:
    """An error message echoes the bad value, cut short: CA's channel refuses trailers over its metadata limit."""
    figures.count("grpc", f"{rpc} (1 MB value)")
    try:
        getattr(shared_provider.stub, rpc)(request_, timeout=TIMEOUT)
    except grpc.RpcError as error:
        message = assert_clean_rejection(error, rpc)
        assert len(message.encode()) <= 4096 and ("xxxx" in message or "yyyy" in message), message
    _still_serving(shared_provider)


@pytest.mark.parametrize("deltas_", [[1] * 8, [2, 2, 2, 1, 1], [3, 3, 3]], ids=["ones", "mixed", "threes"])
def test_concurrent_increases_never_pass_the_max(provider_factory, deltas_: list[int]) -> None:
    provider = provider_factory(groups(), LIVE)
    request = lambda d: pb.NodeGroupIncreaseSizeRequest(id=SPEC_FIXED, delta=d)  # noqa: E731
    with futures.ThreadPoolExecutor(len(deltas_)) as pool:
        outcomes = list(pool.map(lambda d: _outcome(provider, request(d)), deltas_))
    figures.count("grpc", "NodeGroupIncreaseSize (concurrent)", len(deltas_))
    accepted = sum(d for d, ok in zip(deltas_, outcomes) if ok is None)
    target = provider.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=SPEC_FIXED), timeout=TIMEOUT)
    assert accepted == target.targetSize == len(provider.tracker.list(SPEC_FIXED)) <= MAX[SPEC_FIXED]
    for error in filter(None, outcomes):
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds max size" in error.details()


def _outcome(provider: Provider, request) -> Optional[grpc.RpcError]:
    try:
        provider.stub.NodeGroupIncreaseSize(request, timeout=TIMEOUT)
    except grpc.RpcError as error:
        return error
    return None

