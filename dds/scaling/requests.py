"""What cluster-autoscaler asks of a node group, as the gRPC provider hands it on: the nodes a request names, and the
interface of whoever decides what an IncreaseSize or DeleteNodes really does.

The provider (dds/provider, gRPC only) validates CA's call and hands it to a `ScaleUpDecider` / `ScaleDownDecider`;
the controller (dds/controller/ca_requests.py) implements them with the planner, dds/scaling/whole_nodes.py with
whole nodes. Both sides depend on this module, never on each other.

Contract for implementations:
- `increase` answers well within CA's gRPC deadline (default 5 s): it records one in-flight instance per unit of
  `delta` in the tracker before returning (CA reads TargetSize right after) and starts slow work asynchronously.
  It raises `ScaleUpRefused` when nothing can be done (CA backs the group off).
- `delete_nodes` receives live nodes of the group and placeholders of instances the registry has already dropped;
  it starts their removal and returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Protocol, Sequence, Union

from dds.model.groups import NodeGroupSpec
from dds.scaling.instances import InstanceRecord

FAKE_NODE_REASON = "k8s.io/cluster-autoscaler/fake-node-reason"


# --- nodes ---

@dataclass(frozen=True)
class LiveNode:
    """A registered Kubernetes node as the cluster view reports it."""

    name: str
    provider_id: str = ""
    group_id: Optional[str] = None  # None: not in any DDS group
    ready: bool = False
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Placeholder:
    """A node CA made up for one of our instances (failed or never registered): name = providerID = instance id.
    `instance` is the record the registry dropped for it (None when it was already gone)."""

    name: str
    provider_id: str
    reason: str = ""  # CA's fake-node-reason annotation (create-error, unregistered), if any
    instance: Optional[InstanceRecord] = None


DeleteTarget = Union[LiveNode, Placeholder]


@dataclass(frozen=True)
class RequestNode:
    """A node as CA sends it (ExternalGrpcNode)."""

    name: str = ""
    provider_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def placeholder_reason(self) -> Optional[str]:
        return self.annotations.get(FAKE_NODE_REASON)

    def describe(self) -> str:
        if self.provider_id and self.provider_id != self.name:
            return f"{self.name or '(no name)'} (providerID {self.provider_id})"
        return self.name or self.provider_id or "(unnamed node)"


class ScaleUpRefused(Exception):
    """Nothing can be added to the group now; the message says why (shown to the CA operator)."""


class ScaleUpDecider(Protocol):
    def increase(self, group: NodeGroupSpec, delta: int, request_key: str) -> Sequence[InstanceRecord]: ...


class ScaleDownDecider(Protocol):
    def delete_nodes(self, group: NodeGroupSpec, nodes: Sequence[DeleteTarget], request_key: str) -> None: ...
