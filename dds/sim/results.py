"""From raw simulation results to what people compare: one summary row per policy, as a table and as CSV."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, fields
from typing import Optional, Sequence

from dds.sim.engine import SimResult
from dds.sim.ideal import IDEAL_POLICY, IDEAL_RESERVING
from dds.sim.policies import POLICIES
from dds.sim.scenario import GPU_ONLY_SUFFIX

# Fallback references for the mean-wait comparison, when the scenario's own baseline is absent or left jobs unrun
# (its mean would then leave out the hardest jobs and flatter it).
BASELINE_ORDER = ("static", "node-only", "static-concentrated")
GiB = 2**30


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    never_started: int  # jobs that no node could ever run under this policy (e.g. 8 GPUs on 4-GPU nodes)
    wait_mean_s: Optional[float]  # over the jobs that started
    wait_p50_s: Optional[float]
    wait_p95_s: Optional[float]
    makespan_s: float  # first arrival to last finish
    gpu_utilization: float  # GPU-seconds used by jobs / GPU-seconds present on nodes
    gpus_present_avg: float  # GPUs visible on nodes, time-averaged (what was powered and held)
    gpus_attached: int
    gpus_detached: int
    gpus_reallocated: int
    nodes_added: int
    nodes_removed: int
    wait_vs_baseline: Optional[float] = None  # mean wait relative to the baseline policy: -0.3 = 30% shorter
    # GPU-seconds of GPUs attached for gangs that could not start yet, unused meanwhile.
    gpu_stranded_s: float = 0.0
    # Mean wait relative to the ideal pool's (dds/sim/ideal.py), the bound: +0.05 = 5% longer than the bound.
    wait_vs_ideal: Optional[float] = None
    # The same against the ideal pool under DDS's reservations for large GPU requests (`ideal-reserving`): the bound
    # of a policy that serves large jobs, shown for the policies that move GPUs when reservations are on.
    wait_vs_reserving: Optional[float] = None
    # Node-hours of the nodes that exist (Ready; being removed until gone), first arrival to last finish, and the most
    # nodes at once: what the cluster paid for in servers.
    node_hours: float = 0.0
    nodes_peak: int = 0
    # CXL memory (docs/cxl-memory.md): chunks attached and detached, and GiB attached to nodes, time-averaged.
    cxl_chunks_attached: int = 0
    cxl_chunks_detached: int = 0
    cxl_memory_avg_gib: float = 0.0


def percentile(values: Sequence[float], fraction: float) -> Optional[float]:
    """Linear interpolation between closest ranks (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(result: SimResult) -> Summary:
    waits = [j.wait_s for j in result.jobs if j.wait_s is not None]
    start = min((j.arrival_s for j in result.jobs), default=0.0)
    end = max((j.finish_s for j in result.jobs if j.finish_s is not None), default=start)
    used, present, stranded, node_seconds, memory_seconds = _integrals(result, start, end)
    span = max(end - start, 0.0)
    return Summary(
        policy=result.policy, jobs=len(result.jobs), never_started=len(result.jobs) - len(waits),
        wait_mean_s=sum(waits) / len(waits) if waits else None,
        wait_p50_s=percentile(waits, 0.50), wait_p95_s=percentile(waits, 0.95), makespan_s=span,
        gpu_utilization=used / present if present else 0.0, gpus_present_avg=present / span if span else 0.0,
        gpus_attached=result.counters.gpus_attached, gpus_detached=result.counters.gpus_detached,
        gpus_reallocated=result.counters.gpus_reallocated, nodes_added=result.counters.nodes_added,
        nodes_removed=result.counters.nodes_removed, gpu_stranded_s=stranded, node_hours=node_seconds / 3600.0,
        nodes_peak=max((s.nodes for s in result.timeline), default=0),
        cxl_chunks_attached=result.counters.cxl_chunks_attached,
        cxl_chunks_detached=result.counters.cxl_chunks_detached,
        cxl_memory_avg_gib=memory_seconds / span / GiB if span else 0.0)


def _integrals(result: SimResult, start: float, end: float) -> tuple[float, float, float, float, float]:
    """Integrate the step functions of GPUs used, present and stranded, nodes, and CXL memory over [start, end]."""
    used = present = stranded = nodes = memory = 0.0
    timeline = result.timeline
    for current, following in zip(timeline, timeline[1:] + (None,)):
        left = max(current.t_s, start)
        right = min(following.t_s if following is not None else end, end)
        if right > left:
            used += current.gpus_used * (right - left)
            present += current.gpus_present * (right - left)
            stranded += current.gpus_stranded * (right - left)
            nodes += current.nodes * (right - left)
            memory += current.cxl_memory * (right - left)
    return used, present, stranded, nodes, memory


def compare(results: Sequence[SimResult], baseline: str = "static") -> tuple[Summary, ...]:
    """One summary per result, each with its mean wait relative to the baseline (see `baseline_name`) and, when the
    ideal pool is among the results, to the ideal's."""
    return _with_ideal_gap(_with_baseline_ratio([summarize(r) for r in results], baseline))


def ideal_gap(summary: Summary, bound: Summary) -> Optional[float]:
    """Mean wait over the bound's, less one; None when either has no mean, when the bound waits not at all, or when
    the two did not run the same jobs (a policy that could not run some jobs leaves the hardest out of its mean)."""
    if summary.wait_mean_s is None or not bound.wait_mean_s or summary.never_started != bound.never_started:
        return None
    return summary.wait_mean_s / bound.wait_mean_s - 1.0


def _with_ideal_gap(summaries: Sequence[Summary]) -> tuple[Summary, ...]:
    """A GPU-only run (`<policy>/gpu-only`), and a policy that attaches nothing (so no CXL memory either), is measured
    against the GPU-only cluster's bound when it is there."""
    bounds = {s.policy: s for s in summaries if s.policy in (IDEAL_POLICY, IDEAL_POLICY + GPU_ONLY_SUFFIX)}
    if IDEAL_POLICY not in bounds:
        return tuple(summaries)
    reserving = next((s for s in summaries if s.policy == IDEAL_RESERVING), None)
    out = []
    for s in summaries:
        fixed = s.policy in POLICIES and not POLICIES[s.policy].moves_gpus
        twin = IDEAL_POLICY + GPU_ONLY_SUFFIX if fixed or s.policy.endswith(GPU_ONLY_SUFFIX) else IDEAL_POLICY
        moves = s.policy in POLICIES and POLICIES[s.policy].moves_gpus  # reservations are for attach-first policies
        out.append(Summary(**{**asdict(s), "wait_vs_ideal": ideal_gap(s, bounds.get(twin, bounds[IDEAL_POLICY])),
                              "wait_vs_reserving": ideal_gap(s, reserving) if moves and reserving else None}))
    return tuple(out)


def _with_baseline_ratio(summaries: list[Summary], baseline: str) -> tuple[Summary, ...]:
    name = baseline_name(summaries, baseline)
    reference = next((s for s in summaries if s.policy == name), None)
    if reference is None or not reference.wait_mean_s:
        return tuple(summaries)  # no fair reference, or one with no wait at all: no ratio to show
    baseline = reference
    out = []
    for s in summaries:
        ratio = None if s.wait_mean_s is None else s.wait_mean_s / baseline.wait_mean_s - 1.0
        out.append(Summary(**{**asdict(s), "wait_vs_baseline": ratio}))
    return tuple(out)


def baseline_name(summaries: Sequence[Summary], preferred: str = "static") -> Optional[str]:
    """The preferred baseline if it ran, and ran every job; else the first of BASELINE_ORDER that did."""
    complete = {s.policy for s in summaries if s.never_started == 0}
    return next((name for name in (preferred,) + BASELINE_ORDER if name in complete), None)


# --- rendering ---

_COLUMNS = (
    ("policy", "policy", "{}"),
    ("wait_mean_s", "wait mean", "{:.0f}s"),
    ("wait_p50_s", "p50", "{:.0f}s"),
    ("wait_p95_s", "p95", "{:.0f}s"),
    ("wait_vs_baseline", "vs base", "{:+.0%}"),
    ("wait_vs_ideal", "vs ideal", "{:+.1%}"),
    ("wait_vs_reserving", "vs reserving", "{:+.1%}"),
    ("never_started", "never ran", "{}"),
    ("makespan_s", "makespan", "{:.0f}s"),
    ("gpu_utilization", "GPU util", "{:.0%}"),
    ("gpus_present_avg", "GPUs held", "{:.1f}"),
    ("gpus_attached", "attach", "{}"),
    ("gpus_detached", "detach", "{}"),
    ("gpus_reallocated", "realloc", "{}"),
    ("gpu_stranded_s", "stranded GPU-h", "{:.1f}", 1 / 3600),  # GPU-seconds shown as GPU-hours
    ("nodes_added", "+nodes", "{}"),
    ("nodes_removed", "-nodes", "{}"),
)


def render_table(summaries: Sequence[Summary]) -> str:
    rows = [[column[1] for column in _COLUMNS]]
    for s in summaries:
        rows.append([_cell(getattr(s, column[0]), column[2], *column[3:]) for column in _COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object, fmt: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return fmt.format(value * scale if scale != 1.0 else value)


LEGEND = (
    "wait mean/p50/p95: seconds from a job's arrival to its start, over the jobs that started (lower is better)",
    "vs base: mean wait relative to the baseline policy (negative = shorter waits, better)",
    "vs ideal: mean wait relative to the ideal pool (GPUs move at once, none idle on the wrong node, every node there "
    "from the start): the gap to the bound; '-' when the two ran different jobs",
    "vs reserving: the same against the ideal pool under DDS's reservations for large GPU requests (ideal-reserving): "
    "the bound of a policy that serves large jobs rather than leaving them to kube-scheduler's order",
    "never ran: jobs this policy could not start at all; they are left out of the wait columns",
    "makespan: seconds from the first arrival to the last finish (lower is better)",
    "GPU util: GPU-seconds used by jobs / GPU-seconds held by nodes (higher is better)",
    "GPUs held: GPUs attached to nodes, time-averaged (fewer = more left in the pools for others)",
    "attach/detach/realloc: GPU attaches, detaches, and GPUs moved between nodes",
    "stranded GPU-h: GPU-hours attached for gangs that could not start yet, unused meanwhile (lower is better)",
    "+nodes/-nodes: nodes added and removed",
)


def render_legend() -> str:
    return "\n".join(["columns:"] + [f"  {line}" for line in LEGEND])


def unrun_warning(summaries: Sequence[Summary]) -> Optional[str]:
    """A policy that could not run some jobs has its wait figures over the others only, which flatters it."""
    unrun = [s for s in summaries if s.never_started]
    if not unrun:
        return None
    named = ", ".join(f"{s.policy} ({s.never_started} of {s.jobs})" for s in unrun)
    return (f"warning: jobs never ran under {named}: their waits are missing from the wait columns, so those policies "
            "look better on wait than they are; compare them on 'never ran' first")


def summaries_csv(summaries: Sequence[Summary]) -> str:
    out = io.StringIO()
    names = [f.name for f in fields(Summary)]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for s in summaries:
        writer.writerow(["" if getattr(s, n) is None else _csv_value(getattr(s, n)) for n in names])
    return out.getvalue()


def jobs_csv(results: Sequence[SimResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["policy", "job", "arrival_s", "gpus", "start_s", "finish_s", "wait_s", "node"])
    for result in results:
        for job in result.jobs:
            writer.writerow([result.policy, job.name, _csv_value(job.arrival_s), job.gpus,
                             _csv_value(job.start_s), _csv_value(job.finish_s), _csv_value(job.wait_s),
                             job.node or ""])
    return out.getvalue()


def timeline_csv(results: Sequence[SimResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["policy", "t_s", "gpus_used", "gpus_present", "pending", "nodes", "gpus_stranded",
                     "cxl_memory_gib"])
    for result in results:
        for sample in result.timeline:
            writer.writerow([result.policy, _csv_value(sample.t_s), sample.gpus_used, sample.gpus_present,
                             sample.pending, sample.nodes, sample.gpus_stranded, _csv_value(sample.cxl_memory / GiB)])
    return out.getvalue()


def _csv_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value == value else "nan"
    return str(value)


# --- CXL memory against GPU-only (issue 43) ---

@dataclass(frozen=True)
class MemoryEffect:
    """One policy on the same jobs with CXL memory in the pools and GPU-only: what memory attaches change."""

    policy: str
    memory: Summary
    gpu_only: Summary

    def ratio(self, name: str) -> Optional[float]:
        """The memory run's figure over the GPU-only run's (0.5 = half); None when either has none or GPU-only's is
        0 (or when the two did not run the same jobs, for the waits: the one that left jobs unrun flatters itself)."""
        mine, theirs = getattr(self.memory, name), getattr(self.gpu_only, name)
        if mine is None or not theirs:
            return None
        if name.startswith("wait_") and self.memory.never_started != self.gpu_only.never_started:
            return None
        return mine / theirs


MEMORY_FIGURES = (("wait_mean_s", "wait mean", "{:,.0f}s"), ("wait_p95_s", "p95", "{:,.0f}s"),
                  ("never_started", "never ran", "{}"), ("node_hours", "node-hours", "{:,.1f}"),
                  ("nodes_peak", "peak nodes", "{}"), ("nodes_added", "+nodes", "{}"),
                  ("cxl_chunks_attached", "CXL chunks", "{}"), ("cxl_memory_avg_gib", "CXL GiB (avg)", "{:,.0f}"))
_RATIO_FIGURES = ("wait_mean_s", "wait_p95_s", "node_hours", "nodes_peak", "nodes_added")


def memory_effects(summaries: Sequence[Summary], suffix: str) -> tuple[MemoryEffect, ...]:
    """Each policy that ran both with CXL memory and GPU-only (its GPU-only row named `<policy><suffix>`)."""
    by_name = {s.policy: s for s in summaries}
    return tuple(MemoryEffect(s.policy, s, by_name[s.policy + suffix]) for s in summaries
                 if s.policy + suffix in by_name)


def render_memory_table(effects: Sequence[MemoryEffect]) -> str:
    """Per policy: the memory run, the GPU-only run, and memory / GPU-only (the ratio: below 1 = less with memory)."""
    rows = [["policy", "run"] + [title for _, title, _ in MEMORY_FIGURES]]
    for effect in effects:
        rows.append([effect.policy, "CXL memory"] + [_cell(getattr(effect.memory, n), f) for n, _, f in MEMORY_FIGURES])
        rows.append(["", "GPU-only"] + [_cell(getattr(effect.gpu_only, n), f) for n, _, f in MEMORY_FIGURES])
        rows.append(["", "memory/GPU-only"] + [_cell(effect.ratio(n), "{:.2f}x") if n in _RATIO_FIGURES else ""
                                              for n, _, _ in MEMORY_FIGURES])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(row[2:], widths[2:])]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def memory_csv(effects: Sequence[MemoryEffect]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    names = [n for n, _, _ in MEMORY_FIGURES]
    writer.writerow(["policy"] + [f"{n}_memory" for n in names] + [f"{n}_gpu_only" for n in names]
                    + [f"{n}_ratio" for n in _RATIO_FIGURES])
    for e in effects:
        writer.writerow([e.policy] + [_csv_value(getattr(e.memory, n)) for n in names]
                        + [_csv_value(getattr(e.gpu_only, n)) for n in names]
                        + [_csv_value(e.ratio(n)) for n in _RATIO_FIGURES])
    return out.getvalue()


# --- Kueue admission (issue 42): jobs admitted through ProvisioningRequests ---

@dataclass(frozen=True)
class Admission:
    """One policy's Kueue jobs: seconds from a job's creation to its admission (`Provisioned=True`) and to all of its
    pods Running, over the jobs that got there."""

    policy: str
    jobs: int
    admitted: int
    retried: int  # jobs that needed more than one ProvisioningRequest (a request Failed, Kueue tried again)
    admitted_p50_s: Optional[float]
    admitted_p95_s: Optional[float]
    from_quota_p50_s: Optional[float]  # request created (quota given) -> all pods Running: the autoscaler's part
    from_quota_p95_s: Optional[float]
    running_p50_s: Optional[float]
    running_p95_s: Optional[float]
    running_max_s: Optional[float]


def admission(result: SimResult) -> Optional[Admission]:
    """None when the run had no Kueue jobs."""
    if not result.workloads:
        return None
    admitted = [w.to_admitted_s for w in result.workloads if w.to_admitted_s is not None]
    running = [w.to_running_s for w in result.workloads if w.to_running_s is not None]
    from_quota = [w.from_quota_s for w in result.workloads if w.from_quota_s is not None]
    return Admission(policy=result.policy, jobs=len(result.workloads), admitted=len(admitted),
                     retried=sum(1 for w in result.workloads if w.attempts > 1),
                     admitted_p50_s=percentile(admitted, 0.5), admitted_p95_s=percentile(admitted, 0.95),
                     from_quota_p50_s=percentile(from_quota, 0.5), from_quota_p95_s=percentile(from_quota, 0.95),
                     running_p50_s=percentile(running, 0.5), running_p95_s=percentile(running, 0.95),
                     running_max_s=max(running, default=None))


def render_admission_table(results: Sequence[SimResult], baseline: str = "node-only") -> str:
    """Per policy the percentiles of creation -> admitted and creation -> all pods Running, and each policy's
    all-Running percentiles over the baseline's (below 1 = admitted and running sooner than the baseline)."""
    rows = [a for a in (admission(r) for r in results) if a is not None]
    base = next((a for a in rows if a.policy == baseline), None)
    header = ["policy", "jobs", "admitted", "retried", "admitted p50", "p95", "all Running p50", "p95", "max",
              "from quota p50", "p95",
              f"p50/{baseline}", f"p95/{baseline}"]
    lines = [header]
    for a in rows:
        lines.append([a.policy, str(a.jobs), str(a.admitted), str(a.retried)]
                     + [_cell(v, "{:,.0f}") for v in (a.admitted_p50_s, a.admitted_p95_s, a.running_p50_s,
                                                       a.running_p95_s, a.running_max_s, a.from_quota_p50_s,
                                                       a.from_quota_p95_s)]
                     + [_ratio(a.running_p50_s, base.running_p50_s if base else None),
                        _ratio(a.running_p95_s, base.running_p95_s if base else None)])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = []
    for index, row in enumerate(lines):
        out.append("  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _ratio(mine: Optional[float], theirs: Optional[float]) -> str:
    return "-" if mine is None or not theirs else f"{mine / theirs:.2f}"
