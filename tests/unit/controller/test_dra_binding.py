"""DRA pool mode's binder against kube-scheduler's binding timeout (KEP-5007, beta in Kubernetes 1.36): an attach that
outlasts it ends in the failure condition (so the scheduler allocates again), and a GPU attached for an allocation the
scheduler no longer holds goes back to the pool instead of staying attached for nobody. Its writes go through a fake
PoolBindingWriter port: no apiserver (tests/e2e/test_dra_pool_mode.py has the real one)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dds.controller.dra_binding import PoolModeBinder, abandoned_attaches
from dds.fabric.base import Operation, OperationKind, OperationState, PoolState
from dds.model.groups import GpuApi
from dds.planner.dra import ATTACH_FAILED, ATTACHED, binding_key, pool_slots, slot_device
from dds.model.dra_devices import DRIVER, dra_pool_name
from dds.model.dra_records import AllocatedDeviceInfo, DraState, ResourceClaimInfo, ResourceSliceInfo
from dds.model.plan import Case
from dds.model.snapshot import Device
from tests.unit.planner.builders import make_node, make_snapshot
from tests.unit.planner.test_dra import dra_group

ALLOCATED_AT = "2026-11-26T20:00:00Z"
ALLOCATED_EPOCH = 1795723200.0  # ALLOCATED_AT as epoch seconds
SLOT = slot_device("A30", 0, "pool-a").name


def allocated_claim(at: str = ALLOCATED_AT) -> ResourceClaimInfo:
    return ResourceClaimInfo("default", "c", allocated=(AllocatedDeviceInfo("gpu", DRIVER, dra_pool_name("pool-a"),
                                                                            SLOT),),
                             reserved_for=("train",), uid="uid-c", allocated_at=at, allocated_node="w1")


def attach_op(state: OperationState, devices: tuple[str, ...] = (), at: str = ALLOCATED_AT) -> Operation:
    return Operation(key=binding_key(allocated_claim(at), SLOT), kind=OperationKind.ATTACH, node="w1", state=state,
                     requested=1, model="A30", pool="pool-a", devices=devices, started_at=ALLOCATED_EPOCH)


@dataclass
class FakeFabric:
    ops: list[Operation] = field(default_factory=list)

    def pools(self) -> tuple[PoolState, ...]:
        return (PoolState("pool-a", {"A30": 4}, {"A30": 3}),)

    def operation(self, key: str) -> Any:
        return next((o for o in self.ops if o.key == key), None)

    def operations(self) -> tuple[Operation, ...]:
        return tuple(self.ops)


@dataclass
class FakeWriter:
    """The binder's PoolBindingWriter port: what it would write to the cluster, kept."""

    conditions: list[tuple[str, str]] = field(default_factory=list)
    slices: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)
    recorded: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def publish_pool_slots(self, fabric_pool, slots, group_labels) -> None:
        self.slices.append((fabric_pool, tuple(s.name for s in slots), tuple(group_labels)))

    def set_condition(self, namespace, name, device, condition, reason, message) -> None:
        self.conditions.append((condition, message))

    def record_devices(self, namespace, name, fabric_ids) -> None:
        self.recorded.append((f"{namespace}/{name}", tuple(fabric_ids)))


@dataclass
class FakeActions:
    detaches: list[tuple[Any, str, Case]] = field(default_factory=list)
    attaches: list[str] = field(default_factory=list)

    def attach(self, step, key, case, on_done=None) -> None:
        self.attaches.append(key)

    def detach(self, step, key, case, on_done=None) -> None:
        self.detaches.append((step, key, case))


def pool_snapshot(claims=(), devices=("w1-gpu-0",)):
    node = replace(make_node("w1", gpus=0), devices=tuple(Device(id=d, model="A30", pool="pool-a") for d in devices))
    snapshot = make_snapshot([node], [], groups=[dra_group(api=GpuApi.DRA_POOL, models=())])
    return replace(snapshot, dra=DraState(claims=tuple(claims)))


def binder(fabric, writer, actions, now: float, timeout: float = 60.0) -> PoolModeBinder:
    return PoolModeBinder(writer, fabric, actions, binding_timeout_seconds=timeout,  # type: ignore[arg-type]
                          clock=lambda: now)


def test_an_attach_outlasting_the_binding_timeout_gets_the_failure_condition() -> None:
    fabric, writer, actions = FakeFabric([attach_op(OperationState.RUNNING)]), FakeWriter(), FakeActions()
    binder(fabric, writer, actions, now=ALLOCATED_EPOCH + 30).reconcile(pool_snapshot([allocated_claim()]))
    assert writer.conditions == []  # half way: the scheduler still waits
    binder(fabric, writer, actions, now=ALLOCATED_EPOCH + 51).reconcile(pool_snapshot([allocated_claim()]))
    ((condition, message),) = writer.conditions
    assert condition == ATTACH_FAILED and "binding timeout (60s" in message


def test_a_gpu_attached_for_an_allocation_the_scheduler_dropped_goes_back() -> None:
    done = attach_op(OperationState.SUCCEEDED, ("w1-gpu-0",))
    fabric, writer, actions = FakeFabric([done]), FakeWriter(), FakeActions()
    # The claim was deallocated after the scheduler's timeout, then allocated again (another allocation timestamp).
    binder(fabric, writer, actions, now=ALLOCATED_EPOCH + 70).reconcile(
        pool_snapshot([allocated_claim("2026-11-26T20:01:10Z")]))
    ((step, key, case),) = actions.detaches
    assert actions.attaches == [binding_key(allocated_claim("2026-11-26T20:01:10Z"), SLOT)]  # the new allocation's
    assert (step.node, step.device_ids, case) == ("w1", ("w1-gpu-0",), Case.ORPHAN_RECLAIM)
    assert key == f"dra-release/{done.key}"


def test_a_gpu_of_a_live_allocation_or_held_by_a_claim_stays() -> None:
    done = attach_op(OperationState.SUCCEEDED, ("w1-gpu-0",))
    assert abandoned_attaches([done], DraState(claims=(allocated_claim(),)), lambda node: {"w1-gpu-0"}) == []
    # Allocation gone, but the device is no longer attached (or a claim holds it): nothing to release.
    assert abandoned_attaches([done], DraState(), lambda node: ()) == []
    assert abandoned_attaches([attach_op(OperationState.RUNNING)], DraState(), lambda node: {"w1-gpu-0"}) == []
    assert abandoned_attaches([done], DraState(), lambda node: {"w1-gpu-0"}) == [(done, ("w1-gpu-0",))]


def test_the_pool_slice_is_published_through_the_port_once_until_it_changes() -> None:
    fabric, writer, actions = FakeFabric(), FakeWriter(), FakeActions()
    bind = binder(fabric, writer, actions, now=ALLOCATED_EPOCH)
    bind.reconcile(pool_snapshot())
    ((pool, slots, groups),) = writer.slices
    assert pool == "pool-a" and groups == ("gpu",) and len(slots) == 3  # one slot per free A30
    listed = ResourceSliceInfo(name="s", driver=DRIVER, pool=dra_pool_name("pool-a"),
                               devices=pool_slots("pool-a", {"A30": 3}, DraState()))
    bind.reconcile(replace(pool_snapshot(), dra=DraState(slices=(listed,))))
    assert len(writer.slices) == 1  # the slice the watch cache shows is the one wanted: no request


def test_a_succeeded_attach_is_recorded_on_the_claim_and_bound() -> None:
    fabric = FakeFabric([attach_op(OperationState.SUCCEEDED, ("w1-gpu-0",))])
    writer, actions = FakeWriter(), FakeActions()
    binder(fabric, writer, actions, now=ALLOCATED_EPOCH + 5).reconcile(pool_snapshot([allocated_claim()]))
    assert writer.recorded == [("default/c", ("w1-gpu-0",))]
    ((condition, message),) = writer.conditions
    assert condition == ATTACHED and message == "w1-gpu-0 attached to w1"
    assert actions.attaches == [] and actions.detaches == []
