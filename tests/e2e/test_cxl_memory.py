"""CXL memory with the real cluster-autoscaler and kube-scheduler: memory-bound pods are served by attaching pooled
memory to a live worker, no node added; a pod needing GPUs and memory gets both; memory the pods' requests need stays
past the cooldown; idle memory goes back to the pool after it; a pod no worker fits even with its maximum memory gets a
node.

Two workers of 64 GiB, each with its boot A30 taken by a 48 GiB pod (16 GiB free); the group takes up to 64 GiB of CXL
memory per node in 16 GiB chunks from a pool of 8 A30 and 8 chunks (128 GiB); a 5 s idle cooldown. In file order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dds.model.cxl import cxl_model
from dds.model.groups import ANN_CXL_MEMORY_CHUNK, ANN_MAX_CXL_MEMORY
from harness.stack import Stack, StackOptions, gpus_allocatable, pod, start_stack
from tests.e2e.cluster_facts import busy_workers, dds_events, describe, machineset_replicas, pods_running

pytestmark = pytest.mark.e2e

TIMEOUT = 120.0
COOLDOWN = 5.0
GiB = 2**30


def memory_gib(node) -> int:
    return int(node.status.allocatable["memory"]) // GiB


def node_of(stack: Stack, name: str) -> str:
    return next(p.spec.node_name for p in stack.pods() if p.metadata.name == name)


def memory_by_node(stack: Stack) -> dict[str, int]:
    return {n.metadata.name: memory_gib(n) for n in stack.nodes()}


def shown(stack: Stack) -> str:
    return f"{describe(stack)} | memory GiB: {memory_by_node(stack)}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(
        pool_size=8, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0), node_provisioning_seconds=10.0,
        gpu_idle_cooldown_seconds=COOLDOWN, node_idle_cooldown_seconds=600.0,
        machineset_annotations={ANN_MAX_CXL_MEMORY: "64Gi", ANN_CXL_MEMORY_CHUNK: "16Gi"},
        dds_settings={"simulated_fabric": {"pools": [
            {"name": "default", "devices": {"A30": 8, cxl_model(16 * GiB): 8}}]}})
    with start_stack(tmp_path_factory.mktemp("cxl-memory"), options) as stack:
        busy_workers(stack, memory_gib=48, timeout=TIMEOUT)
        yield stack


def test_a_memory_bound_pod_is_served_by_an_attach_and_no_node_is_added(stack: Stack):
    stack.core.create_namespaced_pod("demo", pod("mem-0", memory_gib=40))
    stack.wait_for("mem-0 Running", lambda: pods_running(stack, ["mem-0"]), TIMEOUT, lambda: shown(stack))
    node = node_of(stack, "mem-0")
    assert memory_by_node(stack)[node] == 64 + 32, shown(stack)  # 24 GiB short: two 16 GiB chunks
    assert machineset_replicas(stack) == 2 and len(stack.nodes()) == 2, shown(stack)
    attached = [e for e in dds_events(stack) if e.involved == f"node/{node}" or e.involved == "pod/mem-0"]
    # Told and counted as memory, never as GPUs (docs/cxl-memory.md).
    assert [e for e in attached if e.reason == "AttachingMemory" and e.involved == "pod/mem-0"
            and "2 CXL memory chunks of 16 GiB (32 GiB)" in e.message], [e.line() for e in attached]
    assert not [e for e in attached if e.reason.endswith("GPU") and cxl_model(16 * GiB) in e.message], \
        [e.line() for e in attached]
    counted = stack.dds.metrics()
    assert counted.get(f'dds_cxl_memory_chunks_attached_total{{model="{cxl_model(16 * GiB)}",pool="default"}}') == 2, \
        counted
    assert not [k for k in counted if k.startswith("dds_gpus_") and cxl_model(16 * GiB) in k], counted


def test_a_pod_needing_gpus_and_memory_gets_both_on_one_worker(stack: Stack):
    stack.core.create_namespaced_pod("demo", pod("both-0", memory_gib=30, gpus=2))
    stack.wait_for("both-0 Running", lambda: pods_running(stack, ["both-0"]), TIMEOUT, lambda: shown(stack))
    node = next(n for n in stack.nodes() if n.metadata.name == node_of(stack, "both-0"))
    assert gpus_allocatable(node) == 3, shown(stack)  # its boot GPU and two attached
    assert memory_gib(node) >= 64 + 16, shown(stack)
    assert machineset_replicas(stack) == 2, shown(stack)


def test_memory_the_pods_requests_need_is_never_detached(stack: Stack):
    before = memory_by_node(stack)
    time.sleep(COOLDOWN * 3)  # well past the idle cooldown
    assert memory_by_node(stack) == before, shown(stack)
    assert pods_running(stack, ["mem-0", "both-0"]), shown(stack)


def test_idle_memory_is_detached_after_the_cooldown(stack: Stack):
    node = node_of(stack, "mem-0")
    stack.core.delete_namespaced_pod("mem-0", "demo", grace_period_seconds=0)
    stack.wait_for("mem-0's chunks back in the pool", lambda: memory_by_node(stack)[node] <= 64 + 16, TIMEOUT,
                   lambda: shown(stack))
    # The detach told as memory once the fabric has the chunks back (the node may show it a moment before).
    detached = stack.wait_for("DDS's DetachedMemory Event", lambda: [
        e for e in dds_events(stack) if e.involved == f"node/{node}" and e.reason == "DetachedMemory"], 10.0,
        lambda: str([e.line() for e in dds_events(stack)]))
    assert "CXL memory chunk" in detached[-1].message, detached[-1].line()
    assert pods_running(stack, ["both-0"]), shown(stack)


def test_a_pod_no_worker_fits_even_with_its_maximum_memory_gets_a_node(stack: Stack):
    stack.core.delete_namespaced_pod("both-0", "demo", grace_period_seconds=0)
    # 100 GiB: a worker holds at most 64 + 64 GiB and 48 GiB are taken on each; a new node's template holds 128 GiB.
    stack.core.create_namespaced_pod("demo", pod("huge-0", memory_gib=100))
    stack.wait_for("a third node for huge-0", lambda: machineset_replicas(stack) == 3, TIMEOUT, lambda: shown(stack))
    stack.wait_for("huge-0 Running on the new node, its memory attached there", lambda: pods_running(stack, ["huge-0"]),
                   TIMEOUT * 2, lambda: shown(stack))
    assert memory_by_node(stack)[node_of(stack, "huge-0")] >= 100, shown(stack)
