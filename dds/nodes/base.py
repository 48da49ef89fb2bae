"""Horizontal provisioning: add and remove whole nodes of a group.

In a cluster this is Cluster API: DDS raises a MachineSet's replicas and Cluster API's controllers, with an
infrastructure provider, make the machine; removing marks the Machine `cluster.x-k8s.io/delete-machine` and lowers
replicas. The demo and the e2e tests run Cluster API's own manager, with the harness's kwok provider for the servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional, Protocol, runtime_checkable

from dds.model.groups import NodeGroupSpec


class MachinePhase(str, Enum):
    PROVISIONING = "provisioning"  # wanted, node not yet registered/ready
    RUNNING = "running"  # node registered and Ready
    DELETING = "deleting"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class MachineInfo:
    name: str
    group_id: str
    provider_id: str
    phase: MachinePhase
    node_name: Optional[str] = None
    created_at: float = 0.0
    error: Optional[str] = None


@runtime_checkable
class NodeProvisioner(Protocol):
    def machines(self, group: NodeGroupSpec) -> tuple[MachineInfo, ...]: ...

    def add_nodes(self, group: NodeGroupSpec, count: int, key: str) -> None:
        """Ask for `count` more nodes; idempotent by `key` (a retried call with the same key adds nothing)."""
        ...

    def remove_node(self, group: NodeGroupSpec, node_name: str, key: str) -> None:
        """Remove one specific node (its Machine); idempotent by `key`."""
        ...
