"""Case 3 end to end: the MachineSet in observed mode (dds.cdi.dev/template-mode: observed), so the autoscaler maps live
nodes to the group and owns their removal. When it finds nodes unneeded it taints them and calls DeleteNodes; DDS's
planner decides, per node, between releasing only idle GPUs and removing the node.

Three workers boot with 3 A30 each (then the autoscaler starts):
- worker A runs only a DaemonSet pod that uses one GPU: the autoscaler calls it empty and unneeded (GPU utilization
  1/3) and does not drain daemons, so that GPU stays in use while the node lives. DDS keeps the node, releases its two
  idle GPUs and lifts the autoscaler's taint (GPU-only removal);
- worker B runs a bare pod on 2 GPUs: needed, never asked about;
- worker C is empty: DDS releases its 3 GPUs first, then removes its Machine (node removal).

The autoscaler is the real cluster-autoscaler 1.35.2, as in every e2e test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.model.plan import Case
from harness.stack import (WORKLOAD_NAMESPACE, Stack, StackOptions, gpus_allocatable, is_ready, pod,
                               start_stack)

pytestmark = pytest.mark.e2e

BOOT_GPUS = 3
CA_TAINT = "ToBeDeletedByClusterAutoscaler"
OPTIONS = StackOptions(
    attach_latency=(1.0, 2.0), detach_latency=(1.0, 2.0), node_provisioning_seconds=2.0,
    # DDS's own idle-GPU scan (case 4) must not get there first: only the autoscaler's DeleteNodes acts here.
    gpu_idle_cooldown_seconds=3600.0, node_idle_cooldown_seconds=3600.0,
    pool_size=10, workers=3, autoscaler=False,
    machineset_annotations={"dds.cdi.dev/template-mode": "observed",
                            "capacity.cluster-autoscaler.kubernetes.io/gpu-count": str(BOOT_GPUS)},
    autoscaler_timings={"scale_down_unneeded_time": 10.0, "scale_down_delay_after_add": 10.0})
SCALE_DOWN_TIMEOUT = 180.0


def pinned(body: dict[str, Any], node: str) -> dict[str, Any]:
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def node_events(stack: Stack, node: str, reason: str) -> list[Any]:
    return [e for e in stack.core.list_namespaced_event("default",
                                                        field_selector=f"involvedObject.name={node}").items
            if e.reason == reason]


def gpus_detached(stack: Stack) -> float:
    return sum(v for k, v in stack.dds.metrics().items() if k.startswith("dds_gpus_detached_total{"))


def decisions(stack: Stack, outcome: str) -> float:
    return stack.dds.metrics().get(f'dds_decisions_total{{case="{Case.SCALE_DOWN.value}",outcome="{outcome}"}}', 0.0)


@pytest.fixture(scope="module")
def scaled_down(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, str]]]:
    with start_stack(tmp_path_factory.mktemp("observed"), OPTIONS) as stack:
        def describe() -> str:
            return "; ".join(f"{n.metadata.name}: {gpus_allocatable(n)} GPU(s)" for n in stack.nodes())

        stack.wait_for(f"3 Ready workers with {BOOT_GPUS} GPUs each", lambda: len(
            [n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) == BOOT_GPUS]) == 3, 120.0, describe)
        a, b, c = sorted(n.metadata.name for n in stack.nodes())
        apps = client.AppsV1Api(stack.api)
        daemonset = apps.create_namespaced_daemon_set(WORKLOAD_NAMESPACE, {
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "gpu-agent"},
            "spec": {"selector": {"matchLabels": {"app": "gpu-agent"}},
                     "template": {"metadata": {"labels": {"app": "gpu-agent"}},
                                  "spec": {"nodeSelector": {"dds.test/none": "none"},
                                           "containers": [{"name": "agent", "image": "example.com/agent:1"}]}}}})
        agent = pinned(pod("gpu-agent-a", memory_gib=1, gpus=1), a)
        agent["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-agent",
                                                 "uid": daemonset.metadata.uid, "controller": True}]
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, agent)
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pinned(pod("resident", memory_gib=8, gpus=2), b))
        stack.wait_for("gpu-agent-a and resident Running", lambda: all(
            p.status.phase == "Running" for p in stack.pods()) and len(stack.pods()) == 2, 60.0)

        stack.start_autoscaler()
        stack.wait_for("the autoscaler's DeleteNodes handled: A kept, C gone", lambda: (
            node_events(stack, a, "KeptNode") and c not in {n.metadata.name for n in stack.nodes()}),
            SCALE_DOWN_TIMEOUT, describe)
        stack.wait_for("A's idle GPUs back in the pool, every detach counted", lambda: (
            gpus_allocatable(stack.core.read_node(a)) == 1 and gpus_detached(stack) == 2 + BOOT_GPUS),
            60.0, lambda: f"{describe()}; dds_gpus_detached_total {gpus_detached(stack):g}")
        yield stack, {"a": a, "b": b, "c": c}


def test_a_node_whose_daemon_holds_a_gpu_is_kept_and_gives_back_its_idle_gpus(scaled_down):
    stack, nodes = scaled_down
    a = next(n for n in stack.nodes() if n.metadata.name == nodes["a"])
    assert is_ready(a) and CA_TAINT not in [t.key for t in a.spec.taints or ()]
    assert gpus_allocatable(a) == 1
    [kept] = node_events(stack, nodes["a"], "KeptNode")
    assert "CA asked to remove it" in kept.message and "gpu-agent-a" in kept.message  # the live node, by name
    assert stack.core.read_namespaced_pod("gpu-agent-a", WORKLOAD_NAMESPACE).spec.node_name == nodes["a"]
    assert decisions(stack, "gpu") >= 1


def test_an_empty_node_gives_back_its_gpus_then_goes(scaled_down):
    stack, nodes = scaled_down
    [detached] = node_events(stack, nodes["c"], "DetachedGPU")
    assert f"detached {BOOT_GPUS} GPU(s)" in detached.message
    [removing] = node_events(stack, nodes["c"], "RemovingNode")
    assert detached.first_timestamp <= removing.first_timestamp
    machineset = client.CustomObjectsApi(stack.api).get_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", "default", "machinesets", "gpu-workers")
    assert machineset["spec"]["replicas"] == 2
    assert decisions(stack, "node") >= 1


def test_the_needed_node_is_untouched_and_every_gpu_is_accounted_for(scaled_down):
    stack, nodes = scaled_down
    b = next(n for n in stack.nodes() if n.metadata.name == nodes["b"])
    assert gpus_allocatable(b) == BOOT_GPUS
    assert sorted(n.metadata.name for n in stack.nodes()) == [nodes["a"], nodes["b"]]
    assert gpus_detached(stack) == 2 + BOOT_GPUS  # A's idle two, all of C's
    assert sum(gpus_allocatable(n) for n in stack.nodes()) == 1 + BOOT_GPUS
    assert stack.core.read_namespaced_pod("resident", WORKLOAD_NAMESPACE).spec.node_name == nodes["b"]
