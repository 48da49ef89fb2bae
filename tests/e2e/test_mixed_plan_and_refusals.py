"""What the real cluster-autoscaler's scale-ups get when DDS can serve only part of them, or nothing.

One stack, two workers whose boot A30 are busy, and a pool with one A30 left. DDS's own loop waits 300 s here, so
everything below is CA's doing (case 1) or DDS's answer to it. In file order:
1. a mixed plan: two 1-GPU pods; CA asks for one node; DDS attaches the one free GPU for one pod and tells CA
   OutOfResources for the node the other pod would need (its GPUs would come from the same empty pool): the first pod
   runs, no node is added, the second pod is told why it waits;
2. refusals: a pod asking for a GPU model no pool holds and a pod asking for more GPUs than a node takes get one Event
   each from DDS with the reason in a user's words — once, not every loop — and `dds plan` prints the same reasons.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from harness.stack import Stack, StackOptions, pod, start_stack
from tests.e2e.cluster_facts import (GROUP, busy_workers, dds_events, describe, log_lines, machineset_replicas,
                                     pods_running)

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
POOL_SIZE = 3  # two go to the workers at boot, one is left
ATTACH_LATENCY = (2.0, 3.0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=POOL_SIZE, attach_latency=ATTACH_LATENCY, detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=600.0,
                           node_idle_cooldown_seconds=600.0, dds_settings={"pending_debounce_seconds": 300.0})
    with start_stack(tmp_path_factory.mktemp("mixed-plan"), options) as stack:
        busy_workers(stack, memory_gib=48, timeout=TIMEOUT)
        yield stack


def pod_events(stack: Stack, name: str) -> list:
    return [e for e in dds_events(stack) if e.involved == f"pod/{name}"]


def test_a_mixed_plan_attaches_what_it_can_and_refuses_only_the_node(stack: Stack):
    for name in ("train-a", "train-b"):
        stack.core.create_namespaced_pod("demo", pod(name, memory_gib=8, gpus=1))
    stack.wait_for("one of the two GPU pods Running",
                   lambda: pods_running(stack, ["train-a"]) or pods_running(stack, ["train-b"]), TIMEOUT,
                   lambda: describe(stack))
    running = "train-a" if pods_running(stack, ["train-a"]) else "train-b"
    waiting = "train-b" if running == "train-a" else "train-a"
    assert [e.reason for e in pod_events(stack, running) if e.reason == "AttachingGPU"] == ["AttachingGPU"]
    told = stack.wait_for(f"{waiting} told why it waits",
                          lambda: [e for e in pod_events(stack, waiting) if e.reason == "NoFreeGPU"], 30.0)
    assert "pool default has 0 free A30" in told[0].message, told[0].message
    # CA's accounting: its one unit of scale-up is the node that cannot come (OutOfResources), so it backs the group
    # off; the attach is DDS's answer to the rest of the same request.
    backoff = stack.wait_for("CA to back the group off", lambda: [
        line for line in log_lines(stack.autoscaler.log_path, "Disabling scale-up for node group") if GROUP in line],
        30.0)
    assert "OutOfResources" in backoff[0]
    assert machineset_replicas(stack) == 2
    metrics = stack.dds.metrics()
    assert metrics.get('dds_decisions_total{case="fast-path-attach",outcome="gpu"}', 0.0) == 0.0


def test_pods_dds_cannot_help_are_told_why_once(stack: Stack):
    a100 = pod("a100", memory_gib=8, gpus=1)
    a100["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "A100"}
    stack.core.create_namespaced_pod("demo", a100)
    stack.core.create_namespaced_pod("demo", pod("six", memory_gib=8, gpus=6))
    stack.wait_for("an Event on each pod", lambda: pod_events(stack, "a100") and pod_events(stack, "six"), 30.0,
                   lambda: "; ".join(e.line() for e in dds_events(stack)))
    time.sleep(5.0)  # five more passes of DDS's loop (1 s here): no repeats
    [model] = pod_events(stack, "a100")
    assert (model.reason, model.message) == (
        "NoMatchingGPU", "asks for A100 GPUs, but no pool holds A100 (pool default holds A30)")
    [count] = pod_events(stack, "six")
    assert (count.reason, count.message) == (
        "TooManyGPUs", f"needs 6 GPUs on one node, but a node holds at most 4 ({GROUP}: max-gpus-per-node 4)")
    log = stack.dds.log_path.read_text()
    assert "pod demo/a100: DDS cannot help (NoMatchingGPU)" in log
    assert machineset_replicas(stack) == 2


def test_dds_plan_gives_the_same_reasons(stack: Stack):
    done = subprocess.run([sys.executable, "-m", "dds", "plan", "--kubeconfig", str(stack.dds_kubeconfig),
                           "--config", str(stack.config_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "asks for A100 GPUs, but no pool holds A100" in done.stdout, done.stdout
    assert "needs 6 GPUs on one node, but a node holds at most 4" in done.stdout, done.stdout
