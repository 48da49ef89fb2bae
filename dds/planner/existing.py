"""Placing pods on live nodes: now, or after attaching GPUs one virtual GPU at a time.

`ExistingCapacity` is what the scale-up driver needs from the live cluster; `FastExisting` implements it over the
array scratch (dds/planner/state.py), the reference planner (dds/planner/reference.py) naively. Both check first
(`fits_now`, `fits_after_gpus` return a `Choice`) and commit second (`commit`), as the style guide asks.

Attaching one GPU at a time and re-simulating stops at the first k where the pod fits. Attaching GPUs changes only the
node's GPU capacity, and the GPU check is monotone in it, so that first k is exactly the node's GPU shortfall: the fast
path computes it for every node at once, then *verifies* the chosen node on a fork with the k virtual GPUs attached
through the scalar filters (and reverts). The reference literally loops k = 1, 2, ... on a rebuilt world; the tests
check both give the same placements.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from dds.model.resources import CPU, MEMORY, PODS
from dds.planner.filters import ClusterView
from dds.model.plan import Reject
from dds.planner.requests import PodRequest
from dds.planner.scoring import Candidates, best_fit, order_keys, primary_score, rank
from dds.model.snapshot import PodAffinityTerm, PodInfo
from dds.planner.state import Choice, ClusterState, StaticTable

MAX_REJECTS = 8  # rejected options listed per pod; the counts cover every node
RUNNERS_UP = 3  # candidates that fitted but lost, listed first among the rejected options
# Above SHORTCUT_ABOVE candidates only the best RANKED_FIRST are sorted (and given an attach model); the rest only when
# those do not settle the choice. Below, the shortcut's own cost outweighs what it saves.
RANKED_FIRST = 16
SHORTCUT_ABOVE = 256
RANKING_KEPT_UP_TO = 32  # nodes changed since a shape's last pod above which its kept order is dropped, not updated


@dataclass(frozen=True)
class Explanation:
    """Why the live nodes did not take a pod: counts per reason over all nodes, and the first few in detail."""

    nodes: int
    counts: tuple[tuple[str, int], ...]
    rejects: tuple[Reject, ...]

    def summary(self) -> str:
        if not self.nodes:
            return "no live nodes"
        parts = ", ".join(f"{count} {reason}" for reason, count in self.counts)
        return f"0/{self.nodes} nodes available: {parts}" if parts else f"0/{self.nodes} nodes available"


class ExistingCapacity(Protocol):
    cluster: ClusterView  # every pod of the plan, for pod-affinity's "does any pod match" rule

    def see_elsewhere(self, pods: list[PodInfo]) -> None:
        """Pods placed off the live nodes (nodes on their way, new nodes): affinity rules must see them too."""
        ...

    def fits_now(self, req: PodRequest, coming: bool = True) -> Optional[Choice]:
        """The best node the pod fits on as it is; `coming=False`: without the GPUs still on their way."""
        ...

    def gpus_coming(self) -> bool:
        """Whether some live node has GPUs on their way that no pod of this plan counts on yet."""
        ...

    def fits_on_coming(self, req: PodRequest) -> Optional[Choice]:
        """The node the pod fits on counting the GPUs on their way, the one it leaves the fewest free GPUs (the
        policy's score breaks ties): those GPUs were ordered for pods like it, so they are filled, not spread over."""
        ...

    def fits_after_gpus(self, req: PodRequest) -> Optional[Choice]: ...

    def commit(self, req: PodRequest, choice: Choice) -> None: ...

    def explain(self, req: PodRequest, with_gpus: bool) -> Explanation: ...

    def node_name(self, choice: Choice) -> str: ...

    def pool_of(self, choice: Choice) -> Optional[str]: ...

    def pool_free(self) -> dict[tuple[str, str], int]: ...


SortKeys = Callable[[np.ndarray], list[tuple]]


class _Ranking:
    """A screen's candidates in the full order a search over them would give (`rank`, then the fewest GPUs left for
    the pods placed on GPUs on their way), as sort keys (left, -score, -secondary, attach, not filling the node, not
    holding a model, node, score): the node's position makes each key unique, and the score rides along."""

    def __init__(self, keys: list[tuple]) -> None:
        self.sorted = sorted(keys)
        self.key_of = {key[NODE]: key for key in keys}

    def update(self, nodes: Sequence[int], keys: list[tuple]) -> None:
        """Nodes changed: their old keys go, `keys` (of those still candidates) come in."""
        for node in nodes:
            old = self.key_of.pop(node, None)
            if old is not None:
                del self.sorted[bisect.bisect_left(self.sorted, old)]
        for key in keys:
            bisect.insort(self.sorted, key)
            self.key_of[key[NODE]] = key

    def first(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The best RANKED_FIRST candidates: their nodes, scores and GPUs left."""
        first = self.sorted[:RANKED_FIRST]
        return (np.array([key[NODE] for key in first], dtype=np.int64), np.array([key[SCORE] for key in first]),
                np.array([key[0] for key in first], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.sorted)


NODE, SCORE = 6, 7  # positions in a _Ranking key


@dataclass
class _Screen:
    """A pre-screen's verdict per live node for one pod shape, as of `seen` entries of the state's touched log; and
    its candidates in order, once pods of the shape come one after the other."""

    ok: np.ndarray
    seen: int
    rules: int
    sort_keys: Optional[SortKeys] = None
    in_a_row: int = 0  # pods of this shape judged one after the other, with no other screen in between
    _ranking: Optional[_Ranking] = None

    def ranking(self) -> Optional[_Ranking]:
        """The kept order, once pods of the shape come one after the other: ordering every candidate costs a few
        searches, which only a run of alike pods (each changing a node or two) repays; mixed pods take the search."""
        if self._ranking is None and self.sort_keys is not None and self.in_a_row > 0:
            self._ranking = _Ranking(self.sort_keys(np.flatnonzero(self.ok)))
        return self._ranking

    def judge_again(self, nodes: np.ndarray, verdicts: np.ndarray) -> None:
        self.ok[nodes] = verdicts
        if self._ranking is None or self.sort_keys is None:
            return
        if len(nodes) > RANKING_KEPT_UP_TO:
            self._ranking = None  # many nodes changed since: ordering afresh, if asked again, costs less
        else:
            self._ranking.update(nodes.tolist(), self.sort_keys(nodes[verdicts]))


class FastExisting:
    def __init__(self, state: ClusterState, policy: str) -> None:
        self.state = state
        self.policy = policy
        self.cluster: ClusterView = state
        self._explained: dict[tuple, Explanation] = {}
        self._screens: dict[tuple, _Screen] = {}
        # Per kind of screen, the one the last pod was judged by: a pod passes several kinds in turn (now, coming,
        # after), so a run of alike pods is a run within each kind.
        self._last_screen: dict[str, _Screen] = {}
        self._shapes: dict[int, tuple[PodRequest, tuple]] = {}

    def _screened(self, kind: str, req: PodRequest, screen: Callable[[np.ndarray], np.ndarray],
                  sort_keys: Optional[SortKeys] = None) -> _Screen:
        """`screen(nodes)` (a verdict per node of the index array `nodes`) for every live node, kept per pod shape and
        judged again only on the nodes changed since, with the candidates' order (`sort_keys`) kept the same way. A
        burst of alike pods is placed one by one, each placement changing a node or two: judging and ranking thousands
        of nodes again for every pod is the cost this saves. Pods with placement rules of their own (host ports, pod
        affinity) are judged afresh, in full: others' placements change their verdicts."""
        s = self.state
        pod = req.pod
        if pod.host_ports or pod.required_pod_affinity or pod.required_pod_anti_affinity:
            return _Screen(screen(np.arange(len(s.nodes))), len(s.touched), s.rules_version)
        key = (kind, self._shape(req))
        found = self._screens.get(key)
        if found is None or found.rules != s.rules_version:
            found = self._screens[key] = _Screen(screen(np.arange(len(s.nodes))), len(s.touched), s.rules_version,
                                                 sort_keys)
        elif found.seen < len(s.touched):
            nodes = np.fromiter(sorted(set(s.touched[found.seen:])), dtype=np.int64)
            found.judge_again(nodes, screen(nodes))
            found.seen = len(s.touched)
        found.in_a_row = found.in_a_row + 1 if self._last_screen.get(kind) is found else 0
        self._last_screen[kind] = found
        return found

    def _shape(self, req: PodRequest) -> tuple:
        found = self._shapes.get(id(req))
        if found is None or found[0] is not req:
            found = self._shapes[id(req)] = (req, _shape(req))
        return found[1]

    def see_elsewhere(self, pods: list[PodInfo]) -> None:
        self.state.elsewhere = pods

    # --- choose --------------------------------------------------------------------------------------------------
    def fits_now(self, req: PodRequest, coming: bool = True) -> Optional[Choice]:
        s = self.state
        gpus = s.gpu_request(req)
        nodes = np.flatnonzero(self._screened("now" if coming else "visible", req,
                                              self._fits_as_is(req, gpus, coming)).ok)
        if not nodes.size:
            return None
        attach = np.zeros(nodes.size, dtype=np.int64)
        return self.best_verified(req, nodes, attach, s.model[nodes], gpus)

    def _fits_as_is(self, req: PodRequest, gpus: np.ndarray, coming: bool) -> Callable[[np.ndarray], np.ndarray]:
        """The pre-screen of a node as it is: enough free GPUs (`coming`: counting those on their way), then the
        static, resource and placement tests. The GPU test goes first: with most GPUs in use it leaves a few nodes of
        thousands, and the rest is judged on those few."""
        s = self.state

        def screen(nodes: np.ndarray) -> np.ndarray:
            free = s.gpu_free[nodes] if coming else s.gpu_free[nodes] - s.gpu_coming[nodes]
            ok = (free >= gpus[nodes]) & s.target[nodes]
            some = nodes[ok]
            if some.size:
                ok[ok] = (s.static_ok_now(s.static_table(req), some)
                          & s.fits_other_resources(s.request_vector(req), some) & s.placement_ok(req)[some])
            return ok
        return screen

    def gpus_coming(self) -> bool:
        return bool(self.state.gpu_coming.any())

    def fits_on_coming(self, req: PodRequest) -> Optional[Choice]:
        s = self.state
        gpus = s.gpu_request(req)
        screened = self._screened("coming", req, self._fits_as_is(req, gpus, True),
                                  self._sort_keys(req, gpus, attaching=False))
        ranking = screened.ranking()
        if ranking is not None:
            nodes, score, left = ranking.first()
            found, sure = self._first_verified(
                req, nodes, np.zeros(nodes.size, dtype=np.int64), s.model[nodes], np.arange(nodes.size), score, left,
                partial=len(ranking) > nodes.size)
            if sure:
                return found
        nodes = np.flatnonzero(screened.ok)
        if not nodes.size:
            return None
        attach = np.zeros(nodes.size, dtype=np.int64)
        return self.best_verified(req, nodes, attach, s.model[nodes], gpus, left=s.gpu_free[nodes] - gpus[nodes])

    def _sort_keys(self, req: PodRequest, gpus: np.ndarray, attaching: bool) -> SortKeys:
        """Sort keys of candidate nodes in the order `best_verified` ranks them: the policy's `rank` (GPUs attached:
        each node's shortfall; else none), then, for pods placed on GPUs on their way, the fewest left first."""
        s = self.state

        def keys(nodes: np.ndarray) -> list[tuple]:
            if attaching:
                attach, left = gpus[nodes] - s.gpu_free[nodes], np.zeros(nodes.size, dtype=np.int64)
            else:
                attach, left = np.zeros(nodes.size, dtype=np.int64), s.gpu_free[nodes] - gpus[nodes]
            c = self.candidates(req, nodes, attach, gpus)
            fit = best_fit(c)
            score = primary_score(self.policy, c, fit)
            ranked = order_keys(self.policy, c, fit, score, np.arange(nodes.size))
            # Most significant first, for tuple comparison; the node's position (ranked[0]) last, then the score.
            return list(zip(left.tolist(), *(key.tolist() for key in reversed(ranked)), score.tolist()))
        return keys

    def fits_after_gpus(self, req: PodRequest) -> Optional[Choice]:
        s = self.state
        gpus = s.gpu_request(req)
        shortfall = gpus - s.gpu_free
        screened = self._screened("after", req, self._fits_after_attach(req, gpus),
                                  self._sort_keys(req, gpus, attaching=True))
        base = screened.ok
        if not base.any():
            return None
        table = s.static_table(req)
        ranking = screened.ranking()
        if ranking is not None:
            found, sure = self._first_ranked_after_gpus(req, table, ranking, shortfall)
        else:
            found, sure = self._best_few_after_gpus(req, table, base, shortfall, gpus)
        if sure:
            return found
        model = self._attach_models(table, base, shortfall)
        nodes = np.flatnonzero(model >= 0)
        if not nodes.size:
            return None
        return self.best_verified(req, nodes, shortfall[nodes], model[nodes], gpus)

    def _fits_after_attach(self, req: PodRequest, gpus: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """The pre-screen of a node for an attach: it takes GPUs, lacks some and has the slots for them, and has room
        for the pod's other resources and its placement rules."""
        s = self.state

        def screen(nodes: np.ndarray) -> np.ndarray:
            shortfall = gpus[nodes] - s.gpu_free[nodes]
            return (s.attachable[nodes] & s.target[nodes] & (shortfall >= 1) & (shortfall <= s.free_slots[nodes])
                    & s.fits_other_resources(s.request_vector(req), nodes) & s.placement_ok(req)[nodes])
        return screen

    def _first_ranked_after_gpus(self, req: PodRequest, table: StaticTable, ranking: _Ranking, shortfall: np.ndarray
                                 ) -> tuple[Optional[Choice], bool]:
        """As _best_few_after_gpus, from the kept order: the best RANKED_FIRST candidates, those a pool can serve."""
        s = self.state
        nodes, score, _ = ranking.first()
        best = np.zeros(len(s.nodes), dtype=bool)
        best[nodes] = True
        models = self._attach_models(table, best, shortfall)[nodes]
        return self._first_verified(req, nodes, shortfall[nodes], models, np.flatnonzero(models >= 0), score, None,
                                    partial=len(ranking) > nodes.size)

    def _best_few_after_gpus(self, req: PodRequest, table: StaticTable, base: np.ndarray, shortfall: np.ndarray,
                             gpus: np.ndarray) -> tuple[Optional[Choice], bool]:
        """The choice among the best RANKED_FIRST nodes by score, looking up an attachable model for those only; and
        whether that is sure. The score does not depend on the model, so the candidates that have one keep their
        order: when enough of the best few have one, the choice and its runners-up are those of the full search."""
        s = self.state
        nodes = np.flatnonzero(base)
        if nodes.size <= SHORTCUT_ABOVE or s.pool_free.max(initial=0) < shortfall[nodes].min():
            return None, False  # few candidates, or no pool has enough devices for any: the full search is cheap
        attach = shortfall[nodes]
        order, score = rank(self.policy, self.candidates(req, nodes, attach, gpus), limit=RANKED_FIRST)
        best = np.zeros(len(s.nodes), dtype=bool)
        best[nodes[order]] = True
        models = self._attach_models(table, best, shortfall)[nodes]
        return self._first_verified(req, nodes, attach, models, order[models[order] >= 0], score, None, partial=True)

    def _attach_models(self, table: StaticTable, base: np.ndarray, shortfall: np.ndarray) -> np.ndarray:
        """Per node, the model an attach would bring (-1: none fits): its own model if it holds one; otherwise its
        group's default, then the other allowed models in name order, that the pod accepts and the pool still has."""
        s = self.state
        chosen = np.full(len(s.nodes), -1, dtype=np.int64)
        if not s.models:
            return chosen
        nodes = np.flatnonzero(base)
        if not nodes.size:
            return chosen
        pool, short, model = np.maximum(s.pool[nodes], 0), shortfall[nodes], s.model[nodes]
        # [node, model]: the pod accepts the model on that node and the node's pool has enough of it free.
        fits = s.accepted_models(table)[nodes] & (s.pool_free[pool, :len(s.models)] >= short[:, None])
        at = np.arange(nodes.size)
        holding = model != s.no_model
        picked = np.where(holding & fits[at, np.where(holding, model, 0)], model, -1)
        bare = ~holding
        if bare.any():
            fits &= s.allowed[nodes]
            preferred = s.preferred[nodes]
            default_fits = bare & (preferred >= 0) & fits[at, np.maximum(preferred, 0)]
            other_fits = bare & ~default_fits & fits.any(axis=1)
            # argmax of a boolean row: its first True, the first model in name order that fits.
            picked = np.where(default_fits, preferred, np.where(other_fits, np.argmax(fits, axis=1), picked))
        chosen[nodes] = picked
        return chosen

    def best_verified(self, req: PodRequest, nodes: np.ndarray, attach: np.ndarray, models: np.ndarray,
                      gpus: np.ndarray, left: Optional[np.ndarray] = None) -> Optional[Choice]:
        """The best candidate the scalar filters accept (model indexes: the model each candidate would hold). `left`:
        free GPUs each candidate keeps after placement, fewest first, before the policy's order (tightest fit)."""
        candidates = self.candidates(req, nodes, attach, gpus)
        if left is None and len(nodes) > SHORTCUT_ABOVE:
            # Thousands of candidates, and nearly always the first passes: sort only the best few. Their order is the
            # full order's beginning, so the choice and its runners-up are the same whenever they lie within it.
            order, score = rank(self.policy, candidates, limit=RANKED_FIRST)
            found, sure = self._first_verified(req, nodes, attach, models, order, score, None, partial=True)
            if sure:
                return found
        order, score = rank(self.policy, candidates)
        if left is not None:
            order = order[np.argsort(left[order], kind="stable")]
        return self._first_verified(req, nodes, attach, models, order, score, left, partial=False)[0]

    def _first_verified(self, req: PodRequest, nodes: np.ndarray, attach: np.ndarray, models: np.ndarray,
                        order: np.ndarray, score: np.ndarray, left: Optional[np.ndarray], partial: bool
                        ) -> tuple[Optional[Choice], bool]:
        """The first candidate in `order` the scalar filters accept, with its runners-up; and whether that is sure.
        `partial`: `order` is only the beginning of the full order, so a choice too near its end (its runners-up may
        lie beyond) or no choice at all is not sure."""
        s = self.state
        for rank_index, position in enumerate(order):
            if partial and rank_index + RUNNERS_UP >= len(order):
                return None, False
            i, k = int(nodes[position]), int(attach[position])
            model = None if int(models[position]) in (s.no_model, -1) else s.models[int(models[position])]
            mark = s.fork()
            s.attach(i, k, model)
            verdict = s.verify(req, i, model)
            s.revert(mark)
            if verdict is None:
                best = float(score[position])
                runners = order[rank_index + 1:rank_index + 1 + RUNNERS_UP]
                alternatives = tuple(
                    self._runner_up(int(nodes[p]), float(score[p]), int(attach[p]), best) if left is None
                    or left[p] == left[position] else self._looser_fit(int(nodes[p]), int(left[p]), int(left[position]))
                    for p in runners)
                return Choice(node=i, attach=k, model=model, score=best, alternatives=alternatives), True
        return None, not partial

    def _runner_up(self, i: int, score: float, attach: int, best: float) -> Reject:
        what = f" after {attach} GPU{'s' if attach != 1 else ''}" if attach else ""
        if score < best:
            return Reject(self.state.nodes[i].name, f"fits{what} but scores lower ({self.policy} {score:.2f})")
        return Reject(self.state.nodes[i].name, f"fits{what} with an equal {self.policy} score {score:.2f} but lost "
                                                f"the tie-break (fewer GPUs, full slots, held model, name)")

    def _looser_fit(self, i: int, left: int, best: int) -> Reject:
        return Reject(self.state.nodes[i].name, f"fits once the GPUs attaching there are online, but would leave "
                                                f"{left} free where the chosen node leaves {best}")

    def candidates(self, req: PodRequest, nodes: np.ndarray, attach: np.ndarray, gpus: np.ndarray) -> Candidates:
        s = self.state
        cpu, memory = s.resource_row[CPU], s.resource_row[MEMORY]
        r = req.requests
        present = s.gpu_capacity[nodes] + attach
        in_use = s.gpu_capacity[nodes] - s.gpu_free[nodes]
        return Candidates(
            order=nodes, attach=attach,
            cpu_used=s.capacity[cpu, nodes] - s.free[cpu, nodes] + r.milli_cpu, cpu_capacity=s.capacity[cpu, nodes],
            memory_used=s.capacity[memory, nodes] - s.free[memory, nodes] + r.memory,
            memory_capacity=s.capacity[memory, nodes],
            gpu_request=gpus[nodes], gpu_free_before=s.gpu_free[nodes] + attach, gpu_used=in_use + gpus[nodes],
            gpu_present=present, gpu_slots=s.gpu_capacity[nodes] + s.free_slots[nodes],
            has_model=s.model[nodes] != s.no_model)

    # --- commit --------------------------------------------------------------------------------------------------
    def commit(self, req: PodRequest, choice: Choice) -> None:
        s = self.state
        s.attach(choice.node, choice.attach, choice.model)
        if req.gpus(s.nodes[choice.node].gpu_resource):
            s.hold_model(choice.node, choice.model)
        s.place(choice.node, req)

    def node_name(self, choice: Choice) -> str:
        return self.state.nodes[choice.node].name

    def pool_of(self, choice: Choice) -> Optional[str]:
        return self.state.facts[choice.node].pool

    def pool_free(self) -> dict[tuple[str, str], int]:
        s = self.state
        return {(p, m): int(s.pool_free[pi, mi]) for p, pi in s.pool_index.items() for m, mi in s.model_index.items()}

    # --- explain -------------------------------------------------------------------------------------------------
    def explain(self, req: PodRequest, with_gpus: bool) -> Explanation:
        """First failing check per live node, counted per reason over all nodes (vectorized); details for the first
        MAX_REJECTS nodes in name order. Pods of the same shape judged against an unchanged scratch share one."""
        key = (_shape(req), with_gpus, self.state.version)
        found = self._explained.get(key)
        if found is None:
            found = self._explain(req, with_gpus)
            if self._explained and next(iter(self._explained))[2] != self.state.version:
                self._explained.clear()  # the scratch changed: older explanations are stale
            self._explained[key] = found
        return found

    def _explain(self, req: PodRequest, with_gpus: bool) -> Explanation:
        s = self.state
        n = len(s.nodes)
        table = s.static_table(req)
        gpus = s.gpu_request(req)
        code = np.full(n, -1, dtype=np.int64)
        makers: list[tuple[Callable[[int], Reject], np.ndarray]] = []  # (detail maker, sub-key: equal key = reason)
        undecided = np.ones(n, dtype=bool)
        zeros = np.zeros(n, dtype=np.int64)

        def settle(mask: np.ndarray, make: Callable[[int], Reject], subkey: np.ndarray = zeros) -> None:
            hit = mask & undecided
            code[hit] = len(makers)
            makers.append((make, subkey))
            undecided[hit] = False

        static_now = s.static_ok_now(table)
        if with_gpus and s.models:
            # A node without GPUs is judged as it would be labelled with any model it may still get.
            bare = (s.model == s.no_model) & s.attachable
            static_now = static_now | (bare & (table.ok[table.row, :len(s.models)] & s.allowed).any(axis=1))
        settle(~s.target & static_now, lambda i: Reject(s.nodes[i].name, "node(s) were being removed"))
        settle(~static_now, lambda i: s.static_reject(table, i), table.row * (s.no_model + 1) + s.model)
        for row, amount in s.request_vector(req):
            settle(s.free[row] < amount, lambda i, row=row, amount=amount: self._resource_reject(i, row, amount))
        short = gpus - s.gpu_free
        if with_gpus:
            settle((short > 0) & ~s.attachable, lambda i: self._gpu_reject(i, gpus, "Insufficient"), s.gpu_name_of)
            settle(short > s.free_slots, lambda i: self._gpu_reject(i, gpus, "gpu-slots-full"))
            model = self._attach_models(table, undecided & (short > 0), short)
            settle((short > 0) & (model < 0), lambda i: self._pool_reject(req, table, i, int(short[i])),
                   ((s.pool + 1) * len(table.rejects) + table.row) * (s.no_model + 1) + s.model)
        else:
            settle(short > 0, lambda i: self._gpu_reject(i, gpus, "Insufficient"), s.gpu_name_of)
        for reason, passing in s.placement_masks(req):
            settle(~passing, lambda i, reason=reason: Reject(s.nodes[i].name, reason))
        counts: Counter[str] = Counter()
        for c, (make, subkey) in enumerate(makers):
            hit = np.flatnonzero(code == c)
            if not hit.size:
                continue
            if subkey is zeros:  # one reason for the whole family
                counts[make(int(hit[0])).reason] += int(hit.size)
                continue
            keys, first, sizes = np.unique(subkey[hit], return_index=True, return_counts=True)
            for position, size in zip(first, sizes):
                counts[make(int(hit[position])).reason] += int(size)
        failing = np.flatnonzero(code >= 0)[:MAX_REJECTS]
        rejects = tuple(makers[int(code[i])][0](int(i)) for i in failing)
        ordered = tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
        return Explanation(nodes=n, counts=ordered, rejects=rejects)

    def _resource_reject(self, i: int, row: int, amount: int) -> Reject:
        s = self.state
        name = s.resource_names[row]
        return Reject(s.nodes[i].name, "Too many pods" if name == PODS else f"Insufficient {name}", resource=name,
                      requested=amount, free=int(s.free[row, i]), capacity=int(s.capacity[row, i]))

    def _gpu_reject(self, i: int, gpus: np.ndarray, kind: str) -> Reject:
        s = self.state
        node = s.nodes[i]
        if kind == "gpu-slots-full":
            return Reject(node.name, "gpu-slots-full", resource=node.gpu_resource, requested=int(gpus[i]),
                          free=int(s.gpu_free[i] + s.free_slots[i]), capacity=int(s.gpu_capacity[i] + s.free_slots[i]))
        return Reject(node.name, f"Insufficient {node.gpu_resource}", resource=node.gpu_resource,
                      requested=int(gpus[i]), free=int(s.gpu_free[i]),
                      capacity=int(s.gpu_capacity[i]))

    def _pool_reject(self, req: PodRequest, table: StaticTable, i: int, shortfall: int) -> Reject:
        s = self.state
        pool = s.facts[i].pool or "?"
        held = s.model_name(i)
        models = (held,) if held else tuple(s.models[m] for m in np.flatnonzero(s.allowed[i]))
        accepted = [m for m in models if table.ok[table.row[i], s.model_index[m]]]
        if not accepted:
            wanted = ", ".join(models) or "none known"
            return Reject(s.nodes[i].name, f"no GPU model the pod accepts (node takes: {wanted})")
        p = s.pool_index[pool]
        free = max(int(s.pool_free[p, s.model_index[m]]) for m in accepted)
        return Reject(s.nodes[i].name, "pool-exhausted", resource=f"{pool}/{'|'.join(accepted)}", requested=shortfall,
                      free=free)


def _shape(req: PodRequest) -> tuple:
    """Everything `explain` reads of a pod, as a hashable key."""
    pod, r = req.pod, req.requests
    return (req.static_key, (r.milli_cpu, r.memory, r.ephemeral_storage, r.pods, tuple(sorted(r.scalar.items()))),
            pod.namespace, tuple(sorted(pod.labels.items())), pod.host_ports, _terms(pod.required_pod_affinity),
            _terms(pod.required_pod_anti_affinity))


def _terms(terms: tuple[PodAffinityTerm, ...]) -> tuple:
    return tuple((tuple(sorted(t.label_selector.match_labels.items())), t.label_selector.match_expressions,
                  t.topology_key, t.namespaces) for t in terms)
