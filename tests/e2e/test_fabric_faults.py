"""Fabric faults (issue 9 part 2): each kind the simulated fabric injects (FaultSpec), on the demo's GPU step.

The stack runs without an autoscaler: this test asks DDS for the node, with cluster-autoscaler's certificate, as CA
does (NodeGroupIncreaseSize, then NodeGroupNodes) — so no fault waits behind CA's 30 s GPU-pod buffer or its backoff
(what CA does with the errors DDS reports is tests/e2e/test_errors_reach_ca.py). The real CA would blur the exact counts
asserted here: it backs the group off after an errorInfo, asks again (more attempts, more faults injected) and deletes
failed instances on its own schedule. The README's "The real cluster-autoscaler" lists it among the e2e files without
CA. One stack for all; before each GPU step DDS restarts on the fault under test (`max_faults` caps how
often it strikes; the count lives in the fabric's stored state).

| fault                        | DDS                                                    | the pod        |
|------------------------------|--------------------------------------------------------|----------------|
| attach_error (twice)         | retries after 2 s, then 4 s (tenacity's backoff)       | Running        |
| attach_error (always)        | 4 attempts, then errorInfo BackendError (class Other)  | Pending, told  |
| attach_hang                  | cancels it after the orphan timeout, retries           | Running        |
| partial_attach               | attaches what is missing on the same node              | Running        |
| device_failure_after_attach  | detaches the failed GPU, attaches a replacement        | Running        |
| detach_error                 | the idle GPU is detached again after the cooldown      | (gone)         |

After each: the pod goes, its GPUs are detached when idle, and the invariants of harness/invariants.py must hold
(no device leaked: pool counts add up, every node shows what the fabric attached, nothing in flight, CA's view empty).
Figures (faults injected, recovered) are printed and merged into $DDS_RELIABILITY_FIGURES under "faults".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dds import certs
from dds.kube.configmap import DATA_KEY
from harness.provider_client import (INSTANCE_CREATING, ExternalGrpcClient, Instance, Placeholder, load_cloud_config,
                                         open_channel)
from harness.invariants import describe as describe_violations
from harness.invariants import wait_converged
from harness.stack import DDS_NAMESPACE, Stack, StackOptions, gpus_allocatable, pod, start_stack
from tests.e2e.cluster_facts import (FABRIC_STATE_CONFIGMAP, GROUP, busy_workers, dds_events, describe, fabric_facts,
                                     pods_running)
from tests.unit.reliability import figures

pytestmark = pytest.mark.e2e

SOAK = os.environ.get("DDS_SOAK") == "1"
SOAK_STEPS = 12
POOL_SIZE = 8
BOOT_GPUS = 2  # one per worker
HANG_TIMEOUT = 10.0  # orphan_attach_timeout_seconds: a hung attach is cancelled after this
IDLE_COOLDOWN = 6.0
TIMEOUT = 120.0
FIGURES: dict[str, dict[str, Any]] = {}  # fault kind -> figures of its run


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(autoscaler=False, pool_size=POOL_SIZE, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=IDLE_COOLDOWN,
                           node_idle_cooldown_seconds=600.0,
                           # No CA here: DDS's own loop for pods CA did not serve (case 2) would act after this.
                           dds_settings={"orphan_attach_timeout_seconds": HANG_TIMEOUT,
                                         "pending_debounce_seconds": 600.0})
    with start_stack(tmp_path_factory.mktemp("fabric-faults"), options) as started:
        busy_workers(started, memory_gib=48, timeout=TIMEOUT)
        yield started
    _report()


def _report() -> None:
    if not FIGURES:
        return
    injected = sum(f["injected"] for f in FIGURES.values())
    recovered = sum(f["recovered"] for f in FIGURES.values())
    reported = sum(f["reported"] for f in FIGURES.values())
    violations = sum(f["violations"] for f in FIGURES.values())
    lines = [f"{injected} faults injected in {len(FIGURES)} runs; {recovered} GPU steps recovered (pod Running or GPU "
             f"back), {reported} reported to CA as errorInfo; invariant violations: {violations}"]
    lines += [f"{kind}: {f['injected']} injected, {f['outcome']}" for kind, f in FIGURES.items()]
    figures.add_summary("fabric faults", lines)
    target = os.environ.get("DDS_RELIABILITY_FIGURES")
    if target:
        figures.merge_section(Path(target), "faults", {"injected": injected, "recovered": recovered,
                                                       "reported": reported, "violations": violations, "runs": FIGURES})


# --- the steps ---

@dataclass
class Provider:
    """cluster-autoscaler's side of the wire, with its certificate."""

    stack: Stack

    def __enter__(self) -> ExternalGrpcClient:
        self._channel = open_channel(load_cloud_config(self.stack.tls_dir / certs.CLOUD_CONFIG))
        return ExternalGrpcClient(self._channel)

    def __exit__(self, *_exc: object) -> None:
        self._channel.close()


def restart_with_faults(stack: Stack, **faults: Any) -> dict[str, int]:
    """DDS on `faults` from now on; returns the faults injected so far (the count is cumulative per kind)."""
    stack.config_path = stack.write_dds_config("dds.yaml", stack.grpc_port, simulated_fabric={"faults": faults})
    stack.restart_dds(kill=False)
    return faults_injected(stack)


def faults_injected(stack: Stack) -> dict[str, int]:
    config_map = stack.core.read_namespaced_config_map(FABRIC_STATE_CONFIGMAP, DDS_NAMESPACE)
    return dict(json.loads((config_map.data or {})[DATA_KEY]).get("faults", {}))


def unschedulable(stack: Stack, name: str) -> bool:
    found = next((p for p in stack.pods() if p.metadata.name == name), None)
    conditions = (found.status.conditions or ()) if found is not None else ()
    return any(c.type == "PodScheduled" and c.status == "False" for c in conditions)


def gpu_step(stack: Stack, name: str, gpus: int = 1) -> float:
    """A GPU pod goes Pending; ask DDS for a node as CA would. Returns when it asked (monotonic)."""
    stack.core.create_namespaced_pod("demo", pod(name, memory_gib=8, gpus=gpus))
    stack.wait_for(f"{name} unschedulable", lambda: unschedulable(stack, name), TIMEOUT, lambda: describe(stack))
    with Provider(stack) as provider:
        provider.increase_size(GROUP, 1)
    return time.monotonic()


def fabric_errors(metrics: dict[str, float], kind: str, code: str) -> float:
    return metrics.get(f'dds_fabric_errors_total{{backend="simulated",code="{code}",kind="{kind}"}}', 0.0)


def failed_instances(stack: Stack) -> list[Instance]:
    with Provider(stack) as provider:
        return [i for i in provider.nodes(GROUP) if i.error is not None]


def drop_failed(stack: Stack, instances: list[Instance]) -> None:
    """What CA does with failed instances: delete their placeholders."""
    with Provider(stack) as provider:
        provider.delete_placeholders(GROUP, [Placeholder(i.id, "create-error") for i in instances])


def events_about(stack: Stack, involved: str, reason: str) -> list[str]:
    return [e.message for e in dds_events(stack) if e.involved == involved and e.reason == reason]


def back_to_boot_gpus(stack: Stack) -> bool:
    """Each worker holds its boot GPU only, in the fabric (nothing in flight) and as the node shows it. The fabric
    decides: a node stops showing a GPU as soon as its detach starts, and a detach can still fail."""
    facts = fabric_facts(stack)
    return (facts.attached_count() == BOOT_GPUS and not facts.running("attach") and not facts.running("detach")
            and all(gpus_allocatable(n) == 1 for n in stack.nodes()))


def finish(stack: Stack, name: str) -> list:
    """The pod goes; its GPUs are detached once idle; then everything must have converged."""
    stack.core.delete_namespaced_pod(name, "demo", grace_period_seconds=0)
    stack.wait_for("each worker back to its boot GPU", lambda: back_to_boot_gpus(stack), TIMEOUT,
                   lambda: f"{describe(stack)}; fabric: {fabric_facts(stack).attached()}")
    violations, _ = wait_converged(stack, 60.0)
    return violations


def record(run: str, injected: int, *, recovered: int, reported: int, outcome: str, violations: list) -> None:
    FIGURES[run] = {"injected": injected, "recovered": int(recovered), "reported": reported, "outcome": outcome,
                    "violations": len(violations)}


def injected_since(stack: Stack, before: dict[str, int], kind: str) -> int:
    return faults_injected(stack).get(kind, 0) - before.get(kind, 0)


# --- one test per fault kind ---

def test_attach_errors_are_retried_with_backoff_until_the_pod_runs(stack: Stack):
    before = restart_with_faults(stack, attach_error=1.0, max_faults=2)
    asked = gpu_step(stack, "train-error")
    stack.wait_for("train-error Running", lambda: pods_running(stack, ["train-error"]), TIMEOUT,
                   lambda: describe(stack))
    took = time.monotonic() - asked
    metrics = stack.dds.metrics()
    retries = events_about(stack, "pod/train-error", "RetryingAttach")
    injected = injected_since(stack, before, "attach_error")
    assert injected == 2
    assert fabric_errors(metrics, "attach", "BackendError") == 2, metrics
    assert len(retries) == 2, retries
    assert any("retry 1 of 3 in 2s" in r for r in retries) and any("retry 2 of 3 in 4s" in r for r in retries), retries
    violations = finish(stack, "train-error")
    record("attach_error", injected, recovered=1, reported=0, violations=violations,
           outcome=f"retried twice (2 s, 4 s), pod Running {took:.1f}s after the scale-up")
    assert violations == [], describe_violations(violations)


def test_persistent_attach_errors_reach_ca_as_error_info(stack: Stack):
    before = restart_with_faults(stack, attach_error=1.0)  # no budget: the fabric never recovers
    gpu_step(stack, "train-broken")

    [instance] = stack.wait_for("the instance to fail", lambda: failed_instances(stack), TIMEOUT,
                                lambda: describe(stack))
    metrics = stack.dds.metrics()
    assert instance.state == INSTANCE_CREATING
    assert (instance.error.code, instance.error.error_class) == ("BackendError", 99)  # OtherErrorClass
    assert "after 4 attempt(s)" in instance.error.message, instance.error.message
    assert fabric_errors(metrics, "attach", "BackendError") == 4, metrics
    assert events_about(stack, "pod/train-broken", "ScaleUpFailed"), "the pod was not told"
    assert not pods_running(stack, ["train-broken"])
    # Nothing leaked while failing: every failed attach gave its device back.
    assert sum(gpus_allocatable(n) for n in stack.nodes()) == BOOT_GPUS
    drop_failed(stack, [instance])
    violations = finish(stack, "train-broken")
    record("attach_error (persistent)", injected_since(stack, before, "attach_error"), recovered=0, reported=1,
           violations=violations,
           outcome="4 attempts, then errorInfo BackendError to CA; pod stays Pending (clear error)")
    assert violations == [], describe_violations(violations)


def test_a_hung_attach_is_cancelled_and_retried(stack: Stack):
    before = restart_with_faults(stack, attach_hang=1.0, max_faults=1)
    asked = gpu_step(stack, "train-hang")
    stack.wait_for("train-hang Running", lambda: pods_running(stack, ["train-hang"]), TIMEOUT + HANG_TIMEOUT,
                   lambda: describe(stack))
    took = time.monotonic() - asked
    metrics = stack.dds.metrics()
    retries = events_about(stack, "pod/train-hang", "RetryingAttach")
    injected = injected_since(stack, before, "attach_hang")
    assert injected == 1
    assert fabric_errors(metrics, "attach", "Timeout") == 1, metrics
    assert any("never completed" in r for r in retries), retries
    assert took >= HANG_TIMEOUT
    violations = finish(stack, "train-hang")
    record("attach_hang", injected, recovered=1, reported=0, violations=violations,
           outcome=f"cancelled after the {HANG_TIMEOUT:g}s orphan timeout, retried; pod Running after {took:.1f}s")
    assert violations == [], describe_violations(violations)


def test_a_partial_attach_gets_the_rest_attached(stack: Stack):
    before = restart_with_faults(stack, partial_attach=1.0, max_faults=1)
    gpu_step(stack, "train-partial", gpus=2)
    stack.wait_for("train-partial Running", lambda: pods_running(stack, ["train-partial"]), TIMEOUT,
                   lambda: describe(stack))
    metrics = stack.dds.metrics()
    [running] = [p for p in stack.pods() if p.metadata.name == "train-partial"]
    node = next(n for n in stack.nodes() if n.metadata.name == running.spec.node_name)
    injected = injected_since(stack, before, "partial_attach")
    assert injected == 1
    assert fabric_errors(metrics, "attach", "BackendError") == 1, metrics
    assert gpus_allocatable(node) == 3  # its boot GPU and the two the pod asked for: no more
    assert events_about(stack, "pod/train-partial", "RetryingAttach")
    violations = finish(stack, "train-partial")
    record("partial_attach", injected, recovered=1, reported=0, violations=violations,
           outcome="the missing GPU(s) attached on the same node; pod Running")
    assert violations == [], describe_violations(violations)


def test_a_gpu_failing_after_attach_is_returned_and_replaced(stack: Stack):
    before = restart_with_faults(stack, device_failure_after_attach=1.0, max_faults=1)
    gpu_step(stack, "train-failing")
    stack.wait_for("train-failing Running", lambda: pods_running(stack, ["train-failing"]), TIMEOUT,
                   lambda: describe(stack))
    stack.wait_for("the failure to be seen", lambda: fabric_errors(stack.dds.metrics(), "device", "DeviceFailed"),
                   TIMEOUT, lambda: describe(stack))
    [running] = [p for p in stack.pods() if p.metadata.name == "train-failing"]
    node = running.spec.node_name
    stack.wait_for(f"{node} back to 2 GPUs", lambda: next(
        gpus_allocatable(n) for n in stack.nodes() if n.metadata.name == node) == 2, TIMEOUT, lambda: describe(stack))
    metrics = stack.dds.metrics()
    injected = injected_since(stack, before, "device_failure_after_attach")
    assert injected == 1
    assert fabric_errors(metrics, "device", "DeviceFailed") == 1, metrics
    assert events_about(stack, f"node/{node}", "GPUFailed")
    assert pods_running(stack, ["train-failing"])
    violations = finish(stack, "train-failing")
    record("device_failure_after_attach", injected, recovered=1, reported=0, violations=violations,
           outcome="the failed GPU detached (back to the fabric) and a replacement attached; pod kept Running")
    assert violations == [], describe_violations(violations)


def test_a_failed_detach_is_tried_again(stack: Stack):
    before = restart_with_faults(stack, detach_error=1.0, max_faults=1)
    gpu_step(stack, "train-detach")
    stack.wait_for("train-detach Running", lambda: pods_running(stack, ["train-detach"]), TIMEOUT,
                   lambda: describe(stack))
    violations = finish(stack, "train-detach")  # the idle GPU's first detach fails, the next one succeeds
    metrics = stack.dds.metrics()
    injected = injected_since(stack, before, "detach_error")
    assert injected == 1
    assert fabric_errors(metrics, "detach", "BackendError") == 1, metrics
    assert [e for e in dds_events(stack) if e.reason == "DetachFailed"]
    record("detach_error", injected, recovered=1, reported=0, violations=violations,
           outcome=f"the idle GPU detached again after the {IDLE_COOLDOWN:g}s cooldown")
    assert violations == [], describe_violations(violations)


@pytest.mark.slow
@pytest.mark.skipif(not SOAK, reason="the long fault campaign runs under make soak (DDS_SOAK=1)")
def test_every_fault_at_random_many_gpu_steps(stack: Stack):
    """All fault kinds at once, at random (seeded), no budget: every GPU step ends with the pod Running or a clear
    error to CA, and after each the invariants hold."""
    kinds = {"attach_error": 0.3, "attach_hang": 0.05, "partial_attach": 0.2, "device_failure_after_attach": 0.15,
             "detach_error": 0.2}
    before = restart_with_faults(stack, seed=11, **kinds)
    ran, failed, violations = 0, 0, []
    for step in range(SOAK_STEPS):
        name = f"soak-{step}"
        gpu_step(stack, name, gpus=1 + step % 2)
        stack.wait_for(f"{name} Running or told", lambda: pods_running(stack, [name]) or failed_instances(stack),
                       TIMEOUT + HANG_TIMEOUT, lambda: describe(stack))
        failures = failed_instances(stack)
        if failures:
            assert all(i.error.code in ("BackendError", "Timeout") for i in failures), failures
            drop_failed(stack, failures)
            failed += 1
        else:
            ran += 1
        violations += finish(stack, name)
    injected = {kind: injected_since(stack, before, kind) for kind in kinds}
    record("all kinds at random (soak)", sum(injected.values()), recovered=ran, reported=failed,
           violations=violations, outcome=f"{SOAK_STEPS} GPU steps: {ran} Running, {failed} told CA errorInfo; "
                                          f"injected {injected}")
    assert violations == [], describe_violations(violations)
