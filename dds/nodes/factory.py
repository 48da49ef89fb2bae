"""Build the node backend that settings.node_backend names.

| settings.node_backend | provisioner           | api_client |
|-----------------------|-----------------------|------------|
| machineset (default)  | MachineSetProvisioner | required   |
| memory                | MemoryProvisioner     | no         |

With `machineset`, Cluster API's own controllers and an infrastructure provider make and delete the machines; DDS only
scales MachineSets and MachineDeployments and marks the Machines it removes. `memory` never makes a node (`dds serve`
on a file).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from dds.config import NodeBackend, Settings
from dds.kube import ApiClient
from dds.nodes.base import NodeProvisioner
from dds.nodes.machineset import MachineSetProvisioner
from dds.nodes.memory import MemoryProvisioner


def build_node_backend(settings: Settings, *, clock: Callable[[], float], api_client: Optional[ApiClient] = None,
                       on_written: Optional[Callable[[Mapping[str, Any]], None]] = None) -> NodeProvisioner:
    """`on_written`: told every Cluster API object DDS's writes answered (the watch cache's `assume`)."""
    backend = settings.node_backend
    if backend == NodeBackend.MEMORY:
        return MemoryProvisioner(clock=clock)
    if api_client is None:
        raise ValueError(f"node_backend {backend.value} needs a cluster: pass --kubeconfig or --in-cluster "
                         f"(or node_backend memory without one)")
    if backend == NodeBackend.MACHINESET:
        return MachineSetProvisioner(api_client, clock, on_written=on_written)
    raise ValueError(f"node_backend: unknown backend {backend!r}")
