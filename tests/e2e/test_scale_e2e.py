"""At scale end to end: the real cluster-autoscaler drives DDS (a process on mutual TLS, reading through its watch
cache) on a cluster of 500 kwok nodes and 5,000 pods, and a 1-GPU pod still goes Pending -> Running by a GPU attach
within the bound the 2-node demo asserts (tests/e2e/test_demo.py).

The 500 background nodes belong to no node group and carry no GPU (CA and DDS must read them all and still pick the
group's worker); their pods are bound directly (spec.nodeName), as a busy cluster's pods already are.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest
from kubernetes import client

from harness.controlplane import KWOK_NODE_ANNOTATION
from harness.stack import Stack, StackOptions, WORKLOAD_NAMESPACE, gpus_allocatable, is_ready, pod, start_stack
from tests.e2e.test_demo import ATTACH_LATENCY, GPU_PATH_OVERHEAD_SECONDS

pytestmark = pytest.mark.e2e

BACKGROUND_NODES = 500
BACKGROUND_PODS = 5_000
BACKGROUND_NAMESPACE = "background"


def background_node(i: int) -> dict[str, Any]:
    key, value = KWOK_NODE_ANNOTATION
    resources = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    name = f"bg-{i:04d}"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {key: value}, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": resources, "allocatable": resources}}


def background_pod(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"bg-{i:05d}", "labels": {"app": "background"}},
            "spec": {"nodeName": f"bg-{i % BACKGROUND_NODES:04d}",
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}]}}


def in_parallel(calls: Any, workers: int = 16) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(call) for call in calls]:
            future.result()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Long cooldowns: building the background takes a minute, and the workers must keep their boot GPUs meanwhile.
    options = StackOptions(attach_latency=ATTACH_LATENCY, detach_latency=(1.0, 2.0), node_provisioning_seconds=12.0,
                           gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0, autoscaler=False)
    with start_stack(tmp_path_factory.mktemp("scale-e2e"), options) as stack:
        core = stack.core
        core.create_namespace({"metadata": {"name": BACKGROUND_NAMESPACE}})
        in_parallel(lambda i=i: core.create_node(background_node(i), _preload_content=False)
                    for i in range(BACKGROUND_NODES))
        in_parallel(lambda i=i: core.create_namespaced_pod(BACKGROUND_NAMESPACE, background_pod(i),
                                                           _preload_content=False)
                    for i in range(BACKGROUND_PODS))
        # DDS started before the background arrived: its cache took all of it in through the watch. CA starts now,
        # on the big cluster from its first scan.
        stack.start_autoscaler()
        yield stack


def phase(core: client.CoreV1Api, name: str) -> str:
    return core.read_namespaced_pod(name, WORKLOAD_NAMESPACE).status.phase or ""


def test_a_gpu_pod_runs_by_an_attach_within_the_demos_bound(stack: Stack) -> None:
    core = stack.core
    stack.wait_for("two Ready workers with 1 GPU each",
                   lambda: len([n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) == 1]) == 2,
                   timeout=180)
    workers = {n.metadata.name for n in stack.nodes() if gpus_allocatable(n) >= 1}
    for name in ("busy-0", "busy-1"):  # both boot GPUs taken: the next GPU pod needs an attach or a node
        core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod(name, memory_gib=48, gpus=1))
    stack.wait_for("busy-0 and busy-1 Running",
                   lambda: all(phase(core, n) == "Running" for n in ("busy-0", "busy-1")), timeout=180)

    lists_before = lists_sent(stack)
    core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("train-0", memory_gib=8, gpus=1))
    started = time.monotonic()
    stack.wait_for("train-0 Running", lambda: phase(core, "train-0") == "Running", timeout=300)
    gpu_path = time.monotonic() - started

    node = core.read_namespaced_pod("train-0", WORKLOAD_NAMESPACE).spec.node_name
    assert node in workers, f"train-0 ran on {node}, not on a worker that got a GPU"
    assert len([n for n in stack.nodes() if n.metadata.name not in workers and not n.metadata.name.startswith("bg-")]) \
        == 0, "a node was added for a 1-GPU pod"
    metrics = stack.dds.metrics() if stack.dds else {}
    attached = sum(v for k, v in metrics.items() if k.startswith("dds_decisions_total{") and 'outcome="gpu"' in k)
    assert attached >= 1, metrics
    assert gpu_path <= ATTACH_LATENCY[1] + GPU_PATH_OVERHEAD_SECONDS
    # The cache, not LISTs, fed every decision on the way (CA's calls and DDS's loop alike).
    assert lists_sent(stack) == lists_before, "decisions listed the cluster instead of reading the watch cache"


def lists_sent(stack: Stack) -> float:
    assert stack.dds is not None
    return stack.dds.metrics().get('dds_apiserver_requests_total{verb="LIST"}', 0.0)
