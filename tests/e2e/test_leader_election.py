"""Two DDS replicas on one stack (issue 7, "Done when": only the leader attaches; killing it hands over within the lease
duration). Real apiserver, scheduler and kwok; both replicas are `dds serve` processes on mutual TLS with leader election
on one Lease (dds-system/dds-leader), identities dds-a and dds-b, each on its own ports.

How cluster-autoscaler reaches "DDS": its cloud-config has one address. In a cluster that is the DDS Service, which routes
to the Ready pods carrying the leader's label dds.cdi.dev/leader=true (every replica is Ready once it can serve; the
leader labels its own Pod: dds/kube/leader_label.py). Each replica here is told its Pod (POD_NAME: an API object in
dds-system, no kubelet runs it), and a `ReadyForwarder` (harness/forwarder.py) plays the Service: CA dials it, each new
connection goes to the replica that is Ready and whose Pod is labelled at that moment, and a killed replica's
connections break so CA's channel reconnects to the new leader. Pointing CA at the leader's port instead would hide the
one thing worth seeing: that CA finds the new leader by itself.

The scenario runs once for the module (fixture `election`); each test asserts one thing a user would check:
1. dds-a leads, dds-b is a standby: Ready but not labelled, and it answers every CloudProvider RPC UNAVAILABLE naming
   the leader.
2. A memory-heavy pod: CA asks for a node through the forwarder; dds-a adds it and attaches its boot GPU.
3. SIGKILL dds-a while a new 1-GPU pod arrives: dds-b takes the Lease (handover measured, printed) and serves that
   scale-up: one GPU attached, no node added. Every DDS Event says which replica wrote it (reportingInstance).
4. dds-a comes back: now it is the standby (Ready, its Pod's label cleared at start), naming dds-b.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import grpc
import pytest
import yaml
from kubernetes import client

from dds import certs
from harness.autoscaler import free_port
from harness.forwarder import ReadyForwarder, Route
from harness.invariants import wait_converged
from harness.replicas import Replica, create_replica_pod
from harness.stack import (DDS_NAMESPACE, WORKLOAD_NAMESPACE, DdsProcess, Stack, StackOptions, gpus_allocatable,
                               is_ready, pod, start_stack)
from tests.e2e.cluster_facts import (DdsEvent, ProviderClient, check_no_double_action, dds_events, describe,
                                     fabric_facts, machineset_replicas, pods_running)
from tests.unit.reliability import figures

pytestmark = pytest.mark.e2e

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6.0, 4.0, 1.0
# A standby judges expiry on its own clock from the last change it saw (client-go's rule): it may have seen the last
# renewal up to one jittered retry (x2.2) after it happened, and it retries every jittered retry period.
JITTERED_RETRY = RETRY_PERIOD * 2.2
HANDOVER_BOUND = LEASE_DURATION + 2 * JITTERED_RETRY + 1.0  # + 1 s for the API round trips and the /readyz poll
POOL_SIZE = 8
STEP_TIMEOUT = 150.0


@dataclass
class ElectionRun:
    standby_ready_while_a_leads: bool = False
    standby_labelled_while_a_leads: bool = True
    standby_answer_while_a_leads: Optional[tuple[grpc.StatusCode, str]] = None
    leader_answer_while_a_leads: Optional[tuple[grpc.StatusCode, str]] = None
    events_before_kill: list[DdsEvent] = field(default_factory=list)
    events_after_kill: list[DdsEvent] = field(default_factory=list)
    routes_before_kill: list[Route] = field(default_factory=list)
    routes_after_takeover: list[Route] = field(default_factory=list)
    attached_before_kill: int = 0
    attached_at_end: int = 0
    nodes_before_kill: int = 0
    nodes_at_end: int = 0
    handover_seconds: float = 0.0
    lease_holder: str = ""
    lease_transitions: int = 0
    pool_used_seen_by_new_leader: float = -1.0
    pool_used_at_takeover: int = -1
    restarted_ready: bool = False
    restarted_labelled: bool = True
    restarted_answer: Optional[tuple[grpc.StatusCode, str]] = None
    invariant_problems: list[str] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)


def wait_for(stack: Stack, what: str, predicate, timeout: float = STEP_TIMEOUT):
    return stack.wait_for(what, predicate, timeout, describe=lambda: describe(stack))


def used_gauge(process: DdsProcess) -> Optional[float]:
    return process.metrics().get('dds_pool_devices{model="A30",pool="default",state="used"}')


class Scenario:
    def __init__(self, workdir: Path) -> None:
        self.run = ElectionRun()
        self.started = time.monotonic()
        self.stack: Stack = start_stack(workdir, StackOptions(
            workers=2, autoscaler=False, pool_size=POOL_SIZE, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0),
            node_provisioning_seconds=8.0, gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
            autoscaler_timings={"scale_down_unneeded_time": 600.0, "scale_down_delay_after_add": 600.0},
            dds_settings={"leader_election": True, "identity": "dds-a", "lease_duration_seconds": LEASE_DURATION,
                          "renew_deadline_seconds": RENEW_DEADLINE, "retry_period_seconds": RETRY_PERIOD},
            dds_env={"POD_NAME": "dds-a"}))
        for identity in ("dds-a", "dds-b"):  # dds-a's label is written by its next pass once its Pod is there
            create_replica_pod(self.stack.core, identity)
        self.extra: list[DdsProcess] = []
        self.forwarder: Optional[ReadyForwarder] = None

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self.started:6.1f}s  {text}"
        self.run.timeline.append(line)
        print(line, flush=True)

    def close(self) -> None:
        for process in self.extra:
            process.stop()
        if self.forwarder is not None:
            self.forwarder.stop()
        self.stack.close()

    # --- setup: dds-a is the stack's DDS (leader), dds-b a standby, CA behind the forwarder ---
    def start_replicas_and_autoscaler(self) -> None:
        stack = self.stack
        self.a = Replica("dds-a", stack.config_path, stack.grpc_port, stack.dds)
        b_port = free_port()
        self.b = Replica("dds-b", stack.write_dds_config("dds-b.yaml", b_port, identity="dds-b"), b_port)
        # Ready is not leading any more: dds-a leads once its Pod carries the label (written by its next pass).
        wait_for(stack, "dds-a leading, its Pod labelled", lambda: self.a.labelled(stack.core), timeout=60)
        self.b.process = stack.start_dds(self.b.config, "dds-b.log", wait_ready=False, env={"POD_NAME": "dds-b"})
        self.extra.append(self.b.process)
        core = stack.core
        self.forwarder = ReadyForwarder(lambda: [self.a.backend(core), self.b.backend(core)]).start()
        cloud_config = certs.cloud_config(certs.CloudConfigOptions(address=self.forwarder.address,
                                                                   files_dir=str(stack.tls_dir)))
        (stack.tls_dir / certs.CLOUD_CONFIG).write_text(yaml.safe_dump(cloud_config, sort_keys=False))
        stack.start_autoscaler()
        self.note(f"dds-a leads on {self.a.address}, dds-b standby on {self.b.address}; {stack.autoscaler.kind} "
                  f"dials the forwarder on {self.forwarder.address}")

    def lease(self) -> client.V1Lease:
        return client.CoordinationV1Api(self.stack.api).read_namespaced_lease("dds-leader", DDS_NAMESPACE)

    # --- 1 and 2: dds-a leads ---
    def while_a_leads(self) -> None:
        stack, run = self.stack, self.run
        wait_for(stack, "two Ready workers with their boot GPU",
                 lambda: len([n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) == 1]) == 2)
        wait_for(stack, "dds-b Ready (started, a standby)", self.b.process.ready, timeout=60)
        run.standby_ready_while_a_leads = self.b.process.ready()
        run.standby_labelled_while_a_leads = self.b.labelled(stack.core)
        with ProviderClient(stack, self.b.address) as standby, ProviderClient(stack, self.a.address) as leader:
            run.standby_answer_while_a_leads = standby.refusal()
            run.leader_answer_while_a_leads = leader.refusal()
        self.note(f"dds-b answers {run.standby_answer_while_a_leads}")
        for name in ("busy-0", "busy-1"):
            stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod(name, memory_gib=48, gpus=1))
        wait_for(stack, "busy-0 and busy-1 Running", lambda: pods_running(stack, ["busy-0", "busy-1"]))
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("mem-0", memory_gib=24))
        self.note("mem-0 (24Gi) created: no worker holds it, CA asks for a node")
        wait_for(stack, "mem-0 Running on a new node with its boot GPU",
                 lambda: pods_running(stack, ["mem-0"]) and sum(gpus_allocatable(n) for n in stack.nodes()) == 3)
        # busy-2 takes the new node's GPU, so the next GPU pod needs an attach.
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("busy-2", memory_gib=8, gpus=1))
        wait_for(stack, "busy-2 Running", lambda: pods_running(stack, ["busy-2"]))
        self.note("mem-0 and busy-2 Running on the node dds-a added")

    # --- 3: SIGKILL the leader, a GPU pod arrives ---
    def kill_leader(self) -> None:
        stack, run = self.stack, self.run
        time.sleep(1.0)  # let the Event recorder write what dds-a did
        run.events_before_kill = dds_events(stack)
        run.routes_before_kill = list(self.forwarder.routes)
        run.attached_before_kill = fabric_facts(stack).attached_count()
        run.nodes_before_kill = machineset_replicas(stack)
        transitions_before = self.lease().spec.lease_transitions or 0
        self.a.process.kill()
        killed = time.monotonic()
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("train-1", memory_gib=8, gpus=1))
        self.note("SIGKILL dds-a; train-1 (1 GPU) created")
        stack.dds = self.b.process  # the stack now watches the replica that should lead
        while not (self.b.process.ready() and self.b.labelled(stack.core)):
            if time.monotonic() - killed > 3 * HANDOVER_BOUND:
                raise AssertionError(f"dds-b not Ready and labelled {3 * HANDOVER_BOUND:.0f}s after dds-a was killed")
            stack.check_alive()
            time.sleep(0.1)
        run.handover_seconds = time.monotonic() - killed
        lease = self.lease()
        run.lease_holder = lease.spec.holder_identity or ""
        run.lease_transitions = (lease.spec.lease_transitions or 0) - transitions_before
        self.note(f"dds-b labelled (leading) {run.handover_seconds:.1f}s after the kill "
                  f"(lease {LEASE_DURATION:g}s, retry {RETRY_PERIOD:g}s)")
        wait_for(stack, "dds-b's first loop to publish the pool gauges",
                 lambda: used_gauge(self.b.process) is not None, timeout=30)
        run.pool_used_seen_by_new_leader = used_gauge(self.b.process)
        run.pool_used_at_takeover = fabric_facts(stack).attached_count()

    def new_leader_serves(self) -> None:
        stack, run = self.stack, self.run
        wait_for(stack, "train-1 Running", lambda: pods_running(stack, ["train-1"]))
        self.note("train-1 Running")
        a2 = stack.start_dds(self.a.config, "dds-a-restarted.log", wait_ready=False, env={"POD_NAME": "dds-a"})
        self.extra.append(a2)
        self.a.process = a2
        time.sleep(2 * JITTERED_RETRY)  # a campaign step or two: it has seen who holds the Lease
        wait_for(stack, "dds-a restarted Ready (a standby)", a2.ready, timeout=60)
        run.restarted_ready = a2.ready()
        run.restarted_labelled = self.a.labelled(stack.core)
        with ProviderClient(stack, self.a.address) as restarted:
            run.restarted_answer = restarted.refusal()
        self.note(f"dds-a restarted as a standby: answers {run.restarted_answer}")

    def settle_and_check(self) -> None:
        stack, run = self.stack, self.run

        violations, _ = wait_converged(stack, 60)  # through the forwarder, as CA reads it
        run.invariant_problems = [str(v) for v in violations]
        time.sleep(1.0)  # let the Event recorder write the last Events
        run.routes_after_takeover = self.forwarder.routes[len(run.routes_before_kill):]
        run.events_after_kill = [e for e in dds_events(stack) if e.uid not in {x.uid for x in run.events_before_kill}]
        run.attached_at_end = fabric_facts(stack).attached_count()
        run.nodes_at_end = machineset_replicas(stack)
        run.invariant_problems += check_no_double_action(stack, expected_nodes=3, expected_attached=4)


@pytest.fixture(scope="module")
def election(tmp_path_factory) -> ElectionRun:
    scenario = Scenario(tmp_path_factory.mktemp("leader-election"))
    try:
        scenario.start_replicas_and_autoscaler()
        scenario.while_a_leads()
        scenario.kill_leader()
        scenario.new_leader_serves()
        scenario.settle_and_check()
    finally:
        scenario.close()
    report(scenario.run)
    return scenario.run


def report(run: ElectionRun) -> None:
    """Printed at the end of the run; merged into $DDS_RELIABILITY_FIGURES under "leader-election"."""
    timing = f"lease {LEASE_DURATION:g}s, renew deadline {RENEW_DEADLINE:g}s, retry {RETRY_PERIOD:g}s"
    figures.add_summary("two DDS replicas", [
        f"handover after SIGKILL of the leader: {run.handover_seconds:.1f}s ({timing}; bound {HANDOVER_BOUND:.1f}s)",
        f"DDS Events before the kill: {len(run.events_before_kill)} (by "
        f"{', '.join(sorted({e.instance for e in run.events_before_kill}))}); after: {len(run.events_after_kill)} (by "
        f"{', '.join(sorted({e.instance for e in run.events_after_kill}))})",
        f"GPUs attached for the pod after the kill: {run.attached_at_end - run.attached_before_kill}; "
        f"nodes added: {run.nodes_at_end - run.nodes_before_kill}; violations: {len(run.invariant_problems)}"])
    target = os.environ.get("DDS_RELIABILITY_FIGURES")
    if target:
        figures.merge_section(Path(target), "leader-election", {
            "handover_seconds": round(run.handover_seconds, 1), "lease_duration_seconds": LEASE_DURATION,
            "retry_period_seconds": RETRY_PERIOD, "violations": len(run.invariant_problems)})


def lines(events: list[DdsEvent]) -> str:
    return "\n".join(e.line() for e in events)


def test_the_standby_is_ready_unlabelled_and_refuses_ca_naming_the_leader(election: ElectionRun):
    assert election.leader_answer_while_a_leads is None, election.leader_answer_while_a_leads
    assert election.standby_ready_while_a_leads is True and election.standby_labelled_while_a_leads is False
    assert election.standby_answer_while_a_leads == (grpc.StatusCode.UNAVAILABLE, "not the leader; the leader is dds-a")
    # The killed leader's label stayed on its Pod (SIGKILL); the restarted process cleared it at start.
    assert election.restarted_ready is True and election.restarted_labelled is False
    assert election.restarted_answer == (grpc.StatusCode.UNAVAILABLE, "not the leader; the leader is dds-b")


def test_only_the_leader_acts_and_every_event_names_it(election: ElectionRun):
    before, after = election.events_before_kill, election.events_after_kill
    assert {e.instance for e in before} == {"dds-a"}, lines(before)
    assert {"AddingNode", "AttachingGPU", "AttachedGPU"} <= {e.reason for e in before}, lines(before)
    assert {e.instance for e in after} == {"dds-b"}, lines(after)
    assert any(e.reason == "AttachingGPU" and e.involved == "pod/train-1" for e in after), lines(after)


def test_ca_reaches_only_the_labelled_leader(election: ElectionRun):
    assert election.routes_before_kill and {r.backend for r in election.routes_before_kill} <= {"dds-a", None}
    assert "dds-a" in {r.backend for r in election.routes_before_kill}
    assert {r.backend for r in election.routes_after_takeover} <= {"dds-b", None}
    assert "dds-b" in {r.backend for r in election.routes_after_takeover}


def test_killing_the_leader_hands_over_within_the_lease_duration(election: ElectionRun):
    assert election.lease_holder == "dds-b"
    assert election.lease_transitions == 1
    assert election.handover_seconds <= HANDOVER_BOUND, \
        f"handover took {election.handover_seconds:.1f}s, bound {HANDOVER_BOUND:.1f}s"


def test_the_new_leader_plans_on_the_fabric_as_it_is_not_as_it_was_at_its_start(election: ElectionRun):
    # Its first pass publishes the pool as the fabric held it when dds-a died (not as it was when dds-b started, before
    # dds-a added a node); the same pass may then attach for train-1 (the fast path), which the fabric count includes.
    assert election.pool_used_seen_by_new_leader == election.attached_before_kill
    assert election.pool_used_at_takeover in (election.attached_before_kill, election.attached_before_kill + 1)


def test_the_next_scale_up_is_served_once_by_the_new_leader(election: ElectionRun):
    assert election.attached_at_end == election.attached_before_kill + 1, "train-1 should cost exactly one attach"
    assert election.nodes_at_end == election.nodes_before_kill == 3, "no node added for train-1"
    assert election.invariant_problems == []
