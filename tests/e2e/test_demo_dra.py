"""`python -m harness.demo --dra` end to end: the talk's demo with every GPU asked for through a ResourceClaim, on the
real kube-scheduler (allocating the devices DDS's node-local ResourceSlices list) with the real cluster-autoscaler
present, which cannot serve DRA pods (its templates carry no ResourceSlices) — so both halves are DDS's loop.
"""

from __future__ import annotations

import pytest

from harness.demo import DemoOptions, DemoResult, Entry, run_demo
from harness.demo_plot import is_png
from harness.demo_dra import DraDemo, dra_options
from harness.stack import StackOptions

pytestmark = pytest.mark.e2e

ATTACH_LATENCY = (3.0, 4.0)
GPU_PATH_OVERHEAD_SECONDS = 5.0  # as tests/e2e/test_demo.py: debounce, a loop pass, the scheduler's retry, kwok


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> DemoResult:
    options = DemoOptions(workdir=tmp_path_factory.mktemp("demo-dra"), step_timeout_seconds=180.0, echo=True,
                          stack=StackOptions(attach_latency=ATTACH_LATENCY, detach_latency=(1.0, 2.0),
                                             node_provisioning_seconds=12.0, gpu_idle_cooldown_seconds=8.0,
                                             node_idle_cooldown_seconds=10.0))
    return run_demo(dra_options(options), scenario=DraDemo)


def entries(result: DemoResult, kind: str, subject: str, text: str) -> list[Entry]:
    return [e for e in result.timeline if e.kind == kind and e.subject == subject and text in e.text]


def first(result: DemoResult, kind: str, subject: str, text: str) -> Entry:
    matches = entries(result, kind, subject, text)
    assert matches, f"no {kind} entry for {subject} containing {text!r}; timeline:\n" + \
        "\n".join(e.line() for e in result.timeline)
    return matches[0]


def test_the_gpu_path_attaches_for_a_claim_and_adds_no_node(demo: DemoResult) -> None:
    # The scheduler's DRA plugin said no, before the attach (the timeline may first show the pod Pending with no
    # condition yet, when it is seen before the scheduler's first attempt).
    pending = first(demo, "pod", "train-0", "cannot allocate all claims")
    attaching = first(demo, "dds", "pod/train-0", "AttachingGPU")
    running = first(demo, "pod", "train-0", "Running")
    assert pending.at <= attaching.at <= running.at
    assert not [e for e in demo.timeline if e.kind == "dds" and "AddingNode" in e.text and e.at < running.at]
    assert ATTACH_LATENCY[0] <= demo.gpu_path_seconds <= ATTACH_LATENCY[1] + GPU_PATH_OVERHEAD_SECONDS


def test_the_node_path_is_dds_loop_because_ca_cannot_see_claims(demo: DemoResult) -> None:
    assert entries(demo, "ca", "pod/mem-0", "cannot allocate all claims")  # CA's NotTriggerScaleUp
    first(demo, "dds", "pod/mem-0", "AddingNode")
    assert demo.nodes_added == 1 and demo.nodes_removed == 1
    assert demo.metrics.get('dds_decisions_total{case="case1-scale-up",outcome="node"}', 0) >= 1


def test_idle_devices_go_back_after_the_cooldown(demo: DemoResult) -> None:
    assert demo.gpus_detached >= demo.gpus_attached - demo.gpus_attached_at_boot


def test_the_picture_counts_the_devices_of_each_nodes_resourceslice(demo: DemoResult) -> None:
    # No nvidia.com/gpu capacity here: the GPUs per node drawn are the devices DDS publishes in each node's slice.
    assert demo.picture is not None and is_png(demo.picture)
    gpu, node = demo.spans
    attached = next(s for s in demo.samples if max(s.gpus.values(), default=0) == 2)
    # Sampled by polling: the first sample at 2 devices can come a poll after the GPU path's end, never before its start.
    # A path's start is its end less its measured duration, so the two spans may touch by a few tenths of a second.
    assert gpu.start <= attached.at and gpu.end <= node.start + 0.5
