"""Pool mode (DRA device binding conditions, docs/dra.md): every pass, each fabric pool's slots are published in its
ResourceSlice, on the nodes of the groups annotated dds.cdi.dev/gpu-api: dra-pool that draw from it (a pool no such
group draws from has no slice), and each slot kube-scheduler allocated to a claim gets its GPU attached to the allocation's node, then
the binding condition the scheduler waits for in PreBind (or the failure condition, so it allocates again).

    allocated slot ──► attach 1 x model to the node (key: claim, allocation, slot: idempotent across passes/restarts)
                   ──► attach succeeded: claim annotated with the fabric devices, condition dds.cdi.dev/attached True
                   ──► attach failed:    condition dds.cdi.dev/attach-failed True (the scheduler retries)
                   ──► attach still running close to kube-scheduler's binding timeout (dra_binding_timeout_seconds):
                       condition dds.cdi.dev/attach-failed True, so the scheduler retries at once instead of timing out
    an attach whose allocation is gone (the scheduler gave up on it: binding timeout or failure; or its pod ended and
    the claim was released) ──► its GPUs detached back to the pool once it ends: no claim can use a GPU on a pool-mode
    node outside a slot, so nothing stays attached for nobody (`abandoned_attaches`)
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Protocol, Sequence

from dds.controller.apply import Actions
from dds.fabric.base import Fabric, FabricError, Operation, OperationKind, OperationState
from dds.groups.labels import node_group_label_value
from dds.kube.decode import timestamp
from dds.model.groups import GpuApi, NodeGroupSpec
from dds.planner.dra import (ATTACH_FAILED, ATTACHED, BINDING_KEY_PREFIX, PoolBinding, binding_key, pool_bindings,
                             pool_slots)
from dds.model.dra_devices import DRIVER, dra_pool_name
from dds.model.dra_records import DraDevice, DraState
from dds.model.plan import Attach, Case, Detach
from dds.model.snapshot import Snapshot

log = logging.getLogger(__name__)


# kube-scheduler looks at a waiting claim every 5 s (dynamicresources PreBind): a failure condition set this long before
# its binding timeout is seen before the timeout, so the scheduler retries on DDS's word, with the reason DDS gives.
GIVE_UP_MARGIN_SECONDS = 10.0
RELEASE_KEY_PREFIX = "dra-release/"


def abandoned_attaches(operations: Iterable[Operation], state: DraState,
                       attached: Callable[[str], Iterable[str]]) -> list[tuple[Operation, tuple[str, ...]]]:
    """Pool-mode attaches that ended with devices for an allocation no claim holds any more, each with its devices
    still attached to the node and held by no claim (`attached(node)`: such device ids)."""
    live = {binding_key(c, r.device) for c in state.claims if c.allocated for r in c.allocated}
    out = []
    for op in operations:
        if (op.kind != OperationKind.ATTACH or not op.key.startswith(BINDING_KEY_PREFIX) or not op.state.done
                or not op.devices or op.key in live):
            continue
        still = set(attached(op.node))
        devices = tuple(d for d in op.devices if d in still)
        if devices:
            out.append((op, devices))
    return out


def pool_mode_groups(groups: Sequence[NodeGroupSpec], fabric_pool: str) -> tuple[str, ...]:
    """The node-group label values of the dra-pool groups drawing from `fabric_pool`: the only nodes its slots go to."""
    return tuple(sorted(node_group_label_value(g.id) for g in groups
                        if g.gpu_api is GpuApi.DRA_POOL and g.fabric_pool == fabric_pool))


class PoolBindingWriter(Protocol):
    """Pool mode's writes to the cluster (dds.kube.controller_ports.KubePoolBindingWriter: the apiserver). Each raises
    what the cluster answers; the next pass tries again."""

    def publish_pool_slots(self, fabric_pool: str, slots: Sequence[DraDevice], group_labels: Sequence[str]) -> None:
        """Publish the pool's ResourceSlice: `slots`, on the nodes of the groups whose node-group label values are
        `group_labels` (none: the slice offers nothing)."""
        ...

    def record_devices(self, namespace: str, name: str, fabric_ids: Sequence[str]) -> None:
        """Annotate the ResourceClaim with the fabric devices attached for it."""
        ...

    def set_condition(self, namespace: str, name: str, device: tuple[str, str, str], condition: str, reason: str,
                      message: str) -> None:
        """Set `condition` True on the claim's allocated (driver, pool, device)."""
        ...


class PoolModeBinder:
    def __init__(self, writer: PoolBindingWriter, fabric: Fabric, actions: Actions,
                 binding_timeout_seconds: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        self._fabric = fabric
        self._actions = actions
        self._writer = writer
        # When an attach still running is given up: kube-scheduler's binding timeout less the margin (at least half).
        self._give_up_after = max(binding_timeout_seconds / 2, binding_timeout_seconds - GIVE_UP_MARGIN_SECONDS)
        self._binding_timeout = binding_timeout_seconds
        self._clock = clock
        self._placed: dict[str, tuple[str, ...]] = {}  # fabric pool -> the groups its slice was last placed on

    def reconcile(self, snapshot: Snapshot) -> None:
        pools = self._fabric.pools()
        listed = {s.pool: s.devices for s in snapshot.dra.slices if s.driver == DRIVER}
        for pool in pools:
            groups = pool_mode_groups(snapshot.groups, pool.name)
            name = dra_pool_name(pool.name)
            if not groups:
                if name in listed:  # no dra-pool group draws from it (any more): its slice goes
                    self._writer.publish_pool_slots(pool.name, (), ())
                continue
            slots = pool_slots(pool.name, dict(pool.free), snapshot.dra)
            # As the watch cache saw it: no request when equal (the node selector only changes with the groups).
            if listed.get(name, ()) != slots or self._placed.get(pool.name) != groups:
                self._writer.publish_pool_slots(pool.name, slots, groups)
                self._placed[pool.name] = groups
        for binding in pool_bindings(snapshot.dra, {p.name: tuple(p.total) for p in pools}):
            self._bind(binding)
        if any(g.gpu_api is GpuApi.DRA_POOL for g in snapshot.groups):
            self._release_abandoned(snapshot)

    def _release_abandoned(self, snapshot: Snapshot) -> None:
        free = {n.name: {d.id for d in n.devices if not d.in_claim} for n in snapshot.nodes}
        for op, devices in abandoned_attaches(self._fabric.operations(), snapshot.dra,
                                              lambda node: free.get(node, ())):
            step = Detach(node=op.node, device_ids=devices,
                          reason=f"attached for a pool slot allocation kube-scheduler no longer holds ({op.key}): "
                                 f"no claim can use them on a pool-mode node, so they go back to pool {op.pool}")
            log.info("pool mode: releasing %s from %s: %s", ", ".join(devices), op.node, step.reason)
            self._actions.detach(step, f"{RELEASE_KEY_PREFIX}{op.key}", Case.ORPHAN_RECLAIM)

    def _bind(self, binding: PoolBinding) -> None:
        claim = binding.claim
        operation = self._fabric.operation(binding.key)
        if operation is None:
            step = Attach(node=binding.node, pool=binding.fabric_pool, model=binding.model, count=1,
                          pods=tuple(f"{claim.namespace}/{p}" for p in claim.reserved_for),
                          reason=f"ResourceClaim {claim.key} was allocated pool device {binding.device} on "
                                 f"{binding.node}; kube-scheduler waits for it to be attached")
            try:
                self._actions.attach(step, binding.key, Case.FAST_PATH)
            except FabricError as exc:
                self._fail(binding, exc.message)
            return
        if not operation.state.done:
            waited = self._clock() - (timestamp(claim.allocated_at) or operation.started_at)
            if waited >= self._give_up_after:
                self._fail(binding, f"attaching {binding.model} to {binding.node} has taken {waited:.0f}s, close to "
                                    f"kube-scheduler's binding timeout ({self._binding_timeout:.0f}s, "
                                    f"dra_binding_timeout_seconds): the scheduler allocates again, and the GPU goes "
                                    f"back to the pool when the attach ends")
            return
        if operation.state == OperationState.SUCCEEDED and operation.devices:
            self._writer.record_devices(claim.namespace, claim.name, operation.devices)
            self._writer.set_condition(claim.namespace, claim.name, self._device(binding), ATTACHED, "Attached",
                                       f"{', '.join(operation.devices)} attached to {binding.node}")
            log.info("pool mode: %s bound %s to %s (%s)", claim.key, binding.device, binding.node,
                     ", ".join(operation.devices))
            return
        self._fail(binding, operation.error.message if operation.error else "the attach brought no device")

    def _fail(self, binding: PoolBinding, message: str) -> None:
        claim = binding.claim
        log.warning("pool mode: attaching %s for %s to %s failed: %s", binding.device, claim.key, binding.node, message)
        self._writer.set_condition(claim.namespace, claim.name, self._device(binding), ATTACH_FAILED, "AttachFailed",
                                   message)

    @staticmethod
    def _device(binding: PoolBinding) -> tuple[str, str, str]:
        return DRIVER, dra_pool_name(binding.fabric_pool), binding.device
