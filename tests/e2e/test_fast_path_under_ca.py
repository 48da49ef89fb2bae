"""The fast path and cluster-autoscaler, one owner per decision: DDS attaches for a GPU pod at once; when the attach
outlasts CA's 30 s buffer for GPU pods, CA asks for a node for the same pod — and gets a scale-up that ends when the
attach does: nothing is done twice, no node is added, CA neither counts the scale-up as failed nor backs the group off.

Two workers with their boot A30 busy, a fabric that takes 38-40 s to attach (real hardware's tens of seconds).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from harness.stack import Stack, StackOptions, gpus_allocatable, pod, start_stack
from tests.e2e.cluster_facts import (GROUP, busy_workers, dds_events, describe, log_lines, machineset_replicas,
                                     pods_running)

pytestmark = pytest.mark.e2e

ATTACH_LATENCY = (38.0, 40.0)
TIMEOUT = 150.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=4, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=600.0,
                           node_idle_cooldown_seconds=600.0)
    with start_stack(tmp_path_factory.mktemp("fast-path-ca"), options) as stack:
        busy_workers(stack, memory_gib=24, timeout=TIMEOUT)
        # From here on the fabric is slow: DDS restarts on the new latency (the fabric's state survives it).
        stack.config_path = stack.write_dds_config(
            "dds.yaml", stack.grpc_port, simulated_fabric={"attach_latency": {"min": ATTACH_LATENCY[0],
                                                                               "max": ATTACH_LATENCY[1]}})
        stack.restart_dds(kill=False)
        yield stack


def test_a_slow_attach_and_cas_scale_up_for_the_same_pod_add_up_to_one_gpu(stack: Stack):
    stack.core.create_namespaced_pod("demo", pod("train-0", memory_gib=8, gpus=1))
    started = time.monotonic()
    stack.wait_for("CA's scale-up for train-0 while its GPU is on its way",
                   lambda: log_lines(stack.dds.log_path, "case 1: CA asked"), 60.0, lambda: describe(stack))
    stack.wait_for("train-0 Running", lambda: pods_running(stack, ["train-0"]), TIMEOUT, lambda: describe(stack))
    took = time.monotonic() - started
    assert took <= ATTACH_LATENCY[1] + 5.0
    attaching = [e for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved == "pod/train-0"]
    assert len(attaching) == 1, [e.line() for e in attaching]
    assert sum(gpus_allocatable(n) for n in stack.nodes()) == 3
    assert machineset_replicas(stack) == 2
    metrics = stack.dds.metrics()
    assert metrics.get('dds_decisions_total{case="fast-path-attach",outcome="gpu"}', 0.0) == 1


def test_ca_sees_its_scale_up_succeed_and_never_backs_off(stack: Stack):
    done = stack.wait_for("CA to see its scale-up finish", lambda: [
        line for line in log_lines(stack.autoscaler.log_path, "finished successfully") if GROUP in line], 30.0)
    assert done
    log = stack.autoscaler.log_path.read_text()
    assert "Disabling scale-up for node group" not in log
    assert "Failed to scale up" not in log
