"""Errors reach cluster-autoscaler (issue 6 part 6), on the stack with the real cluster-autoscaler.

A pool of two A30, both composed into the two workers at boot. A third GPU pod goes Pending; CA asks DDS for a node
(IncreaseSize). The planner would add one — a new node boots with one GPU — but that GPU comes from the same empty pool,
so the node would come up without it and CA would ask again for another (dds/planner/attach_failures.py). DDS adds
no node: the instance CA asked for is listed `instanceCreating` with errorInfo OutOfResources (class 1), CA backs off
and deletes the placeholder, and Events and metrics say why. When the pool grows (an operator adds a GPU: DDS restarted
on the new pool), DDS's own loop (case 2: pods CA did not serve) attaches it and the pod runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dds import certs
from harness.provider_client import (INSTANCE_CREATING, ExternalGrpcClient, Instance, Placeholder, load_cloud_config,
                                         open_channel)
from harness.invariants import describe as describe_violations
from harness.invariants import wait_converged
from harness.stack import Stack, StackOptions, pod, start_stack
from tests.e2e.cluster_facts import (GROUP, busy_workers, dds_events, describe, log_lines, machineset_replicas,
                                     pods_running)

pytestmark = pytest.mark.e2e

POOL_SIZE = 2  # both go to the workers at boot
TIMEOUT = 150.0


@dataclass
class Outcome:
    stack: Stack
    ca_backed_off: str  # what the autoscaler said when it backed off
    listed: list[Instance]  # NodeGroupNodes right after an IncreaseSize of our own during the backoff
    placeholder_deleted: list[str]  # DDS's log lines: CA deleted the failed instances' placeholders
    metrics_before_restart: dict[str, float]
    replicas_while_short: int
    converged_violations: list


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> Iterator[Outcome]:
    options = StackOptions(pool_size=POOL_SIZE, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=600.0,
                           node_idle_cooldown_seconds=600.0)
    with start_stack(tmp_path_factory.mktemp("errors-reach-ca"), options) as stack:
        busy_workers(stack, memory_gib=48, timeout=TIMEOUT)
        stack.core.create_namespaced_pod("demo", pod("train-0", memory_gib=8, gpus=1))
        # CA waits 30 s before scaling up for a GPU pod, asks, is told OutOfResources and backs off.
        backed_off = stack.wait_for("the autoscaler to back off", lambda: _ca_backed_off(stack), TIMEOUT,
                                    lambda: f"{describe(stack)}; autoscaler log {stack.autoscaler.log_path}")
        deleted = stack.wait_for("CA to delete the failed instance's placeholder",
                                 lambda: log_lines(stack.dds.log_path, "deleted its placeholder (create-error)"), 30.0)
        # What CA reads: the real one deletes the placeholder within its loop, too fast to watch from outside; so
        # ask for a node ourselves, with CA's certificate, and read NodeGroupNodes at once. That instance is ours, not
        # CA's: CA re-reads NodeGroupNodes only every 2 minutes (CloudProviderNodeInstancesCacheRefreshInterval), so
        # we drop it as CA drops its own (DeleteNodes with a create-error placeholder).
        channel = open_channel(load_cloud_config(stack.tls_dir / certs.CLOUD_CONFIG))
        try:
            provider = ExternalGrpcClient(channel)
            provider.increase_size(GROUP, 1)
            listed = provider.nodes(GROUP)
            provider.delete_placeholders(GROUP, [Placeholder(i.id, "create-error") for i in listed if i.failed_creating])
        finally:
            channel.close()
        time.sleep(5.0)  # CA loops on (every 2 s): still no node, no attach
        replicas = machineset_replicas(stack)
        metrics = stack.dds.metrics()

        # An operator adds a GPU to the pool; DDS restarts on the new configuration (the fabric's state survives).
        stack.config_path = stack.write_dds_config(
            "dds.yaml", stack.grpc_port,
            simulated_fabric={"pools": [{"name": "default", "devices": {"A30": POOL_SIZE + 1}}]})
        stack.restart_dds(kill=False)
        stack.wait_for("train-0 Running on the added GPU", lambda: pods_running(stack, ["train-0"]), TIMEOUT,
                       lambda: describe(stack))
        violations, _ = wait_converged(stack, 60.0)
        yield Outcome(stack, backed_off, listed, deleted, metrics, replicas, violations)


def _ca_backed_off(stack: Stack) -> str:
    lines = [line for line in log_lines(stack.autoscaler.log_path, "Disabling scale-up for node group") if GROUP in line]
    return lines[0] if lines else ""


def test_ca_sees_the_instance_creating_with_out_of_resources(outcome: Outcome):
    failed = [i for i in outcome.listed if i.error is not None]
    assert len(failed) == 1, outcome.listed
    assert failed[0].state == INSTANCE_CREATING
    assert (failed[0].error.code, failed[0].error.error_class) == ("OutOfResources", 1)  # OutOfResourcesErrorClass
    assert "pool default has 0 free A30" in failed[0].error.message, failed[0].error.message


def test_the_autoscaler_backs_off_and_drops_the_failed_instance(outcome: Outcome):
    assert "OutOfResources" in outcome.ca_backed_off, outcome.ca_backed_off
    assert outcome.placeholder_deleted


def test_no_node_is_added_for_a_gpu_the_pool_cannot_give(outcome: Outcome):
    assert outcome.replicas_while_short == 2
    assert sum(v for k, v in outcome.metrics_before_restart.items() if k.startswith("dds_nodes_added_total")) == 0


def test_events_and_metrics_say_why(outcome: Outcome):
    metrics = outcome.metrics_before_restart
    assert metrics.get('dds_decisions_total{case="case1-scale-up",outcome="error"}', 0) >= 1, metrics
    events = [e for e in dds_events(outcome.stack) if e.reason == "NoFreeGPU"]
    involved = {e.involved for e in events}
    assert {"pod/train-0", "machineset/gpu-workers"} <= involved, [e.line() for e in events]
    assert all("OutOfResources" in e.message and "pool default" in e.message for e in events)


def test_once_the_pool_can_serve_dds_attaches_and_everything_converges(outcome: Outcome):
    attached = [e for e in dds_events(outcome.stack) if e.reason == "AttachingGPU" and e.involved == "pod/train-0"]
    assert attached, "the added GPU was not attached for train-0"
    assert outcome.converged_violations == [], describe_violations(outcome.converged_violations)
