"""A client of DDS's externalgrpc CloudProvider service, speaking to it as cluster-autoscaler does (the same
cloud-config file, mutual TLS, one deadline per call), so tests can read what DDS tells CA.

The e2e tests drive DDS with the real cluster-autoscaler; this client is only how a test *looks*: CA exposes no API
for its view of a node group, and the crash campaign's invariants compare that view (target sizes, in-flight instances
and their errors) with the cluster. Tests that provoke a state CA would reach only after long backoffs (an instance
that failed to be created) also drop it through here, as CA's DeleteNodes would.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import grpc
import yaml

from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc as pb_grpc

INSTANCE_RUNNING, INSTANCE_CREATING, INSTANCE_DELETING = 1, 2, 3
# The annotation CA puts on the placeholder node it sends for an instance that never got a Node.
FAKE_NODE_REASON_ANNOTATION = "k8s.io/cluster-autoscaler/fake-node-reason"


@dataclass(frozen=True)
class CloudConfig:
    """The externalgrpc cloud-config file CA reads with --cloud-config (dds certs writes it)."""

    address: str
    cert: Optional[Path] = None
    key: Optional[Path] = None
    cacert: Optional[Path] = None


def load_cloud_config(path: Path) -> CloudConfig:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict) or not isinstance(data.get("address"), str):
        raise ValueError(f"{path}: a cloud-config needs an 'address' (host:port of the externalgrpc provider)")
    files = {key: Path(data[key]) if data.get(key) else None for key in ("cert", "key", "cacert")}
    return CloudConfig(address=data["address"], **files)


def open_channel(config: CloudConfig) -> grpc.Channel:
    if config.cert is None:
        return grpc.insecure_channel(config.address)
    if config.key is None or config.cacert is None:
        raise ValueError("a cloud-config with 'cert' needs 'key' and 'cacert' too (mutual TLS)")
    credentials = grpc.ssl_channel_credentials(root_certificates=config.cacert.read_bytes(),
                                               private_key=config.key.read_bytes(),
                                               certificate_chain=config.cert.read_bytes())
    return grpc.secure_channel(config.address, credentials)


class ProviderError(Exception):
    """An RPC answered with a status other than OK."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method}: {code.name}: {details}")
        self.method, self.code, self.details = method, code, details


@dataclass(frozen=True)
class NodeGroup:
    id: str
    min_size: int
    max_size: int


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


@dataclass(frozen=True)
class Placeholder:
    """The node CA sends for an instance without a Node: name = providerID = instance id, and a reason annotation."""

    instance_id: str
    reason: str

    def to_proto(self) -> pb.ExternalGrpcNode:
        return pb.ExternalGrpcNode(name=self.instance_id, providerID=self.instance_id,
                                   annotations={FAKE_NODE_REASON_ANNOTATION: self.reason})


class ExternalGrpcClient:
    def __init__(self, channel: grpc.Channel, timeout: float = 10.0) -> None:
        self._stub = pb_grpc.CloudProviderStub(channel)
        self._timeout = timeout

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise ProviderError(method, exc.code(), exc.details() or "") from exc

    def refresh(self) -> None:
        self._call("Refresh", pb.RefreshRequest())

    def node_groups(self) -> list[NodeGroup]:
        answer = self._call("NodeGroups", pb.NodeGroupsRequest())
        return [NodeGroup(g.id, g.minSize, g.maxSize) for g in answer.nodeGroups]

    def node_group_for_node(self, name: str, provider_id: str = "") -> Optional[str]:
        """The group id CA would map this node to; None when DDS says it is not autoscaled."""
        answer = self._call("NodeGroupForNode", pb.NodeGroupForNodeRequest(
            node=pb.ExternalGrpcNode(name=name, providerID=provider_id)))
        return answer.nodeGroup.id or None

    def gpu_label(self) -> str:
        return self._call("GPULabel", pb.GPULabelRequest()).label

    def target_size(self, group_id: str) -> int:
        return self._call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group_id)).targetSize

    def increase_size(self, group_id: str, delta: int) -> None:
        self._call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=group_id, delta=delta))

    def delete_placeholders(self, group_id: str, placeholders: Sequence[Placeholder]) -> None:
        self._call("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(
            id=group_id, nodes=[p.to_proto() for p in placeholders]))

    def nodes(self, group_id: str) -> list[Instance]:
        answer = self._call("NodeGroupNodes", pb.NodeGroupNodesRequest(id=group_id))
        instances = []
        for item in answer.instances:
            state, error = item.status.instanceState, item.status.errorInfo
            failure = (InstanceError(error.errorCode, error.errorMessage, error.instanceErrorClass)
                       if state and error.errorCode else None)
            instances.append(Instance(item.id, state, failure))
        return instances
