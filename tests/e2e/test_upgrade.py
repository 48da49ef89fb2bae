"""`helm upgrade` of DDS with two replicas while the real cluster-autoscaler scales (issue 40 point 1): no scale-up
lost, the leader handed over well within the lease duration.

What runs: the chart (charts/dds) rendered by `helm template` with two replicas and the simulated fabric, every
rendered object applied to the test control plane (ServiceAccounts, RBAC and admission policies, the settings ConfigMap,
the Service selecting the leader's label, the PodDisruptionBudget, the Deployment); the real kube-apiserver, scheduler,
kwok and cluster-autoscaler 1.36.1. No kubelet and no Deployment controller run here, so:
- each replica is a `dds serve` process with the chart's settings (settings.yaml of the rendered ConfigMap, with the
  addresses, TLS files and kubeconfig of this machine) and POD_NAME naming its Pod, an API object the harness reports
  Running and Ready from the replica's /readyz (harness/replicas.py);
- the rollout is played as the Deployment controller plays it from the rendered strategy (maxSurge 1, maxUnavailable 0):
  a new replica, Ready, then an old one sent SIGTERM (a pod deletion), and again (harness/rollout.py);
- a `ReadyForwarder` plays the Service: CA dials it, each connection goes to the Ready replica carrying the leader's
  label (harness/forwarder.py);
- the first replica is the stack's own DDS process, started (with the chart's settings) before the rendered objects
  are applied; applying them replaces the RBAC the stack installed from manifests/ with the chart's, under which both
  replicas then run;
- the Deployment controller does not consult a PodDisruptionBudget (evictions do): the rendered PDB is in the API and
  the test checks that the rollout never had fewer Ready replicas than it allows.

The "new version" is the same code with the change a `helm upgrade --set settings.log_level=DEBUG` makes: the rendered
settings (its checksum annotation changes the pod template, hence the rollout) and the new replicas running with them.

The scenario runs once (fixture `upgrade`): two workers busy on their boot GPUs; a pod needing a node and a pod needing
an attach created just before the upgrade, a second attach asked for when the old leader is sent SIGTERM. Measured and
printed: CA's calls that failed during the upgrade (its log) and DDS's error answers (dds_grpc_request_errors_total),
the seconds without a leader at the handover (Lease holder, and the Service without a routable replica). "During the
upgrade": from applying the upgraded objects until the Service routes to the new leader and one CA loop later.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from dds import certs
from harness import chart
from harness.autoscaler import free_port
from harness.forwarder import ReadyForwarder
from harness.invariants import wait_converged
from harness.replicas import LeadershipWatch, Replica, create_replica_pod, lease_handover
from harness.rollout import TEMPLATE_HASH_LABEL, Deployment, Rollout, Strategy, pod_name, template_hash
from harness.stack import WORKLOAD_NAMESPACE, Stack, StackOptions, gpus_allocatable, is_ready, pod, start_stack
from tests.e2e.cluster_facts import check_no_double_action, describe, pods_running
from tests.unit.reliability import figures

pytestmark = pytest.mark.e2e

INSTALL = {"fabric.backend": "simulated", "replicaCount": "2"}
UPGRADE = {**INSTALL, "settings.log_level": "DEBUG"}
# The settings that describe the machine a replica runs on, not the release: this machine's, not the chart's.
LOCAL_SETTINGS = ("listen", "metrics_listen", "metrics_secure", "tls_cert", "tls_key", "tls_ca", "in_cluster",
                  "node_group_namespaces", "machineset_namespaces")
# CA's calls whose failure it does not simply repeat at its next loop: a failed scale-up backs the group off.
SCALING_CALLS = ("NodeGroupIncreaseSize", "NodeGroupDeleteNodes", "NodeGroupDecreaseTargetSize")
CA_CALL_ERROR = re.compile(r"Error on gRPC call (\w+): rpc error: code = (\w+)")
FAILED_SCALE_UP = re.compile(r"failed to increase node group size", re.IGNORECASE)
CA_SCAN_INTERVAL = 2.0  # the stack's --scan-interval (harness/stack.py)
STEP_TIMEOUT = 120.0


@dataclass
class UpgradeRun:
    lease_duration: float = 0.0
    strategy: Optional[Strategy] = None
    pdb_max_unavailable: int = 0
    rollout: Optional[Rollout] = None
    leader_terminated: list[tuple[float, str]] = field(default_factory=list)
    handovers: list[tuple[str, str, float, float]] = field(default_factory=list)  # old, new, Service s, Lease s
    unroutable_seconds: float = 0.0
    ca_failed_calls: Counter = field(default_factory=Counter)  # (method, code) -> count
    ca_failed_scale_ups: int = 0
    dds_error_answers: dict[str, float] = field(default_factory=dict)
    # From the end of the upgrade until every pod ran: shown, not part of the upgrade's goals.
    ca_failed_calls_after: Counter = field(default_factory=Counter)
    dds_error_answers_after: dict[str, float] = field(default_factory=dict)
    retried_by_new_leader: dict[str, float] = field(default_factory=dict)  # failed method -> calls the new leader served
    templates_at_end: list[str] = field(default_factory=list)
    new_template: str = ""
    debug_logging_at_end: list[bool] = field(default_factory=list)
    served: bool = False
    problems: list[str] = field(default_factory=list)


def local_free(settings: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in settings.items() if key not in LOCAL_SETTINGS}


def grpc_errors(metrics: dict[str, float]) -> dict[str, float]:
    """DDS's error answers by method and code, but UNIMPLEMENTED: the protocol's "no options of its own, use your
    defaults" (NodeGroupGetOptions), which CA asks for and gets every loop."""
    return {key: value for key, value in metrics.items()
            if key.startswith("dds_grpc_request_errors_total") and 'code="UNIMPLEMENTED"' not in key}


def calls_served(metrics: dict[str, float], method: str) -> float:
    return metrics.get(f'dds_grpc_request_duration_seconds_count{{method="{method}"}}', 0.0)


class Scenario:
    def __init__(self, workdir: Path) -> None:
        self.run = UpgradeRun()
        self.installed = chart.render(INSTALL)
        self.upgraded = chart.render(UPGRADE)
        old, new = (chart.find(objects, "Deployment", "dds") for objects in (self.installed, self.upgraded))
        self.settings = {template_hash(old): local_free(chart.settings_of(self.installed)),
                         template_hash(new): local_free(chart.settings_of(self.upgraded))}
        if len(self.settings) != 2:
            raise AssertionError("the upgrade's values do not change the Deployment's pod template")
        self.run.lease_duration = float(chart.settings_of(self.installed)["lease_duration_seconds"])
        self.run.pdb_max_unavailable = int(chart.find(self.installed, "PodDisruptionBudget", "dds")["spec"]
                                           ["maxUnavailable"])
        first = pod_name("dds", template_hash(old))
        self.stack: Stack = start_stack(workdir, StackOptions(
            workers=2, autoscaler=False, pool_size=8, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0),
            node_provisioning_seconds=8.0, gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
            autoscaler_timings={"scale_down_unneeded_time": 600.0, "scale_down_delay_after_add": 600.0},
            dds_settings={**self.settings[template_hash(old)], "identity": first}, dds_env={"POD_NAME": first}))
        self.forwarder: Optional[ReadyForwarder] = None
        self.deployment: Optional[Deployment] = None
        chart.install(self.stack.control_plane, self.installed)
        create_replica_pod(self.stack.core, first, labels={TEMPLATE_HASH_LABEL: template_hash(old)})
        self.first = Replica(first, self.stack.config_path, self.stack.grpc_port, self.stack.dds)
        self.deployment = Deployment(self.stack.core, old, self.start_replica)
        self.deployment.adopt(self.first)

    def start_replica(self, name: str, template: str) -> Replica:
        stack = self.stack
        port = free_port()
        config = stack.write_dds_config(f"{name}.yaml", port, **self.settings[template], identity=name)
        create_replica_pod(stack.core, name, labels={TEMPLATE_HASH_LABEL: template})
        return Replica(name, config, port, stack.start_dds(config, f"{name}.log", wait_ready=False,
                                                           env={"POD_NAME": name}))

    def replicas(self) -> list[Replica]:
        return [p.replica for p in self.deployment.pods] if self.deployment else []

    def close(self) -> None:
        if self.deployment is not None:
            self.deployment.close()
        if self.forwarder is not None:
            self.forwarder.stop()
        self.stack.close()

    def wait_for(self, what: str, predicate, timeout: float = STEP_TIMEOUT) -> Any:
        return self.stack.wait_for(what, predicate, timeout, describe=lambda: describe(self.stack))

    # --- installed: two replicas, CA behind the Service ---
    def install(self) -> None:
        stack = self.stack
        self.wait_for("the first replica leading, its Pod labelled", lambda: self.first.labelled(stack.core), 60)
        self.deployment.scale(60)
        core = stack.core
        self.forwarder = ReadyForwarder(lambda: [r.backend(core) for r in self.replicas()]).start()
        cloud_config = certs.cloud_config(certs.CloudConfigOptions(address=self.forwarder.address,
                                                                   files_dir=str(stack.tls_dir)))
        (stack.tls_dir / certs.CLOUD_CONFIG).write_text(yaml.safe_dump(cloud_config, sort_keys=False))
        stack.start_autoscaler()
        self.wait_for("two Ready workers with their boot GPU",
                      lambda: len([n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) == 1]) == 2)
        for name in ("busy-0", "busy-1"):
            stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod(name, memory_gib=48, gpus=1))
        self.wait_for("busy-0 and busy-1 Running", lambda: pods_running(stack, ["busy-0", "busy-1"]))

    # --- helm upgrade while CA scales ---
    def upgrade(self) -> None:
        stack, run = self.stack, self.run
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("mem-0", memory_gib=24, gpus=1))  # a node
        stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("gpu-1", memory_gib=8, gpus=1))  # an attach
        ca_log = stack.autoscaler.log_path
        log_start = ca_log.stat().st_size
        dds_errors = {r.identity: grpc_errors(r.process.metrics()) for r in self.replicas()}
        final_errors: dict[str, dict[str, float]] = {}

        def on_terminate(replica: Replica) -> None:
            final_errors[replica.identity] = grpc_errors(replica.process.metrics())
            if replica.labelled(stack.core):
                run.leader_terminated.append((time.monotonic(), replica.identity))
                stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("gpu-2", memory_gib=8, gpus=1))

        new = chart.find(self.upgraded, "Deployment", "dds")
        with LeadershipWatch(stack.api, self.replicas) as watch:
            chart.install(stack.control_plane, self.upgraded)  # what `helm upgrade` changes in the API
            run.rollout = self.deployment.roll_to(new, STEP_TIMEOUT, on_terminate)
            stack.dds = self.deployment.pods[0].replica.process  # the stack's waits watch a running replica
            # The upgrade is over once the Service routes to the new leader and CA's loop of that moment has ended.
            self.wait_for("the Service routing to a leader", lambda: any(r.routable(stack.core)
                                                                         for r in self.replicas()), 30)
            time.sleep(stack.options.autoscaler_timings.get("scan_interval", CA_SCAN_INTERVAL))
            log_end = ca_log.stat().st_size
            for replica in self.replicas():
                final_errors[replica.identity] = grpc_errors(replica.process.metrics())
            self.wait_for("every pod Running", lambda: pods_running(stack, ["mem-0", "gpu-1", "gpu-2"]))
            run.served = True
        run.strategy = self.deployment.strategy
        run.new_template = self.deployment.template_hash
        with ca_log.open("rb") as log:
            log.seek(log_start)
            window = log.read(log_end - log_start).decode(errors="replace")
            after = log.read().decode(errors="replace")
        run.ca_failed_calls = Counter(CA_CALL_ERROR.findall(window))
        run.ca_failed_scale_ups = len(FAILED_SCALE_UP.findall(window))
        run.ca_failed_calls_after = Counter(CA_CALL_ERROR.findall(after))
        run.dds_error_answers = {identity: sum(errors.values()) - sum(dds_errors.get(identity, {}).values())
                                 for identity, errors in final_errors.items()}
        run.dds_error_answers_after = {key: value - final_errors[replica.identity].get(key, 0.0)
                                       for replica in self.replicas()
                                       for key, value in grpc_errors(replica.process.metrics()).items()
                                       if value > final_errors[replica.identity].get(key, 0.0)}
        run.unroutable_seconds = sum(gap.seconds for gap in watch.unroutable(since=run.rollout.started))
        changes = watch.holders(since=run.rollout.started - 1.0)
        for terminated_at, old in run.leader_terminated:
            routed = next((s for s in watch.samples if s.at >= terminated_at and s.routable
                           and old not in s.routable), None)
            lease = lease_handover(changes, old)
            run.handovers.append((old, routed.routable[0] if routed else "", (routed.at - terminated_at) if routed
                                  else float("inf"), lease[0] if lease else float("inf")))
        # CA repeats a failed read at its next loop (--scan-interval): the new leader served each method that failed.
        leader = next((r for r in self.replicas() if r.labelled(stack.core)), None)
        served = leader.process.metrics() if leader is not None else {}
        run.retried_by_new_leader = {method: calls_served(served, method) for method, _ in run.ca_failed_calls}

    def settle(self) -> None:
        run = self.run
        violations, _ = wait_converged(self.stack, 60)
        run.problems = [str(v) for v in violations]
        # 2 workers' and the new node's boot GPUs, gpu-1's and gpu-2's attaches; the node mem-0 asked for.
        run.problems += check_no_double_action(self.stack, expected_nodes=3, expected_attached=5)
        pods = self.stack.core.list_namespaced_pod("dds-system", label_selector="app.kubernetes.io/name=dds").items
        run.templates_at_end = sorted(p.metadata.labels.get(TEMPLATE_HASH_LABEL, "") for p in pods)
        run.debug_logging_at_end = [yaml.safe_load(r.config.read_text()).get("log_level") == "DEBUG"
                                    for r in self.replicas()]


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory) -> UpgradeRun:
    scenario = Scenario(tmp_path_factory.mktemp("upgrade"))
    try:
        scenario.install()
        scenario.upgrade()
        scenario.settle()
    finally:
        scenario.close()
    report(scenario.run)
    return scenario.run


def report(run: UpgradeRun) -> None:
    """Printed at the end of the run; merged into $DDS_RELIABILITY_FIGURES under "upgrade"."""
    failed = sum(run.ca_failed_calls.values())
    scaling = sum(n for (method, _), n in run.ca_failed_calls.items() if method in SCALING_CALLS)
    by_call = ", ".join(f"{method} {code} x{n}" for (method, code), n in sorted(run.ca_failed_calls.items()))
    rollout = run.rollout
    figures.add_summary("helm upgrade, two replicas", [
        f"rollout {rollout.ended - rollout.started:.1f}s (maxSurge {run.strategy.max_surge}, maxUnavailable "
        f"{run.strategy.max_unavailable}); fewest Ready replicas during it: {rollout.min_available}",
        *(f"handover {old} -> {new}: Service without a leader {service:.1f}s, Lease without a holder {lease:.1f}s "
          f"(lease duration {run.lease_duration:g}s)" for old, new, service, lease in run.handovers),
        f"CA calls failed during the upgrade: {failed} ({by_call or 'none'}); scale-up/down calls among them "
        f"(not retried by CA's next loop): {scaling}; failed scale-ups: {run.ca_failed_scale_ups}",
        "calls of each failed method the new leader served afterwards (CA's retries): "
        + (", ".join(f"{m} {n:g}" for m, n in sorted(run.retried_by_new_leader.items())) or "none needed"),
        f"DDS error answers during the upgrade: {sum(run.dds_error_answers.values()):g}; "
        f"violations: {len(run.problems)}",
        f"after the upgrade, until every pod ran: CA calls failed {dict(run.ca_failed_calls_after) or 'none'}, DDS "
        f"error answers {run.dds_error_answers_after or 'none'}"])
    target = os.environ.get("DDS_RELIABILITY_FIGURES")
    if target:
        figures.merge_section(Path(target), "upgrade", {
            "rollout_seconds": round(rollout.ended - rollout.started, 1),
            "handover_seconds": [round(service, 1) for _, _, service, _ in run.handovers],
            "lease_duration_seconds": run.lease_duration, "ca_failed_calls": failed,
            "ca_failed_scaling_calls": scaling, "violations": len(run.problems)})


def test_every_pod_is_served_once_and_nothing_leaks(upgrade: UpgradeRun):
    assert upgrade.served
    assert upgrade.problems == []


def test_no_scale_up_is_lost(upgrade: UpgradeRun):
    scaling = {call: n for call, n in upgrade.ca_failed_calls.items() if call[0] in SCALING_CALLS}
    assert scaling == {}, f"CA's scale-up/down calls failed during the upgrade: {scaling}"
    assert upgrade.ca_failed_scale_ups == 0
    assert sum(upgrade.dds_error_answers.values()) == 0, upgrade.dds_error_answers
    # Every read CA failed to make it made again, answered by the new leader.
    assert all(n > 0 for n in upgrade.retried_by_new_leader.values()), upgrade.retried_by_new_leader


def test_the_leader_hands_over_within_the_lease_duration(upgrade: UpgradeRun):
    assert len(upgrade.leader_terminated) == 1, "the rollout sends the old leader SIGTERM once"
    [(old, new, service, lease)] = upgrade.handovers
    assert new and new != old
    assert service < upgrade.lease_duration, f"the Service had no leader for {service:.1f}s"
    assert lease < upgrade.lease_duration, f"the Lease had no holder for {lease:.1f}s"
    assert upgrade.unroutable_seconds < upgrade.lease_duration


def test_the_rollout_keeps_the_strategy_and_the_disruption_budget(upgrade: UpgradeRun):
    strategy = upgrade.strategy
    assert (strategy.replicas, strategy.max_surge, strategy.max_unavailable) == (2, 1, 0)
    assert upgrade.rollout.min_available >= strategy.replicas - strategy.max_unavailable
    assert upgrade.rollout.min_available >= strategy.replicas - upgrade.pdb_max_unavailable
    assert upgrade.templates_at_end == [upgrade.new_template] * 2
    assert upgrade.debug_logging_at_end == [True, True]
