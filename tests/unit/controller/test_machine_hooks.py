"""The pre-terminate hook's decisions: held on Machines whose node holds fabric devices, the devices detached once
Cluster API waits for the hook, released when they are back, and released anyway (Event, stranded) after the bound."""

from __future__ import annotations

from dds.controller.machine_hooks import HookStep, Verb, hook_steps
from dds.controller.observe import MachineRef

BOUND = 300.0
GROUP = "MachineSet/default/gpu-workers"


def state(name: str, node: str | None = "node-a", *, hooked: bool = False, deleting: bool = False,
          waiting: bool = False) -> MachineRef:
    return MachineRef(namespace="default", name=name, group_id=GROUP, provider_id=f"kwok://{name}", node_name=node,
                      deleting=deleting, terminating=deleting, hooked=hooked, awaiting_pre_terminate=waiting)


def steps(*machines: MachineRef, held: dict | None = None, detaching: set | None = None,
          since: dict | None = None, now: float = 1000.0) -> list[HookStep]:
    return hook_steps(machines, held or {}, detaching or set(), since or {}, now, BOUND)


def test_a_live_machine_whose_node_holds_devices_gets_the_hook_once() -> None:
    assert steps(state("m-a"), held={"node-a": ["gpu-1"]}) == [HookStep(Verb.HOLD, "m-a", GROUP, "node-a")]
    assert steps(state("m-a", hooked=True), held={"node-a": ["gpu-1"]}) == []
    assert steps(state("m-a"), held={}) == []  # nothing to give back: no hook


def test_a_hooked_live_machine_keeps_its_hook_when_its_gpus_are_gone() -> None:
    assert steps(state("m-a", hooked=True), held={}) == []


def test_nothing_happens_while_cluster_api_drains() -> None:
    assert steps(state("m-a", hooked=True, deleting=True), held={"node-a": ["gpu-1"]}) == []


def test_once_cluster_api_waits_the_devices_are_detached_then_the_hook_released() -> None:
    waiting = state("m-a", hooked=True, deleting=True, waiting=True)
    assert steps(waiting, held={"node-a": ["gpu-1", "gpu-2"]}, since={"m-a": 990.0}) == [
        HookStep(Verb.DETACH, "m-a", GROUP, "node-a", ("gpu-1", "gpu-2"))]
    assert steps(waiting, held={"node-a": ["gpu-1"]}, detaching={"node-a"}, since={"m-a": 990.0}) == []
    assert steps(waiting, held={}, since={"m-a": 990.0}) == [HookStep(Verb.RELEASE, "m-a", GROUP, "node-a")]


def test_after_the_bound_the_hook_is_released_with_the_devices_still_there() -> None:
    waiting = state("m-a", hooked=True, deleting=True, waiting=True)
    assert steps(waiting, held={"node-a": ["gpu-1"]}, detaching={"node-a"}, since={"m-a": 1000.0 - BOUND}) == [
        HookStep(Verb.GIVE_UP, "m-a", GROUP, "node-a", ("gpu-1",))]


def test_a_deleting_machine_without_a_node_has_nothing_to_wait_for() -> None:
    assert steps(state("m-a", node=None, hooked=True, deleting=True)) == [HookStep(Verb.RELEASE, "m-a", GROUP, "")]


def test_a_machine_without_the_hook_is_not_dds_to_hold() -> None:
    assert steps(state("m-a", deleting=True, waiting=True), held={"node-a": ["gpu-1"]}) == []
