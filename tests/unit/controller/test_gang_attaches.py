"""No GPU stays attached for a gang that cannot start: when one of its attaches fails, or when it has not reached its
minimum of running pods within the bound, the GPUs attached for it that no pod uses are detached, and every member
waiting is told why."""

from __future__ import annotations

from dataclasses import replace

from dds.controller.gang_attaches import GangAttaches
from dds.fabric.base import FabricError, ErrorCode, Operation, OperationKind, OperationState
from dds.model.snapshot import POD_GROUP_LABEL
from dds.model.plan import Attach, Case, PlannerConfig
from tests.unit.planner.builders import make_group, make_node, make_pod, make_snapshot

TIMEOUT = 300.0


class Fabric:
    def __init__(self) -> None:
        self.ops: dict[str, Operation] = {}

    def operation(self, key: str):
        return self.ops.get(key)

    def finish(self, key: str, node: str, devices: tuple[str, ...], state=OperationState.SUCCEEDED, error=None):
        self.ops[key] = Operation(key=key, kind=OperationKind.ATTACH, node=node, state=state, requested=len(devices),
                                  model="A30", pool="pool-a", devices=devices, error=error)


class Actions:
    def __init__(self) -> None:
        self.detached: list[tuple[str, tuple[str, ...], Case]] = []

    def detach(self, step, key, case, on_done=None):
        self.detached.append((step.node, step.device_ids, case))
        return object()


class Events:
    def __init__(self) -> None:
        self.told: list[tuple[str, str, str]] = []

    def emit(self, ref, kind, reason, message):
        self.told.append((ref.name, reason, message))


def gang_pod(name: str, node=None):
    return make_pod(name, gpus=1, node=node, labels={POD_GROUP_LABEL: "ddp"})


def setup():
    clock = [1000.0]
    fabric, actions, events = Fabric(), Actions(), Events()
    gangs = GangAttaches(actions, fabric, events, TIMEOUT, lambda: clock[0])
    pods = [gang_pod("w-0"), gang_pod("w-1")]
    # Each worker node got one GPU for the gang (devices <node>-gpu-0); the pods are still pending.
    snapshot = make_snapshot([make_node("n1", gpus=1), make_node("n2", gpus=1)], pods)
    steps = [Attach("n1", "pool-a", "A30", 1, ("default/w-0",), "gang"),
             Attach("n2", "pool-a", "A30", 1, ("default/w-1",), "gang")]
    gangs.started(snapshot, steps, ["k1", "k2"])
    return clock, fabric, actions, events, gangs, snapshot


def test_a_failed_member_attach_releases_what_was_attached_for_the_others():
    clock, fabric, actions, events, gangs, snapshot = setup()
    fabric.finish("k1", "n1", ("n1-gpu-0",))
    fabric.finish("k2", "n2", (), OperationState.FAILED, FabricError(ErrorCode.OUT_OF_RESOURCES, "pool empty"))
    gangs.reconcile(snapshot)
    assert actions.detached == [("n1", ("n1-gpu-0",), Case.GANG_ROLLBACK)]
    assert {(name, reason) for name, reason, _ in events.told} == {("w-0", "GangRolledBack"), ("w-1", "GangRolledBack")}
    assert "the attach of 1 of its GPU set(s) failed (pool empty)" in events.told[0][2]
    gangs.reconcile(snapshot)
    assert len(actions.detached) == 1, "rolled back once"


def test_a_gang_that_does_not_start_in_time_gives_its_gpus_back():
    clock, fabric, actions, events, gangs, snapshot = setup()
    fabric.finish("k1", "n1", ("n1-gpu-0",))
    fabric.finish("k2", "n2", ("n2-gpu-0",))
    clock[0] += TIMEOUT - 1
    gangs.reconcile(snapshot)
    assert actions.detached == []
    clock[0] += 2
    gangs.reconcile(snapshot)
    assert sorted(actions.detached) == [("n1", ("n1-gpu-0",), Case.GANG_ROLLBACK),
                                        ("n2", ("n2-gpu-0",), Case.GANG_ROLLBACK)]
    assert "did not reach its 2 running pod(s) within 300s" in events.told[0][2]


def test_a_gang_that_started_is_forgotten_and_a_member_running_keeps_its_gpu():
    clock, fabric, actions, events, gangs, snapshot = setup()
    fabric.finish("k1", "n1", ("n1-gpu-0",))
    fabric.finish("k2", "n2", ("n2-gpu-0",))
    running = replace(snapshot, pods=(gang_pod("w-0", node="n1"), gang_pod("w-1", node="n2")))
    gangs.reconcile(running)
    clock[0] += 2 * TIMEOUT
    gangs.reconcile(running)
    assert actions.detached == [] and events.told == []

    clock, fabric, actions, events, gangs, snapshot = setup()
    fabric.finish("k1", "n1", ("n1-gpu-0",))
    fabric.finish("k2", "n2", ("n2-gpu-0",))
    half = replace(snapshot, pods=(gang_pod("w-0", node="n1"), gang_pod("w-1")))
    clock[0] += TIMEOUT + 1
    gangs.reconcile(half)
    assert actions.detached == [("n2", ("n2-gpu-0",), Case.GANG_ROLLBACK)]  # w-0 runs on n1's GPU: it stays
    assert [name for name, _, _ in events.told] == ["w-1"]


def test_attaches_still_running_are_waited_for_before_the_timeout_rolls_back():
    clock, fabric, actions, events, gangs, snapshot = setup()
    fabric.finish("k1", "n1", ("n1-gpu-0",))
    fabric.finish("k2", "n2", (), OperationState.RUNNING)
    clock[0] += TIMEOUT + 1
    gangs.reconcile(snapshot)
    assert actions.detached == []


def test_a_failure_waits_for_the_gangs_other_attaches_and_holds_the_gang_back_meanwhile():
    clock, fabric, actions, events, gangs, snapshot = setup()
    fabric.finish("k1", "n1", (), OperationState.RUNNING)
    fabric.finish("k2", "n2", (), OperationState.FAILED, FabricError(ErrorCode.BACKEND, "switch port down"))
    gangs.reconcile(snapshot)
    assert actions.detached == []
    assert gangs.not_held(snapshot.pending_pods()) == [], "not planned again while its set is voided"
    fabric.finish("k1", "n1", ("n1-gpu-0",))
    gangs.reconcile(snapshot)
    assert actions.detached == [("n1", ("n1-gpu-0",), Case.GANG_ROLLBACK)]
    assert gangs.not_held(snapshot.pending_pods()) == [], "the pass that rolls back sees the GPUs as still there"
    gangs.reconcile(snapshot)
    assert len(gangs.not_held(snapshot.pending_pods())) == 2, "planned whole again on the next pass"


def test_a_plan_made_before_the_gang_was_held_is_not_acted_on():
    """The loop plans before it reconciles: a plan for the members of a gang the reconcile then holds (its set
    failed) must be made again, or more GPUs would complete the gang just before its rollback detaches them."""
    clock, fabric, actions, events, gangs, snapshot = setup()
    planned_for = gangs.not_held(snapshot.pending_pods())
    assert not gangs.holds_any(planned_for)
    fabric.finish("k1", "n1", (), OperationState.RUNNING)
    fabric.finish("k2", "n2", (), OperationState.FAILED, FabricError(ErrorCode.BACKEND, "switch port down"))
    gangs.reconcile(snapshot)
    assert gangs.holds_any(planned_for), "the plan serves a gang now held: plan again"
    assert not gangs.holds_any([make_pod("solo", gpus=1)])


def test_on_a_busy_device_plugin_node_the_gangs_idle_gpu_stays_and_the_event_says_why():
    """The CDI operator in DEVICE_PLUGIN mode detaches from a node only once no GPU of it is busy: a rollback detach
    there would only sit in its retries. The GPU stays (scale-down releases it once the node is idle); the others go."""
    clock, fabric, actions, events = [1000.0], Fabric(), Actions(), Events()
    gangs = GangAttaches(actions, fabric, events, TIMEOUT, lambda: clock[0], planner=PlannerConfig(cdi_operator=True))
    pods = [gang_pod("w-0"), gang_pod("w-1"), make_pod("train", gpus=1, node="n1")]
    # n1 held one GPU for "train" and got a second for the gang; n2 got one.
    snapshot = make_snapshot([make_node("n1", gpus=2), make_node("n2", gpus=1)], pods, groups=[make_group()])
    gangs.started(snapshot, [Attach("n1", "pool-a", "A30", 1, ("default/w-0",), "gang"),
                             Attach("n2", "pool-a", "A30", 1, ("default/w-1",), "gang")], ["k1", "k2"])
    fabric.finish("k1", "n1", ("n1-gpu-1",))
    fabric.finish("k2", "n2", ("n2-gpu-0",))
    clock[0] += TIMEOUT + 1
    gangs.reconcile(snapshot)
    assert actions.detached == [("n2", ("n2-gpu-0",), Case.GANG_ROLLBACK)]
    message = events.told[0][2]
    assert "1 GPU(s) attached for it released" in message
    assert "kept for now: n1: device-plugin node: the operator detaches only from an idle node" in message


def test_with_another_fabric_the_same_rollback_detaches_from_the_busy_node_too():
    clock, fabric, actions, events = [1000.0], Fabric(), Actions(), Events()
    gangs = GangAttaches(actions, fabric, events, TIMEOUT, lambda: clock[0])
    pods = [gang_pod("w-0"), make_pod("train", gpus=1, node="n1")]
    snapshot = make_snapshot([make_node("n1", gpus=2)], pods, groups=[make_group()])
    gangs.started(snapshot, [Attach("n1", "pool-a", "A30", 1, ("default/w-0",), "gang")], ["k1"])
    fabric.finish("k1", "n1", ("n1-gpu-1",))
    clock[0] += TIMEOUT + 1
    gangs.reconcile(snapshot)
    assert actions.detached == [("n1", ("n1-gpu-1",), Case.GANG_ROLLBACK)]
