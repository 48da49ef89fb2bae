"""How low could the other jobs' mean wait be, at best, when the 8-GPU jobs must start within a bound?

An oracle, not DDS: a KubeComp testbed where GPUs move between the two nodes instantly, every job's duration is
known, and the two 8-GPU jobs' start times are chosen by brute force (every pair on a grid) within `bound` seconds of
their arrival. Other jobs are started as kube-scheduler would (oldest first, a later one when an earlier one does not
fit), but never when that would delay a planned 8-GPU start (EASY backfill with exact durations). Its "never"
line is the same pool with no reservations (the large jobs start when 8 GPUs happen to be free).

    .venv/bin/python hack/starvation_bound.py [--seed 1] [--bound 900] [--step 10]

Used in docs/simulation.md (Starvation) as the lower bound no reservation policy can beat on this trace.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

from dds.sim.trace import Job
from dds.sim.workloads import KUBECOMP_NODE_CORES, WorkloadParams, build

POOL_GPUS = 8
NODES = 2


@dataclass
class _Pool:
    """Running jobs as (end, gpus, node, cores); GPUs are one pool, cores are per node."""

    running: list[tuple[float, int, int, int]] = field(default_factory=list)

    def free_gpus(self) -> int:
        return POOL_GPUS - sum(r[1] for r in self.running)

    def node_for(self, job: Job) -> Optional[int]:
        for node in range(NODES):
            used = sum(r[3] for r in self.running if r[2] == node)
            if KUBECOMP_NODE_CORES - used >= job.milli_cpu // 1000:
                return node
        return None

    def freed_by(self, instant: float) -> int:
        return sum(r[1] for r in self.running if r[0] <= instant)


def _blocks_a_large_start(pool: _Pool, job: Job, now: float, planned: dict[str, float],
                          started: dict[str, float]) -> bool:
    end = now + job.duration_s
    for name, start in planned.items():
        if name not in started and end > start:
            if pool.free_gpus() - job.gpus + pool.freed_by(start) < POOL_GPUS:
                return True
    return False


def _start_one(pool: _Pool, pending: list[Job], now: float, planned: dict[str, float],
               started: dict[str, float]) -> bool:
    for job in pending:
        if job.name in planned:
            if now < planned[job.name] or pool.free_gpus() < job.gpus:
                continue
        elif job.gpus > pool.free_gpus() or _blocks_a_large_start(pool, job, now, planned, started):
            continue
        node = pool.node_for(job)
        if node is None:
            continue
        pool.running.append((now + job.duration_s, job.gpus, node, job.milli_cpu // 1000))
        started[job.name] = now
        pending.remove(job)
        return True
    return False


def run(jobs: Sequence[Job], planned: dict[str, float]) -> dict[str, float]:
    """Start times of every job, the large ones held to start no earlier than `planned` (by name)."""
    pool, pending, started = _Pool(), [], {}
    arrivals = sorted(jobs, key=lambda j: j.arrival_s)
    index, now = 0, 0.0
    while index < len(arrivals) or pending:
        instants = [r[0] for r in pool.running] + [s for n, s in planned.items() if n not in started and s > now]
        if index < len(arrivals):
            instants.append(arrivals[index].arrival_s)
        if not instants:
            break  # what still waits can never start
        now = min(instants)
        pool.running = [r for r in pool.running if r[0] > now]
        while index < len(arrivals) and arrivals[index].arrival_s <= now:
            pending.append(arrivals[index])
            index += 1
        while _start_one(pool, pending, now, planned, started):
            pass
    return started


def waits(jobs: Sequence[Job], started: dict[str, float], large: bool) -> list[float]:
    return [started[j.name] - j.arrival_s for j in jobs if (j.gpus >= POOL_GPUS) == large and j.name in started]


def oracle(seed: int, bound: float = 900.0, step: float = 10.0
           ) -> tuple[list[float], float, Optional[tuple[float, list[float]]]]:
    """kubecomp-w4 of `seed`: the 8-GPU waits and the other jobs' mean when never reserved, and the best other jobs'
    mean with every 8-GPU job started within `bound` (with those jobs' waits), None when no start times do."""
    jobs = build("kubecomp-w4", WorkloadParams(seed=seed)).jobs
    large = [j for j in jobs if j.gpus >= POOL_GPUS]
    never = run(jobs, {})
    steps = int(bound // step) + 1
    best: Optional[tuple[float, list[float]]] = None
    for grid in _grid(len(large), steps):
        planned = {j.name: j.arrival_s + k * step for j, k in zip(large, grid)}
        started = run(jobs, planned)
        big = waits(jobs, started, True)
        if len(big) < len(large) or max(big) > bound:
            continue
        mean = statistics.mean(waits(jobs, started, False))
        if best is None or mean < best[0]:
            best = (mean, big)
    return waits(jobs, never, True), statistics.mean(waits(jobs, never, False)), best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bound", type=float, default=900.0, help="the 8-GPU jobs' longest wait (s)")
    parser.add_argument("--step", type=float, default=10.0, help="grid of the start times tried (s)")
    args = parser.parse_args()
    never_large, never_others, best = oracle(args.seed, args.bound, args.step)
    print(f"never reserved: 8-GPU waits {sorted(round(w) for w in never_large)}, "
          f"other jobs' mean {never_others:.0f}s")
    if best is None:
        print(f"no start times within {args.bound:.0f}s")
        return
    print(f"best start times within {args.bound:.0f}s: 8-GPU waits {[round(w) for w in best[1]]}, "
          f"other jobs' mean {best[0]:.0f}s")


def _grid(dimensions: int, steps: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for _ in range(dimensions):
        out = [point + (k,) for point in out for k in range(steps)]
    return out


if __name__ == "__main__":
    main()
