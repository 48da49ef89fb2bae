"""The demo's picture: what `make demo` saw, over time, in one PNG a person reads at a glance.

Three panels share the time axis (seconds since the demo started):
1. GPUs per node — one step line per node, as the node shows them (nvidia.com/gpu allocatable plus its devices in
   ResourceSlices): a worker going 1 -> 2 is an attach, a line that starts later is an added node, one that ends is a
   removed node;
2. the pool's free GPUs (DDS's `dds_pool_devices{state="free"}`) and the Ready nodes;
3. pods Pending and Running;
4. memory per node (only when a run had CXL memory attached: some node's memory grew or shrank while it was in the
   cluster) — one step line per node, its allocatable memory in GiB, over a dashed line at the nodes' own memory: a
   worker going 64 -> 80 GiB is a 16 GiB chunk attached (docs/cxl-memory.md).
The GPU path and the node path (or the memory path) are shaded across all panels, from the pods' creation to their
Running, with their durations.

The demo (harness/demo.py) records the samples as it watches the cluster and writes them beside the PNG as JSON;
`python -m harness.demo_plot RECORDING.json [-o PICTURE.png]` draws a recording again (docs/demo-timeline.png is one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# One colour per path, the same in the shading and its label; node lines take the default cycle's others.
PATH_COLOURS = {"GPU path": "#2ca02c", "node path": "#ff7f0e", "memory path": "#e377c2"}
FALLBACK_PATH_COLOUR = "#9467bd"
NODE_COLOURS = ("#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")


class RecordingError(ValueError):
    """A recording that cannot be drawn; the message says which field and why."""


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the demo's start
    gpus: dict[str, int]  # node name -> GPUs the node shows
    ready_nodes: int
    pending_pods: int
    running_pods: int
    pool_free: Optional[int] = None  # None: DDS's /metrics could not be read at that moment
    memory: dict[str, float] = field(default_factory=dict)  # node name -> allocatable memory the node shows, GiB


@dataclass(frozen=True)
class Span:
    """A path of the demo: from the pods' creation to their Running."""

    name: str  # "GPU path" or "node path"
    start: float
    end: float
    detail: str = ""  # what happened on it, e.g. "1 pod, a GPU attached, no node"

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Moment:
    """Something DDS or CA did, from their Events, marked on the GPU panel (e.g. "DDS attaches a GPU")."""

    at: float
    label: str


@dataclass(frozen=True)
class Recording:
    title: str
    samples: list[Sample]
    spans: list[Span] = field(default_factory=list)
    moments: list[Moment] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)  # the nodes the demo started with; the others were added
    own_memory_gib: Optional[float] = None  # a node's own memory (its group's), without CXL memory; None: unknown

    def node_order(self) -> list[str]:
        """Nodes in the order they first showed up (the boot-time workers first)."""
        seen: dict[str, None] = {}
        for sample in self.samples:
            for name in sample.gpus:
                seen.setdefault(name, None)
        return list(seen)

    def memory_attached(self) -> bool:
        """Whether any node's memory changed while it was in the cluster (CXL memory attached or detached): then the
        picture has its memory panel. A node added with more memory than the workers is a new node, not an attach."""
        first: dict[str, float] = {}
        for sample in self.samples:
            for name, gib in sample.memory.items():
                if first.setdefault(name, gib) != gib:
                    return True
        return False

    def first_workers(self) -> set[str]:
        """The demo's workers: as recorded, else the nodes of the first sample that has any."""
        if self.workers:
            return set(self.workers)
        return next((set(s.gpus) for s in self.samples if s.gpus), set())


# --- JSON ---

def write_recording(recording: Recording, path: Path) -> Path:
    path.write_text(json.dumps(asdict(recording), indent=1) + "\n")
    return path


def read_recording(path: Path) -> Recording:
    try:
        raw = json.loads(path.read_text())
        return Recording(title=raw["title"], samples=[Sample(**s) for s in raw["samples"]],
                         spans=[Span(**s) for s in raw.get("spans", [])],
                         moments=[Moment(**m) for m in raw.get("moments", [])], workers=raw.get("workers", []),
                         own_memory_gib=raw.get("own_memory_gib"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RecordingError(f"{path}: not a demo recording ({type(exc).__name__}: {exc})") from exc


# --- the picture ---

def render(recording: Recording, path: Path) -> Path:
    """Draw `recording` into the PNG `path` (Agg, no display needed) and return it."""
    if not recording.samples:
        raise RecordingError(f"{recording.title!r}: no samples to draw (the demo recorded nothing before it ended)")
    # The figure is made without pyplot: no global backend, no window, nothing left open after the file is written.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with_memory = recording.memory_attached()
    figure = Figure(figsize=(12, 10.6 if with_memory else 8.2), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    ratios = [1.35, 1, 1] + ([1] if with_memory else [])
    panels = list(figure.subplots(len(ratios), 1, sharex=True, height_ratios=ratios))
    gpus_axes, pool_axes, pods_axes = panels[:3]
    titled = [(gpus_axes, "GPUs per node"), (pool_axes, "GPU pool and nodes"), (pods_axes, "pods")]
    times = [s.at for s in recording.samples]
    end = max(times[-1], *(s.end for s in recording.spans)) if recording.spans else times[-1]

    _gpus_per_node(gpus_axes, recording, times)
    _steps(pool_axes, times, [_or_nan(s.pool_free) for s in recording.samples], "free GPUs in the pool", "#1f77b4")
    _steps(pool_axes, times, [s.ready_nodes for s in recording.samples], "nodes Ready", "#7f7f7f", dashed=True)
    _steps(pods_axes, times, [s.pending_pods for s in recording.samples], "pods Pending", "#d62728")
    _steps(pods_axes, times, [s.running_pods for s in recording.samples], "pods Running", "#17becf")

    if with_memory:
        _memory_per_node(panels[3], recording, times)
        titled.append((panels[3], "memory per node (GiB allocatable)"))

    for axes, title in titled:
        axes.set_title(title, loc="left", fontsize=11, fontweight="bold")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylim(bottom=0)
        axes.grid(axis="y", alpha=0.3)
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
        for span in recording.spans:
            axes.axvspan(span.start, span.end, color=_path_colour(span), alpha=0.16, linewidth=0)
    _paths_and_moments(gpus_axes, recording)
    panels[-1].set_xlim(max(times[0] - 1, 0), end + 1)  # from the first look at the cluster (the stack starts before)
    panels[-1].set_xlabel("seconds since the demo started")
    figure.suptitle(recording.title, fontsize=13, fontweight="bold")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def _paths_and_moments(axes: Any, recording: Recording) -> None:
    """The paths' names and durations in rows above the node lines (a short path's label may run over the next
    path's shading, never over its label), and the Events' moments as dotted lines labelled at the panel's foot."""
    most = max((v for s in recording.samples for v in s.gpus.values()), default=0)
    rows = max(len(recording.spans), 1)
    axes.set_ylim(0, most + 0.35 + 0.42 * rows)
    axes.set_yticks(range(0, most + 1))
    times = [s.at for s in recording.samples]
    middle = (times[0] + times[-1]) / 2
    for row, span in enumerate(recording.spans):
        label = f"{span.name}: {span.seconds:.1f} s" + (f" \u2014 {span.detail}" if span.detail else "")
        # A path in the right half is labelled leftwards from its end, so that the label stays inside the panel.
        left = span.start <= middle
        axes.annotate(label, xy=(span.start if left else span.end, most + 0.3 + 0.42 * (rows - row)),
                      xytext=(3 if left else -3, 0), textcoords="offset points", va="top",
                      ha="left" if left else "right", fontsize=9.5, fontweight="bold", color=_path_colour(span))
    for moment in recording.moments:
        axes.vlines(moment.at, 0, most + 0.2, color="#444444", linestyle=":", linewidth=1)  # stops below the labels
        axes.annotate(moment.label, xy=(moment.at, 0.06), xytext=(-2, 0), textcoords="offset points", rotation=90,
                      va="bottom", ha="right", fontsize=8, color="#333333",
                      bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})


def _gpus_per_node(axes: Any, recording: Recording, times: Sequence[float]) -> None:
    workers = recording.first_workers()
    for index, node in enumerate(recording.node_order()):
        # A node not in a sample is not in the cluster then: the line starts when it registers and ends when it goes.
        values = [_or_nan(s.gpus.get(node)) for s in recording.samples]
        role = "worker" if node in workers else "added node"
        # Overlapping lines (both workers at 1 GPU) stay visible: each node a little apart.
        offset = (index - 0.5 * (len(workers) - 1)) * 0.04 if node in workers else 0.0
        axes.step(times, [v + offset for v in values], where="post", linewidth=2.4, label=f"{node} ({role})",
                  color=NODE_COLOURS[index % len(NODE_COLOURS)])


def _memory_per_node(axes: Any, recording: Recording, times: Sequence[float]) -> None:
    """Each node's allocatable memory over time, in the node's colour of the GPU panel, and the nodes' own memory
    dashed: what a line shows above it is CXL memory attached."""
    workers = recording.first_workers()
    for index, node in enumerate(recording.node_order()):
        values = [_or_nan(s.memory.get(node)) for s in recording.samples]
        if all(math.isnan(v) for v in values):
            continue
        role = "worker" if node in workers else "added node"
        # As in the GPU panel: workers with the same memory stay visible, each a little apart (half a GiB).
        offset = (index - 0.5 * (len(workers) - 1)) * 0.5 if node in workers else 0.0
        axes.step(times, [v + offset for v in values], where="post", linewidth=2.4, label=f"{node} ({role})",
                  color=NODE_COLOURS[index % len(NODE_COLOURS)])
    if recording.own_memory_gib is not None:
        axes.axhline(recording.own_memory_gib, color="#444444", linestyle="--", linewidth=1,
                     label=f"own memory ({recording.own_memory_gib:g} GiB); above: CXL memory attached")


def _steps(axes: Any, times: Sequence[float], values: Sequence[float], label: str, colour: str,
           dashed: bool = False) -> None:
    axes.step(times, values, where="post", linewidth=2.2, label=label, color=colour,
              linestyle="--" if dashed else "-")


def _or_nan(value: Optional[float]) -> float:
    return math.nan if value is None else float(value)


def _path_colour(span: Span) -> str:
    return PATH_COLOURS.get(span.name, FALLBACK_PATH_COLOUR)


def is_png(path: Path) -> bool:
    with path.open("rb") as picture:
        return picture.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.demo_plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", type=Path, help="a demo's demo-timeline.json")
    parser.add_argument("-o", "--output", type=Path, help="the PNG to write (default: beside the recording)")
    args = parser.parse_args(argv)
    try:
        recording = read_recording(args.recording)
        print(render(recording, args.output or args.recording.with_suffix(".png")))
    except RecordingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
