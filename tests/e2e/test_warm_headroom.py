"""Warm headroom with the real cluster-autoscaler: a group that keeps one idle GPU attached starts the next GPU pod
with no attach at all, then refills its headroom.

Two workers with their boot A30 busy; MachineSet annotation dds.cdi.dev/warm-gpus: "1"; a GPU idle cooldown of 5 s,
so an idle GPU that were not headroom would go back to the pool at once. In file order:
1. DDS attaches one warm GPU and keeps it past the cooldown;
2. a 1-GPU pod starts on it within 3 s (no attach on its path);
3. DDS attaches a new warm GPU;
4. the pod finishes: its GPU is idle past the cooldown, and only the headroom (one GPU) stays.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dds.model.groups import ANN_WARM_GPUS
from harness.stack import Stack, StackOptions, gpus_allocatable, pod, start_stack
from tests.e2e.cluster_facts import busy_workers, dds_events, describe, machineset_replicas, pods_running

pytestmark = pytest.mark.e2e

TIMEOUT = 120.0
WARM_START_BOUND_SECONDS = 3.0
COOLDOWN = 5.0


def total_gpus(stack: Stack) -> int:
    return sum(gpus_allocatable(n) for n in stack.nodes())


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=6, attach_latency=(3.0, 4.0), detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=COOLDOWN,
                           node_idle_cooldown_seconds=600.0, machineset_annotations={ANN_WARM_GPUS: "1"})
    with start_stack(tmp_path_factory.mktemp("warm-headroom"), options) as stack:
        busy_workers(stack, memory_gib=24, timeout=TIMEOUT)
        yield stack


def test_one_warm_gpu_is_attached_and_kept_past_the_cooldown(stack: Stack):
    stack.wait_for("a third GPU attached as headroom", lambda: total_gpus(stack) == 3, TIMEOUT,
                   lambda: describe(stack))
    time.sleep(COOLDOWN * 2)  # well past the idle cooldown
    assert total_gpus(stack) == 3, describe(stack)
    assert stack.dds.metrics().get('dds_decisions_total{case="warm-headroom",outcome="gpu"}', 0.0) >= 1


def test_a_gpu_pod_starts_on_the_warm_gpu_without_an_attach(stack: Stack):
    attaches_before = [e for e in dds_events(stack) if e.reason == "AttachingGPU"]
    stack.core.create_namespaced_pod("demo", pod("train-0", memory_gib=8, gpus=1))
    started = time.monotonic()
    stack.wait_for("train-0 Running", lambda: pods_running(stack, ["train-0"]), TIMEOUT, lambda: describe(stack))
    took = time.monotonic() - started
    assert took <= WARM_START_BOUND_SECONDS, f"train-0 took {took:.1f}s"
    for_the_pod = [e for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved == "pod/train-0"]
    assert for_the_pod == [], [e.line() for e in for_the_pod]
    assert len([e for e in dds_events(stack) if e.reason == "AttachingGPU"]) >= len(attaches_before)


def test_the_headroom_is_refilled(stack: Stack):
    stack.wait_for("a new warm GPU beside the three in use", lambda: total_gpus(stack) == 4, TIMEOUT,
                   lambda: describe(stack))
    assert machineset_replicas(stack) == 2  # headroom is GPUs, never nodes


def test_when_the_pod_ends_only_the_headroom_stays(stack: Stack):
    stack.core.delete_namespaced_pod("train-0", "demo", grace_period_seconds=0)
    stack.wait_for("back to the busy pods' GPUs plus one warm", lambda: total_gpus(stack) == 3, TIMEOUT,
                   lambda: describe(stack))
    time.sleep(COOLDOWN * 2)
    assert total_gpus(stack) == 3, describe(stack)
