"""The demo's picture (harness/demo_plot.py) drawn from a recorded timeline, and the parts of harness/demo.py that
turn what the demo saw into it: the paths' spans and the Events marked on it.

`demo-timeline.json` beside this file is the recording of a real `make demo` run (docs/demo-timeline.png is its
picture)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from harness.demo import Demo, DemoOptions, Entry, moments
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
