"""CXL memory with the real cluster-autoscaler when the pool has none: the group takes CXL memory, but its pool holds
GPUs only, so a memory-bound pod takes the node path — cluster-autoscaler's scale-up, one node added — and DDS's plan
says why (no free memory in the pool). Two 64 GiB workers each with a 48 GiB pod on its boot A30, as in
test_cxl_memory.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dds.model.groups import ANN_CXL_MEMORY_CHUNK, ANN_MAX_CXL_MEMORY
from harness.stack import Stack, StackOptions, pod, start_stack
from tests.e2e.cluster_facts import busy_workers, describe, machineset_replicas, pods_running

pytestmark = pytest.mark.e2e

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(
        pool_size=8, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0), node_provisioning_seconds=10.0,
        gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
        machineset_annotations={ANN_MAX_CXL_MEMORY: "64Gi", ANN_CXL_MEMORY_CHUNK: "16Gi"})
    with start_stack(tmp_path_factory.mktemp("cxl-memory-empty-pool"), options) as stack:
        busy_workers(stack, memory_gib=48, timeout=TIMEOUT)
        yield stack


def test_a_pool_without_memory_falls_back_to_a_node(stack: Stack):
    stack.core.create_namespaced_pod("demo", pod("mem-0", memory_gib=40))
    stack.wait_for("a third node for mem-0", lambda: machineset_replicas(stack) == 3, TIMEOUT, lambda: describe(stack))
    stack.wait_for("mem-0 Running", lambda: pods_running(stack, ["mem-0"]), TIMEOUT, lambda: describe(stack))
    node = next(p.spec.node_name for p in stack.pods() if p.metadata.name == "mem-0")
    assert node not in {p.spec.node_name for p in stack.pods() if p.metadata.name in ("busy-0", "busy-1")}
    # DDS's plan (logged with CA's scale-up) names the empty memory pool as why no worker took the pod.
    assert "cxl-pool-exhausted" in stack.dds.log_path.read_text(errors="replace")
