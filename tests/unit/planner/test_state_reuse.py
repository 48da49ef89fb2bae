"""The planner's state reuses what the last state derived from the nodes and pods that did not change (GPU facts,
allocatable columns, bound-pod sums, by object identity): a state built that way equals one built from nothing, and so
do the plans made on it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dds.planner import plan_scale_down, plan_scale_up, state
from dds.model.plan import PlannerConfig
from dds.planner.memos import PlannerMemos
from dds.planner.requests import RequestCache
from dds.model.snapshot import Snapshot
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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_state_built_on_the_last_ones_equals_one_built_from_nothing(seed: int) -> None:
    first = random_snapshot(seed, Shape(nodes=40, pending=8, slots=8, pools=2))
    by_node = {n.name: first.pods_on(n.name) for n in first.nodes}
    first = indexed(dataclasses.replace(first), by_node)
    second, _ = next_snapshot(first, by_node, seed)
    memos = PlannerMemos()  # kept from the first state to the second, as the Controller keeps its own
    state.ClusterState(first, RequestCache(memos.requests), None, memos=memos)
    reused = state.ClusterState(second, RequestCache(memos.requests), None, memos=memos)
    config = PlannerConfig(batch_solver="greedy")
    plans = plan_scale_up(second, config, memos=memos), plan_scale_down(second, config, memos=memos)
    fresh = state.ClusterState(second, RequestCache(), None)  # no memos: derived from nothing
    for name in ARRAYS:
        assert np.array_equal(getattr(reused, name), getattr(fresh, name)), name
    assert reused.facts == fresh.facts
    assert (plan_scale_up(second, config), plan_scale_down(second, config)) == plans


def test_memos_are_reused_only_by_the_objects_they_were_derived_from() -> None:
    """A memo is the caller's: a state built with it reuses the columns of the nodes that did not change, and one built
    without it (or with another) reuses nothing."""
    first = random_snapshot(4, Shape(nodes=40, pending=8, slots=8, pools=2))
    by_node = {n.name: first.pods_on(n.name) for n in first.nodes}
    first = indexed(dataclasses.replace(first), by_node)
    second, _ = next_snapshot(first, by_node, 4)
    memos = PlannerMemos()
    built = state.ClusterState(first, RequestCache(memos.requests), None, memos=memos)
    again = state.ClusterState(second, RequestCache(memos.requests), None, memos=memos)
    unshared = state.ClusterState(second, RequestCache(), None)
    unchanged = [node.name for node, before in zip(second.nodes, first.nodes) if node is before]
    assert unchanged
    assert all(again.facts[again.index[name]] is built.facts[built.index[name]] for name in unchanged)
    assert not any(unshared.facts[unshared.index[name]] is built.facts[built.index[name]] for name in unchanged)
