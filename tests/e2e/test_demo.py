"""The talk's demo end to end (issue 4): a real apiserver, scheduler and kwok, DDS as a process on mutual TLS, and
the real cluster-autoscaler driving it over externalgrpc.

One run, several assertions about what a user sees: the order of events, how many GPUs were attached and nodes added,
and the GPU path's Pending -> Running time against the configured fabric latency (the fast path: no wait for CA).
"""

from __future__ import annotations

import pytest

from harness import versions
from harness.demo import PICTURE, DemoOptions, DemoResult, Entry, run_demo, summary
from harness.demo_plot import is_png, read_recording
from harness.stack import StackOptions

pytestmark = pytest.mark.e2e

ATTACH_LATENCY = (3.0, 4.0)
# The GPU path's bound beyond the attach itself (issue: Pending -> Running <= attach latency + 5 s): DDS's debounce of
# a burst (2 s), its next loop pass (1 s here), the scheduler's retry once the node shows the GPU, the kwok pod stage.
GPU_PATH_OVERHEAD_SECONDS = 5.0
# The node path: CA's scan (2 s), DDS, the node's provisioning (12 s here), the scheduler and kwok.
NODE_PATH_BOUND_SECONDS = 40.0


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> DemoResult:
    options = DemoOptions(workdir=tmp_path_factory.mktemp("demo"), step_timeout_seconds=180.0, echo=True,
                          stack=StackOptions(attach_latency=ATTACH_LATENCY, detach_latency=(1.0, 2.0),
                                             node_provisioning_seconds=12.0, gpu_idle_cooldown_seconds=8.0,
                                             node_idle_cooldown_seconds=10.0))
    return run_demo(options)


def first(result: DemoResult, kind: str, subject: str, text: str) -> Entry:
    matches = [e for e in result.timeline if e.kind == kind and e.subject == subject and text in e.text]
    assert matches, f"no {kind} entry for {subject} containing {text!r}; timeline:\n" + \
        "\n".join(e.line() for e in result.timeline)
    return matches[0]


def test_the_gpu_path_attaches_and_adds_no_node(demo: DemoResult):
    # The fast path: DDS's loop attaches for a pod a live node can take once the GPU is there, without waiting for
    # CA (which does not scale up for a GPU pod younger than 30 s).
    assert demo.metrics.get('dds_decisions_total{case="fast-path-attach",outcome="gpu"}', 0) >= 1
    pending = first(demo, "pod", "train-0", "Pending")
    attaching = first(demo, "dds", "pod/train-0", "AttachingGPU")
    running = first(demo, "pod", "train-0", "Running")
    assert pending.at <= attaching.at <= running.at
    added_before = [e for e in demo.timeline if e.kind == "dds" and "AddingNode" in e.text and e.at < running.at]
    assert added_before == [], "a node was added for the 1-GPU pod"
    assert not [e for e in demo.timeline if e.kind == "ca" and "TriggeredScaleUp" in e.text and e.at < running.at]
    assert "fits" in attaching.text or "GPU" in attaching.text  # the reason is in the Event


def test_gpu_path_time_is_the_fabric_latency_plus_bounded_overhead(demo: DemoResult):
    assert ATTACH_LATENCY[0] <= demo.gpu_path_seconds <= ATTACH_LATENCY[1] + GPU_PATH_OVERHEAD_SECONDS


def test_the_node_path_is_cas_scale_up(demo: DemoResult):
    assert demo.metrics.get('dds_decisions_total{case="case1-scale-up",outcome="node"}', 0) >= 1
    assert demo.node_path_seconds <= NODE_PATH_BOUND_SECONDS


def test_memory_heavy_pods_get_exactly_one_new_node(demo: DemoResult):
    adding = first(demo, "dds", "machineset/gpu-workers", "AddingNode")
    for name in ("mem-0", "mem-1"):
        assert adding.at <= first(demo, "pod", name, "Running").at
    assert demo.nodes_added == 1


def test_scale_down_detaches_then_removes_the_empty_node(demo: DemoResult):
    removed = [e for e in demo.timeline if e.kind == "node" and "removed from the cluster" in e.text]
    assert len(removed) == 1 and demo.nodes_removed == 1
    node = removed[0].subject
    detached = first(demo, "dds", f"node/{node}", "DetachedGPU")
    removing = first(demo, "dds", f"node/{node}", "RemovingNode")
    assert detached.at <= removing.at <= removed[0].at


def test_the_nodes_come_and_go_through_cluster_apis_own_manager(demo: DemoResult):
    """The demo names the Cluster API it ran, and its summary times the removal of a node holding a GPU: DDS's decision,
    the GPU detached, then Cluster API's Machine deletion to the Node gone."""
    assert demo.cluster_api == f"Cluster API {versions.read_pins(versions.SHARED_PINS)['CLUSTER_API_VERSION']}"
    assert any(e.kind == "step" and e.text.startswith(f"{demo.cluster_api}: its manager (pid ")
               for e in demo.timeline[:3]), [e.line() for e in demo.timeline[:3]]
    assert demo.node_removal_seconds is not None and demo.node_removal_seconds > 0
    assert f"node removal:          {demo.node_removal_seconds:.1f}s" in summary(demo)


def test_gpu_counts_add_up_in_metrics(demo: DemoResult):
    # Every attach counted: the two workers' and the added node's boot GPUs, and train-0's.
    assert (demo.gpus_attached, demo.gpus_attached_at_boot) == (4, 3), _fabric_story(demo)
    assert demo.gpus_detached == 2, _fabric_story(demo)  # train-0's once idle, and the removed node's boot GPU
    decisions = {k: v for k, v in demo.metrics.items() if k.startswith("dds_decisions_total{")}
    assert any('outcome="gpu"' in k and 'case="fast-path-attach"' in k and v >= 1 for k, v in decisions.items()), decisions
    assert any('outcome="node"' in k and 'case="case1-scale-up"' in k and v >= 1 for k, v in decisions.items()), decisions


def _fabric_story(demo: DemoResult) -> str:
    """What a count that does not add up is explained by: every attach, detach and node change the run showed."""
    words = ("GPU", "Node", "ScaleUp", "ScaleDown", "registered", "removed")
    return "\n".join(e.line() for e in demo.timeline
                     if e.kind in ("dds", "ca", "node", "step") and any(w in e.text for w in words))


def test_every_decision_is_explained_in_the_journal(demo: DemoResult):
    gpu = [d for d in demo.decisions if d["case"] == "fast-path-attach" and d["outcome"] == "gpu"
           and "demo/train-0" in d["plan"]]
    assert gpu and "fit live nodes once GPUs are attached" in gpu[-1]["trigger"], demo.decisions
    node = [d for d in demo.decisions if d["case"] == "case1-scale-up" and d["outcome"] == "node"]
    assert node and "demo/mem-0" in node[-1]["plan"]
    assert any(d["case"] == "case4-scale-down-blocked" and d["outcome"] == "node" for d in demo.decisions)


def test_the_timeline_picture_shows_the_gpu_path_before_the_node_path(demo: DemoResult):
    # The PNG beside the logs, named in the summary, and the series it was drawn from (its recording beside it).
    assert demo.picture == demo.workdir / PICTURE and is_png(demo.picture)
    recording = read_recording(demo.picture.with_suffix(".json"))
    assert recording.samples == demo.samples and recording.spans == demo.spans
    gpu, node = demo.spans
    # A path's start is its end less its measured duration, so the two spans may touch by a few tenths of a second.
    assert (gpu.name, node.name) == ("GPU path", "node path") and gpu.end <= node.start + 0.5
    assert abs(gpu.seconds - demo.gpu_path_seconds) < 0.2 and abs(node.seconds - demo.node_path_seconds) < 0.2
    workers = recording.first_workers()
    assert len(workers) == 2
    # What a reader sees: a worker at 2 GPUs once the GPU path started and before any node joins (a sample can come a
    # poll after the path's end); the added node's line starts within the node path; the pool's free count drops.
    attached = next(s for s in demo.samples if any(s.gpus.get(w, 0) == 2 for w in workers))
    joined = next(s for s in demo.samples if set(s.gpus) - workers)
    assert gpu.start <= attached.at < joined.at <= node.end
    free = [s.pool_free for s in demo.samples if s.pool_free is not None]
    assert free and min(free) < max(free)
