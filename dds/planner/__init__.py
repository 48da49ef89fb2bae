"""The decision engine: a pure function from a Snapshot to a plan. No I/O, no clock (Snapshot.now), deterministic.

Public API (the controller, `dds plan` and the simulator call exactly these):

    plan_scale_up(snapshot, config, pods=None) -> ScaleUpPlan     cases 1 and 2: GPUs (and CXL memory) first, nodes
                                                                  when needed
    plan_scale_down(snapshot, config, candidates=None) -> ScaleDownPlan   cases 3 and 4
    (both take `memos=`: a PlannerMemos kept by a caller that decides repeatedly, dds/planner/memos.py)
    render_scale_up(plan) / render_scale_down(plan) -> str         what and why, for people
    effective_requests(pod) -> Resources                           kube-scheduler's request rule
"""

from __future__ import annotations

from typing import Optional, Sequence

from dds.planner.batch import improve_with_batch
from dds.planner.cxl_memory import plan_with_cxl_memory, takes_cxl_memory
from dds.planner.dra import leave_pool_slots_to_the_scheduler
from dds.planner.existing import FastExisting
from dds.planner.gangs import plan_all_or_nothing
from dds.model.plan import PlannerConfig, ScaleUpPlan
from dds.planner.refusals import with_refusals
from dds.planner.render import render_scale_down, render_scale_up
from dds.planner.requests import RequestCache, effective_requests
from dds.planner.scale_down import plan_scale_down
from dds.planner.scale_up import drive, pending_requests
from dds.planner.scoring import check_policy
from dds.model.snapshot import PodInfo, Snapshot
from dds.planner.state import ClusterState
from dds.planner.memos import PlannerMemos

__all__ = ("plan_scale_up", "plan_scale_down", "render_scale_up", "render_scale_down", "effective_requests")


def plan_scale_up(snapshot: Snapshot, config: PlannerConfig, pods: Optional[Sequence[PodInfo]] = None, *,
                  memos: Optional[PlannerMemos] = None) -> ScaleUpPlan:
    """Plan for the pending pods (`pods`, default: every pending pod of the snapshot): which fit now, which after
    attaching GPUs to live nodes, which need new nodes, and why each. A gang's minimum gets capacity as one unit or
    not at all (dds/planner/gangs.py). A dra-pool group's nodes get their GPUs through pool slots, never by a plan's
    attach (dds/planner/dra.py). `memos`: what an earlier decision derived, reused where nothing changed (PlannerMemos); a
    fresh one without it."""
    check_policy(config.policy)
    memos = memos if memos is not None else PlannerMemos()  # one for every plan of this call (gangs plan again)

    def plan_gpus(snapshot: Snapshot, memos: PlannerMemos) -> ScaleUpPlan:
        def plan_pods(snapshot: Snapshot, config: PlannerConfig, pods: Optional[Sequence[PodInfo]]) -> ScaleUpPlan:
            return _plan_pods(snapshot, config, pods, memos)

        plan = with_refusals(plan_all_or_nothing(plan_pods, snapshot, config, pods, memos=memos), snapshot)
        return leave_pool_slots_to_the_scheduler(plan, snapshot)

    if not takes_cxl_memory(snapshot):
        return plan_gpus(snapshot, memos)
    # CXL memory tried on live nodes for what the GPU plan leaves to new nodes (dds/planner/cxl_memory.py). Each
    # re-run sees a snapshot with more memory on a node: memos are kept per snapshot, so each run gets its own.
    first = [memos]
    return plan_with_cxl_memory(snapshot, config, lambda seen: plan_gpus(seen, first.pop() if first else PlannerMemos()))


def _plan_pods(snapshot: Snapshot, config: PlannerConfig, pods: Optional[Sequence[PodInfo]],
               memos: PlannerMemos) -> ScaleUpPlan:
    cache = RequestCache(memos.requests)
    reqs, notes = pending_requests(snapshot, pods, cache)
    state = ClusterState(snapshot, cache, config.groups, extra_pods=[r.pod for r in reqs], memos=memos)
    greedy = drive(snapshot, config, reqs, FastExisting(state, config.policy), notes)
    return improve_with_batch(snapshot, config, reqs, greedy, memos=memos)
