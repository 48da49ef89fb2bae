"""Nodes at zero GPUs do not trap the real cluster-autoscaler (docs/gpu-label.md).

Four workers run CPU-only pods; after the GPU idle cooldown DDS detaches their boot GPUs, so every worker sits at 0
GPUs — four nodes, over CA's --ok-total-unready-count (3) and its --max-total-unready-percentage (45 %), the state in
which CA, were the nodes still carrying its GPU label, would count them unready ("seems to have unready GPU"), fail
every scale-up ("node without with gpu label, without capacity not belonging to autoscaled node group") and stop
autoscaling the cluster. Then, in file order:
1. a CPU-only pod that no worker has the memory for gets a new node through CA's IncreaseSize;
2. a 1-GPU pod gets a GPU attached to a live worker (DDS's fast path), no node added for it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml

from dds.model.groups import ANN_CAPI_MAX, LABEL_ATTACHED_GPU
from harness.stack import Stack, StackOptions, gpus_allocatable, is_ready, pod, start_stack
from tests.e2e.cluster_facts import GROUP, dds_events, describe, machineset_replicas, pods_running

pytestmark = pytest.mark.e2e

WORKERS = 4
TIMEOUT = 150.0
ATTACH_LATENCY = (2.0, 3.0)
GPU_PATH_OVERHEAD_SECONDS = 5.0  # as the demo's bound: DDS's debounce and loop pass, the scheduler, kwok
# What CA logs when nodes carry its GPU label without GPUs (processors/customresources/gpu_processor.go) and when the
# cluster is too unready to autoscale (core/static_autoscaler.go).
TRAP_LINES = re.compile(r"seems to have unready GPU|node without with gpu label|could not create quotas tracker|"
                        r"Cluster has no ready nodes|is not ready for autoscaling|Cluster is not ready")


@dataclass
class Cluster:
    stack: Stack
    workers: set[str]
    log_offset: int = 0  # CA's log from here on is read once the workers sit at 0 GPUs
    timings: dict[str, float] = field(default_factory=dict)

    def ca_log_since_zero(self) -> str:
        with self.stack.autoscaler.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")


def workers_at_zero_without_label(stack: Stack, workers: set[str]) -> bool:
    nodes = [n for n in stack.nodes() if n.metadata.name in workers]
    return len(nodes) == len(workers) and all(
        gpus_allocatable(n) == 0 and LABEL_ATTACHED_GPU not in (n.metadata.labels or {}) for n in nodes)


def detached(stack: Stack) -> float:
    return sum(v for k, v in stack.dds.metrics().items() if k.startswith("dds_gpus_detached_total{"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    options = StackOptions(workers=WORKERS, pool_size=8, attach_latency=ATTACH_LATENCY, detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=5.0,
                           node_idle_cooldown_seconds=600.0, machineset_annotations={ANN_CAPI_MAX: "6"})
    with start_stack(tmp_path_factory.mktemp("zero-gpu"), options) as stack:
        stack.wait_for(f"{WORKERS} Ready workers with their boot GPU and CA's GPU label",
                       lambda: len([n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) == 1
                                    and LABEL_ATTACHED_GPU in (n.metadata.labels or {})]) == WORKERS,
                       TIMEOUT, lambda: describe(stack))
        workers = {n.metadata.name for n in stack.nodes()}
        for index in range(WORKERS):  # 40 of 64 GiB each: every worker keeps work, none has room for 30 GiB more
            stack.core.create_namespaced_pod("demo", pod(f"cpu-{index}", memory_gib=40))
        stack.wait_for("the CPU pods Running", lambda: pods_running(stack, [f"cpu-{i}" for i in range(WORKERS)]),
                       TIMEOUT, lambda: describe(stack))
        stack.wait_for("every worker at 0 GPUs, without CA's GPU label",
                       lambda: workers_at_zero_without_label(stack, workers), TIMEOUT, lambda: describe(stack))
        cluster = Cluster(stack, workers, log_offset=stack.autoscaler.log_path.stat().st_size)
        time.sleep(6.0)  # three of CA's scans over the zero-GPU workers before anything asks for capacity
        yield cluster


def test_a_cpu_pod_that_needs_a_node_gets_one_while_workers_sit_at_zero_gpus(cluster: Cluster):
    stack = cluster.stack
    stack.core.create_namespaced_pod("demo", pod("mem-0", memory_gib=30))
    started = time.monotonic()
    stack.wait_for("mem-0 Running on a new node", lambda: pods_running(stack, ["mem-0"]), TIMEOUT,
                   lambda: f"{describe(stack)}; CA log {stack.autoscaler.log_path}")
    cluster.timings["node path"] = time.monotonic() - started
    node = next(p.spec.node_name for p in stack.pods() if p.metadata.name == "mem-0")
    assert node not in cluster.workers
    assert machineset_replicas(stack) == WORKERS + 1


def test_a_gpu_pod_gets_an_attach_to_a_live_worker(cluster: Cluster):
    stack = cluster.stack
    nodes_before = {n.metadata.name for n in stack.nodes()}
    # The node added for mem-0 boots, gets its boot GPU, and (idle) gives it back: only then is no GPU left anywhere.
    stack.wait_for("every boot GPU, the new node's too, detached", lambda: detached(stack) >= WORKERS + 1
                   and workers_at_zero_without_label(stack, nodes_before), TIMEOUT, lambda: describe(stack))
    before = stack.dds.metrics().get('dds_decisions_total{case="fast-path-attach",outcome="gpu"}', 0.0)
    stack.core.create_namespaced_pod("demo", pod("gpu-0", memory_gib=8, gpus=1))
    started = time.monotonic()
    stack.wait_for("gpu-0 Running", lambda: pods_running(stack, ["gpu-0"]), TIMEOUT, lambda: describe(stack))
    took = time.monotonic() - started
    cluster.timings["GPU path"] = took
    name = next(p.spec.node_name for p in stack.pods() if p.metadata.name == "gpu-0")
    assert name in nodes_before, "a node was added for a pod one attach serves"
    # DDS labels a node on its next loop pass after the GPU shows (1 s here).
    node = stack.wait_for(f"CA's GPU label back on {name}", lambda: [
        n for n in [stack.core.read_node(name)] if (n.metadata.labels or {}).get(LABEL_ATTACHED_GPU) == "A30"], 10.0)[0]
    assert gpus_allocatable(node) == 1
    assert stack.dds.metrics().get('dds_decisions_total{case="fast-path-attach",outcome="gpu"}', 0.0) == before + 1
    assert took <= ATTACH_LATENCY[1] + GPU_PATH_OVERHEAD_SECONDS, cluster.timings


def test_ca_never_saw_a_gpu_node_without_gpus(cluster: Cluster):
    trapped = [line for line in cluster.ca_log_since_zero().splitlines() if TRAP_LINES.search(line)]
    assert trapped == [], "\n".join(trapped[:10])


def test_dds_labels_gpus_and_explains_each_change(cluster: Cluster):
    detached = [e for e in dds_events(cluster.stack) if e.reason == "DetachingGPU"
                and e.involved.removeprefix("node/") in cluster.workers]
    assert len(detached) >= WORKERS  # each worker's idle boot GPU went back to the pool
    log = cluster.stack.dds.log_path.read_text()
    assert f"removed {LABEL_ATTACHED_GPU}" in log and f"set {LABEL_ATTACHED_GPU}=A30" in log


def ca_status_groups(stack: Stack) -> dict[str, dict]:
    """CA's status ConfigMap (cluster-autoscaler-status, in the namespace it runs in): each node group's health (sizes
    and node counts), by name."""
    config_map = stack.core.read_namespaced_config_map("cluster-autoscaler-status", "dds-system")
    document = yaml.safe_load((config_map.data or {}).get("status") or "{}") or {}
    return {group["name"]: group.get("health") or {} for group in document.get("nodeGroups") or ()}


def rpc_count(stack: Stack, method: str) -> float:
    return stack.dds.metrics().get(f'dds_grpc_request_duration_seconds_count{{method="{method}"}}', 0.0)


def test_ca_holds_the_live_workers_in_the_groups_companion_and_asks_once_per_node(cluster: Cluster):
    """The workers at 0 GPUs are, for CA, the live nodes of `<group>#live` (docs/scale.md, "The companion group"):
    held at min = max = target, healthy, while the group itself keeps only its room to grow; and because CA caches
    that answer, it asks DDS about each node about once a scan (6-8 times when DDS answered "not autoscaled")."""
    stack = cluster.stack
    live = len(stack.nodes())
    companion = f"{GROUP}#live"

    def settled() -> dict[str, dict]:
        groups = ca_status_groups(stack)
        shown = groups.get(companion, {})
        return groups if shown.get("cloudProviderTarget") == live and GROUP in groups else {}

    groups = stack.wait_for(f"CA's status ConfigMap showing {companion} with {live} node(s)", settled, 60.0,
                            lambda: f"{describe(stack)}; status groups {ca_status_groups(stack)}")
    shown, group = groups[companion], groups[GROUP]
    assert (shown["minSize"], shown["maxSize"]) == (live, live), shown
    assert shown["status"] == "Healthy" and shown["nodeCounts"]["registered"]["total"] == live
    assert (group["minSize"], group["maxSize"], group["cloudProviderTarget"]) == (0, 6 - live, 0), group

    refreshes, lookups = rpc_count(stack, "Refresh"), rpc_count(stack, "NodeGroupForNode")
    stack.wait_for("three more CA scans", lambda: rpc_count(stack, "Refresh") >= refreshes + 3, 60.0)
    scans = rpc_count(stack, "Refresh") - refreshes
    per_node = (rpc_count(stack, "NodeGroupForNode") - lookups) / scans / live
    assert per_node <= 1.5, f"{per_node:.2f} NodeGroupForNode calls per node per scan over {scans:.0f} scans"
    refused = [line for line in cluster.ca_log_since_zero().splitlines()
               if "group size not found" in line or "Failed to get node group" in line
               or ("#live" in line and ("rror" in line or "refused" in line))]
    assert refused == [], "\n".join(refused[:10])
