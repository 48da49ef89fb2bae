"""The CDI operator in DEVICE_PLUGIN mode detaches a GPU only from a node where no GPU is busy (it checks the whole
node's GPU load, not the GPU leaving): the planner plans what it will do (dds/planner/device_modes.py).

The builders' group "gpu" is an extended-resource group (`nvidia.com/gpu`): with `cdi_operator` on it is a
device-plugin group; without it (the simulated fabric, Redfish) nothing changes.
"""

from __future__ import annotations

import pytest

from dds.model.groups import GpuApi, NodeGroupSpec
from dds.model.plan import PlannerConfig, ScaleDownPlan
from dds.planner import plan_scale_down, plan_scale_up
from dds.planner.device_modes import IDLE_NODE_ONLY, detaches_only_from_idle_node
from dds.planner.moves import plan_moves
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

NOW = 1000.0
OPERATOR = PlannerConfig(cdi_operator=True)
OTHER_FABRIC = PlannerConfig()


def detached(plan: ScaleDownPlan) -> dict[str, tuple[str, ...]]:
    return {d.node: d.device_ids for d in plan.detaches}


def held(plan: ScaleDownPlan, node: str) -> list[str]:
    return [k.reason for k in plan.kept if k.node == node and IDLE_NODE_ONLY in k.reason]


def busy_node_snapshot(pods_gpus: int = 1, gpus: int = 3):
    """w1 holds `gpus` GPUs, idle past the cooldown beyond what its one pod (`pods_gpus` GPUs) uses."""
    node = make_node("w1", gpus=gpus, gpus_idle_since=0.0)
    pods = [make_pod("train", gpus=pods_gpus, node="w1")] if pods_gpus else []
    return make_snapshot([node], pods, now=NOW, groups=[make_group(gpu_cooldown=60, min_size=1)])


def test_idle_gpus_of_a_busy_device_plugin_node_stay_with_the_reason() -> None:
    plan = plan_scale_down(busy_node_snapshot(), OPERATOR)
    assert plan.detaches == ()
    [reason] = held(plan, "w1")
    assert "its 2 idle GPUs stay attached while 1 GPU is in use on the node" in reason
    assert plan.idle_past_cooldown == (), "GPUs DDS does not detach are not counted as idle past the cooldown"


def test_with_another_fabric_the_same_idle_gpus_go() -> None:
    plan = plan_scale_down(busy_node_snapshot(), OTHER_FABRIC)
    assert detached(plan) == {"w1": ("w1-gpu-2", "w1-gpu-1")}
    assert not held(plan, "w1")


def test_once_no_gpu_of_the_node_is_busy_its_idle_gpus_go() -> None:
    plan = plan_scale_down(busy_node_snapshot(pods_gpus=0), OPERATOR)
    assert detached(plan) == {"w1": ("w1-gpu-2", "w1-gpu-1", "w1-gpu-0")}
    assert not held(plan, "w1")


def test_a_pod_without_gpus_does_not_hold_the_idle_gpus() -> None:
    # The operator checks GPU load (nvidia-smi), not pods: a CPU-only pod leaves every GPU idle.
    node = make_node("w1", gpus=2, gpus_idle_since=0.0)
    snapshot = make_snapshot([node], [make_pod("web", node="w1")], now=NOW,
                             groups=[make_group(gpu_cooldown=60, min_size=1)])
    assert detached(plan_scale_down(snapshot, OPERATOR)) == {"w1": ("w1-gpu-1", "w1-gpu-0")}


def test_a_node_ca_asked_to_remove_that_stays_keeps_its_idle_gpus_while_busy() -> None:
    node = make_node("w1", gpus=2, gpus_idle_since=0.0)
    pinned = make_pod("train", gpus=1, node="w1", not_movable="local storage")
    snapshot = make_snapshot([node], [pinned], now=NOW, groups=[make_group(gpu_cooldown=60)])
    plan = plan_scale_down(snapshot, OPERATOR, candidates=["w1"])
    assert plan.removals == () and plan.detaches == ()
    [keep] = plan.kept  # one Keep per node: the Event CA's candidate gets
    assert "cannot move" in keep.reason and "only its idle GPUs are released" not in keep.reason
    assert IDLE_NODE_ONLY in keep.reason and "its 1 idle GPU stays attached while 1 GPU is in use" in keep.reason


def test_a_node_removed_with_busy_gpus_keeps_its_idle_ones_until_its_pods_moved() -> None:
    # CA's candidate: its pod fits on w2, so the node goes; its idle GPU is not detached ahead of the pod's move
    # (the operator would refuse while the pod's GPU is busy) but with the node once the pods are gone.
    nodes = [make_node("w1", gpus=2), make_node("w2", gpus=1)]
    snapshot = make_snapshot(nodes, [make_pod("train", gpus=1, node="w1")], now=NOW)
    plan = plan_scale_down(snapshot, OPERATOR, candidates=["w1"])
    assert [r.node for r in plan.removals] == ["w1"]
    assert "w1" not in detached(plan)
    assert ("its 1 GPU idle now stays until its pods have moved (device-plugin node: the operator detaches only "
            "from an idle node)") in plan.removals[0].reason
    assert not [k for k in plan.kept if k.node == "w1"], "a kept candidate is untainted: this one goes"

    other = plan_scale_down(snapshot, OTHER_FABRIC, candidates=["w1"])
    assert detached(other) == {"w1": ("w1-gpu-1",)}


def test_a_forced_removal_is_not_held_the_operator_skips_its_check_for_it() -> None:
    nodes = [make_node("w1", gpus=2), make_node("w2", gpus=1)]
    snapshot = make_snapshot(nodes, [make_pod("train", gpus=1, node="w1")], now=NOW,
                             groups=[make_group(force_detach=True)])
    plan = plan_scale_down(snapshot, OPERATOR, candidates=["w1"])
    [detach] = plan.detaches
    assert (detach.node, detach.force) == ("w1", True) and len(detach.device_ids) == 2
    assert not held(plan, "w1")


def test_no_idle_gpu_moves_off_a_busy_device_plugin_node() -> None:
    """w1's pod fills its cpu and uses one of its two GPUs; a 1-GPU pod waits that fits w2 only, the pool is empty.
    Elsewhere the idle GPU moves to w2 at once; with the operator in device-plugin mode it stays (the detach would
    be refused) and the pod waits for a GPU or a node."""
    nodes = [make_node("w1", gpus=2), make_node("w2")]
    pods = [make_pod("hog", gpus=1, cores=8, node="w1"), make_pod("train", gpus=1, cores=2)]
    snapshot = make_snapshot(nodes, pods, groups=[make_group(replicas=2, max_size=2)], pools=[make_pool(A30=0)])
    for config, moved in ((OTHER_FABRIC, ("w1-gpu-1",)), (OPERATOR, None)):
        config = PlannerConfig(batch_solver="greedy", allow_new_nodes=False, cdi_operator=config.cdi_operator)
        detaches = plan_moves(snapshot, config, plan_scale_up(snapshot, config), plan_scale_up)
        assert (detaches[0].device_ids if detaches else None) == moved, config


def dra_group() -> NodeGroupSpec:
    fields = make_group().model_dump(exclude={"gpu_resource", "gpu_api", "dra"})
    return NodeGroupSpec(**fields, gpu_api=GpuApi.DRA_NODE_LOCAL)


@pytest.mark.parametrize("config, group, expected", [
    pytest.param(OPERATOR, make_group(), True, id="operator-extended-resource-is-device-plugin"),
    pytest.param(OPERATOR, dra_group(), False, id="operator-dra-group-checks-the-leaving-gpu-only"),
    pytest.param(OTHER_FABRIC, make_group(), False, id="another-fabric-has-no-such-check"),
    pytest.param(OPERATOR, None, False, id="no-group"),
])
def test_the_device_mode_follows_the_groups_gpu_api(config, group, expected) -> None:
    assert detaches_only_from_idle_node(config, group) is expected


def test_a_node_kept_for_another_reason_says_both_in_one_keep() -> None:
    # No work (a DaemonSet pod only) and force-detach off: the node stays; its daemon's GPU is busy, so its two idle
    # GPUs stay too, and its one Keep says both.
    node = make_node("w1", gpus=3, empty_since=0.0, gpus_idle_since=0.0)
    daemon = make_pod("agent", gpus=1, node="w1", owner="DaemonSet")
    plan = plan_scale_down(make_snapshot([node], [daemon], now=NOW, groups=[make_group(gpu_cooldown=60)]), OPERATOR)
    assert plan.detaches == () and plan.removals == ()
    [keep] = plan.kept
    assert "force-detach is off" in keep.reason and "its 2 idle GPUs stay attached" in keep.reason


@pytest.mark.parametrize("work_ended, detaches", [
    pytest.param(NOW - 30, False, id="work-ended-within-the-cooldown"),
    pytest.param(NOW - 90, True, id="work-ended-past-the-cooldown"),
])
def test_the_gpus_freed_last_on_a_device_plugin_node_still_get_their_cooldown(work_ended, detaches) -> None:
    # The node's idle clock started long ago (an idle GPU held while another was busy); its last pod ended
    # `work_ended`: the cooldown (60 s) counts from then, not from the first idle GPU.
    node = make_node("w1", gpus=2, gpus_idle_since=0.0, empty_since=work_ended)
    snapshot = make_snapshot([node], [], now=NOW, groups=[make_group(gpu_cooldown=60, min_size=1)])
    assert bool(plan_scale_down(snapshot, OPERATOR).detaches) is detaches
    assert plan_scale_down(snapshot, OTHER_FABRIC).detaches, "another fabric keeps the node's own idle clock"
