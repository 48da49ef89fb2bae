"""Node scoring policies: which of the nodes a pod fits on (now, or after k GPUs) to choose.

All policies score the state *after* placement, over arrays of candidates (one entry per candidate node), so the fast
planner and the reference planner call the very same function and cannot drift apart.

| policy       | primary score (higher wins)                                            | source                     |
|--------------|------------------------------------------------------------------------|----------------------------|
| best-fit     | mean utilization after placement of cpu, memory and attached GPUs      | KubeComp best-fit          |
| least-demand | fits now: requested GPUs / free GPUs; after attach: -(GPUs to attach)  | KubeComp Equation 1        |
| concentrated | GPUs on the node after placement / its GPU slots (pack on few nodes)   | KubeComp "concentrated"    |
| spread       | 1 - GPUs in use after placement / GPU slots; cpu-only pods: 1 - util   | KubeComp "even", LeastAlloc|

Ties break on best-fit (spread: the least allocated node), then fewer GPUs to attach, then fragmentation (KubeComp's
GPU choice): prefer a node whose free slots become 0, then a node that already holds the model (a GPU-less node stays
free to take any model), then the node name.
After attaching exactly the GPUs a pod lacks, every candidate uses all its attached GPUs, so best-fit then decides on
cpu and memory and the tie-breaks fill slots; spread and concentrated measure GPUs against slots (what the node could
hold), so they balance or pack the pool's devices across servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

POLICIES = ("best-fit", "least-demand", "concentrated", "spread")
SCORE_LEVELS = 3  # distinct top scores tried before a full selection of the best few


class UnknownPolicy(ValueError):
    pass


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise UnknownPolicy(f"PlannerConfig.policy {policy!r} is not one of {', '.join(POLICIES)}")
    return policy


@dataclass(frozen=True)
class Candidates:
    """One entry per candidate node (arrays of equal length), all measured after placing the pod there."""

    order: np.ndarray  # tie-break of last resort: the node's position in name order
    attach: np.ndarray  # GPUs attached for this pod (0 = fits now)
    cpu_used: np.ndarray  # requested after placement
    cpu_capacity: np.ndarray
    memory_used: np.ndarray
    memory_capacity: np.ndarray
    gpu_request: np.ndarray  # GPUs this pod requests on that node's GPU resource
    gpu_free_before: np.ndarray  # free GPUs before placement, after attaching
    gpu_used: np.ndarray  # GPUs in use after placement
    gpu_present: np.ndarray  # GPUs on the node after attaching
    gpu_slots: np.ndarray  # GPUs the node can hold at most (present + still attachable)
    has_model: np.ndarray  # bool: the node held a GPU model before this pod

    def __len__(self) -> int:
        return len(self.order)


def _ratio(used: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Utilization; a dimension without capacity counts as full (it offers nothing)."""
    safe = np.where(capacity > 0, capacity, 1)
    return np.where(capacity > 0, used / safe, 1.0)


def best_fit(c: Candidates) -> np.ndarray:
    cpu = _ratio(c.cpu_used, c.cpu_capacity)
    memory = _ratio(c.memory_used, c.memory_capacity)
    gpu = _ratio(c.gpu_used, c.gpu_present)  # KubeComp: the least yet sufficient free GPUs
    return np.where(c.gpu_request > 0, (cpu + memory + gpu) / 3.0, (cpu + memory) / 2.0)


def primary_score(policy: str, c: Candidates, fit: Optional[np.ndarray] = None) -> np.ndarray:
    """The policy's score per candidate; `fit`: best_fit(c) when the caller has it already."""
    fit = best_fit(c) if fit is None else fit
    gpu_pod = c.gpu_request > 0
    if policy == "best-fit":
        return fit
    if policy == "least-demand":
        demand = _ratio(c.gpu_request, c.gpu_free_before)
        return np.where(c.attach > 0, -c.attach.astype(float), np.where(gpu_pod, demand, fit))
    if policy == "concentrated":
        return np.where(gpu_pod, _ratio(c.gpu_present, c.gpu_slots), fit)
    if policy == "spread":
        return np.where(gpu_pod, 1.0 - _ratio(c.gpu_used, c.gpu_slots), 1.0 - fit)
    raise UnknownPolicy(f"PlannerConfig.policy {policy!r} is not one of {', '.join(POLICIES)}")


def rank(policy: str, c: Candidates, limit: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions of the candidates best first, primary scores of all of them). `limit`: only the best `limit`
    positions are wanted; fewer may then be returned than there are candidates, always exactly the first ones of the
    full order (only candidates that can be among those first are sorted: see _first_tied)."""
    fit = best_fit(c)
    score = primary_score(policy, c, fit)
    chosen = np.arange(len(c))
    if limit is not None and 0 < limit < len(c):
        # Alike nodes share a few distinct scores: the best few levels usually hold `limit` candidates, found in a
        # few vector passes (a selection over thousands of tied values costs many times more).
        threshold = score.max()
        chosen = np.flatnonzero(score >= threshold)
        for _ in range(SCORE_LEVELS):
            if len(chosen) >= limit:
                break
            threshold = score[score < threshold].max()
            chosen = np.flatnonzero(score >= threshold)
        if len(chosen) < limit:
            threshold = np.partition(score, len(c) - limit)[len(c) - limit]  # the limit-th highest score
            chosen = np.flatnonzero(score >= threshold)
    keys = order_keys(policy, c, fit, score, chosen)
    if limit is not None and len(chosen) > limit:
        keep = _first_tied(keys, limit)
        chosen, keys = chosen[keep], tuple(key[keep] for key in keys)
    order = np.lexsort(keys)
    return chosen[order][:limit], score


def order_keys(policy: str, c: Candidates, fit: np.ndarray, score: np.ndarray, at: np.ndarray
               ) -> tuple[np.ndarray, ...]:
    """`rank`'s order of the candidates at positions `at`, as np.lexsort keys (the last the most significant, each
    ascending): score, then best-fit (spread: the least allocated node), fewer GPUs to attach, filling the node's
    slots, holding a model, the node's position."""
    attach = c.attach[at]
    fills_node = (c.gpu_slots[at] - c.gpu_present[at] == 0) & (attach > 0)
    secondary = -fit[at] if policy == "spread" else fit[at]
    return c.order[at], ~c.has_model[at].astype(bool), ~fills_node, attach, -secondary, -score[at]


def _first_tied(keys: tuple[np.ndarray, ...], limit: int) -> np.ndarray:
    """Positions that hold the first `limit` of the lexicographic order of `keys` (last key most significant): key by
    key, the candidates sharing the best value, while they are at least `limit`. Thousands of alike nodes tie on every
    score, and this leaves the sort a handful of them instead of all."""
    keep = np.arange(len(keys[0]))
    for key in reversed(keys[1:]):
        column = key[keep]
        best = keep[column == column.min()]
        if len(best) < limit:
            return keep
        keep = best
    # Tied on everything but the node's position, which is unique: the `limit` first positions are the ones.
    return keep[np.argpartition(keys[0][keep], limit - 1)[:limit]] if len(keep) > limit else keep
