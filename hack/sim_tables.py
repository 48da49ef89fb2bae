"""Regenerate the tables of docs/simulation.md (and docs/kueue.md's) from the simulator: `make sim-tables`.

    .venv/bin/python hack/sim_tables.py [--check] [--only NAME,...]

Each table sits between `<!-- generated: NAME -->` and `<!-- /generated: NAME -->` in docs/simulation.md and is
replaced in place; the text around it is left alone. Every run uses `dds simulate`'s defaults, which are the
controller's (dds/config.py, group defaults), unless the table says otherwise. `--check` writes nothing and exits 1
when a table would change. A full run takes about five minutes on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import ideal_gap
import starvation_bound
from dds.commands.simulate import release_idle_from_args, reservations_from_args
from dds.planner.reservations import ReservationConfig
from dds.sim.engine import SimResult, simulate
from dds.sim.ideal import IDEAL_POLICY, IDEAL_RESERVING, ideal
from dds.sim.policies import POLICIES, parse_policies
from dds.sim.results import Summary, admission, baseline_name, compare, summarize
from dds.sim.scenario import Scenario, gpu_only
from dds.sim.workloads import WorkloadParams, build

DOC = Path(__file__).resolve().parents[1] / "docs" / "simulation.md"
KUEUE_DOC = DOC.with_name("kueue.md")
SEEDS = "1,2,3"
# The defaults before issue 41: a 60 s GPU cooldown in simulations, no reservations, idle GPUs never released early.
BEFORE = ("--gpu-idle-cooldown", "60", "--no-reservations", "--no-release-idle-gpus")
SHORT = {"static-concentrated": "static-conc."}


def _run(workload: str, policy: str, seed: int = 1, warm: int = 0, memory: bool = True) -> SimResult:
    """`memory=False`: the workload GPU-only (its pools' CXL memory taken out, dds.sim.scenario.gpu_only)."""
    scenario = build(workload, WorkloadParams(seed=seed))
    return _simulate(scenario if memory else gpu_only(scenario), policy, warm)


def _reservations() -> ReservationConfig:
    """The defaults' reservation rule (`dds simulate`'s, the controller's)."""
    return reservations_from_args(ideal_gap.parse([]))


def _simulate(scenario: Scenario, policy: str, warm: int = 0) -> SimResult:
    """`scenario` under `policy` with `dds simulate`'s defaults."""
    defaults = ideal_gap.parse([])
    return simulate(scenario, POLICIES[policy], reservations=reservations_from_args(defaults),
                    release_idle=release_idle_from_args(defaults), warm_gpus=warm)


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f} s"


def ideal_gap_table(flags: Sequence[str]) -> str:
    """W1-W4 at 200 jobs (the issue's reference), then W4 at its own 50 jobs, multi-pool and elastic."""
    long = [line.replace(" |", " (200 jobs) |", 1)
            for line in ideal_gap.rows(ideal_gap.parse(["--seeds", SEEDS, *flags]))]
    own = ideal_gap.rows(ideal_gap.parse(["--seeds", SEEDS, "--jobs", "0", "--workloads",
                                          "kubecomp-w4,kubecomp-multipool,elastic", *flags]))
    return "\n".join([ideal_gap.HEADER, *long, *own])


def large_jobs_table() -> str:
    lines = ["| seed | 8-GPU waits, before | other jobs' mean, before | 8-GPU waits, defaults | other jobs' mean, "
             "defaults | ideal-reserving: 8-GPU waits | ideal-reserving: other jobs' mean "
             "| oracle: 8-GPU waits ≤ 900 s | oracle: other jobs' mean | defaults over the oracle |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for seed in (int(s) for s in SEEDS.split(",")):
        before = _large_and_others(_before_run(seed))
        after = _large_and_others(_run("kubecomp-w4", "best-fit", seed))
        bound = _large_and_others(ideal(build("kubecomp-w4", WorkloadParams(seed=seed)), _reservations()))
        _, _, best = starvation_bound.oracle(seed)
        oracle_large, oracle_others = (best[1], best[0]) if best else ([], None)
        gap = "-" if oracle_others is None else f"{after[1] / oracle_others - 1:+.0%}"
        lines.append(f"| {seed} | {_waits(before[0])} | {before[1]:,.0f} s | {_waits(after[0])} | {after[1]:,.0f} s "
                     f"| {_waits(bound[0])} | {bound[1]:,.0f} s "
                     f"| {_waits(oracle_large)} | {_seconds(oracle_others)} | {gap} |")
    return "\n".join(lines)


def _before_run(seed: int) -> SimResult:
    args = ideal_gap.parse(list(BEFORE))
    scenario = build("kubecomp-w4", WorkloadParams(seed=seed, gpu_idle_cooldown_s=args.gpu_idle_cooldown))
    return simulate(scenario, POLICIES["best-fit"], reservations=reservations_from_args(args),
                    release_idle=release_idle_from_args(args))


def _large_and_others(result: SimResult) -> tuple[list[float], float]:
    large = [j.wait_s for j in result.jobs if j.gpus >= ideal_gap.LARGE_GPUS and j.wait_s is not None]
    others = [j.wait_s for j in result.jobs if j.gpus < ideal_gap.LARGE_GPUS and j.wait_s is not None]
    return large, statistics.mean(others)


def _waits(values: Sequence[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values) + " s" if values else "-"


def results_table() -> str:
    policies = [p.name for p in parse_policies("all")]
    header = ["workload", "baseline"] + [SHORT.get(p, p) for p in policies] + ["ideal", "ideal, reserving"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workload in ("kubecomp-w1", "kubecomp-w2", "kubecomp-w3", "kubecomp-w4", "kubecomp-ae",
                     "kubecomp-multipool"):
        scenario = build(workload, WorkloadParams(seed=1))
        results = [_run(workload, p) for p in policies] + [ideal(scenario), ideal(scenario, _reservations())]
        summaries = compare(results, scenario.baseline)
        base = baseline_name(summaries, scenario.baseline)
        cells = [_result_cell(s, base) for s in summaries]
        lines.append(f"| {workload} | {SHORT.get(base or '-', base or '-')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _result_cell(summary: Summary, base: Optional[str]) -> str:
    never = f" [{summary.never_started} never]" if summary.never_started else ""
    if summary.wait_mean_s is None:
        return never.strip()
    # No ratio for the baseline itself, the bound, or a policy that left jobs unrun (its mean leaves them out).
    ratio = ("" if summary.policy in (base, IDEAL_POLICY, IDEAL_RESERVING) or summary.wait_vs_baseline is None or never
             else f" ({summary.wait_vs_baseline:+.0%})".replace("-", "−"))
    return f"{summary.wait_mean_s:,.0f}{ratio}{never}"


def reallocation_table() -> str:
    lines = ["| mean gap | best-fit | least-demand | spread | concentrated |", "|---|---|---|---|---|"]
    for gap in (30, 60, 120):
        cells = []
        for policy in ("best-fit", "least-demand", "spread", "concentrated"):
            s = summarize(_run(f"kubecomp-realloc-{gap}", policy))
            cells.append(f"{s.gpus_reallocated} ({s.gpus_attached})")
        lines.append(f"| {gap} s | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def elastic_table() -> str:
    lines = ["| policy | mean wait | GPU utilization | GPUs held (avg) | nodes added |", "|---|---|---|---|---|"]
    results = [_run("elastic", p) for p in ("node-only", "best-fit", "least-demand", "spread", "concentrated")]
    elastic = build("elastic", WorkloadParams(seed=1))
    for s in [summarize(r) for r in results + [ideal(elastic), ideal(elastic, _reservations())]]:
        added = "-" if s.policy in (IDEAL_POLICY, IDEAL_RESERVING) else str(s.nodes_added)
        lines.append(f"| {s.policy} | {_seconds(s.wait_mean_s)} | {s.gpu_utilization:.0%} | {s.gpus_present_avg:.1f} "
                     f"| {added} |")
    return "\n".join(lines)


def warm_table() -> str:
    lines = ["| workload | K | mean wait | p50 | p95 | GPUs held (avg) | attaches |", "|---|---|---|---|---|---|---|"]
    for workload in ("kubecomp-w1", "kubecomp-w2", "kubecomp-w3", "kubecomp-w4", "elastic"):
        runs = [summarize(_run(workload, "best-fit", warm=k)) for k in (0, 1, 2)]

        def joined(values: Sequence[str]) -> str:
            return " / ".join(values)
        lines.append(f"| {workload} | 0 / 1 / 2 | {joined([f'{s.wait_mean_s:,.0f}' for s in runs])} s "
                     f"| {joined([f'{s.wait_p50_s:,.0f}' for s in runs])} s "
                     f"| {joined([f'{s.wait_p95_s:,.0f}' for s in runs])} s "
                     f"| {joined([f'{s.gpus_present_avg:.1f}' for s in runs])} "
                     f"| {joined([str(s.gpus_attached) for s in runs])} |")
    return "\n".join(lines)


def gangs_table() -> str:
    lines = ["| policy | mean wait | never ran | GPUs held (avg) | attached / detached | stranded GPU-seconds |",
             "|---|---|---|---|---|---|"]
    names = {"best-fit": "best-fit (gang-aware)", "gang-unaware": "gang-unaware (best-fit, pod by pod)",
             "static": "static 4/4/4/4", IDEAL_POLICY: "ideal"}
    results = [_run("gangs", p) for p in ("best-fit", "gang-unaware", "static")]
    for s in [summarize(r) for r in results] + [summarize(ideal(build("gangs", WorkloadParams(seed=1))))]:
        lines.append(f"| {names[s.policy]} | {_seconds(s.wait_mean_s)} | {s.never_started} | "
                     f"{s.gpus_present_avg:.1f} | {s.gpus_attached:,} / {s.gpus_detached:,} | "
                     f"{s.gpu_stranded_s:,.0f} |")
    return "\n".join(lines)


def cxl_memory_table() -> str:
    """`cxl-memory`, best-fit, seeds 1-3: with the pool's CXL memory against GPU-only, and the ideal bound of each."""
    lines = ["| seed | run | mean wait | p95 wait | node-hours | peak nodes | nodes added | CXL chunks attached "
             "| CXL memory held (avg) | ideal mean wait |", "|---|---|---|---|---|---|---|---|---|---|"]
    for seed in (int(s) for s in SEEDS.split(",")):
        scenario = build("cxl-memory", WorkloadParams(seed=seed))
        memory, alone = (summarize(_run("cxl-memory", "best-fit", seed, memory=m)) for m in (True, False))
        bounds = [summarize(ideal(s)) for s in (scenario, gpu_only(scenario))]
        for name, s, bound in (("CXL memory", memory, bounds[0]), ("GPU-only", alone, bounds[1])):
            lines.append(f"| {seed} | {name} | {_seconds(s.wait_mean_s)} | {_seconds(s.wait_p95_s)} | "
                         f"{s.node_hours:.1f} | {s.nodes_peak} | {s.nodes_added} | {s.cxl_chunks_attached} | "
                         f"{s.cxl_memory_avg_gib:,.0f} GiB | {_seconds(bound.wait_mean_s)} |")
        lines.append(f"| {seed} | memory / GPU-only | {_ratio(memory.wait_mean_s, alone.wait_mean_s)} | "
                     f"{_ratio(memory.wait_p95_s, alone.wait_p95_s)} | {_ratio(memory.node_hours, alone.node_hours)} "
                     f"| {_ratio(memory.nodes_peak, alone.nodes_peak)} | {_ratio(memory.nodes_added, alone.nodes_added)} "
                     f"| | | |")
    return "\n".join(lines)


KUEUE_GAPS = ((600.0, "default"), (2400.0, "sparse"))


def kueue_table() -> str:
    """`kueue`: node-only (CA's best-effort-atomic class) against best-fit (DDS's class), seeds 1-3, the default
    arrivals and sparse ones; the last column of each pair of rows is DDS over node-only."""
    lines = ["| arrivals | seed | policy | admitted p50 / p95 | all Running p50 / p95 / max | from quota p50 / p95 "
             "| GPUs held (avg) | nodes added |", "|---|---|---|---|---|---|---|---|"]
    for gap, label in KUEUE_GAPS:
        for seed in (int(s) for s in SEEDS.split(",")):
            scenario = build("kueue", WorkloadParams(seed=seed, mean_interval_s=gap))
            rows = []
            for policy in ("node-only", "best-fit"):
                result = _simulate(scenario, policy)
                rows.append((policy, admission(result), summarize(result)))
            for policy, a, s in rows:
                lines.append(f"| {label} ({gap:,.0f} s) | {seed} | {policy} "
                             f"| {_secs(a.admitted_p50_s, a.admitted_p95_s)} "
                             f"| {_secs(a.running_p50_s, a.running_p95_s, a.running_max_s)} "
                             f"| {_secs(a.from_quota_p50_s, a.from_quota_p95_s)} | {s.gpus_present_avg:.1f} "
                             f"| {s.nodes_added} |")
            (_, base, base_s), (_, dds, dds_s) = rows
            lines.append(f"| | {seed} | best-fit / node-only | | "
                         f"{_ratio(dds.running_p50_s, base.running_p50_s)} / "
                         f"{_ratio(dds.running_p95_s, base.running_p95_s)} | "
                         f"{_ratio(dds.from_quota_p50_s, base.from_quota_p50_s)} / "
                         f"{_ratio(dds.from_quota_p95_s, base.from_quota_p95_s)} | "
                         f"{_ratio(dds_s.gpus_present_avg, base_s.gpus_present_avg)} | |")
    return "\n".join(lines)


def _secs(*values: Optional[float]) -> str:
    return " / ".join("-" if v is None else f"{v:,.0f}" for v in values) + " s"


def _ratio(mine: Optional[float], theirs: Optional[float]) -> str:
    return "-" if mine is None or not theirs else f"**{mine / theirs:.2f}x**"


TABLES: Mapping[str, Callable[[], str]] = {
    "ideal-gap": lambda: ideal_gap_table(()),
    "ideal-gap-before": lambda: ideal_gap_table(BEFORE),
    "large-jobs": large_jobs_table,
    "results": results_table,
    "reallocation": reallocation_table,
    "elastic": elastic_table,
    "warm": warm_table,
    "gangs": gangs_table,
    "cxl-memory": cxl_memory_table,
    "kueue": kueue_table,
}
TABLE_DOCS: Mapping[str, Path] = {"kueue": KUEUE_DOC}  # the others are DOC's


def replace_block(text: str, name: str, table: str) -> str:
    doc = TABLE_DOCS.get(name, DOC)
    pattern = re.compile(rf"(<!-- generated: {re.escape(name)} -->\n).*?(<!-- /generated: {re.escape(name)} -->)",
                         re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc}: no '<!-- generated: {name} -->' ... '<!-- /generated: {name} -->' block")
    return pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table would change")
    parser.add_argument("--only", help=f"comma-separated tables of: {', '.join(TABLES)}")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(TABLES)
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        parser.error(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(TABLES)}")
    texts = {doc: doc.read_text() for doc in {TABLE_DOCS.get(n, DOC) for n in names}}
    originals = dict(texts)
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        doc = TABLE_DOCS.get(name, DOC)
        texts[doc] = replace_block(texts[doc], name, TABLES[name]())
    if args.check:
        return 1 if texts != originals else 0
    for doc, text in texts.items():
        doc.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
