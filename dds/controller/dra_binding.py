"""Pool mode (DRA device binding conditions, docs/dra.md): every pass, each fabric pool's slots are published in its
ResourceSlice, on the nodes of the groups annotated dds.cdi.dev/gpu-api: dra-pool that draw from it (a pool no such
group draws from has no slice), and each slot kube-scheduler allocated to a claim gets its GPU attached to the allocation's node, then
the binding condition the scheduler waits for in PreBind (or the failure condition, so it allocates again).

    allocated slot ──► attach 1 x model to the node (key: claim, allocation, slot: idempotent across passes/restarts)
                   ──► attach succeeded: claim annotated with the fabric devices, condition dds.cdi.dev/attached True
                   ──► attach failed:    condition dds.cdi.dev/attach-failed True (the scheduler retries)
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from dds.controller.apply import Actions
from dds.fabric.base import Fabric, FabricError, OperationState
from dds.groups.labels import node_group_label_value
from dds.kube import ApiClient
from dds.kube.dra import ClaimBindingWriter
from dds.kube.resourceslices import publish_pool_slots
from dds.model.groups import GpuApi, NodeGroupSpec
from dds.planner.dra import ATTACH_FAILED, ATTACHED, DRIVER, PoolBinding, dra_pool_name, pool_bindings, pool_slots
from dds.planner.plan import Attach, Case
from dds.planner.snapshot import Snapshot

log = logging.getLogger(__name__)


def pool_mode_groups(groups: Sequence[NodeGroupSpec], fabric_pool: str) -> tuple[str, ...]:
    """The node-group label values of the dra-pool groups drawing from `fabric_pool`: the only nodes its slots go to."""
    return tuple(sorted(node_group_label_value(g.id) for g in groups
                        if g.gpu_api is GpuApi.DRA_POOL and g.fabric_pool == fabric_pool))


class PoolModeBinder:
    def __init__(self, api: ApiClient, fabric: Fabric, actions: Actions,
                 writer: Optional[ClaimBindingWriter] = None) -> None:
        self._api = api
        self._fabric = fabric
        self._actions = actions
        self._writer = writer or ClaimBindingWriter(api)
        self._placed: dict[str, tuple[str, ...]] = {}  # fabric pool -> the groups its slice was last placed on

    def reconcile(self, snapshot: Snapshot) -> None:
        pools = self._fabric.pools()
        listed = {s.pool: s.devices for s in snapshot.dra.slices if s.driver == DRIVER}
        for pool in pools:
            groups = pool_mode_groups(snapshot.groups, pool.name)
            name = dra_pool_name(pool.name)
            if not groups:
                if name in listed:  # no dra-pool group draws from it (any more): its slice goes
                    publish_pool_slots(self._api, pool.name, (), ())
                continue
            slots = pool_slots(pool.name, dict(pool.free), snapshot.dra)
            # As the watch cache saw it: no request when equal (the node selector only changes with the groups).
            if listed.get(name, ()) != slots or self._placed.get(pool.name) != groups:
                publish_pool_slots(self._api, pool.name, slots, groups)
                self._placed[pool.name] = groups
        for binding in pool_bindings(snapshot.dra, {p.name: tuple(p.total) for p in pools}):
            self._bind(binding)

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
