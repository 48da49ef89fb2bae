"""Batch planning: many pending pods planned together as one mixed-integer program (HiGHS), against the greedy plan.

The greedy plan (dds/planner/scale_up.py) places pods one at a time; a batch can do better, e.g. two pods that each
need one GPU on different nodes may both fit on one node after two GPUs (one attach operation instead of two). The MILP
places exactly the pods greedy placed on live and new nodes, and minimizes, in this order:
1. GPUs attached + nodes added ("attaches + nodes"),
2. nodes added (a GPU is cheaper than a node: DDS's whole point),
3. fragmentation: live nodes that receive GPUs (each one more server holding a slice of the pool, one more fabric
   operation).
It never adds more nodes than greedy. The result is used only when it is at least as good as greedy: fewer
attaches + nodes, or equal and less fragmentation. `ScaleUpPlan.solver` says which plan was returned.

Scope: pods with host ports or pod (anti-)affinity make the batch greedy-only (their verdicts depend on each other's
placement); nodes on their way keep greedy's pods. Candidate nodes per pod: greedy's choice plus the policy's best
CANDIDATES_PER_POD that fit now and that fit after GPUs, so the program stays small and greedy's plan is always
feasible in it.

Determinism: one thread, a fixed seed and a node limit (work, not time, bounds the search). The time budget
(PlannerConfig.solver_time_budget_seconds) is only a safety net: a solve stopped by it is discarded and greedy's plan
kept, so a slow machine never gets a different MILP plan, only greedy's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import highspy
import numpy as np

from dds.highs import silent_highs
from dds.planner.existing import FastExisting
from dds.planner.filters import PLACEMENT_FILTERS, first_reject
from dds.planner.nodes import SimNode, template_node
from dds.model.plan import Attach, NewNodes, PlannerConfig, PodDecision, ScaleUpPlan, Verdict
from dds.planner.requests import PodRequest, RequestCache
from dds.planner.scoring import rank
from dds.model.snapshot import Snapshot
from dds.planner.state import ClusterState
from dds.planner.memos import PlannerMemos
from dds.planner.virtual import commit_on, first_fit_on

SOLVERS = ("auto", "greedy", "milp")
CANDIDATES_PER_POD = 16
AUTO_MAX_PODS = 64  # "auto" solves batches up to this many pods needing action...
AUTO_MAX_COLUMNS = 20_000  # ...and programs up to this many variables; beyond, greedy is as good as it gets in time
MILP_MAX_COLUMNS = 200_000  # even when asked for, larger programs are not built
NODE_LIMIT = 20_000  # branch-and-bound nodes: the deterministic work bound


class UnknownSolver(ValueError):
    pass


def fragmentation(plan: ScaleUpPlan) -> int:
    """Live nodes that receive GPUs in the plan."""
    return len({a.node for a in plan.attaches})


def cost(plan: ScaleUpPlan) -> int:
    return plan.gpus + plan.nodes


def at_least_as_good(candidate: ScaleUpPlan, greedy: ScaleUpPlan) -> bool:
    if candidate.nodes > greedy.nodes:
        return False
    if cost(candidate) != cost(greedy):
        return cost(candidate) < cost(greedy)
    return fragmentation(candidate) < fragmentation(greedy)


def _note(plan: ScaleUpPlan, text: str) -> ScaleUpPlan:
    return replace(plan, notes=plan.notes + (text,))


def improve_with_batch(snapshot: Snapshot, config: PlannerConfig, reqs: Sequence[PodRequest],
                       greedy: ScaleUpPlan, *, memos: Optional[PlannerMemos] = None) -> ScaleUpPlan:
    """Greedy's plan, or the MILP's when PlannerConfig.batch_solver allows it and it is at least as good."""
    mode = config.batch_solver
    if mode not in SOLVERS:
        raise UnknownSolver(f"PlannerConfig.batch_solver {mode!r} is not one of {', '.join(SOLVERS)}")
    if mode == "greedy" or greedy.is_empty:
        return greedy
    decisions = {d.pod: d for d in greedy.decisions}
    on_new = {p for n in greedy.new_nodes for p in n.pods}
    batch = [r for r in reqs if (decisions[r.key].verdict in (Verdict.FITS_NOW, Verdict.FITS_AFTER_GPUS)
                                 and decisions[r.key].node is not None) or r.key in on_new]
    if any(r.has_placement_terms for r in batch):
        return _note(greedy, "batch solver skipped: pods with host ports or pod affinity are planned greedily")
    if mode == "auto" and len(batch) > AUTO_MAX_PODS:
        return greedy
    program = _Program(snapshot, config, batch, greedy, memos)
    limit = AUTO_MAX_COLUMNS if mode == "auto" else MILP_MAX_COLUMNS
    if program.columns > limit:
        return greedy if mode == "auto" else _note(
            greedy, f"batch solver skipped: {program.columns} variables exceed {limit}; greedy plan kept")
    solved = program.solve(config.solver_time_budget_seconds)
    if solved is None:
        return _note(greedy, f"batch solver: {program.status}; greedy plan kept")
    plan = program.replay(solved)
    if plan is None or not at_least_as_good(plan, greedy):
        return greedy
    return plan


@dataclass
class _Rows:
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    start: list[int] = field(default_factory=lambda: [0])
    index: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def add(self, terms: dict[int, float], lower: float, upper: float) -> None:
        if not terms:
            return
        for column, coefficient in sorted(terms.items()):
            self.index.append(column)
            self.value.append(coefficient)
        self.start.append(len(self.index))
        self.lower.append(lower)
        self.upper.append(upper)


class _Program:
    """The batch as a MILP: x[p,n] pod on live node, a[n,m] GPUs of model m attached to n, y[p,s] pod on new-node
    slot s, u[s] slot opened, e[s] GPUs attached to it, b[n] node touched."""

    def __init__(self, snapshot: Snapshot, config: PlannerConfig, batch: Sequence[PodRequest],
                 greedy: ScaleUpPlan, memos: Optional[PlannerMemos] = None) -> None:
        self.snapshot, self.config, self.batch, self.greedy = snapshot, config, list(batch), greedy
        memos = memos if memos is not None else PlannerMemos()
        self.cache = RequestCache(memos.requests)
        self.reqs = [self.cache.get(r.pod) for r in batch]
        self.state = ClusterState(snapshot, self.cache, config.groups, extra_pods=[r.pod for r in batch], memos=memos)
        self.live = FastExisting(self.state, config.policy)
        self.status = ""
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.rows = _Rows()
        self._build()

    @property
    def columns(self) -> int:
        return len(self.cost)

    def _column(self, cost: float, upper: float, integer: bool = True) -> int:
        self.cost.append(cost)
        self.lower.append(0.0)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.cost) - 1

    # --- candidates ---------------------------------------------------------------------------------------------
    def _candidates(self, req: PodRequest, greedy_node: Optional[str]) -> dict[int, list[int]]:
        """Live node -> models (indexes; [-1] = no model needed) this pod may use there."""
        s = self.state
        table = s.static_table(req)
        gpus = s.gpu_request(req)
        other = s.target & s.fits_other_resources(s.request_vector(req))
        now = other & s.static_ok_now(table) & (s.gpu_free >= gpus)
        short = gpus - s.gpu_free
        can_attach = other & s.attachable & (short >= 1) & (short <= s.free_slots)
        static = table.ok[table.row]
        chosen: set[int] = set()
        for mask, attach in ((now, np.zeros(len(s.nodes), dtype=np.int64)), (can_attach, np.maximum(short, 0))):
            nodes = np.flatnonzero(mask)
            if nodes.size:
                order, _ = rank(self.config.policy, self.live.candidates(req, nodes, attach[nodes], gpus))
                chosen.update(int(nodes[i]) for i in order[:CANDIDATES_PER_POD])
        if greedy_node is not None and greedy_node in s.index:
            chosen.add(s.index[greedy_node])
        out: dict[int, list[int]] = {}
        for i in sorted(chosen):
            if self._pinned_out(req, i):
                continue
            if gpus[i] == 0 or now[i]:
                out[i] = [-1]
            elif can_attach[i]:
                held = int(s.model[i])
                if held != s.no_model:
                    models = [held] if static[i, held] else []
                else:
                    models = [m for m in range(len(s.models)) if s.allowed[i, m] and static[i, m]]
                if models:
                    out[i] = models
        return out

    def _pinned_out(self, req: PodRequest, i: int) -> bool:
        """Existing pods' anti-affinity (the batch has no placement terms of its own)."""
        return self.state.has_pods(i) and first_reject(PLACEMENT_FILTERS, req, self.state.view(i),
                                                         self.state) is not None

    # --- the program --------------------------------------------------------------------------------------------
    def _build(self) -> None:
        s, decisions = self.state, {d.pod: d for d in self.greedy.decisions}
        node_count_bound = max(1, sum(n.count for n in self.greedy.new_nodes))
        touched_weight = 1.0
        node_weight = touched_weight * (len(s.nodes) + 1)  # tie-break 2 dominates fragmentation
        unit_weight = node_weight * (node_count_bound + 1)  # GPUs + nodes dominate both
        self.x: dict[tuple[int, int], int] = {}
        self.options: list[dict[int, list[int]]] = []
        for p, req in enumerate(self.reqs):
            options = self._candidates(req, decisions[req.key].node)
            self.options.append(options)
            for i in options:
                self.x[(p, i)] = self._column(0.0, 1.0)
        nodes = sorted({i for (_, i) in self.x})
        self.attach: dict[tuple[int, int], int] = {}  # (node, model) -> column
        self.touched: dict[int, int] = {}
        self.model_pick: dict[tuple[int, int], int] = {}  # (node, model) -> binary, for nodes without a model
        for i in nodes:
            slots = int(s.free_slots[i])
            models = sorted({m for (p, j), _ in self.x.items() if j == i for m in self.options[p][i] if m >= 0})
            if slots <= 0 or not models:
                continue
            self.touched[i] = self._column(touched_weight, 1.0)
            for m in models:
                self.attach[(i, m)] = self._column(unit_weight, float(slots))
                if int(s.model[i]) == s.no_model:
                    self.model_pick[(i, m)] = self._column(0.0, 1.0)
        # New-node slots: as many per group as greedy opened there, never more.
        self.slots: list[tuple[str, int]] = []
        self.y: dict[tuple[int, int], int] = {}
        self.opened: list[int] = []
        self.extra: list[int] = []
        groups = {g.id: g for g in self.snapshot.groups}
        fits_group: dict[tuple[int, str], bool] = {}
        for new in self.greedy.new_nodes:
            group = groups[new.group]
            for j in range(new.count):
                slot = len(self.slots)
                self.slots.append((group.id, j))
                self.opened.append(self._column(unit_weight + node_weight, 1.0))
                self.extra.append(self._column(unit_weight, float(group.max_gpus_per_node - group.initial_gpus)))
                for p, req in enumerate(self.reqs):
                    key = (p, group.id)
                    if key not in fits_group:
                        probe = template_node(group, f"new:{group.id}", group.max_gpus_per_node, 0, self.snapshot)
                        probe.virtual = True
                        fits_group[key] = first_fit_on(req, probe, self.state, None, False) is not None
                    if fits_group[key]:
                        self.y[(p, slot)] = self._column(0.0, 1.0)
        self._constraints(nodes, groups)

    def _constraints(self, nodes: list[int], groups: dict) -> None:
        s, rows = self.state, self.rows
        for p in range(len(self.reqs)):
            terms = {c: 1.0 for (q, _), c in self.x.items() if q == p}
            terms.update({c: 1.0 for (q, _), c in self.y.items() if q == p})
            rows.add(terms, 1.0, 1.0)  # every pod greedy placed is placed
        by_node: dict[int, list[int]] = {}
        for (p, i) in self.x:
            by_node.setdefault(i, []).append(p)
        for i in nodes:
            pods = by_node[i]
            for row in range(len(s.resource_names)):
                if s.free[row, i] >= 2**61:
                    continue
                terms = {self.x[(p, i)]: float(amount) for p in pods
                         for r, amount in s.request_vector(self.reqs[p]) if r == row}
                rows.add(terms, -np.inf, float(s.free[row, i]))
            gpu = s.nodes[i].gpu_resource
            terms = {self.x[(p, i)]: float(self.reqs[p].gpus(gpu)) for p in pods if self.reqs[p].gpus(gpu)}
            for (j, m), column in self.attach.items():
                if j == i:
                    terms[column] = -1.0
            rows.add(terms, -np.inf, float(s.gpu_free[i]))
            slots = float(s.free_slots[i])
            if i in self.touched:
                attach_terms = {c: 1.0 for (j, _), c in self.attach.items() if j == i}
                rows.add({**attach_terms, self.touched[i]: -slots}, -np.inf, 0.0)
            picks = {c: 1.0 for (j, _), c in self.model_pick.items() if j == i}
            if picks:
                rows.add(picks, -np.inf, 1.0)  # a node without a model takes one
                for (j, m), pick in self.model_pick.items():
                    if j == i:
                        rows.add({self.attach[(i, m)]: 1.0, pick: -slots}, -np.inf, 0.0)
                        for p in pods:  # a GPU pod lands only if the node's model is one it accepts
                            if self.reqs[p].gpus(s.nodes[i].gpu_resource) and m not in self.options[p][i]:
                                rows.add({self.x[(p, i)]: 1.0, pick: 1.0}, -np.inf, 1.0)
        pool_terms: dict[tuple[int, int], dict[int, float]] = {}
        for (i, m), column in self.attach.items():
            pool_terms.setdefault((int(s.pool[i]), m), {})[column] = 1.0
        for (pool, m), terms in pool_terms.items():
            rows.add(terms, -np.inf, float(s.pool_free[pool, m]))
        for slot, (group_id, _) in enumerate(self.slots):
            group = groups[group_id]
            capacity = group.node_allocatable(0, group.max_cxl_chunks)  # as template_node: memory at its maximum
            members = [p for (p, t) in self.y if t == slot]
            for p in members:
                rows.add({self.y[(p, slot)]: 1.0, self.opened[slot]: -1.0}, -np.inf, 0.0)
            rows.add({self.y[(p, slot)]: 1.0 for p in members}, -np.inf, float(capacity.pods))
            for name in ("cpu", "memory", "ephemeral-storage"):
                rows.add({self.y[(p, slot)]: float(self.reqs[p].requests.get(name)) for p in members
                          if self.reqs[p].requests.get(name)}, -np.inf, float(capacity.get(name)))
            scalars = {n for p in members for n in self.reqs[p].requests.scalar if n != group.gpu_resource}
            for name in sorted(scalars):
                rows.add({self.y[(p, slot)]: float(self.reqs[p].requests.get(name)) for p in members},
                         -np.inf, float(capacity.get(name)))
            gpu_terms = {self.y[(p, slot)]: float(self.reqs[p].gpus(group.gpu_resource)) for p in members
                         if self.reqs[p].gpus(group.gpu_resource)}
            rows.add({**gpu_terms, self.extra[slot]: -1.0}, -np.inf, float(group.initial_gpus))
            rows.add({self.extra[slot]: 1.0, self.opened[slot]: -float(group.max_gpus_per_node - group.initial_gpus)},
                     -np.inf, 0.0)
            if slot + 1 < len(self.slots) and self.slots[slot + 1][0] == group_id:
                rows.add({self.opened[slot + 1]: 1.0, self.opened[slot]: -1.0}, -np.inf, 0.0)  # open in order

    # --- solving ------------------------------------------------------------------------------------------------
    def solve(self, budget_seconds: float) -> Optional[np.ndarray]:
        h = silent_highs()
        for option, value in (("threads", 1), ("random_seed", 0), ("mip_rel_gap", 0.0), ("mip_abs_gap", 0.5),
                              ("mip_max_nodes", NODE_LIMIT), ("time_limit", float(budget_seconds)),
                              ("presolve", "on")):
            h.setOptionValue(option, value)
        lp = highspy.HighsLp()
        lp.num_col_ = self.columns
        lp.num_row_ = len(self.rows.lower)
        lp.col_cost_ = np.array(self.cost, dtype=float)
        lp.col_lower_ = np.array(self.lower, dtype=float)
        lp.col_upper_ = np.array(self.upper, dtype=float)
        lp.row_lower_ = np.array(self.rows.lower, dtype=float)
        lp.row_upper_ = np.array(self.rows.upper, dtype=float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(self.rows.start, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(self.rows.index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(self.rows.value, dtype=float)
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in self.integer]
        h.passModel(lp)
        h.run()
        status = h.getModelStatus()
        self.status = h.modelStatusToString(status)
        if status == highspy.HighsModelStatus.kTimeLimit:
            self.status = f"stopped by its {budget_seconds:g}s time budget"
            return None
        values = np.array(h.getSolution().col_value)
        if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kSolutionLimit,
                          highspy.HighsModelStatus.kIterationLimit) or values.size != self.columns:
            return None
        if status != highspy.HighsModelStatus.kOptimal and not h.getInfo().primal_solution_status:
            return None
        return np.rint(values).astype(np.int64)

    # --- the plan -----------------------------------------------------------------------------------------------
    def replay(self, values: np.ndarray) -> Optional[ScaleUpPlan]:
        """Apply the solution through the same scratch and scalar checks as greedy (a solution that does not verify
        is dropped, never trusted)."""
        s, policy = self.state, self.config.policy
        greedy_decisions = {d.pod: d for d in self.greedy.decisions}
        where: dict[int, int] = {p: i for (p, i), c in self.x.items() if values[c] == 1}
        slot_of: dict[int, int] = {p: t for (p, t), c in self.y.items() if values[c] == 1}
        models = {i: s.models[m] for (i, m), c in self.attach.items() if values[c] > 0}
        decisions: dict[str, PodDecision] = {}
        steps: dict[str, Attach] = {}
        for p, req in enumerate(self.reqs):
            if p not in where:
                continue
            i = where[p]
            gpus = s.gpu_request(req)
            k = max(0, int(gpus[i] - s.gpu_free[i]))
            model = models.get(i, s.model_name(i)) if k else s.model_name(i)
            model_index = s.model_index[model] if model is not None else s.no_model
            choice = self.live.best_verified(req, np.array([i]), np.array([k], dtype=np.int64),
                                               np.array([model_index]), gpus)
            if choice is None:
                return None
            self.live.commit(req, choice)
            node = s.nodes[i].name
            old = greedy_decisions[req.key]
            if k:
                pool = s.facts[i].pool or ""
                step = steps.get(node) or Attach(node, pool, model or "", 0, (), "", choice.score)
                steps[node] = replace(step, count=step.count + k, pods=step.pods + (req.key,))
                decisions[req.key] = replace(old, verdict=Verdict.FITS_AFTER_GPUS, node=node, group=None,
                                             gpus_added=k, score=choice.score, reason=(
                                                 f"fits on {node} after {k} {model} GPU{'s' if k > 1 else ''} "
                                                 f"(batch plan; {policy} {choice.score:.2f})"))
            else:
                decisions[req.key] = replace(old, verdict=Verdict.FITS_NOW, node=node, group=None, gpus_added=0,
                                             score=choice.score, reason=f"fits now on {node} (batch plan; {policy} "
                                                                        f"{choice.score:.2f})")
        new_nodes = self._replay_new_nodes(slot_of, values, decisions, greedy_decisions)
        if new_nodes is None:
            return None
        attaches = tuple(replace(a, reason=f"{a.count} {a.model} GPU{'s' if a.count > 1 else ''} from pool {a.pool} "
                                           f"so {', '.join(a.pods)} fit on {a.node} (batch plan)")
                         for a in steps.values())
        ordered = tuple(decisions.get(d.pod, d) for d in self.greedy.decisions)
        notes = tuple(n for n in self.greedy.notes if not n.startswith("the new nodes need"))
        return ScaleUpPlan(attaches=attaches, new_nodes=new_nodes, decisions=ordered, policy=policy, solver="milp",
                           notes=notes + (f"batch plan (MILP) for {len(self.reqs)} pods: {self.status}",))

    def _replay_new_nodes(self, slot_of: dict[int, int], values: np.ndarray, decisions: dict[str, PodDecision],
                          greedy_decisions: dict[str, PodDecision]) -> Optional[tuple[NewNodes, ...]]:
        groups = {g.id: g for g in self.snapshot.groups}
        built: dict[int, SimNode] = {}
        for p, req in enumerate(self.reqs):
            if p not in slot_of:
                continue
            slot = slot_of[p]
            group_id, j = self.slots[slot]
            group = groups[group_id]
            node = built.get(slot)
            if node is None:
                node = template_node(group, f"new:{group.id}#{j + 1}", group.initial_gpus,
                                     group.max_gpus_per_node - group.initial_gpus, self.snapshot)
                node.virtual = True
                built[slot] = node
            found = first_fit_on(req, node, self.state, None, True)
            if found is None:
                return None
            commit_on(node, req, found[0], found[1])
            after = f", then {found[0]} GPU(s) attached once it is up" if found[0] else ""
            decisions[req.key] = replace(greedy_decisions[req.key], verdict=Verdict.NEEDS_NODE, node=None,
                                         group=group.id, gpus_added=found[0],
                                         reason=f"needs a new node of {group.id}{after} (batch plan)")
        out: list[NewNodes] = []
        for group_id in dict.fromkeys(g for g, _ in self.slots):
            group = groups[group_id]
            nodes = [built[t] for t in sorted(built) if self.slots[t][0] == group_id]
            if not nodes:
                continue
            pods = tuple(p.key for n in nodes for p in n.placed)
            out.append(NewNodes(group=group_id, count=len(nodes), pods=pods,
                                gpus_per_node=tuple(n.gpus - group.initial_gpus for n in nodes),
                                reason=f"{', '.join(pods)} fit no live node in the batch plan; "
                                       f"{len(nodes)} new node(s) of {group_id}"))
        return tuple(out)
