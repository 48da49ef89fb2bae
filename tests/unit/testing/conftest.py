"""A fake externalgrpc provider (a real gRPC server with canned answers), an in-memory cluster, and builders."""

from __future__ import annotations

import itertools
import threading
from concurrent import futures
from dataclasses import replace
from typing import Any, Iterator, Optional

import grpc
import pytest

from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from dds.provider.gen.k8s import core_v1_pb2
from dds.testing.ca_standin import AutoscalerStandIn, CloudConfig, StandInOptions
from dds.testing.ca_standin.views import TAINT_TO_BE_DELETED, NodeView, PodView, Taint, node_from_manifest, pod_from_manifest

GPU_LABEL = "nvidia.com/gpu.product"
T0 = 100_000.0  # the fake clock's start; nodes and pods below are older unless told otherwise


def iso(seconds: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def make_node(name: str, cpu: str = "4", memory: str = "16Gi", gpus: int = 0, pods: int = 110,
              labels: Optional[dict[str, str]] = None, ready: bool = True, created: float = 0.0,
              ready_since: float = 0.0, taints: tuple[Taint, ...] = (), unschedulable: bool = False,
              provider_id: Optional[str] = None, annotations: Optional[dict[str, str]] = None) -> NodeView:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    return node_from_manifest({
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {},
                     "creationTimestamp": iso(created)},
        "spec": {"providerID": f"fake://{name}" if provider_id is None else provider_id,
                 "unschedulable": unschedulable,
                 "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]},
        "status": {"capacity": resources, "allocatable": resources,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastTransitionTime": iso(ready_since)}]}})


def make_pod(name: str, cpu: str = "1", memory: str = "1Gi", gpus: int = 0, node: str = "",
             pending: Optional[bool] = None, created: float = 0.0, owner: str = "ReplicaSet",
             namespace: str = "default", node_selector: Optional[dict[str, str]] = None,
             tolerations: Optional[list[dict[str, str]]] = None, annotations: Optional[dict[str, str]] = None,
             **spec: Any) -> PodView:
    requests = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    pending = (not node) if pending is None else pending
    conditions = ([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}] if pending else [])
    return pod_from_manifest({
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": iso(created),
                     "annotations": annotations or {},
                     "ownerReferences": [{"kind": owner, "name": "x", "controller": True}] if owner else []},
        "spec": {"nodeName": node, "nodeSelector": node_selector or {}, "tolerations": tolerations or [],
                 "containers": [{"name": "main", "resources": {"requests": requests}}], **spec},
        "status": {"phase": "Running" if node else "Pending", "conditions": conditions}})


def template_proto(name: str = "template", cpu: str = "16", memory: str = "64Gi", gpus: int = 4,
                   labels: Optional[dict[str, str]] = None) -> core_v1_pb2.Node:
    node = core_v1_pb2.Node()
    node.metadata.name = name
    node.metadata.labels.update(labels if labels is not None else {GPU_LABEL: "A30"})
    for key, value in {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus)}.items():
        node.status.capacity[key].string = value
        node.status.allocatable[key].string = value
    condition = node.status.conditions.add()
    condition.type, condition.status = "Ready", "True"
    return node


class FakeProvider(pb_grpc.CloudProviderServicer):
    """Canned answers the test sets; `fail` makes a method answer with a status code."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups: dict[str, tuple[int, int]] = {}  # id -> (min, max)
        self.targets: dict[str, int] = {}
        self.instances: dict[str, list[pb.Instance]] = {}
        self.group_of_node: dict[str, str] = {}  # node name (or placeholder id) -> group id
        self.templates: dict[str, core_v1_pb2.Node] = {}
        self.options: Optional[pb.NodeGroupAutoscalingOptions] = None  # None: UNIMPLEMENTED
        self.fail: dict[str, grpc.StatusCode] = {}
        self.requests: list[tuple[str, Any]] = []
        self.deadlines: list[Optional[float]] = []  # seconds left when each call arrived
        self.apply_increase = True
        self._ids = itertools.count(1)

    def add_group(self, group_id: str, min_size: int = 0, max_size: int = 5, target: int = 0) -> None:
        self.groups[group_id] = (min_size, max_size)
        self.targets[group_id] = target
        self.instances.setdefault(group_id, [])

    def creating(self, group_id: str, instance_id: str, error_code: str = "") -> None:
        status = pb.InstanceStatus(instanceState=pb.InstanceStatus.instanceCreating)
        if error_code:
            status.errorInfo.CopyFrom(pb.InstanceErrorInfo(errorCode=error_code, errorMessage="no capacity",
                                                           instanceErrorClass=1))
        self.instances[group_id].append(pb.Instance(id=instance_id, status=status))
        self.group_of_node[instance_id] = group_id

    def _enter(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.requests.append((method, request))
            self.deadlines.append(context.time_remaining())
        if method in self.fail:
            context.abort(self.fail[method], f"injected failure of {method}")

    def _group(self, group_id: str) -> pb.NodeGroup:
        low, high = self.groups[group_id]
        return pb.NodeGroup(id=group_id, minSize=low, maxSize=high)

    def NodeGroups(self, request, context):
        self._enter("NodeGroups", request, context)
        return pb.NodeGroupsResponse(nodeGroups=[self._group(g) for g in self.groups])

    def NodeGroupForNode(self, request, context):
        self._enter("NodeGroupForNode", request, context)
        group_id = self.group_of_node.get(request.node.name, "")
        return pb.NodeGroupForNodeResponse(nodeGroup=self._group(group_id) if group_id else pb.NodeGroup())

    def GPULabel(self, request, context):
        self._enter("GPULabel", request, context)
        return pb.GPULabelResponse(label=GPU_LABEL)

    def GetAvailableGPUTypes(self, request, context):
        self._enter("GetAvailableGPUTypes", request, context)
        return pb.GetAvailableGPUTypesResponse()

    def Cleanup(self, request, context):
        self._enter("Cleanup", request, context)
        return pb.CleanupResponse()

    def Refresh(self, request, context):
        self._enter("Refresh", request, context)
        return pb.RefreshResponse()

    def NodeGroupTargetSize(self, request, context):
        self._enter("NodeGroupTargetSize", request, context)
        return pb.NodeGroupTargetSizeResponse(targetSize=self.targets[request.id])

    def NodeGroupIncreaseSize(self, request, context):
        self._enter("NodeGroupIncreaseSize", request, context)
        if self.apply_increase:
            self.targets[request.id] += request.delta
            for _ in range(request.delta):
                self.creating(request.id, f"instance-{next(self._ids)}")
        return pb.NodeGroupIncreaseSizeResponse()

    def NodeGroupDeleteNodes(self, request, context):
        self._enter("NodeGroupDeleteNodes", request, context)
        gone = {n.providerID for n in request.nodes}
        self.instances[request.id] = [i for i in self.instances.get(request.id, []) if i.id not in gone]
        return pb.NodeGroupDeleteNodesResponse()

    def NodeGroupDecreaseTargetSize(self, request, context):
        self._enter("NodeGroupDecreaseTargetSize", request, context)
        self.targets[request.id] += request.delta
        return pb.NodeGroupDecreaseTargetSizeResponse()

    def NodeGroupNodes(self, request, context):
        self._enter("NodeGroupNodes", request, context)
        return pb.NodeGroupNodesResponse(instances=self.instances.get(request.id, []))

    def NodeGroupTemplateNodeInfo(self, request, context):
        self._enter("NodeGroupTemplateNodeInfo", request, context)
        if request.id not in self.templates:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no template")
        return pb.NodeGroupTemplateNodeInfoResponse(nodeBytes=self.templates[request.id].SerializeToString())

    def NodeGroupGetOptions(self, request, context):
        self._enter("NodeGroupGetOptions", request, context)
        if self.options is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no options")
        return pb.NodeGroupAutoscalingOptionsResponse(nodeGroupAutoscalingOptions=self.options)


class FakeCluster:
    """An in-memory cluster: taints and evictions change what the next list returns."""

    def __init__(self) -> None:
        self.nodes: list[NodeView] = []
        self.pods: list[PodView] = []
        self.evicted: list[str] = []
        self.tainted: list[str] = []

    def list_nodes(self) -> list[NodeView]:
        return list(self.nodes)

    def list_pods(self) -> list[PodView]:
        return list(self.pods)

    def add_to_be_deleted_taint(self, node_name: str, now: float) -> None:
        self.tainted.append(node_name)
        self.nodes = [replace(n, taints=n.taints + (Taint(TAINT_TO_BE_DELETED, str(int(now)), "NoSchedule"),))
                      if n.name == node_name else n for n in self.nodes]

    def remove_to_be_deleted_taint(self, node_name: str) -> None:
        self.nodes = [replace(n, taints=tuple(t for t in n.taints if t.key != TAINT_TO_BE_DELETED))
                      if n.name == node_name else n for n in self.nodes]

    def evict_pod(self, namespace: str, name: str) -> None:
        self.evicted.append(f"{namespace}/{name}")
        self.pods = [p for p in self.pods if (p.namespace, p.name) != (namespace, name)]


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def provider() -> Iterator[tuple[FakeProvider, int]]:
    fake = FakeProvider()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CloudProviderServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, port
    server.stop(grace=None)


class Harness:
    def __init__(self, fake: FakeProvider, port: int) -> None:
        self.fake = fake
        self.port = port
        self.cluster = FakeCluster()
        self.clock = FakeClock()
        self.standins: list[AutoscalerStandIn] = []

    def standin(self, **options: Any) -> AutoscalerStandIn:
        defaults = dict(unschedulable_pod_time_buffer=0.0, unschedulable_gpu_pod_time_buffer=0.0)
        defaults.update(options)
        scan = defaults.pop("scan_interval", 10.0)
        grpc_timeout = defaults.pop("grpc_timeout", 5.0)
        provision = defaults.pop("max_node_provision_time", 900.0)
        standin = AutoscalerStandIn(self.cluster, CloudConfig(f"127.0.0.1:{self.port}", grpc_timeout), scan_interval=scan,
                                    max_node_provision_time=provision, options=StandInOptions(**defaults),
                                    clock=self.clock)
        self.standins.append(standin)
        return standin


@pytest.fixture
def harness(provider) -> Iterator[Harness]:
    fake, port = provider
    h = Harness(fake, port)
    yield h
    for standin in h.standins:
        standin._channel.close()


def methods(result) -> list[str]:
    return [c.method for c in result.calls]


def calls(result) -> list[tuple[str, str]]:
    return [(c.method, c.request) for c in result.calls]
