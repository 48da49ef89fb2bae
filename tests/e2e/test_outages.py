"""Outages in the middle of a scale-up (issue 9, part 3): the kube-apiserver restarts while an attach is in flight and
while a node is being added; cluster-autoscaler restarts while DDS is attaching the GPU it asked for. Each time: no
double action (exactly the GPUs and nodes the pods need, each device attached at most once, pool counts add up, every
node shows the GPUs the fabric gave it, CA's view converges), DDS recovers (/readyz back, its loop goes on) and the pods
end Running.

One stack for the module (one DDS, the real cluster-autoscaler), steps in file order:
1. two workers, each with its boot A30 busy (busy-0, busy-1);
2. train-0 asks for a GPU; the apiserver restarts while DDS attaches it;
3. train-1 asks for a GPU; cluster-autoscaler is killed while DDS attaches it, and started again;
4. mem-0 and mem-1 need a new node; the apiserver restarts before Cluster API has made its Machine.
`make soak` adds: 5. cluster-autoscaler restarts while a node is being added.
Attach latency (8-10 s) and node provisioning (15 s) are long enough for an outage (~3-5 s) to land inside them; the
test records whether it did and fails if it did not (the step would then prove nothing).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.stack import (WORKLOAD_NAMESPACE, Stack, StackOptions, gpus_allocatable, is_ready, pod,
                               start_stack)
from harness.invariants import ClusterHistory, ClusterReader, HistoryBounds, wait_converged
from harness.invariants import describe as describe_violations
from tests.e2e.cluster_facts import (check_no_double_action, describe, fabric_facts, log_lines, machineset_replicas,
                                     pods_running)
from tests.unit.reliability import figures

pytestmark = pytest.mark.e2e

POOL_SIZE = 8
ATTACH_LATENCY = (8.0, 10.0)
NODE_PROVISIONING = 15.0
STEP_TIMEOUT = 150.0
SOAK = os.environ.get("DDS_SOAK") == "1"
MACHINE_LAG = 10.0  # Cluster API's Machine comes this long after the apiserver is back: CA re-lists and scans meanwhile
CONVERGE_WITHIN = 90.0  # "CA's view converges": scan intervals, the instance's completion, the last loop passes
ORPHAN_BOUND = 600.0 + 30.0  # DDS's orphan_attach_timeout_seconds plus a detach
LOOP_PASSES = 'dds_plan_duration_seconds_count{kind="scale-down"}'  # one per control-loop pass


@dataclass
class Counts:
    attached: int
    nodes: int

    @classmethod
    def now(cls, stack: Stack) -> "Counts":
        return cls(fabric_facts(stack).attached_count(), machineset_replicas(stack))


class Outages:
    def __init__(self, stack: Stack, history: ClusterHistory) -> None:
        self.stack = stack
        self.history = history  # watches the whole module: no node removed with work, no orphan, GPUs shown in time
        self.started = time.monotonic()
        self.injected: list[tuple[str, str]] = []  # (what was restarted, during which scale-up)
        self.violations: list[str] = []

    def note(self, text: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f}s  {text}", flush=True)

    def wait_for(self, what: str, predicate, timeout: float = STEP_TIMEOUT):
        return self.stack.wait_for(what, predicate, timeout, describe=lambda: describe(self.stack))

    def create(self, name: str, memory_gib: int, gpus: int = 0) -> None:
        self.stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod(name, memory_gib=memory_gib, gpus=gpus))

    def new_running_attach(self, known: set[str]) -> list[str]:
        return [op["key"] for op in fabric_facts(self.stack).running("attach") if op["key"] not in known]

    def due(self, key: str) -> float:
        """When the fabric completes attach `key` (wall clock)."""
        return next(op["due"] for op in fabric_facts(self.stack).operations if op["key"] == key)

    def attach_keys(self) -> set[str]:
        return {op["key"] for op in fabric_facts(self.stack).operations if op["kind"] == "attach"}

    def restart_apiserver(self, during: str) -> float:
        self.injected.append(("kube-apiserver", during))
        started = time.monotonic()
        self.stack.control_plane.restart_apiserver()
        took = time.monotonic() - started
        self.note(f"kube-apiserver restarted ({took:.1f}s down)")
        return took

    def restart_autoscaler(self, during: str) -> None:
        """SIGKILL cluster-autoscaler and start a new one on the same flags; the old log is kept beside the new one."""
        self.injected.append(("cluster-autoscaler", during))
        handle = self.stack.autoscaler
        handle.kill()
        handle.log_path.rename(handle.log_path.with_name(f"before-restart-{handle.log_path.name}"))
        self.stack.start_autoscaler()
        self.note(f"{handle.kind} killed and started again")

    def recovered_and_settled(self) -> None:
        """DDS Ready again and its loop running; then everything at rest (CA's view converged) within a bound."""
        dds = self.stack.dds
        self.wait_for("DDS /readyz back", dds.ready, timeout=60)
        loops = dds.metrics().get(LOOP_PASSES, 0.0)
        self.wait_for("DDS's control loop to run again", lambda: dds.metrics().get(LOOP_PASSES, 0.0) > loops,
                      timeout=30)
        violations, took = wait_converged(self.stack, CONVERGE_WITHIN, self.history)
        assert violations == [], describe_violations(violations)
        self.note(f"converged {took:.1f}s after the pods ran")

    def check(self, expected: Counts) -> None:
        """Nothing done twice: exactly the expected attaches and nodes. An attach still in flight is waited for (within
        CONVERGE_WITHIN): a new node's boot GPU starts once DDS sees its Machine's nodeRef, which Cluster API may set
        after the node's pods already run; any other problem fails at once."""
        deadline = time.monotonic() + CONVERGE_WITHIN
        while True:
            problems = check_no_double_action(self.stack, expected_nodes=expected.nodes,
                                              expected_attached=expected.attached, history=self.history)
            if not problems or time.monotonic() > deadline or not all("still in flight" in p for p in problems):
                break
            time.sleep(2.0)
        self.violations += [p for p in problems if p not in self.violations]
        assert problems == [], "\n".join(problems)

    def report(self) -> None:
        """The figures for the reliability section: outages injected and violations found (printed at the end of the
        run; merged into $DDS_RELIABILITY_FIGURES under "outages")."""
        lines = [f"outages injected: {len(self.injected)} "
                 f"({', '.join(f'{what} restarted during {during}' for what, during in self.injected)})",
                 f"autoscaler: {self.stack.autoscaler.kind}; invariant violations: {len(self.violations)}",
                 *self.violations]
        figures.add_summary("outages in the middle of a scale-up", lines)
        target = os.environ.get("DDS_RELIABILITY_FIGURES")
        if target:
            figures.merge_section(Path(target), "outages", {
                "injected": [{"restarted": what, "during": during} for what, during in self.injected],
                "violations": len(self.violations)})


@pytest.fixture(scope="module")
def outages(tmp_path_factory) -> Iterator[Outages]:
    stack = start_stack(tmp_path_factory.mktemp("outages"), StackOptions(
        workers=2, pool_size=POOL_SIZE, attach_latency=ATTACH_LATENCY, detach_latency=(1.0, 2.0),
        node_provisioning_seconds=NODE_PROVISIONING, gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
        autoscaler_timings={"scale_down_unneeded_time": 600.0, "scale_down_delay_after_add": 600.0}))
    try:
        with ClusterHistory(ClusterReader.for_stack(stack), HistoryBounds(orphan_seconds=ORPHAN_BOUND)) as history:
            run = Outages(stack, history)
            run.note(f"stack up; autoscaler: {stack.autoscaler.kind}")
            run.wait_for("two Ready workers with their boot GPU",
                         lambda: len([n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) == 1]) == 2)
            for name in ("busy-0", "busy-1"):
                run.create(name, memory_gib=48, gpus=1)
            run.wait_for("busy-0 and busy-1 Running", lambda: pods_running(stack, ["busy-0", "busy-1"]))
            yield run
            run.report()
    finally:
        stack.close()


def test_apiserver_restart_while_an_attach_is_in_flight(outages: Outages):
    before, known = Counts.now(outages.stack), outages.attach_keys()
    outages.create("train-0", memory_gib=8, gpus=1)
    (key,) = outages.wait_for("DDS attaching a GPU for train-0", lambda: outages.new_running_attach(known))
    outages.note(f"attach {key} in flight")
    down_at = time.time()
    outages.restart_apiserver(during="an attach")
    assert outages.due(key) > down_at, "the attach was done before the outage: this step proved nothing"
    outages.wait_for("train-0 Running", lambda: pods_running(outages.stack, ["train-0"]))
    outages.note("train-0 Running")
    outages.recovered_and_settled()
    outages.check(Counts(attached=before.attached + 1, nodes=before.nodes))


def test_autoscaler_restart_while_an_attach_is_in_flight(outages: Outages):
    stack = outages.stack
    before, known = Counts.now(stack), outages.attach_keys()
    asked_before = len(log_lines(stack.dds.log_path, "case 1: CA asked"))
    outages.create("train-1", memory_gib=8, gpus=1)
    (key,) = outages.wait_for("DDS attaching a GPU for train-1", lambda: outages.new_running_attach(known))
    outages.note(f"attach {key} in flight")
    killed_at = time.time()
    outages.restart_autoscaler(during="an attach")
    assert outages.due(key) > killed_at, "the attach was done before the restart: this step proved nothing"
    outages.wait_for("train-1 Running", lambda: pods_running(stack, ["train-1"]))
    outages.note("train-1 Running")
    outages.recovered_and_settled()
    asked = len(log_lines(stack.dds.log_path, "case 1: CA asked")) - asked_before
    outages.note(f"CA asked DDS for capacity {asked} time(s) for train-1")
    outages.check(Counts(attached=before.attached + 1, nodes=before.nodes))


def test_apiserver_restart_while_a_node_is_being_added(outages: Outages):
    """Cluster API's MachineSet controller is paused from before DDS's MachineSet patch until after the restart, as
    when it too is still reconnecting to the apiserver: the new replica has no Machine yet.
    (DDS once ended its node instance there and CA, seeing its scale-up gone, had it add a second node.)"""
    stack = outages.stack
    before = Counts.now(stack)
    asked_before = len(log_lines(stack.dds.log_path, "case 1: CA asked"))
    with stack.machines_paused():
        for name in ("mem-0", "mem-1"):
            outages.create(name, memory_gib=24)
        outages.wait_for("DDS adding a node (MachineSet scaled up)", lambda: machineset_replicas(stack) > before.nodes)
        outages.restart_apiserver(during="a node add, before its Machine")
        time.sleep(MACHINE_LAG)  # CA, back on the apiserver, looks at the group again before the Machine exists
    assert len(stack.nodes()) == before.nodes, "the node was up before the outage ended: this step proved nothing"
    outages.wait_for("mem-0 and mem-1 Running", lambda: pods_running(stack, ["mem-0", "mem-1"]))
    asked = len(log_lines(stack.dds.log_path, "case 1: CA asked")) - asked_before
    assert asked == 1, f"CA asked DDS {asked} times for one node: it lost sight of the node on its way"
    outages.note("mem-0 and mem-1 Running on the new node")
    outages.recovered_and_settled()
    # the new node's boot GPU is its only attach
    outages.check(Counts(attached=before.attached + 1, nodes=before.nodes + 1))


@pytest.mark.slow
@pytest.mark.skipif(not SOAK, reason="a soak variant: make soak (DDS_SOAK=1)")
def test_autoscaler_restart_while_a_node_is_being_added(outages: Outages):
    stack = outages.stack
    before = Counts.now(stack)
    for name in ("mem-2", "mem-3"):
        outages.create(name, memory_gib=24)
    outages.wait_for("DDS adding a node (MachineSet scaled up)", lambda: machineset_replicas(stack) > before.nodes)
    outages.restart_autoscaler(during="a node add")
    assert len(stack.nodes()) == before.nodes, "the node was up before CA restarted: this step proved nothing"
    outages.wait_for("mem-2 and mem-3 Running", lambda: pods_running(stack, ["mem-2", "mem-3"]))
    outages.recovered_and_settled()
    outages.check(Counts(attached=before.attached + 1, nodes=before.nodes + 1))
