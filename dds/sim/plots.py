"""PNG plots of a comparison: wait-time CDF per policy, GPUs in use (and held) over time per policy.

matplotlib with the Agg backend (files only, no display); imported lazily so the rest of `dds` does not need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from dds.sim.engine import SimResult


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install 'dds[sim]' (or --no-plots)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def wait_cdf(results: Sequence[SimResult], path: Path, title: str) -> Path:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 5))
    for result in results:
        waits = sorted(j.wait_s / 60.0 for j in result.jobs if j.wait_s is not None)
        if not waits:
            continue
        total = len(result.jobs)  # jobs that never ran keep the curve below 1: visible, not hidden
        axes.step(waits, [(i + 1) / total for i in range(len(waits))], where="post", label=result.policy)
    axes.set_xlabel("wait time (minutes)")
    axes.set_ylabel("fraction of jobs started")
    axes.set_ylim(0, 1.02)
    axes.set_title(f"{title}: job wait time CDF")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def gpus_over_time(results: Sequence[SimResult], path: Path, title: str) -> Path:
    plt = _pyplot()
    figure, panels = _panels(plt, len(results), 1.7)
    for axes, result in zip(panels, results):
        times = [s.t_s / 3600.0 for s in result.timeline]
        axes.step(times, [s.gpus_present for s in result.timeline], where="post", color="0.6", label="on nodes")
        axes.step(times, [s.gpus_used for s in result.timeline], where="post", label="in use")
        _policy_panel(axes, result.policy)
    return _save(plt, figure, panels, f"{title}: GPUs in use / on nodes over time", "upper right", path)


def nodes_with_and_without_memory(results: Sequence[SimResult], suffix: str, path: Path, title: str) -> Path:
    """One panel per policy that ran with CXL memory and GPU-only (its twin named `<policy><suffix>`): the nodes of
    each run over time, and the CXL memory the memory run held (right axis)."""
    plt = _pyplot()
    by_name = {r.policy: r for r in results}
    pairs = [(r, by_name[r.policy + suffix]) for r in results if r.policy + suffix in by_name]
    figure, panels = _panels(plt, len(pairs), 1.9)
    for axes, (memory, alone) in zip(panels, pairs):
        for result, style, label in ((alone, "--", "nodes, GPU-only"), (memory, "-", "nodes, with CXL memory")):
            axes.step([s.t_s / 3600.0 for s in result.timeline], [s.nodes for s in result.timeline], where="post",
                      linestyle=style, label=label)
        held = axes.twinx()
        held.fill_between([s.t_s / 3600.0 for s in memory.timeline], [s.cxl_memory / 2**30 for s in memory.timeline],
                          step="post", color="tab:purple", alpha=0.2, linewidth=0, label="CXL memory held (GiB)")
        held.set_ylim(bottom=0)
        held.tick_params(labelsize="x-small")
        axes.set_ylim(bottom=0)
        _policy_panel(axes, memory.policy)
    return _save(plt, figure, panels, f"{title}: nodes with CXL memory and GPU-only; CXL memory held (shaded, GiB on "
                 "the right)", "upper left", path)


def _panels(plt, rows: int, inches: float):  # type: ignore[no-untyped-def]
    """`rows` panels (at least one) stacked on a shared time axis, `inches` high each."""
    rows = max(rows, 1)
    figure, axes_list = plt.subplots(rows, 1, figsize=(9, inches * rows + 1), sharex=True, squeeze=False)
    return figure, [a[0] for a in axes_list]


def _policy_panel(axes, policy: str) -> None:  # type: ignore[no-untyped-def]
    axes.set_ylabel(policy, rotation=0, ha="right", va="center", fontsize="small")
    axes.grid(True, alpha=0.3)


def _save(plt, figure, panels, title: str, legend: str, path: Path) -> Path:  # type: ignore[no-untyped-def]
    panels[0].set_title(title)
    panels[0].legend(loc=legend, fontsize="x-small")
    panels[-1].set_xlabel("time (hours)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
