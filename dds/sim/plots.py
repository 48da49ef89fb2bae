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
    rows = len(results)
    figure, axes_list = plt.subplots(rows, 1, figsize=(9, 1.7 * rows + 1), sharex=True, squeeze=False)
    for axes, result in zip((a[0] for a in axes_list), results):
        times = [s.t_s / 3600.0 for s in result.timeline]
        axes.step(times, [s.gpus_present for s in result.timeline], where="post", color="0.6", label="on nodes")
        axes.step(times, [s.gpus_used for s in result.timeline], where="post", label="in use")
        axes.set_ylabel(result.policy, rotation=0, ha="right", va="center", fontsize="small")
        axes.grid(True, alpha=0.3)
    first = axes_list[0][0]
    first.set_title(f"{title}: GPUs in use / on nodes over time")
    first.legend(loc="upper right", fontsize="x-small")
    axes_list[-1][0].set_xlabel("time (hours)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def nodes_with_and_without_memory(results: Sequence[SimResult], suffix: str, path: Path, title: str) -> Path:
    """One panel per policy that ran with CXL memory and GPU-only (its twin named `<policy><suffix>`): the nodes of
    each run over time, and the CXL memory the memory run held (right axis)."""
    plt = _pyplot()
    by_name = {r.policy: r for r in results}
    pairs = [(r, by_name[r.policy + suffix]) for r in results if r.policy + suffix in by_name]
    figure, axes_list = plt.subplots(max(len(pairs), 1), 1, figsize=(9, 1.9 * max(len(pairs), 1) + 1), sharex=True,
                                     squeeze=False)
    for axes, (memory, alone) in zip((a[0] for a in axes_list), pairs):
        for result, style, label in ((alone, "--", "nodes, GPU-only"), (memory, "-", "nodes, with CXL memory")):
            axes.step([s.t_s / 3600.0 for s in result.timeline], [s.nodes for s in result.timeline], where="post",
                      linestyle=style, label=label)
        held = axes.twinx()
        held.fill_between([s.t_s / 3600.0 for s in memory.timeline], [s.cxl_memory / 2**30 for s in memory.timeline],
                          step="post", color="tab:purple", alpha=0.2, linewidth=0, label="CXL memory held (GiB)")
        held.set_ylim(bottom=0)
        held.tick_params(labelsize="x-small")
        axes.set_ylim(bottom=0)
        axes.set_ylabel(memory.policy, rotation=0, ha="right", va="center", fontsize="small")
        axes.grid(True, alpha=0.3)
    first = axes_list[0][0]
    first.set_title(f"{title}: nodes with CXL memory and GPU-only; CXL memory held (shaded, GiB on the right)")
    first.legend(loc="upper left", fontsize="x-small")
    axes_list[-1][0].set_xlabel("time (hours)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
