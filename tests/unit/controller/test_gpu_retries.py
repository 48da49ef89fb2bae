"""GPU instances of CA's scale-ups (dds/controller/gpu_retries.py): the table as a table, and what users see — a failed
attach retried after its backoff (times from a fake clock), then a node instead when the node is full, CA told when
nothing can serve the pods, and a restarted DDS picking the instance up from the fabric's operations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest

from dds.controller.gpu_retries import (GPU_INSTANCE_LIFECYCLE, GpuInstanceEvent, GpuInstanceRetries,
                                        GpuInstanceState, GpuInstanceWork, InstanceOutcomes)
from dds.fabric.base import ErrorCode, FabricError, Operation, OperationKind, OperationState
from dds.model.lifecycle import IllegalTransition
from dds.model.plan import Attach
from dds.scaling.instances import InstanceKind, InstanceRecord
from tests.unit.model.tables import every_pair, pair_id
from tests.unit.planner.builders import make_group, make_pool, make_snapshot

GROUP = make_group("gpu", max_size=3, initial_gpus=1)
RECORD = InstanceRecord(id="dds://gpu/gpu/abc", group_id="gpu", kind=InstanceKind.GPU)
STEP = Attach(node="worker-1", pool="pool-a", model="A30", count=1, pods=("default/train",), reason="train fits")


@pytest.mark.parametrize("state, event, target", every_pair(GPU_INSTANCE_LIFECYCLE), ids=pair_id)
def test_every_row_goes_where_it_says_and_every_other_pair_raises(state, event, target):
    work = GpuInstanceWork(state=state)
    if target is None:
        with pytest.raises(IllegalTransition):
            work.move(event)
        assert work.state == state
    else:
        assert work.move(event) == target


@dataclass
class World:
    """The fabric and CA as the retries see them; `now` is the injected clock."""

    now: float = 100.0
    started: list[tuple[Attach, str]] = field(default_factory=list)
    reporters: dict[str, Callable[[Operation], None]] = field(default_factory=dict)
    refuse: Optional[FabricError] = None
    fabric_operations: list[Operation] = field(default_factory=list)
    watched: list[str] = field(default_factory=list)
    room: bool = True
    nodes_instead: list[tuple[str, str]] = field(default_factory=list)
    failures: list[tuple[str, ErrorCode, str, int]] = field(default_factory=list)
    told: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)  # (reason, message, pods)

    def start_attach(self, step: Attach, key: str, on_done: Callable[[Operation], None]) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.started.append((step, key))
        self.reporters[key] = on_done

    def watch(self, operation: Operation, on_done: Callable[[Operation], None]) -> None:
        self.watched.append(operation.key)
        self.reporters[operation.key] = on_done

    def outcomes(self) -> InstanceOutcomes:
        return InstanceOutcomes(
            has_room=lambda: self.room,
            fall_back_to_node=lambda record, reason: self.nodes_instead.append((record.id, reason)),
            fail=lambda record, code, message, klass: self.failures.append((record.id, code, message, klass)),
            tell=lambda kind, reason, message, nodes, pods: self.told.append((reason, message, tuple(pods))))

    def retries(self) -> GpuInstanceRetries:
        return GpuInstanceRetries(lambda: self.now, self.start_attach, self.watch, lambda: self.fabric_operations)


def ended(key: str, error: Optional[ErrorCode] = None, attached: int = 1, requested: int = 1) -> Operation:
    return Operation(key=key, kind=OperationKind.ATTACH, node=STEP.node, pool=STEP.pool, model=STEP.model,
                     requested=requested, devices=tuple(f"A30-{i}" for i in range(attached)),
                     state=OperationState.FAILED if error else OperationState.SUCCEEDED,
                     error=FabricError(error, f"{error.value} from the fabric") if error else None)


def follow(retries: GpuInstanceRetries, world: World, free: int = 6) -> list[str]:
    done: list[str] = []
    retries.follow(GROUP, [RECORD], make_snapshot(groups=[GROUP], pools=[make_pool(A30=free)]), world.outcomes(),
                   done)
    return done


def started_instance(world: World) -> GpuInstanceRetries:
    retries = world.retries()
    retries.start(RECORD.id)
    retries.expect(RECORD.id, f"{RECORD.id}#0", STEP)
    return retries


def test_an_attach_that_succeeds_completes_the_instance():
    world = World()
    retries = started_instance(world)
    assert follow(retries, world) == [] and retries.state_of(RECORD.id) == GpuInstanceState.ATTACHING
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0"))
    assert follow(retries, world) == [RECORD.id]
    assert retries.state_of(RECORD.id) is None, "a finished instance is no longer followed"


def test_a_failed_attach_is_retried_after_the_backoff_then_a_full_node_falls_back_to_a_node():
    world = World()
    retries = started_instance(world)
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0", ErrorCode.BACKEND, attached=0))
    follow(retries, world)
    assert retries.state_of(RECORD.id) == GpuInstanceState.WAITING_TO_RETRY
    assert world.told == [("RetryingAttach", "attaching 1 GPU(s) to worker-1 failed: BackendError from the fabric; "
                                             "retry 1 of 3 in 2s", ("default/train",))]
    world.now += 1.9
    follow(retries, world)
    assert world.started == [], "nothing is started before the backoff has passed"
    world.now += 0.1
    follow(retries, world)
    assert world.started == [(STEP, f"{RECORD.id}#0.r2")]  # the same step, as attempt 2
    assert retries.state_of(RECORD.id) == GpuInstanceState.ATTACHING
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0.r2", ErrorCode.SLOTS_FULL, attached=0))
    assert follow(retries, world) == []
    assert world.nodes_instead == [(RECORD.id, "pool pool-a could not serve worker-1: SlotsFull from the fabric; "
                                               "adding a node instead (its slots are free)")]
    assert world.failures == [] and retries.state_of(RECORD.id) is None


def test_a_full_node_in_a_group_at_its_max_size_is_told_to_ca_as_out_of_resources():
    world = World(room=False)
    retries = started_instance(world)
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0", ErrorCode.SLOTS_FULL, attached=0))
    follow(retries, world)
    [(instance, code, message, klass)] = world.failures
    assert (instance, code, klass) == (RECORD.id, ErrorCode.SLOTS_FULL, 1)
    assert "no node instead: the group is at its max size" in message
    assert world.told[-1][0] == "ScaleUpFailed" and world.nodes_instead == []


def test_retries_end_after_four_attempts_with_the_last_error_for_ca():
    world = World()
    retries = started_instance(world)
    key = f"{RECORD.id}#0"
    for backoff in (2, 4, 8):
        retries.on_attach_done(RECORD.id, ended(key, ErrorCode.TIMEOUT, attached=0))
        follow(retries, world)
        world.now += backoff
        follow(retries, world)
        key = world.started[-1][1]
    assert [k for _, k in world.started] == [f"{RECORD.id}#0.r2", f"{RECORD.id}#0.r3", f"{RECORD.id}#0.r4"]
    retries.on_attach_done(RECORD.id, ended(key, ErrorCode.TIMEOUT, attached=0))
    follow(retries, world)
    [(_, code, message, klass)] = world.failures
    assert (code, klass) == (ErrorCode.TIMEOUT, 99) and message.startswith("attach failed after 4 attempt(s)")


def test_a_partial_attach_retries_only_what_is_missing():
    world = World()
    retries = world.retries()
    retries.start(RECORD.id)
    retries.expect(RECORD.id, f"{RECORD.id}#0", Attach("worker-1", "pool-a", "A30", 3, ("default/big",), "big"))
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0", ErrorCode.BACKEND, attached=2, requested=3))
    follow(retries, world)
    world.now += 2
    follow(retries, world)
    [(step, _)] = world.started
    assert (step.node, step.count, step.pods) == ("worker-1", 1, ("default/big",))


def test_a_retry_the_fabric_refuses_outright_is_judged_like_a_failed_attach():
    world = World()
    retries = started_instance(world)
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0", ErrorCode.BACKEND, attached=0))
    follow(retries, world)
    world.now += 2
    world.refuse = FabricError(ErrorCode.OUT_OF_RESOURCES, "pool-a has no free A30")
    follow(retries, world)  # the retry is refused: recorded as a failed attempt 2
    follow(retries, world)  # ... and judged on the next pass
    [(_, code, _, klass)] = world.failures
    assert (code, klass) == (ErrorCode.OUT_OF_RESOURCES, 1)


def test_an_instance_waiting_on_another_requests_attach_ends_with_it_even_when_it_fails():
    world = World()
    retries = world.retries()
    retries.start(RECORD.id)
    others = ended("fast-path/1", None)
    retries.wait_for(RECORD.id, Operation(key=others.key, kind=OperationKind.ATTACH, node="worker-1",
                                          state=OperationState.RUNNING, requested=1))
    assert follow(retries, world) == []
    world.reporters["fast-path/1"](ended("fast-path/1", ErrorCode.BACKEND, attached=0))
    assert follow(retries, world) == [RECORD.id], "another request's failure is not this instance's"
    assert world.started == [] and world.failures == []


def test_a_restarted_dds_follows_the_latest_round_it_finds_in_the_fabric():
    world = World(fabric_operations=[
        ended(f"{RECORD.id}#0", ErrorCode.BACKEND, attached=0),  # attempt 1, retried already
        ended(f"{RECORD.id}#0.r2", ErrorCode.BACKEND, attached=0),  # attempt 2: the one to judge
        ended("dds://gpu/gpu/other#0", ErrorCode.BACKEND, attached=0),  # another instance's
    ])
    retries = world.retries()  # a fresh process: it follows no instance yet
    follow(retries, world)
    assert retries.state_of(RECORD.id) == GpuInstanceState.WAITING_TO_RETRY
    assert "retry 2 of 3 in 4s" in world.told[0][1]
    world.now += 4
    follow(retries, world)
    # The plan step did not survive the restart: the retry is made from the operation (same node, pool, model).
    assert [(s.node, s.pool, s.model, s.count, k) for s, k in world.started] == [
        ("worker-1", "pool-a", "A30", 1, f"{RECORD.id}#0.r3")]


def test_a_restarted_dds_watches_the_attaches_still_running():
    running = Operation(key=f"{RECORD.id}#0", kind=OperationKind.ATTACH, node="worker-1",
                        state=OperationState.RUNNING, requested=1)
    world = World(fabric_operations=[running])
    retries = world.retries()
    assert follow(retries, world) == []
    assert world.watched == [running.key]
    world.reporters[running.key](ended(running.key))
    assert follow(retries, world) == [RECORD.id]


def test_a_move_the_table_does_not_have_raises():
    work = GpuInstanceWork()
    with pytest.raises(IllegalTransition, match=r"GPU instance: no move from 'attaching' on 'backoff-elapsed'"):
        work.move(GpuInstanceEvent.BACKOFF_ELAPSED)


def test_an_instance_whose_attach_the_fabric_refused_at_the_start_is_followed_no_more():
    world = World()
    retries = world.retries()
    retries.start(RECORD.id)
    retries.expect(RECORD.id, f"{RECORD.id}#0", STEP)
    retries.expect(RECORD.id, f"{RECORD.id}#1", STEP)
    retries.refused_at_start(RECORD.id)  # both of its attaches refused: the caller fails it (CA is told)
    retries.refused_at_start(RECORD.id)
    assert retries.followed() == frozenset()
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0"))  # a late report for it finds nobody to tell
    assert retries.followed() == frozenset() and retries.state_of(RECORD.id) is None


def test_an_instance_ca_dropped_is_forgotten_while_the_others_are_still_followed():
    world = World()
    retries = started_instance(world)  # waiting on its attach
    retries.start("dds://gpu/gpu/kept")
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0", ErrorCode.BACKEND, attached=0))
    follow(retries, world)
    assert retries.state_of(RECORD.id) == GpuInstanceState.WAITING_TO_RETRY
    # CA deleted the placeholder (DeleteNodes / DecreaseTargetSize): the tracker holds it no more.
    retries.forget_ended(lambda instance_id: instance_id != RECORD.id)
    assert retries.followed() == frozenset({"dds://gpu/gpu/kept"})
    retries.on_attach_done(RECORD.id, ended(f"{RECORD.id}#0"))  # a late report for it finds nobody to tell
    assert retries.followed() == frozenset({"dds://gpu/gpu/kept"})
