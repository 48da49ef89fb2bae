"""Build the node backend that settings.node_backend names.

| settings.node_backend | provisioner           | also                                                 | api_client |
|-----------------------|-----------------------|------------------------------------------------------|------------|
| machineset (default)  | MachineSetProvisioner | nothing: Cluster API and its provider make machines   | required   |
| kwok                  | MachineSetProvisioner | KwokInfrastructure: Machines, kwok Nodes (settings.kwok) | required |
| memory                | MemoryProvisioner     | nothing: nodes are never made (`dds serve` on a file) | no         |

The caller starts `infrastructure.run_in_thread(settings.kwok.poll_interval_seconds)` when it is there and stops it
on shutdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from dds.config import NodeBackend, Settings
from dds.kube import ApiClient
from dds.nodes.base import NodeProvisioner
from dds.nodes.kwok import KwokInfrastructure
from dds.nodes.machineset import MachineSetProvisioner
from dds.nodes.memory import MemoryProvisioner


@dataclass
class NodeBackendParts:
    provisioner: NodeProvisioner
    infrastructure: Optional[KwokInfrastructure] = None


def build_node_backend(settings: Settings, *, clock: Callable[[], float], api_client: Optional[ApiClient] = None,
                       on_written: Optional[Callable[[Mapping[str, Any]], None]] = None) -> NodeBackendParts:
    """`on_written`: told every Cluster API object DDS's writes answered (the watch cache's `assume`)."""
    backend = settings.node_backend
    if backend == NodeBackend.MEMORY:
        return NodeBackendParts(MemoryProvisioner(clock=clock))
    if api_client is None:
        raise ValueError(f"node_backend {backend.value} needs a cluster: pass --kubeconfig or --in-cluster "
                         f"(or node_backend memory without one)")
    provisioner = MachineSetProvisioner(api_client, clock, on_written=on_written)
    if backend == NodeBackend.MACHINESET:
        return NodeBackendParts(provisioner)
    if backend == NodeBackend.KWOK:
        infrastructure = KwokInfrastructure(api_client, clock, settings.kwok.provisioning_delay_seconds,
                                            settings.machineset_namespaces, gpu_label=settings.gpu_label)
        return NodeBackendParts(provisioner, infrastructure)
    raise ValueError(f"node_backend: unknown backend {backend!r}")
