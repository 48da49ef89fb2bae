"""A `NodeProvisioner` with no infrastructure behind it (`dds serve --node-groups FILE`, tests).

It remembers the nodes asked for and reports them as provisioning for ever: nothing will ever boot them. That is the
honest answer without a cluster: CA sees its scale-up in flight, and after its max-node-provision-time treats the
instances as never registered and deletes them, exactly as with a cloud that cannot deliver.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Callable

from dds.model.groups import NodeGroupSpec
from dds.nodes.base import MachineInfo, MachinePhase


class MemoryProvisioner:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._machines: dict[str, dict[str, MachineInfo]] = {}  # group id -> machine name -> machine
        self._keys_seen: set[str] = set()

    def machines(self, group: NodeGroupSpec) -> tuple[MachineInfo, ...]:
        with self._lock:
            return tuple(sorted(self._machines.get(group.id, {}).values(), key=lambda m: (m.created_at, m.name)))

    def add_nodes(self, group: NodeGroupSpec, count: int, key: str) -> None:
        if count <= 0:
            raise ValueError(f"add_nodes for {group.id}: count must be positive, got {count}")
        with self._lock:
            if key in self._keys_seen:
                return
            self._keys_seen.add(key)
            machines = self._machines.setdefault(group.id, {})
            for index in range(count):
                name = _machine_name(group.id, key, index)
                machines[name] = MachineInfo(name=name, group_id=group.id, provider_id=f"memory://{name}",
                                             phase=MachinePhase.PROVISIONING, created_at=self._clock())

    def remove_node(self, group: NodeGroupSpec, node_name: str, key: str) -> None:
        with self._lock:
            if key in self._keys_seen:
                return
            self._keys_seen.add(key)
            machines = self._machines.get(group.id, {})
            for name, machine in list(machines.items()):
                if node_name in (name, machine.node_name):
                    del machines[name]


def _machine_name(group_id: str, key: str, index: int) -> str:
    # Deterministic by (key, index): the same request always names the same machines.
    digest = hashlib.sha256(f"{group_id}/{key}/{index}".encode()).hexdigest()[:10]
    tail = group_id.rsplit("/", 1)[-1].lower()
    return f"{tail}-{digest}"
