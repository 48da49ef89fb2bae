"""`dds simulate`: compare scaling policies on a built-in workload or your own trace, in virtual time.

    dds simulate --workload kubecomp-w4 --policies all --seed 1 --out results/w4
    dds simulate --trace examples/traces/small.csv --policies best-fit,node-only
    dds simulate --list

Every policy runs the production planner (dds.planner) on the same jobs; the last row, `ideal`, is the bound (an ideal
pool: dds/sim/ideal.py) and "vs ideal" each policy's gap to it; with reservations on (the default) and a large job,
`ideal-reserving` is the same pool under DDS's reservation rule for large GPU requests and "vs reserving" the gap to
it. On a cluster whose pools hold CXL memory (the `cxl-memory` workload), each attach-first policy also runs GPU-only (`<policy>/gpu-only`: no CXL memory) and a second
table compares the two: waits, node-hours, peak nodes. The tables go to stdout; summary.csv, jobs.csv, timeline.csv
(memory.csv), wait_cdf.png and gpus_over_time.png (nodes_and_memory.png) go to --out. Trace format and policies: docs/simulation.md.
Exit codes: 0 done, 2 bad flags or an unreadable trace.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

from dds.config import Settings
from dds.planner.reservations import ReservationConfig
from dds.sim.engine import SimResult, simulate
from dds.sim.ideal import IDEAL_POLICY, asks_for_reservations, ideal
from dds.sim.policies import GANG_BASELINE, POLICIES, Mode, Policy, parse_policies
from dds.sim.progress import ProgressBar
from dds.sim.results import (MemoryEffect, baseline_name, compare, jobs_csv, memory_csv, memory_effects,
                             render_admission_table, render_legend, render_memory_table, render_table, summaries_csv,
                             timeline_csv, unrun_warning)
from dds.sim.scenario import GPU_ONLY_SUFFIX, Scenario, Timing, gpu_only
from dds.sim.trace import TraceError, dump_csv, load_trace
from dds.sim.workloads import BUILTIN, WorkloadParams, build, trace_scenario

EXIT_USAGE = 2
DEFAULT_WORKLOAD = "kubecomp-w4"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("simulate", help="compare scaling policies on a workload or trace (virtual time)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", help=f"built-in workload (default {DEFAULT_WORKLOAD}; see --list); with "
                                           "--trace: the cluster to run the trace on (default: elastic)")
    parser.add_argument("--trace", type=Path, help="your jobs: a .csv or .jsonl trace (docs/simulation.md)")
    parser.add_argument("--policies", default="all", help="'all' or a comma-separated list (see --list)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload generator (default 1)")
    parser.add_argument("--out", type=Path, help="directory for CSV and PNG files (default sim-out/<workload>)")
    parser.add_argument("--jobs", type=_positive_int, help="number of jobs of a generated workload")
    parser.add_argument("--mean-interval", type=_positive_float, help="mean gap between arrivals (s), generated")
    parser.add_argument("--pools", type=_positive_int, help="number of pools (kubecomp-multipool)")
    parser.add_argument("--attach-latency", type=_non_negative_float, help="seconds per attach (default 30)")
    parser.add_argument("--detach-latency", type=_non_negative_float, help="seconds per detach (default 10)")
    parser.add_argument("--node-provision", type=_non_negative_float,
                        help="seconds from a node request to a Ready node (default 600)")
    parser.add_argument("--loop-interval", type=_positive_float, help="seconds between scale steps (default 10)")
    parser.add_argument("--gpu-idle-cooldown", type=_non_negative_float,
                        help="seconds a GPU stays idle before it is detached (default 300, as a group without "
                             "dds.cdi.dev/gpu-idle-cooldown)")
    parser.add_argument("--solver", choices=("greedy", "auto", "milp"), default="greedy",
                        help="planner batch solver for scale steps (default greedy: reproducible at any CPU speed)")
    parser.add_argument("--reservations", action="store_true",
                        help="reserve a node for a large GPU pod (dds/planner/reservations.py; on by default, as the "
                             "controller's `reservations` setting: docs/reservations.md)")
    parser.add_argument("--no-reservations", action="store_true",
                        help="no reservations (the controller's `reservations: false`); flags naming one win")
    parser.add_argument("--reserve-after", type=_non_negative_float,
                        help="with reservations (implies --reservations): seconds a large GPU pod waits first")
    parser.add_argument("--reserve-early", type=_non_negative_float, metavar="S",
                        help="with reservations (implies --reservations): from S seconds on (default 0, the "
                             "controller's reservation_quiet_age_seconds), reserve before --reserve-after while at "
                             "most one other pending pod could use the node's GPUs")
    parser.add_argument("--warm-gpus", type=int, default=0, metavar="K",
                        help="warm headroom: idle GPUs each group keeps attached and refills (dds.cdi.dev/warm-gpus)")
    parser.add_argument("--move-idle-gpus", action="store_true",
                        help="release idle GPUs at once when pending pods elsewhere would get them, and keep one "
                             "pod's worth of idle GPUs on every node with room for one more GPU pod (experimental; "
                             "meant for a long idle cooldown, e.g. --gpu-idle-cooldown 600)")
    parser.add_argument("--no-release-idle-gpus", action="store_true",
                        help="idle GPUs wait out their cooldown even when pending pods elsewhere would get them (the "
                             "controller's `release_idle_gpus: false`; released at once by default)")
    parser.add_argument("--save-trace", type=Path, help="also write the jobs simulated as a CSV trace")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-files", action="store_true", help="print the table only; write nothing")
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr (auto: when stderr is a terminal)")
    parser.add_argument("--list", action="store_true", help="list workloads and policies, then exit")
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(_listing())
        return 0
    try:
        policies = parse_policies(args.policies)
        scenario = scenario_from_args(args)
    except (TraceError, ValueError) as exc:
        print(f"dds simulate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    policies = with_gang_baseline(scenario, policies)
    if scenario.kueue is not None:  # a ProvisioningRequest needs an autoscaler: DDS's class, or CA's under node-only
        policies = tuple(p for p in policies if p.mode != Mode.STATIC)
    if args.warm_gpus < 0:
        print("dds simulate: --warm-gpus must be >= 0", file=sys.stderr)
        return EXIT_USAGE
    reservations = reservations_from_args(args)
    settings = (args.progress, args.solver, reservations, args.move_idle_gpus, args.warm_gpus,
                release_idle_from_args(args))
    results, seconds = run_policies(scenario, policies, *settings)
    twins = gpu_only_policies(scenario, policies)
    if twins:  # the same policies without CXL memory, to compare with (issue 43)
        more, more_seconds = run_policies(gpu_only(scenario), twins, *settings)
        results += [replace(r, policy=r.policy + GPU_ONLY_SUFFIX) for r in more]
        seconds += more_seconds
    if scenario.kueue is None:  # the ideal pool has no queue: no bound for jobs that wait on Kueue's quota
        started = time.perf_counter()
        results.append(ideal(scenario))  # the bound every policy's row is measured against ("vs ideal")
        seconds.append(time.perf_counter() - started)
        if asks_for_reservations(scenario, reservations) and any(p.moves_gpus for p in policies):
            # and the bound of a policy that serves the large jobs
            started = time.perf_counter()
            results.append(ideal(scenario, reservations))
            seconds.append(time.perf_counter() - started)
    if twins:  # and the GPU-only rows against the GPU-only cluster's
        started = time.perf_counter()
        results.append(replace(ideal(gpu_only(scenario)), policy=IDEAL_POLICY + GPU_ONLY_SUFFIX))
        seconds.append(time.perf_counter() - started)
    summaries = compare(results, scenario.baseline)
    print(f"workload {scenario.name}: {scenario.description}")
    for note in scenario.notes:
        print(f"  - {note}")
    print(f"  - {len(scenario.jobs)} jobs; attach {scenario.timing.attach_s:g}s, detach {scenario.timing.detach_s:g}s,"
          f" node {scenario.timing.node_provision_s:g}s, loop {scenario.timing.loop_interval_s:g}s")
    print()
    print(render_table(summaries))
    base = baseline_name(summaries, scenario.baseline)
    warning = unrun_warning(summaries)
    if warning:
        print(f"\n{warning}")
    print("\n" + render_legend())
    if scenario.kueue is not None:
        print("\n" + KUEUE_HEADING)
        print(render_admission_table(results))
        print(KUEUE_LEGEND)
    effects = memory_effects(summaries, GPU_ONLY_SUFFIX)
    if effects:
        print("\n" + MEMORY_HEADING)
        print(render_memory_table(effects))
        print(MEMORY_LEGEND)
    if base:
        print(f"\n'vs base' = mean wait relative to {base}. Simulated in "
              + ", ".join(f"{r.policy} {s:.1f}s" for r, s in zip(results, seconds)) + " (wall clock).")
    if args.no_files:
        return 0
    out = args.out or Path("sim-out") / scenario.name
    written = write_outputs(out, scenario, results, summaries_csv(summaries), plots=not args.no_plots, effects=effects)
    if args.save_trace:
        args.save_trace.parent.mkdir(parents=True, exist_ok=True)
        args.save_trace.write_text(dump_csv(scenario.jobs))
        written.append(args.save_trace)
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    defaults = Timing()
    timing = Timing(
        attach_s=_pick(args.attach_latency, defaults.attach_s),
        detach_s=_pick(args.detach_latency, defaults.detach_s),
        node_provision_s=_pick(args.node_provision, defaults.node_provision_s),
        loop_interval_s=_pick(args.loop_interval, defaults.loop_interval_s))
    params = WorkloadParams(seed=args.seed, jobs=args.jobs, mean_interval_s=args.mean_interval, pools=args.pools,
                            gpu_idle_cooldown_s=args.gpu_idle_cooldown, timing=timing)
    if args.trace is None:
        return build(args.workload or DEFAULT_WORKLOAD, params)
    jobs = load_trace(args.trace)
    if args.workload is None:
        return trace_scenario(jobs, params, name=args.trace.stem)
    base = build(args.workload, replace(params, jobs=1))
    return replace(base, name=args.trace.stem, jobs=jobs, notes=(f"{len(jobs)} jobs from {args.trace}",),
                   description=f"trace {args.trace.name} on the {args.workload} cluster")


def with_gang_baseline(scenario: Scenario, policies: Sequence[Policy]) -> tuple[Policy, ...]:
    """Jobs in gangs are compared with the gang-unaware planner in the same run (added once, after the rest)."""
    if not any(j.group for j in scenario.jobs) or any(not p.gang_aware for p in policies):
        return tuple(policies)
    if not any(p.moves_gpus for p in policies):
        return tuple(policies)
    return tuple(policies) + (POLICIES[GANG_BASELINE],)


def gpu_only_policies(scenario: Scenario, policies: Sequence[Policy]) -> tuple[Policy, ...]:
    """The policies to run again GPU-only: the attach-first ones, when the scenario's pools hold CXL memory some group
    takes (the others attach nothing, memory included: their GPU-only run would be the same run)."""
    if not scenario.cluster.takes_cxl_memory():
        return ()
    return tuple(p for p in policies if p.moves_gpus)


KUEUE_HEADING = ("Kueue admission: every job's pods are created only once its ProvisioningRequest is Provisioned "
                 "(DDS's class under the attach-first policies, cluster-autoscaler's best-effort-atomic-scale-up "
                 "under node-only), the same jobs, quota and latencies:")
KUEUE_LEGEND = ("  admitted: seconds from the job's creation to Provisioned=True (Kueue admits it; CA's class says it "
                "when it asks for the nodes, DDS's when the GPUs are attached); all Running: from the job's creation "
                "to the last of its pods started, the wait for quota included; from quota: from its (last) request, "
                "created when it got quota, to all Running (the autoscaler's part); retried: jobs whose request "
                "failed and was tried again; p50/node-only, p95/node-only: all Running over node-only's (below 1 = "
                "sooner)")
MEMORY_HEADING = ("CXL memory against GPU-only: the same jobs, each attach-first policy again with no CXL memory in the "
                  "pools (a pod short of memory on every node then waits for a new node):")
MEMORY_LEGEND = ("  memory/GPU-only: the memory run's figure over the GPU-only run's (below 1 = less with CXL memory); "
                 "node-hours: nodes that exist, integrated from the first arrival to the last finish; CXL GiB (avg): "
                 "memory attached to nodes, time-averaged")


def _pick(value: Optional[float], default: float) -> float:
    return default if value is None else value


def reservations_from_args(args: argparse.Namespace) -> ReservationConfig:
    """The controller's defaults (dds/config.py Settings), changed only by the flags given."""
    defaults = Settings.model_fields
    enabled = not args.no_reservations and defaults["reservations"].default
    return ReservationConfig(enabled=(enabled or args.reservations or args.reserve_after is not None
                                      or args.reserve_early is not None),
                             min_age_seconds=_pick(args.reserve_after, defaults["reservation_min_age_seconds"].default),
                             large_fraction=defaults["reservation_large_fraction"].default,
                             quiet_age_seconds=_pick(args.reserve_early,
                                                     defaults["reservation_quiet_age_seconds"].default))


def release_idle_from_args(args: argparse.Namespace) -> bool:
    """The controller's release_idle_gpus default, unless told not to."""
    return not args.no_release_idle_gpus and Settings.model_fields["release_idle_gpus"].default


def run_policies(scenario: Scenario, policies: Sequence[Policy], progress: str = "auto", solver: str = "greedy",
                 reservations: ReservationConfig = ReservationConfig(enabled=False), moves: bool = False,
                 warm_gpus: int = 0, release_idle: bool = False) -> tuple[list[SimResult], list[float]]:
    results, seconds = [], []
    enabled = {"auto": None, "always": True, "never": False}[progress]
    for policy in policies:
        bar = ProgressBar(policy.name, enabled=enabled)
        started = time.perf_counter()  # wall time of the run, reported to the user; the simulation itself is virtual
        results.append(simulate(scenario, policy, progress=bar.update, batch_solver=solver, reservations=reservations,
                                moves=moves, warm_gpus=warm_gpus, release_idle=release_idle))
        seconds.append(time.perf_counter() - started)
        bar.close()
    return results, seconds


def write_outputs(out: Path, scenario: Scenario, results: Sequence[SimResult], summary_csv: str,
                  plots: bool = True, effects: Sequence[MemoryEffect] = ()) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    files = [("summary.csv", summary_csv), ("jobs.csv", jobs_csv(results)), ("timeline.csv", timeline_csv(results))]
    if effects:
        files.append(("memory.csv", memory_csv(effects)))
    for name, text in files:
        path = out / name
        path.write_text(text)
        written.append(path)
    if plots and not _have_matplotlib():
        # A plain install (without the `sim` extra) still simulates: the tables and CSVs are the results.
        print("note: no plots (matplotlib is not installed: pip install 'dds[sim]'); the CSV files have every figure")
    elif plots:
        from dds.sim.plots import gpus_over_time, wait_cdf

        written.append(wait_cdf(results, out / "wait_cdf.png", scenario.name))
        written.append(gpus_over_time(results, out / "gpus_over_time.png", scenario.name))
        if effects:
            from dds.sim.plots import nodes_with_and_without_memory

            written.append(nodes_with_and_without_memory(results, GPU_ONLY_SUFFIX, out / "nodes_and_memory.png",
                                                         scenario.name))
    return written


def _have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _listing() -> str:
    lines = ["workloads:"]
    lines += [f"  {name:<22} {description}" for name, (description, _) in BUILTIN.items()]
    lines.append("policies (--policies all, or a comma-separated list):")
    lines += [f"  {p.name:<22} {p.description}" for p in POLICIES.values()]
    return "\n".join(lines)
