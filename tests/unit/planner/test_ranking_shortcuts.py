"""The fast planner's shortcuts on large clusters (sorting only the best few candidates, looking up attach models for
those only, packing static-filter rows into one key) change no decision: with them off, the same plans."""

from __future__ import annotations

import numpy as np
import pytest

from dds.planner import existing, plan_scale_up
from dds.planner.plan import PlannerConfig
from dds.planner.scoring import Candidates, rank
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
