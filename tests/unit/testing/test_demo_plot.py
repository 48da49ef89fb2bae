"""The demo's picture (harness/demo_plot.py) drawn from a recorded timeline, and the parts of harness/demo.py that
turn what the demo saw into it: the paths' spans and the Events marked on it.

`demo-timeline.json` beside this file is the recording of a real `make demo` run (docs/demo-timeline.png is its
picture)."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.demo import (Demo, DemoOptions, DemoResult, Entry, free_gpus, memory_counted, moments, sample_of,
                          summary)
from harness.demo_plot import (Moment, Recording, RecordingError, Sample, Span, is_png, main, read_recording, render,
                               write_recording)

RECORDED = Path(__file__).with_name("demo-timeline.json")


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]  # signature, then the IHDR chunk: length, type, width, height
    assert header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def small_recording() -> Recording:
    """Two workers with one GPU each; one gets a second (the GPU path), then a node is added (the node path)."""
    samples = [Sample(0.0, {"w1": 1, "w2": 1}, 2, 0, 2, 6),
               Sample(5.0, {"w1": 1, "w2": 1}, 2, 1, 2, 6),
               Sample(9.0, {"w1": 2, "w2": 1}, 2, 0, 3, 5),
               Sample(12.0, {"w1": 2, "w2": 1, "n3": 0}, 2, 2, 3, 5),
               Sample(30.0, {"w1": 2, "w2": 1, "n3": 1}, 3, 0, 5, 4)]
    return Recording("a demo", samples, [Span("GPU path", 4.5, 9.0, "1 pod"), Span("node path", 11.0, 30.0, "2 pods")],
                     [Moment(6.0, "DDS attaches a GPU"), Moment(12.0, "CA scale-up, DDS adds a node")])


def test_the_picture_is_a_png_of_the_recording(tmp_path: Path) -> None:
    picture = render(small_recording(), tmp_path / "out" / "demo.png")
    assert picture == tmp_path / "out" / "demo.png"
    assert is_png(picture)
    assert png_size(picture) == (1320, 902)  # 12 x 8.2 inches at 110 dpi: readable on a laptop screen


def test_a_recording_round_trips_through_json(tmp_path: Path) -> None:
    recording = small_recording()
    assert read_recording(write_recording(recording, tmp_path / "r.json")) == recording


def test_the_recorded_demo_shows_the_gpu_path_before_the_node_path(tmp_path: Path) -> None:
    recording = read_recording(RECORDED)
    gpu, node = recording.spans
    assert (gpu.name, node.name) == ("GPU path", "node path")
    assert gpu.end <= node.start
    workers = recording.first_workers()
    # In the series: a worker shows a second GPU within the GPU path, and the node count rises only after it.
    attached = next(s.at for s in recording.samples if any(s.gpus.get(w, 0) >= 2 for w in workers))
    added = next(s.at for s in recording.samples if set(s.gpus) - workers)
    assert gpu.start <= attached <= gpu.end < added
    assert is_png(render(recording, tmp_path / "recorded.png"))


def test_the_command_draws_a_recording_and_names_the_picture(tmp_path: Path, capsys) -> None:
    assert main([str(RECORDED), "-o", str(tmp_path / "again.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "again.png")
    assert is_png(tmp_path / "again.png")


def test_what_cannot_be_drawn_is_a_clear_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(RecordingError, match="no samples to draw"):
        render(Recording("empty", []), tmp_path / "empty.png")
    (tmp_path / "bad.json").write_text('{"title": "x"}')
    assert main([str(tmp_path / "bad.json")]) == 1
    assert "bad.json: not a demo recording (KeyError" in capsys.readouterr().err


def test_a_path_ends_when_its_last_pod_is_seen_running(tmp_path: Path) -> None:
    demo = Demo(DemoOptions(workdir=tmp_path, echo=False), out=None)
    demo.timeline.entries += [Entry(40.0, "pod", "mem-0", "Pending (Unschedulable: ...)"),
                              Entry(61.5, "pod", "mem-0", "Running on n3"),
                              Entry(63.0, "pod", "mem-1", "Running on n3")]
    assert demo.span("node path", ["mem-0", "mem-1"], 23.0, "2 pods") == Span("node path", 40.0, 63.0, "2 pods")


def test_events_close_together_share_one_mark() -> None:
    timeline = [Entry(35.5, "dds", "pod/train-0", "AttachingGPU: attaching 1 x A30 to w1 for demo/train-0"),
                Entry(35.5, "dds", "node/w1", "AttachingGPU: attaching 1 x A30 to w1"),  # the node's copy: not marked
                Entry(42.9, "dds", "machineset/gpu-workers", "AddingNode: adding 1 node(s)"),
                Entry(42.9, "ca", "pod/mem-0", "TriggeredScaleUp: pod triggered scale-up"),
                Entry(43.0, "ca", "pod/mem-1", "TriggeredScaleUp: pod triggered scale-up"),
                Entry(50.0, "pod", "mem-0", "Running on n3"),
                Entry(88.1, "dds", "machineset/gpu-workers", "RemovingNode: removing node n3")]
    assert moments(timeline) == [Moment(35.5, "DDS attaches a GPU"), Moment(42.9, "DDS adds a node, CA scale-up"),
                                 Moment(88.1, "DDS removes a node")]


def kwok_node(name: str, memory: str, gpus: int = 1) -> SimpleNamespace:
    """A Node as the demo's watcher reads it: allocatable GPUs and memory (bytes as DDS writes them, or 64Gi)."""
    return SimpleNamespace(metadata=SimpleNamespace(name=name),
                           status=SimpleNamespace(allocatable={"nvidia.com/gpu": str(gpus), "memory": memory},
                                                  conditions=[SimpleNamespace(type="Ready", status="True")]))


def running_pod(name: str) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(name=name, deletion_timestamp=None),
                           status=SimpleNamespace(phase="Running"))


def cxl_samples() -> list[Sample]:
    """What the watcher records in `make demo-cxl`: w1 gets a 16 GiB chunk at 10 s, w2 one at 11 s, both go at 40 s."""
    shown = [(0.0, "64Gi", "64Gi"), (10.0, str(80 * 2**30), "64Gi"), (11.0, str(80 * 2**30), str(80 * 2**30)),
             (40.0, "64Gi", "64Gi")]
    return [sample_of(at, [running_pod("busy-0")], [kwok_node("w1", m1), kwok_node("w2", m2)], [], 6)
            for at, m1, m2 in shown]


def test_a_poll_records_each_nodes_memory_beside_its_gpus() -> None:
    sample = sample_of(3.0, [running_pod("busy-0")], [kwok_node("w1", str(80 * 2**30), gpus=2),
                                                      kwok_node("w2", "64Gi")], [], 5)
    assert sample == Sample(3.0, {"w1": 2, "w2": 1}, 2, 0, 1, 5, {"w1": 80.0, "w2": 64.0})


def test_a_run_with_memory_attached_draws_memory_per_node(tmp_path: Path) -> None:
    samples = cxl_samples()
    demo = Demo(DemoOptions(workdir=tmp_path, echo=False), out=None)
    result = DemoResult(timeline=[Entry(9.5, "dds", "pod/mem-0", "AttachingMemory: attaching 1 CXL memory chunk of "
                                                                 "16 GiB (16 GiB) to w1 for demo/mem-0")],
                        autoscaler="cluster-autoscaler", gpu_path_seconds=5.0, node_path_seconds=3.0, nodes_added=0,
                        nodes_removed=0, gpus_attached=3, gpus_attached_at_boot=2, gpus_detached=3, metrics={},
                        decisions=[], workdir=tmp_path, samples=samples,
                        spans=[Span("memory path", 8.0, 11.0, "2 pods, 0 nodes added")], memory_path="memory path")
    picture = demo.draw(result, {"w1", "w2"})
    recording = read_recording(picture.with_suffix(".json"))
    # The plot's data: every node's memory at every poll, and the nodes' own memory (the MachineSet's 64Gi).
    assert [s.memory for s in recording.samples] == [{"w1": 64.0, "w2": 64.0}, {"w1": 80.0, "w2": 64.0},
                                                     {"w1": 80.0, "w2": 80.0}, {"w1": 64.0, "w2": 64.0}]
    assert recording.own_memory_gib == 64.0
    assert recording.memory_attached()
    assert recording.moments == [Moment(9.5, "DDS attaches CXL memory")]
    assert png_size(picture) == (1320, 1166)  # a fourth panel: memory per node


def test_without_memory_attached_the_picture_keeps_its_three_panels(tmp_path: Path) -> None:
    # make demo: every node keeps its own memory (the added node comes with 64Gi): no memory panel.
    samples = [Sample(0.0, {"w1": 1}, 1, 0, 1, 6, {"w1": 64.0}), Sample(9.0, {"w1": 1, "n3": 1}, 2, 0, 2, 5,
                                                                       {"w1": 64.0, "n3": 64.0})]
    recording = Recording("make demo", samples, own_memory_gib=64.0)
    assert not recording.memory_attached()
    assert png_size(render(recording, tmp_path / "demo.png")) == (1320, 902)
    assert not read_recording(RECORDED).memory_attached()  # a recording from before memory was recorded


def test_the_pools_free_gpus_leave_its_cxl_memory_out() -> None:
    metrics = {'dds_pool_devices{model="A30",pool="default",state="free"}': 6.0,
               'dds_pool_devices{model="A30",pool="default",state="used"}': 2.0,
               'dds_pool_devices{model="cxl-memory-16Gi",pool="default",state="free"}': 8.0}
    assert free_gpus(metrics) == 6
    assert free_gpus({}) is None


def test_the_summary_counts_gpus_only_and_cxl_memory_apart(tmp_path: Path) -> None:
    metrics = {'dds_gpus_attached_total{model="A30",pool="default"}': 1.0,
               'dds_cxl_memory_chunks_attached_total{model="cxl-memory-16Gi",pool="default"}': 2.0,
               'dds_cxl_memory_chunks_detached_total{model="cxl-memory-16Gi",pool="default"}': 1.0}
    result = DemoResult(timeline=[], autoscaler="cluster-autoscaler", gpu_path_seconds=5.0, node_path_seconds=3.0,
                        nodes_added=0, nodes_removed=0, gpus_attached=3, gpus_attached_at_boot=2, gpus_detached=1,
                        metrics=metrics, decisions=[], workdir=tmp_path, memory_path="memory path",
                        memory_attached=memory_counted(metrics, "dds_cxl_memory_chunks_attached_total"),
                        memory_detached=memory_counted(metrics, "dds_cxl_memory_chunks_detached_total"))
    lines = summary(result).splitlines()
    assert "GPUs attached by DDS:  3 (2 at node boot, 1 for pending pods)" in lines
    assert "CXL memory by DDS:     32 GiB attached, 16 GiB detached" in lines
    assert not [line for line in summary(replace(result, memory_attached=0)).splitlines() if "CXL" in line]
