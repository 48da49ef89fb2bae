"""cluster-autoscaler's externalgrpc client, re-implemented: one method per RPC, CA's caches, and a log of every call.

What Refresh invalidates and what lives longer, as in CA's externalgrpc provider:

| answer                      | cached until                                   | not cached                      |
|-----------------------------|------------------------------------------------|---------------------------------|
| NodeGroups                  | next Refresh                                   | an error (CA sees no groups)    |
| NodeGroupForNode            | next Refresh (key: node name + providerID)     | id "" and errors                |
| NodeGroupTemplateNodeInfo   | next Refresh (it lives on the group object)    | errors                          |
| GPULabel, GetAvailableGPUTypes | the life of the process                     | errors                          |
| everything else             | never                                          |                                 |

Every call carries the cloud-config `grpc_timeout` as its deadline. Only UNIMPLEMENTED means "not implemented" for the
optional RPCs (TemplateNodeInfo, GetOptions); any other status is an error.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import grpc
from google.protobuf import duration_pb2

from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from dds.provider.gen.k8s import core_v1_pb2

from .config import CloudConfig
from .views import FAKE_NODE_REASON_ANNOTATION, NodeView, node_from_proto

INSTANCE_RUNNING, INSTANCE_CREATING, INSTANCE_DELETING = 1, 2, 3


class ProviderError(Exception):
    """An RPC failed (any status but OK, or UNIMPLEMENTED for an optional RPC)."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method}: {code.name}: {details}")
        self.method, self.code, self.details = method, code, details


class CloudProviderCrash(Exception):
    """An answer that makes a real cluster-autoscaler panic; the stand-in stops instead of carrying on."""


@dataclass(frozen=True)
class RpcCall:
    time: float
    method: str
    request: str  # a short summary of the request
    status: str  # "OK", or the status code name and details


@dataclass(frozen=True)
class NodeGroup:
    id: str
    min_size: int
    max_size: int
    debug: str = ""


@dataclass(frozen=True)
class InstanceError:
    code: str
    message: str
    error_class: int


@dataclass(frozen=True)
class Instance:
    id: str
    state: int = 0  # 0 = no status reported
    error: Optional[InstanceError] = None

    @property
    def failed_creating(self) -> bool:
        return self.state == INSTANCE_CREATING and self.error is not None

    @property
    def expected_to_register(self) -> bool:
        return self.state == 0 or (self.state != INSTANCE_DELETING and self.error is None)


@dataclass(frozen=True)
class GroupOptions:
    scale_down_utilization_threshold: float
    scale_down_gpu_utilization_threshold: float
    scale_down_unneeded_time: float
    scale_down_unready_time: float
    max_node_provision_time: float
    zero_or_max_node_scaling: bool
    ignore_daemonsets_utilization: bool
    # The 1.35+ client has no field for it, so any answer sets it to 0 (issue 10245); the defaults keep CA's flag.
    max_node_startup_time: float


@dataclass(frozen=True)
class Placeholder:
    """The fake node CA sends for an instance without a Node: name = providerID = instance id."""

    instance_id: str
    reason: str

    def to_proto(self) -> pb.ExternalGrpcNode:
        return pb.ExternalGrpcNode(name=self.instance_id, providerID=self.instance_id,
                                   annotations={FAKE_NODE_REASON_ANNOTATION: self.reason})


NodeLike = NodeView | Placeholder


def node_proto(node: NodeLike) -> pb.ExternalGrpcNode:
    if isinstance(node, Placeholder):
        return node.to_proto()
    return pb.ExternalGrpcNode(name=node.name, providerID=node.provider_id, labels=dict(node.labels),
                               annotations=dict(node.annotations))


def _node_key(node: NodeLike) -> str:
    if isinstance(node, Placeholder):
        return node.instance_id + node.instance_id
    return node.name + node.provider_id  # CA's cache key, "ProviderID is empty in some edge cases"


def _seconds(duration: duration_pb2.Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def _duration(seconds: float) -> duration_pb2.Duration:
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=int(round((seconds - whole) * 1e9)))


def open_channel(config: CloudConfig) -> grpc.Channel:
    if not config.uses_tls:
        return grpc.insecure_channel(config.address)
    assert config.key is not None and config.cacert is not None  # parse_cloud_config guarantees it
    credentials = grpc.ssl_channel_credentials(root_certificates=config.cacert.read_bytes(),
                                               private_key=config.key.read_bytes(),
                                               certificate_chain=config.cert.read_bytes() if config.cert else None)
    # CA verifies the server certificate against the host of `address` (an IP needs an IP SAN): grpc's default.
    return grpc.secure_channel(config.address, credentials)


class ExternalGrpcClient:
    def __init__(self, channel: grpc.Channel, timeout: float, clock: Callable[[], float]) -> None:
        self._stub = pb_grpc.CloudProviderStub(channel)
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self.calls: list[RpcCall] = []
        self._groups: Optional[list[NodeGroup]] = None
        self._group_for_node: dict[str, NodeGroup] = {}
        self._templates: dict[str, Optional[NodeView]] = {}
        self._gpu_label: Optional[str] = None
        self._gpu_types: Optional[frozenset[str]] = None

    # --- plumbing ---

    def _call(self, method: str, request: Any, summary: str) -> Any:
        try:
            response = getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            self._record(method, summary, f"{code.name}: {details}")
            raise ProviderError(method, code, details) from exc
        self._record(method, summary, "OK")
        return response

    def _record(self, method: str, summary: str, status: str) -> None:
        with self._lock:
            self.calls.append(RpcCall(self._clock(), method, summary, status))

    # --- cloud provider ---

    def refresh(self) -> None:
        self._groups = None
        self._group_for_node.clear()
        self._templates.clear()
        self._call("Refresh", pb.RefreshRequest(), "")

    def node_groups(self) -> list[NodeGroup]:
        if self._groups is not None:
            return self._groups
        try:
            answer = self._call("NodeGroups", pb.NodeGroupsRequest(), "")
        except ProviderError:
            return []  # CA logs the error and carries on with no groups; nothing is cached
        self._groups = [NodeGroup(g.id, g.minSize, g.maxSize, g.debug) for g in answer.nodeGroups]
        return self._groups

    def node_group_for_node(self, node: NodeLike) -> Optional[NodeGroup]:
        """The node's group, None when not autoscaled; raises ProviderError (not cached)."""
        key = _node_key(node)
        if key in self._group_for_node:
            return self._group_for_node[key]
        name = node.instance_id if isinstance(node, Placeholder) else node.name
        answer = self._call("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=node_proto(node)), f"node={name}")
        group = answer.nodeGroup
        if not group.id:
            return None
        result = NodeGroup(group.id, group.minSize, group.maxSize, group.debug)
        self._group_for_node[key] = result
        return result

    def gpu_label(self) -> str:
        if self._gpu_label is not None:
            return self._gpu_label
        try:
            self._gpu_label = self._call("GPULabel", pb.GPULabelRequest(), "").label
        except ProviderError:
            return ""
        return self._gpu_label

    def gpu_types(self) -> frozenset[str]:
        if self._gpu_types is not None:
            return self._gpu_types
        try:
            answer = self._call("GetAvailableGPUTypes", pb.GetAvailableGPUTypesRequest(), "")
        except ProviderError:
            return frozenset()
        self._gpu_types = frozenset(answer.gpuTypes.keys())
        return self._gpu_types

    def cleanup(self) -> None:
        self._call("Cleanup", pb.CleanupRequest(), "")

    # --- node group ---

    def target_size(self, group_id: str) -> int:
        return self._call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group_id),
                          f"id={group_id}").targetSize

    def increase_size(self, group_id: str, delta: int) -> None:
        self._call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=group_id, delta=delta),
                   f"id={group_id} delta={delta}")

    def decrease_target_size(self, group_id: str, delta: int) -> None:
        self._call("NodeGroupDecreaseTargetSize", pb.NodeGroupDecreaseTargetSizeRequest(id=group_id, delta=delta),
                   f"id={group_id} delta={delta}")

    def delete_nodes(self, group_id: str, nodes: Sequence[NodeLike]) -> None:
        names = ",".join(n.instance_id if isinstance(n, Placeholder) else n.name for n in nodes)
        reasons = sorted({n.reason for n in nodes if isinstance(n, Placeholder)})
        summary = f"id={group_id} nodes={names}" + (f" reason={','.join(reasons)}" if reasons else "")
        self._call("NodeGroupDeleteNodes",
                   pb.NodeGroupDeleteNodesRequest(id=group_id, nodes=[node_proto(n) for n in nodes]), summary)

    def nodes(self, group_id: str) -> list[Instance]:
        answer = self._call("NodeGroupNodes", pb.NodeGroupNodesRequest(id=group_id), f"id={group_id}")
        instances = []
        for item in answer.instances:
            state = item.status.instanceState
            error = item.status.errorInfo
            instances.append(Instance(item.id, state, InstanceError(error.errorCode, error.errorMessage,
                                                                    error.instanceErrorClass)
                                      if state and error.errorCode else None))
        return instances

    def template_node(self, group_id: str) -> Optional[NodeView]:
        """The group's template node; None when UNIMPLEMENTED. Raises ProviderError on other errors."""
        if group_id in self._templates:
            return self._templates[group_id]
        try:
            answer = self._call("NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id=group_id),
                                f"id={group_id}")
        except ProviderError as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                self._templates[group_id] = None
                return None
            raise
        data = answer.nodeBytes or (answer.nodeInfo.SerializeToString() if answer.HasField("nodeInfo") else b"")
        if not data:
            raise CloudProviderCrash(
                f"NodeGroupTemplateNodeInfo for group {group_id!r} answered no node (empty nodeBytes and nodeInfo): "
                f"cluster-autoscaler gets a nil template and panics dereferencing it")
        node = core_v1_pb2.Node()
        node.ParseFromString(data)
        view = node_from_proto(node)
        self._templates[group_id] = view
        return view

    def get_options(self, group_id: str, defaults: GroupOptions) -> GroupOptions:
        """The group's autoscaling options: the answer replaces the defaults; UNIMPLEMENTED or no message keeps them."""
        request = pb.NodeGroupAutoscalingOptionsRequest(id=group_id, defaults=pb.NodeGroupAutoscalingOptions(
            scaleDownUtilizationThreshold=defaults.scale_down_utilization_threshold,
            scaleDownGpuUtilizationThreshold=defaults.scale_down_gpu_utilization_threshold,
            scaleDownUnneededDuration=_duration(defaults.scale_down_unneeded_time),
            scaleDownUnreadyDuration=_duration(defaults.scale_down_unready_time),
            MaxNodeProvisionDuration=_duration(defaults.max_node_provision_time),
            zeroOrMaxNodeScaling=defaults.zero_or_max_node_scaling,
            ignoreDaemonSetsUtilization=defaults.ignore_daemonsets_utilization))
        try:
            answer = self._call("NodeGroupGetOptions", request, f"id={group_id}")
        except ProviderError as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                return defaults
            raise
        if not answer.HasField("nodeGroupAutoscalingOptions"):
            return defaults
        got = answer.nodeGroupAutoscalingOptions
        # The 1.36 client reads only the google.protobuf.Duration fields: a missing one is 0.
        return GroupOptions(
            scale_down_utilization_threshold=got.scaleDownUtilizationThreshold,
            scale_down_gpu_utilization_threshold=got.scaleDownGpuUtilizationThreshold,
            scale_down_unneeded_time=_seconds(got.scaleDownUnneededDuration),
            scale_down_unready_time=_seconds(got.scaleDownUnreadyDuration),
            max_node_provision_time=_seconds(got.MaxNodeProvisionDuration),
            zero_or_max_node_scaling=got.zeroOrMaxNodeScaling,
            ignore_daemonsets_utilization=got.ignoreDaemonSetsUtilization,
            max_node_startup_time=0.0)

