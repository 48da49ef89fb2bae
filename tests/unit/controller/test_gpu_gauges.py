"""The gauges a control loop pass sets from its snapshot and scale-down plan: GPUs per node (`dds_node_gpus`) and idle
GPUs past the cooldown that are not warm headroom (`dds_gpus_idle_past_cooldown`), as /metrics serves them."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from prometheus_client import REGISTRY

from dds.controller.gpu_gauges import GpuGauges
from dds.planner import plan_scale_down
from dds.model.plan import PlannerConfig
from dds.planner.reservations import keep_reserved
from dds.model.snapshot import Device, Snapshot
from tests.unit.planner.builders import make_group, make_node, make_pod, make_snapshot

NOW = 10_000.0
COOLDOWN = 600.0


def node_gpus(node: str) -> dict[tuple[str, str], float]:
    """The node's dds_node_gpus series as served: (group, model) -> value."""
    return {(s.labels["group"], s.labels["model"]): s.value for family in REGISTRY.collect()
            if family.name == "dds_node_gpus" for s in family.samples if s.labels["node"] == node}


def idle_past_cooldown(group: str) -> Optional[float]:
    return REGISTRY.get_sample_value("dds_gpus_idle_past_cooldown", {"group": group})


def a_pass(gauges: GpuGauges, snapshot: Snapshot, config: PlannerConfig = PlannerConfig(),
           reserved: tuple[str, ...] = ()) -> None:
    """What the loop does: plan the scale-down on the pass's snapshot, then record from it."""
    gauges.record(snapshot, keep_reserved(plan_scale_down(snapshot, config), reserved))


def test_each_node_has_its_attached_gpus_by_model_and_nodes_without_gpus_show_zero() -> None:
    mixed = make_node("gg-mixed", gpus=2)
    mixed = replace(mixed, devices=mixed.devices + (Device("gg-mixed-t4", "T4", "pool-a"),))
    snapshot = make_snapshot([mixed, make_node("gg-empty"), make_node("gg-plain", group=None),
                              make_node("gg-foreign", gpus=1, group=None)],
                             groups=[make_group(models=("A30", "T4"))], now=NOW)
    a_pass(GpuGauges(), snapshot)
    assert node_gpus("gg-mixed") == {("gpu", "A30"): 2, ("gpu", "T4"): 1}
    assert node_gpus("gg-empty") == {("gpu", "A30"): 0}  # the group's default model before its first GPU
    assert node_gpus("gg-plain") == {}  # not a DDS node and no fabric GPU: no series
    assert node_gpus("gg-foreign") == {("", "A30"): 1}  # fabric GPUs on a node of no group still count


def test_a_gpu_detached_goes_to_zero_and_a_gone_node_loses_its_series() -> None:
    gauges = GpuGauges()
    a_pass(gauges, make_snapshot([make_node("gg-a", gpus=3), make_node("gg-b", gpus=1)], now=NOW))
    assert node_gpus("gg-a") == {("gpu", "A30"): 3} and node_gpus("gg-b") == {("gpu", "A30"): 1}

    a_pass(gauges, make_snapshot([make_node("gg-a", gpus=1), make_node("gg-b")], now=NOW + 5))
    assert node_gpus("gg-a") == {("gpu", "A30"): 1}
    assert node_gpus("gg-b") == {("gpu", "A30"): 0}  # its line drops to 0 rather than ending

    a_pass(gauges, make_snapshot([make_node("gg-a", gpus=1)], now=NOW + 10))
    assert node_gpus("gg-a") == {("gpu", "A30"): 1}
    assert node_gpus("gg-b") == {}  # the node is gone: so are its series


def test_a_node_moved_to_another_group_keeps_only_its_new_groups_series() -> None:
    gauges = GpuGauges()
    groups = [make_group("gpu"), make_group("big")]
    a_pass(gauges, make_snapshot([make_node("gg-moved", gpus=1)], groups=groups, now=NOW))
    a_pass(gauges, make_snapshot([make_node("gg-moved", gpus=1, group="big")], groups=groups, now=NOW + 5))
    assert node_gpus("gg-moved") == {("big", "A30"): 1}


def test_idle_gpus_past_the_cooldown_are_counted_per_group() -> None:
    groups = [make_group("gg-train", gpu_cooldown=COOLDOWN), make_group("gg-serve", gpu_cooldown=COOLDOWN)]
    nodes = [make_node("gg-t1", group="gg-train", gpus=3, gpus_idle_since=NOW - COOLDOWN - 1),  # 1 in use, 2 idle
             make_node("gg-t2", group="gg-train", gpus=1, gpus_idle_since=NOW - 60),  # idle, cooldown not reached
             make_node("gg-s1", group="gg-serve", gpus=2)]  # busy
    pods = [make_pod("job", gpus=1, node="gg-t1"), make_pod("web", gpus=2, node="gg-s1")]
    a_pass(GpuGauges(), make_snapshot(nodes, pods, groups=groups, now=NOW))
    assert idle_past_cooldown("gg-train") == 2
    assert idle_past_cooldown("gg-serve") == 0  # every group served has its series


def test_warm_headroom_and_reserved_nodes_are_not_counted() -> None:
    groups = [make_group("gg-warm", pool="pool-w", gpu_cooldown=COOLDOWN), make_group("gg-held", gpu_cooldown=COOLDOWN)]
    idle = NOW - 2 * COOLDOWN
    nodes = [make_node("gg-w1", group="gg-warm", pool="pool-w", gpus=3, gpus_idle_since=idle),
             make_node("gg-h1", group="gg-held", gpus=2, gpus_idle_since=idle),
             make_node("gg-h2", group="gg-held", gpus=1, gpus_idle_since=idle)]
    config = PlannerConfig(warm_gpus_by_pool={"pool-w": 2})  # gg-warm keeps 2 idle GPUs warm
    a_pass(GpuGauges(), make_snapshot(nodes, groups=groups, now=NOW), config, reserved=("gg-h1",))
    assert idle_past_cooldown("gg-warm") == 1  # 3 idle, 2 kept warm: 1 DDS should release
    # gg-h1 is reserved for a large pod (its idle GPUs are being gathered for it): only gg-h2's idle GPU counts.
    assert idle_past_cooldown("gg-held") == 1


def test_idle_gpus_of_a_node_being_removed_are_not_past_a_cooldown() -> None:
    # An empty node past its node cooldown is removed, its GPUs released with it: not GPUs left idle.
    node = make_node("gg-empty-node", group="gg-rm", gpus=2, gpus_idle_since=0.0, empty_since=0.0)
    snapshot = make_snapshot([node], groups=[make_group("gg-rm", gpu_cooldown=COOLDOWN)], now=NOW)
    plan = plan_scale_down(snapshot, PlannerConfig(node_removal_enabled=True))
    assert [r.node for r in plan.removals] == ["gg-empty-node"]
    GpuGauges().record(snapshot, plan)
    assert idle_past_cooldown("gg-rm") == 0


def test_a_group_no_longer_served_loses_its_series() -> None:
    gauges = GpuGauges()
    node = make_node("gg-old-1", group="gg-old", gpus=1, gpus_idle_since=0.0)
    a_pass(gauges, make_snapshot([node], groups=[make_group("gg-old", gpu_cooldown=COOLDOWN)], now=NOW))
    assert idle_past_cooldown("gg-old") == 1
    a_pass(gauges, make_snapshot([], groups=[make_group("gg-new")], now=NOW + 5))
    assert idle_past_cooldown("gg-old") is None
    assert idle_past_cooldown("gg-new") == 0
