"""One way to carry out planned steps: the applier. Every action the controller takes — attach, detach, node add,
node removal, taint, label — for CA's scale-up and scale-down (cases 1 and 3), the fast path, warm headroom and idle
GPUs (cases 2 and 4), reservations, repairs and orphan reclaims, goes through `Actions`, over three narrow ports:

| action                    | port                                                   | what else happens here                              |
|---------------------------|--------------------------------------------------------|-----------------------------------------------------|
| attach, detach            | the fabric, through the `Executor`                     | idempotency key, Events, metrics, crash points; the `OperationWatcher` follows the operation to its end |
| node add, node removal    | the `NodeProvisioner`, through `NodeActions`           | Events, metrics; the executor's generation moves     |
| taint, untaint, label     | a `NodeWriter` (dds.kube.nodes.KubeNodeWriter)         | the fresh read of a node's work a cordon needs       |

What is decided stays with the planner (dds/planner/passes.py); who asked is the `case` and the key prefix. `dds
simulate` carries out the same plans through the same `Actions` (dds/sim/engine.py), on the simulated fabric, its
simulated cloud and its own nodes, on a virtual clock.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Protocol, Sequence, Union

from dds.controller.executor import Executor, OperationWatcher
from dds.crashpoints import crashpoint
from dds.fabric.base import FabricError, Operation
from dds.model.groups import NodeGroupSpec
from dds.model.plan import Attach, Case, Detach, NewNodes, RemoveNode

OnDone = Callable[[Operation], None]
_LOOP_OWN = (Case.FAST_PATH, Case.WARM_HEADROOM)  # the attaches the loop starts without CA asking


class NodeWriter(Protocol):
    """The node writes an action makes, and the fresh read a cordon needs. Each raises when the cluster refuses it
    (dds.kube.nodes.KubeNodeWriter: the apiserver's errors)."""

    def taint(self, node: str, key: str, value: str, effect: str) -> None: ...

    def untaint(self, node: str, key: str, *, uncordon_if_cordoned_with_it: bool = False) -> None: ...

    def label(self, node: str, labels: Mapping[str, str]) -> None: ...

    def work_on(self, node: str) -> list[str]: ...


class Actions:
    def __init__(self, executor: Executor, watcher: OperationWatcher, nodes: NodeWriter) -> None:
        self.executor = executor
        self.watcher = watcher
        self.nodes = nodes

    def attach(self, step: Attach, key: str, case: Case, on_done: Optional[OnDone] = None) -> Operation:
        """Start one attach and follow it; raises FabricError when the fabric refuses it outright (the executor has
        already told the node's Events and the metrics)."""
        operation = self.executor.attach(step, key=key, case=case)
        self.watcher.watch(operation, on_done=on_done)
        return operation

    def attach_all(self, steps: Sequence[Attach], key_prefix: str, case: Case) -> list[tuple[Attach, Operation]]:
        """Start every attach; one the fabric refuses is skipped (the planner sees the pod again next pass). Returns
        the steps started, each with its operation."""
        keyed = [(step, f"{key_prefix}/{index}") for index, step in enumerate(steps)]
        return [(step, operation) for (step, _), operation in zip(keyed, self.attach_keyed(keyed, case))
                if isinstance(operation, Operation)]

    def attach_keyed(self, steps: Sequence[tuple[Attach, str]], case: Case,
                     on_done: Sequence[Optional[OnDone]] = ()) -> list[Union[Operation, FabricError]]:
        """Start several attaches at once (one transaction where the fabric has them: a burst is one write), each
        with its key and optional `on_done`, and follow those started. One result per step, in order: its operation,
        or the error that refused it (told by the executor)."""
        results = self.executor.attach_all(steps, case)
        for index, result in enumerate(results):
            if isinstance(result, Operation):
                self.watcher.watch(result, on_done=on_done[index] if index < len(on_done) else None)
                if case in _LOOP_OWN:
                    crashpoint("loop.attach-started")
        return results

    def detach(self, step: Detach, key: str, case: Case, on_done: Optional[OnDone] = None) -> Optional[Operation]:
        """Start one detach and follow it; None when the fabric refused it (told by the executor)."""
        operation = self.executor.detach(step, key=key, case=case)
        if operation is not None:
            self.watcher.watch(operation, on_done=on_done)
        return operation

    # --- nodes: added and removed by the executor's NodeActions (dds/scaling/node_actions.py), as without a cluster ---
    def add_nodes(self, step: NewNodes, group: NodeGroupSpec, key: str, case: Case) -> None:
        """Ask the node provisioner for `step.count` nodes of `group` (raises what the provisioner raises)."""
        self.executor.nodes.add_nodes(step, group, key=key, case=case)

    def remove_node(self, step: RemoveNode, group: NodeGroupSpec, key: str, case: Case) -> None:
        """Remove one node of `group` (its GPUs are released first: dds/controller/removals.py)."""
        self.executor.nodes.remove_node(step, group, key=key, case=case)

    # --- taints and labels ---
    def taint(self, node: str, key: str, value: str, effect: str) -> None:
        self.nodes.taint(node, key, value, effect)

    def untaint(self, node: str, key: str, *, uncordon_if_cordoned_with_it: bool = False) -> None:
        self.nodes.untaint(node, key, uncordon_if_cordoned_with_it=uncordon_if_cordoned_with_it)

    def label(self, node: str, labels: Mapping[str, str]) -> None:
        self.nodes.label(node, labels)

    def work_on(self, node: str) -> list[str]:
        """The pods on `node` that count as work, read fresh (a cordon's recheck decides on it)."""
        return self.nodes.work_on(node)
