"""Mean wait of one DDS configuration against the ideal pool (dds/sim/ideal.py), per workload over several seeds.

    .venv/bin/python hack/ideal_gap.py [--workloads kubecomp-w1,...] [--seeds 1,2,3] [--jobs 200]
        [--policy best-fit] [--gpu-idle-cooldown S] [--move-idle-gpus] [--no-reservations] [--reserve-after S]
        [--reserve-early S] [--no-release-idle-gpus] [--warm-gpus K]

One markdown row per workload: the configuration's mean wait and the ideal's (averaged over the seeds), the gap
(the configuration's summed waits over the ideal's, less one: seeds with long queues weigh more, a seed whose ideal
barely waits cannot blow the figure up), the same against the ideal pool under the configuration's reservation rule
(`ideal-reserving`, dds/sim/ideal.py; "-" with reservations off), GPUs held on average, the p95 of the 8-GPU jobs'
waits and the other jobs' mean wait (all seeds pooled; compare them with hack/starvation_bound.py's oracle). Options left out are `dds simulate`'s defaults (the controller's: dds/config.py). docs/simulation.md ("The ideal bound") was made with it.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Iterator, Optional, Sequence

from dds.commands.simulate import release_idle_from_args, reservations_from_args
from dds.sim.engine import SimResult, simulate
from dds.sim.ideal import ideal
from dds.sim.policies import POLICIES
from dds.sim.results import percentile, summarize
from dds.sim.workloads import WorkloadParams, build

KUBECOMP = ("kubecomp-w1", "kubecomp-w2", "kubecomp-w3", "kubecomp-w4")
LARGE_GPUS = 8


def row(workload: str, seeds: Sequence[int], jobs: Optional[int], args: argparse.Namespace) -> str:
    rule = reservations_from_args(args)
    runs: list[tuple[SimResult, SimResult, SimResult]] = []
    for seed in seeds:
        scenario = build(workload, WorkloadParams(seed=seed, jobs=jobs, gpu_idle_cooldown_s=args.gpu_idle_cooldown))
        result = simulate(scenario, POLICIES[args.policy], reservations=rule, moves=args.move_idle_gpus,
                          warm_gpus=args.warm_gpus, release_idle=release_idle_from_args(args))
        runs.append((result, ideal(scenario), ideal(scenario, rule)))
    waits = [_waits(r) for r, _, _ in runs]
    large = [j.wait_s for r, _, _ in runs for j in r.jobs if j.gpus >= LARGE_GPUS and j.wait_s is not None]
    others = [j.wait_s for r, _, _ in runs for j in r.jobs if j.gpus < LARGE_GPUS and j.wait_s is not None]
    held = statistics.mean(summarize(r).gpus_present_avg for r, _, _ in runs)
    plain = _against([(r, b) for r, b, _ in runs])
    reserving = _against([(r, b) for r, _, b in runs]) if rule.enabled else ("-", "-")
    return (f"| {workload} | {statistics.mean(map(statistics.mean, waits)):,.0f} s | {plain[0]} | {plain[1]} "
            f"| {reserving[0]} | {reserving[1]} | {held:.1f} "
            f"| {'-' if not large else f'{percentile(large, 0.95):,.0f} s'} "
            f"| {'-' if not large else f'{statistics.mean(others):,.0f} s'} |")


def _against(runs: Sequence[tuple[SimResult, SimResult]]) -> tuple[str, str]:
    """The bound's mean wait (averaged over the seeds) and the gap to it: summed waits over the bound's, less one."""
    waits = [_waits(r) for r, _ in runs]
    bound = [_waits(b) for _, b in runs]
    unrun = sum(summarize(r).never_started - summarize(b).never_started for r, b in runs)
    gap = sum(map(sum, waits)) / sum(map(sum, bound)) - 1.0 if sum(map(sum, bound)) else None
    return (f"{statistics.mean(map(statistics.mean, bound)):,.0f} s",
            "-" if gap is None or unrun else f"{gap:+.1%}")


def _waits(result: SimResult) -> list[float]:
    return [j.wait_s for j in result.jobs if j.wait_s is not None]


HEADER = ("| workload | mean wait | ideal | gap | ideal, reserving | gap, reserving | GPUs held | 8-GPU p95 "
          "| other jobs' mean |\n|---|---|---|---|---|---|---|---|---|")


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(KUBECOMP))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=200, help="jobs per generated workload (0: the workload's own)")
    parser.add_argument("--policy", default="best-fit", choices=[p for p, v in POLICIES.items() if v.moves_gpus])
    parser.add_argument("--gpu-idle-cooldown", type=float)
    parser.add_argument("--move-idle-gpus", action="store_true")
    parser.add_argument("--reservations", action="store_true")
    parser.add_argument("--no-reservations", action="store_true")
    parser.add_argument("--reserve-after", type=float, metavar="S", help="implies --reservations")
    parser.add_argument("--reserve-early", type=float, metavar="S", help="implies --reservations")
    parser.add_argument("--no-release-idle-gpus", action="store_true")
    parser.add_argument("--warm-gpus", type=int, default=0)
    return parser.parse_args(argv)


def rows(args: argparse.Namespace) -> Iterator[str]:
    seeds = [int(s) for s in args.seeds.split(",")]
    for workload in args.workloads.split(","):
        yield row(workload, seeds, args.jobs or None, args)


def main() -> None:
    print(HEADER)
    for line in rows(parse()):
        print(line, flush=True)


if __name__ == "__main__":
    main()
