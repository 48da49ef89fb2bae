"""Case 4: a node that stays (its group at min size, its node cooldown not reached) still gives back the GPUs it does
not use once they have been idle for the GPU cooldown (a bug the trace simulator found: they were kept for good)."""

from __future__ import annotations

import pytest

from dds.planner import plan_scale_down
from dds.model.plan import PlannerConfig
from tests.unit.planner.builders import make_group, make_node, make_pod, make_snapshot

NOW = 1000.0


def detached(plan) -> dict[str, tuple[str, ...]]:
    return {d.node: d.device_ids for d in plan.detaches}


@pytest.mark.parametrize("empty_since, min_size, kept_because", [
    pytest.param(0.0, 1, "at its min size 1", id="group-at-min-size"),
    pytest.param(NOW - 120, 0, "removed after 10m", id="node-cooldown-not-reached"),
])
def test_an_empty_node_that_stays_releases_its_idle_gpus_after_the_gpu_cooldown(empty_since, min_size,
                                                                                kept_because) -> None:
    node = make_node("w1", gpus=2, empty_since=empty_since, gpus_idle_since=NOW - 120)
    snapshot = make_snapshot([node], [], now=NOW, groups=[make_group(min_size=min_size, gpu_cooldown=60)])
    plan = plan_scale_down(snapshot, PlannerConfig())
    assert plan.removals == ()
    assert [k.node for k in plan.kept] == ["w1"] and kept_because in plan.kept[0].reason
    assert detached(plan) == {"w1": ("w1-gpu-1", "w1-gpu-0")}
    assert "idle on w1 for 2m (cooldown 1m" in plan.detaches[0].reason


def test_an_empty_node_that_stays_keeps_its_gpus_until_the_gpu_cooldown() -> None:
    node = make_node("w1", gpus=2, empty_since=0.0, gpus_idle_since=NOW - 30)
    snapshot = make_snapshot([node], [], now=NOW, groups=[make_group(min_size=1, gpu_cooldown=60)])
    plan = plan_scale_down(snapshot, PlannerConfig())
    assert plan.detaches == () and [k.node for k in plan.kept] == ["w1"]


def test_a_node_without_work_whose_daemon_uses_a_gpu_gives_back_only_the_idle_ones() -> None:
    # No work (a DaemonSet pod only), so it is "empty"; the node stays (its daemon holds a GPU, force-detach off), and
    # its two other GPUs, idle past the cooldown, go back to the pool.
    node = make_node("w1", gpus=3, empty_since=0.0, gpus_idle_since=0.0)
    daemon = make_pod("agent", gpus=1, node="w1", owner="DaemonSet")
    plan = plan_scale_down(make_snapshot([node], [daemon], now=NOW, groups=[make_group(gpu_cooldown=60)]),
                           PlannerConfig())
    assert plan.removals == ()
    assert "force-detach is off" in plan.kept[0].reason
    assert detached(plan) == {"w1": ("w1-gpu-2", "w1-gpu-1")}
