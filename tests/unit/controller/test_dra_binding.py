"""DRA pool mode's binder against kube-scheduler's binding timeout (KEP-5007, beta in Kubernetes 1.36): an attach that
outlasts it ends in the failure condition (so the scheduler allocates again), and a GPU attached for an allocation the
scheduler no longer holds goes back to the pool instead of staying attached for nobody."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dds.controller.dra_binding import PoolModeBinder, abandoned_attaches
from dds.fabric.base import Operation, OperationKind, OperationState, PoolState
from dds.model.groups import GpuApi
from dds.planner.dra import ATTACH_FAILED, DRIVER, binding_key, dra_pool_name, slot_device
from dds.planner.dra_records import AllocatedDeviceInfo, DraState, ResourceClaimInfo
from dds.planner.plan import Case
from dds.planner.snapshot import Device
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
    conditions: list[tuple[str, str]] = field(default_factory=list)

    def set_condition(self, namespace, name, device, condition, reason, message) -> None:
        self.conditions.append((condition, message))

    def record_devices(self, namespace, name, fabric_ids) -> None:
        pass


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
    return PoolModeBinder(api=None, fabric=fabric, actions=actions, writer=writer,  # type: ignore[arg-type]
                          binding_timeout_seconds=timeout, clock=lambda: now)


def no_slice_writes(monkeypatch) -> None:
    # The slice writes need an apiserver (tests/e2e/test_dra_pool_mode.py); here only the bindings matter.
    monkeypatch.setattr("dds.controller.dra_binding.publish_pool_slots", lambda *a, **k: None)


def test_an_attach_outlasting_the_binding_timeout_gets_the_failure_condition(monkeypatch) -> None:
    no_slice_writes(monkeypatch)
    fabric, writer, actions = FakeFabric([attach_op(OperationState.RUNNING)]), FakeWriter(), FakeActions()
    binder(fabric, writer, actions, now=ALLOCATED_EPOCH + 30).reconcile(pool_snapshot([allocated_claim()]))
    assert writer.conditions == []  # half way: the scheduler still waits
    binder(fabric, writer, actions, now=ALLOCATED_EPOCH + 51).reconcile(pool_snapshot([allocated_claim()]))
    ((condition, message),) = writer.conditions
    assert condition == ATTACH_FAILED and "binding timeout (60s" in message


def test_a_gpu_attached_for_an_allocation_the_scheduler_dropped_goes_back(monkeypatch) -> None:
    no_slice_writes(monkeypatch)
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
