"""The planner's state reuses what the last state derived from the nodes and pods that did not change (GPU facts,
allocatable columns, bound-pod sums, by object identity): a state built that way equals one built from nothing, and so
do the plans made on it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dds.planner import plan_scale_down, plan_scale_up, state
from dds.planner.plan import PlannerConfig
from dds.planner.requests import RequestCache
from dds.planner.snapshot import Snapshot
from tests.bench.synthetic import Shape, random_snapshot

ARRAYS = ("capacity", "free", "gpu_capacity", "gpu_free", "free_slots", "attachable", "target", "model", "pool",
          "allowed", "preferred", "gpu_coming", "pool_free")


def indexed(snapshot: Snapshot, by_node: dict) -> Snapshot:
    """The snapshot with its pods-by-node index given, as the observer gives it (the same tuple for a node whose pods
    did not change)."""
    snapshot.index_pods(by_node)
    return snapshot


def next_snapshot(first: Snapshot, by_node: dict, seed: int) -> tuple[Snapshot, dict]:
    """A later snapshot: a few nodes changed (allocatable, GPUs on their way), a few nodes' pods changed (one gone),
    everything else the very same objects."""
    rng = np.random.default_rng(seed)
    nodes = list(first.nodes)
    for i in rng.choice(len(nodes), 3, replace=False):
        node = nodes[i]
        allocatable = dataclasses.replace(node.allocatable, milli_cpu=node.allocatable.milli_cpu + 1000)
        nodes[i] = dataclasses.replace(node, allocatable=allocatable, attaching=node.attaching + 1)
    by_node = dict(by_node)
    gone = set()
    for name in rng.choice(sorted(n for n, pods in by_node.items() if pods), 3, replace=False):
        gone.add(id(by_node[name][0]))
        by_node[name] = by_node[name][1:]
    pods = tuple(p for p in first.pods if id(p) not in gone)
    return indexed(dataclasses.replace(first, nodes=tuple(nodes), pods=pods), by_node), by_node


def forget_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "_NODE_FACTS", state._NodeFacts())
    monkeypatch.setattr(state, "_NODE_LOADS", state._NodeLoads())
    monkeypatch.setattr(state, "_LAST_CAPACITY", state._LastColumns())
    monkeypatch.setattr(state, "_LAST_SUMS", state._LastColumns())
    monkeypatch.setattr(state, "_BOUND_PODS", state._BoundPodsMemo())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_state_built_on_the_last_ones_equals_one_built_from_nothing(seed: int, monkeypatch) -> None:
    first = random_snapshot(seed, Shape(nodes=40, pending=8, slots=8, pools=2))
    by_node = {n.name: first.pods_on(n.name) for n in first.nodes}
    first = indexed(dataclasses.replace(first), by_node)
    second, _ = next_snapshot(first, by_node, seed)
    state.ClusterState(first, RequestCache(), None)
    reused = state.ClusterState(second, RequestCache(), None)
    config = PlannerConfig(batch_solver="greedy")
    plans = plan_scale_up(second, config), plan_scale_down(second, config)
    forget_everything(monkeypatch)
    fresh = state.ClusterState(second, RequestCache(), None)
    for name in ARRAYS:
        assert np.array_equal(getattr(reused, name), getattr(fresh, name)), name
    assert reused.facts == fresh.facts
    forget_everything(monkeypatch)
    assert (plan_scale_up(second, config), plan_scale_down(second, config)) == plans
