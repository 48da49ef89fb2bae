"""Builders and a real in-process gRPC server for the provider tests."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import grpc
import pytest

from dds.config import Settings
from dds.model.events import ObjectRef
from dds.model.groups import NodeGroupSpec
from dds.nodes.memory import MemoryProvisioner
from dds.scaling.whole_nodes import AddNodesDecider
from dds.scaling.requests import ScaleUpRefused
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc
from dds.scaling.instances import InstanceFactory, InstanceRecord, InstanceTracker
from dds.scaling.requests import DeleteTarget, LiveNode
from dds.provider.registry import Registry, StaticClusterView
from dds.provider.server import ProviderServer, build_server
from dds.groups.schema import GroupInput, parse_group
from dds.groups.catalog import NodeGroupCatalog
from dds.groups.sources import SourceRead
from dds.model.groups import SourceRef


def annotations(overrides: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The demo group's annotations (examples/node-groups.yaml), with `overrides` applied (full keys)."""
    base = {
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "4",
        "capacity.cluster-autoscaler.kubernetes.io/cpu": "16",
        "capacity.cluster-autoscaler.kubernetes.io/memory": "64Gi",
        "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "1",
        "dds.cdi.dev/max-gpus-per-node": "4",
        "dds.cdi.dev/gpu-models": "A30",
        "dds.cdi.dev/fabric-pool": "default",
    }
    base.update(overrides or {})
    return base


def make_group(group_id: str = "MachineSet/default/gpu-workers", replicas: Optional[int] = 1,
               **short: str) -> NodeGroupSpec:
    """The demo group; keyword overrides by short name (see `with_keys`)."""
    spec, errors = parse_group(GroupInput(id=group_id, annotations=annotations(with_keys(**short)), replicas=replicas,
                                          source=SourceRef(kind="File", name=f"test#{group_id}")))
    assert spec is not None, errors
    return spec


def with_keys(**short: str) -> dict[str, str]:
    """Short names for the common keys, for table-driven tests."""
    names = {"min": "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size",
             "max": "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size",
             "max_gpus": "dds.cdi.dev/max-gpus-per-node", "gpu_count": "capacity.cluster-autoscaler.kubernetes.io/gpu-count",
             "mode": "dds.cdi.dev/template-mode", "models": "dds.cdi.dev/gpu-models",
             "taints": "capacity.cluster-autoscaler.kubernetes.io/taints",
             "labels": "capacity.cluster-autoscaler.kubernetes.io/labels",
             "unneeded": "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime",
             "gpu_threshold": "cluster.x-k8s.io/autoscaling-options-scaledowngpuutilizationthreshold"}
    return {names[k]: v for k, v in short.items()}


class StaticSource:
    """A NodeGroupSource whose answer the test sets."""

    kind = "file"

    def __init__(self, groups: Sequence[NodeGroupSpec] = ()) -> None:
        self.result: SourceRead | Exception = SourceRead(tuple(groups))

    def read(self) -> SourceRead:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[ObjectRef, str, str, str]] = []

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        self.events.append((involved, event_type, reason, message))


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RecordingScaleDown:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[DeleteTarget], str]] = []

    def delete_nodes(self, group: NodeGroupSpec, nodes: Sequence[DeleteTarget], request_key: str) -> None:
        self.calls.append((group.id, list(nodes), request_key))


class RefusingScaleUp:
    def increase(self, group: NodeGroupSpec, delta: int, request_key: str) -> Sequence[InstanceRecord]:
        raise ScaleUpRefused(f"pool {group.fabric_pool} is empty and {group.id} is at its max")


@dataclass
class Provider:
    """A running server and everything behind it."""

    server: ProviderServer
    channel: grpc.Channel
    stub: externalgrpc_pb2_grpc.CloudProviderStub
    registry: Registry
    tracker: InstanceTracker
    cluster: StaticClusterView
    source: StaticSource
    scale_down: RecordingScaleDown
    provisioner: MemoryProvisioner
    events: RecordingEvents = field(default_factory=RecordingEvents)


def start_provider(groups: Sequence[NodeGroupSpec], nodes: Sequence[LiveNode] = (), scale_up: object = None,
                   settings: Optional[Settings] = None, channel_credentials: Optional[grpc.ChannelCredentials] = None,
                   target_host: str = "127.0.0.1", interceptors: Sequence[grpc.ServerInterceptor] = ()) -> Provider:
    clock = FakeClock()
    source = StaticSource(groups)
    events = RecordingEvents()
    catalog = NodeGroupCatalog(source=source, events=events)
    catalog.refresh()
    tracker = InstanceTracker()
    cluster = StaticClusterView(nodes)
    provisioner = MemoryProvisioner(clock)
    ids = itertools.count()
    add_nodes = AddNodesDecider(provisioner, tracker, InstanceFactory(clock, short_id=lambda: f"i{next(ids):03d}"))
    registry = Registry(catalog, cluster, tracker, reconcilers=[add_nodes.reconcile])
    scale_down = RecordingScaleDown()
    keys = itertools.count()
    server = build_server(settings or Settings(listen="127.0.0.1:0", insecure=True), registry,
                          scale_up or add_nodes, scale_down, max_workers=4,
                          new_request_key=lambda: f"increase/k{next(keys)}", interceptors=interceptors)
    port = server.start()
    target = f"{target_host}:{port}"
    channel = (grpc.secure_channel(target, channel_credentials) if channel_credentials
               else grpc.insecure_channel(target))
    return Provider(server, channel, externalgrpc_pb2_grpc.CloudProviderStub(channel), registry, tracker, cluster,
                    source, scale_down, provisioner, events)


@pytest.fixture
def provider_factory() -> Iterator:
    started: list[Provider] = []

    def factory(*args: object, **kwargs: object) -> Provider:
        provider = start_provider(*args, **kwargs)  # type: ignore[arg-type]
        started.append(provider)
        return provider

    yield factory
    for provider in started:
        provider.channel.close()
        provider.server.stop(grace_seconds=0)


