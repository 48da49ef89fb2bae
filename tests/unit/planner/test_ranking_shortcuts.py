"""The fast planner's shortcuts on large clusters (sorting only the best few candidates, looking up attach models for
those only, packing static-filter rows into one key) change no decision: with them off, the same plans."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dds.planner import existing, plan_scale_up
from dds.model.plan import PlannerConfig
from dds.planner.scoring import Candidates, rank
from dds.model.snapshot import Snapshot
from dds.planner.state import _unique_rows
from tests.bench.synthetic import Shape, random_snapshot


def random_candidates(rng: np.random.Generator, n: int) -> Candidates:
    """Candidates drawn from few values, so that scores and tie-breaks tie often."""
    def ints(low: int, high: int) -> np.ndarray:
        return rng.integers(low, high, n).astype(np.int64)

    present = ints(0, 4)
    slots = present + ints(0, 3)
    request = ints(0, 3)
    return Candidates(order=rng.permutation(n).astype(np.int64), attach=ints(0, 3), cpu_used=ints(0, 4) * 1000,
                      cpu_capacity=np.full(n, 4000, dtype=np.int64), memory_used=ints(0, 3),
                      memory_capacity=np.full(n, 4, dtype=np.int64), gpu_request=request,
                      gpu_free_before=ints(0, 4), gpu_used=np.minimum(present, request + ints(0, 2)),
                      gpu_present=present, gpu_slots=slots, has_model=rng.random(n) < 0.5)


@pytest.mark.parametrize("policy", ["best-fit", "least-demand", "concentrated", "spread"])
@pytest.mark.parametrize("limit", [1, 4, 16])
def test_ranking_the_best_few_gives_the_beginning_of_the_full_order(policy: str, limit: int) -> None:
    rng = np.random.default_rng(limit)
    for _ in range(50):
        candidates = random_candidates(rng, int(rng.integers(1, 60)))
        full, full_score = rank(policy, candidates)
        few, few_score = rank(policy, candidates, limit=limit)
        assert few.tolist() == full[:limit].tolist()
        assert np.array_equal(few_score, full_score)


@pytest.mark.parametrize("policy", ["best-fit", "least-demand", "concentrated", "spread"])
@pytest.mark.parametrize("alike", [1.0, 0.9, 0.5])
def test_ranking_the_best_few_of_many_alike_nodes_gives_the_beginning_of_the_full_order(policy: str,
                                                                                       alike: float) -> None:
    """Thousands of nodes that tie on every score but their position (a fraction `alike` of them copies of one)."""
    rng = np.random.default_rng(int(alike * 10))
    for n in (300, 2000):
        candidates = random_candidates(rng, n)
        copies = rng.random(n) < alike
        fields = {name: np.where(copies, getattr(candidates, name)[0], getattr(candidates, name))
                  for name in Candidates.__dataclass_fields__ if name != "order"}
        candidates = Candidates(order=candidates.order, **fields)
        full, _ = rank(policy, candidates)
        for limit in (1, 16):
            assert rank(policy, candidates, limit=limit)[0].tolist() == full[:limit].tolist()


@pytest.mark.parametrize("busy", [False, True], ids=["mixed", "attach"])
@pytest.mark.parametrize("policy", ["best-fit", "least-demand", "concentrated", "spread"])
def test_plans_are_the_same_with_the_shortcuts_off(policy: str, busy: bool, monkeypatch) -> None:
    config = PlannerConfig(policy=policy, batch_solver="greedy")
    snapshots = [random_snapshot(seed, Shape(nodes=120, pending=40, slots=8, pools=3, busy=busy))
                 for seed in (1, 2, 3)]
    monkeypatch.setattr(existing, "SHORTCUT_ABOVE", 0)  # on, even for clusters this small
    fast = [plan_scale_up(s, config) for s in snapshots]
    monkeypatch.setattr(existing, "SHORTCUT_ABOVE", 10**9)  # off: every candidate ranked and given a model
    assert [plan_scale_up(s, config) for s in snapshots] == fast


def with_copies(snapshot: Snapshot, copies: int) -> Snapshot:
    """The snapshot with each pending pod repeated: bursts of alike pods, as a Deployment or Job makes them."""
    extra = [dataclasses.replace(pod, name=f"{pod.name}-copy{k}", uid=f"{pod.uid}-copy{k}")
             for pod in snapshot.pending_pods() for k in range(copies)]
    return dataclasses.replace(snapshot, pods=snapshot.pods + tuple(extra))


@pytest.mark.parametrize("busy", [False, True], ids=["mixed", "attach"])
@pytest.mark.parametrize("policy", ["best-fit", "spread"])
def test_plans_are_the_same_without_the_screens_kept_per_pod_shape(policy: str, busy: bool, monkeypatch) -> None:
    """Alike pods' pre-screens are judged again only on the nodes changed since (FastExisting._screened); judging
    every node for every pod gives the same plans, rules-bearing pods and reverted what-ifs included."""
    config = PlannerConfig(policy=policy, batch_solver="greedy")
    snapshots = [with_copies(random_snapshot(seed, Shape(nodes=60, pending=12, slots=8, pools=2, busy=busy)), 4)
                 for seed in (4, 5, 6)]
    kept = [plan_scale_up(s, config) for s in snapshots]
    monkeypatch.setattr(existing.FastExisting, "_screened", lambda self, kind, req, screen, sort_keys=None:
                        existing._Screen(screen(np.arange(len(self.state.nodes))), 0, 0))
    assert [plan_scale_up(s, config) for s in snapshots] == kept


def test_packed_static_rows_number_nodes_as_sorting_the_rows_does() -> None:
    rng = np.random.default_rng(7)
    for spans in ([3, 5], [1, 200, 4], [5000, 5000, 5000]):
        columns = [rng.integers(-1, span - 1, 300).astype(np.int64) for span in spans]
        _, first, row_of = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
        packed_first, packed_row_of = _unique_rows(columns)
        assert packed_first.tolist() == first.tolist() and packed_row_of.tolist() == row_of.reshape(-1).tolist()


def test_rows_too_wide_to_pack_are_still_numbered() -> None:
    huge = [np.array([2**40, 0, 2**40], dtype=np.int64)] * 2  # 2^80 combinations: no single 64-bit key
    first, row_of = _unique_rows(huge)
    assert first.tolist() == [1, 0] and row_of.tolist() == [1, 0, 1]
