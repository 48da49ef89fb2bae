"""The SIGKILL campaign: a workload keeps attaches, detaches, node adds and node removals going on the
whole stack (harness/stack.py) while DDS is killed again and again, at named steps (dds/crashpoints.py) and at
random times; after every crash and every restart the invariants (harness/invariants.py) are checked, and at the
end, with the crashes stopped, the cluster must converge: the workload served, then scaled back down with the pool whole.

    one DDS life:  choose (arm the least-crashed points, or a random-time kill)  ->  start DDS (it may die while
                   starting: resumed work hits an armed point)  ->  CA's view consistent within a bound  ->  wait for
                   the crash (or kill it)  ->  which point fired (from the log)  ->  invariants with DDS dead

Arming the least-crashed points together (not one at a time) lets each life end at whichever armed step the workload
reaches first, so rare steps (node removal) get their turn without waiting a whole workload cycle per crash; a crash
at one step of a removal often makes the restarted DDS resume it and die at the next step: crashes during recovery.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from kubernetes import client

from dds import crashpoints
from dds.kube import capi
from dds.kube.capi import MACHINES, CapiObjects
from harness.invariants import (CA_VIEW, CONVERGED, POOL_COUNTS, ClusterHistory, ClusterReader, Violation, check_invariants,
                                    instant_violations, wait_converged)
from harness.stack import WORKLOAD_NAMESPACE, DdsProcess, Stack, StackError, pod, tail

log = logging.getLogger(__name__)

LOOP_ATTACH = "loop.attach-started"  # reached only by a DDS running its fast path (or a warm refill)
# Reached only through CA's IncreaseSize for GPUs, which a fast-path DDS (attaching 2 s after a pod pends, before CA's
# 30 s GPU-pod buffer) pre-empts: a life armed at one of them alone would only wait out its timeout on the fast path.
CA_GPU_INSTANCE = frozenset({"scale-up.gpu-instance-recorded", "scale-up.gpu-instance-done"})

PART_OF = "app.kubernetes.io/part-of=dds-demo"
DDS_EXITED = "dds-exited-on-its-own"  # a death that is no crash point and no kill of ours: a DDS bug


@dataclass(frozen=True)
class CampaignOptions:
    crashes: int  # crashes to inject in all (named points and random kills)
    min_per_point: int = 1  # ... and at least this many at every named point (unless the time budget runs out)
    slack: int = 0  # arm the points crashed at most min + slack times (0: only the least-crashed ones)
    random_every: int = 4  # every n-th life ends with a kill at a random time instead of an armed point
    max_hit: int = 2  # an armed point fires at its 1st..max_hit-th hit in the life (drawn)
    machine_failures: int = 1  # nodes holding GPUs deleted from under DDS (orphan reclaim), spread over the run
    life_timeout: float = 90.0  # an armed life that does not crash within this is killed at a random time
    ca_view_bound: float = 20.0  # after a restart, CA's view must be consistent within this
    budget_seconds: float = 300.0  # stop injecting after this long, whatever the counts
    serve_bound: float = 240.0  # at the end: the final workload served (and everything settled) within this
    scale_down_bound: float = 180.0  # then everything gone and the pool whole within this
    seed: int = 9
    # Every n-th life (and every life armed at the loop's own attach) DDS runs its fast path: pods a live node takes
    # once GPUs are attached get them from the loop at once. The other lives let CA answer GPU pods first (IncreaseSize).
    fast_path_every: int = 2
    fast_path_debounce_seconds: float = 2.0


@dataclass
class CampaignFigures:
    crashes_by_point: Counter = field(default_factory=Counter)
    random_kills: int = 0
    unfired_lives: int = 0  # armed lives whose points were not reached: ended by a random kill (counted there too)
    startup_crashes: int = 0  # crashes while the restarted DDS was resuming, before it reported ready
    restarts: int = 0
    machine_failures: int = 0
    invariant_checks: int = 0
    monitor_polls: int = 0  # readings of the history monitor (about one a second)
    monitor_failed_polls: int = 0
    violations: list[Violation] = field(default_factory=list)
    converge_seconds: dict[str, float] = field(default_factory=dict)
    activity: dict[str, int] = field(default_factory=dict)  # GPUs attached/detached, nodes added/removed, pods created
    seconds: float = 0.0

    @property
    def crashes(self) -> int:
        return sum(self.crashes_by_point.values()) + self.random_kills

    def add(self, violations: list[Violation]) -> None:
        for violation in violations:
            if violation not in self.violations:
                log.error("campaign: %s", violation)
                self.violations.append(violation)

    def as_json(self) -> dict[str, Any]:
        return {"crashes": self.crashes, "crashes_by_point": dict(sorted(self.crashes_by_point.items())),
                "random_kills": self.random_kills, "unfired_lives": self.unfired_lives,
                "startup_crashes": self.startup_crashes, "restarts": self.restarts,
                "machine_failures": self.machine_failures, "invariant_checks": self.invariant_checks,
                "monitor_polls": self.monitor_polls, "monitor_failed_polls": self.monitor_failed_polls,
                "violations": [str(v) for v in self.violations],
                "converge_seconds": {k: round(v, 1) for k, v in self.converge_seconds.items()},
                "activity": dict(self.activity), "seconds": round(self.seconds)}

    def lines(self) -> list[str]:
        points = ", ".join(f"{name} {count}" for name, count in sorted(self.crashes_by_point.items()))
        return [f"{self.crashes} SIGKILLs in {self.seconds:.0f}s: {sum(self.crashes_by_point.values())} at named "
                f"points, {self.random_kills} at random times ({self.unfired_lives} of them in armed lives whose "
                f"points were not reached); {self.startup_crashes} while resuming after a restart",
                f"per point: {points}",
                f"{self.restarts} restarts, {self.machine_failures} machine failure(s) injected, "
                f"{self.invariant_checks} invariant checks ({self.monitor_polls} monitor polls, "
                f"{self.monitor_failed_polls} failed), {len(self.violations)} violation(s)",
                "workload: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.activity.items()),
                "converged: " + ", ".join(f"{k} in {v:.0f}s" for k, v in self.converge_seconds.items())]


# --- the workload ---

class WorkloadDriver:
    """Cycles through what makes DDS work, in a thread: GPU pods (attaches, through CA's IncreaseSize or DDS's own
    loop), memory-heavy pods one more than the nodes (a node add, its initial GPU), churn (detach after the GPU cooldown,
    a new attach), then everything deleted (detaches, node removal down to the group's min size)."""

    def __init__(self, stack: Stack, seed: int, gpu_pods: int = 3, memory_gib: int = 40,
                 step_timeout: float = 100.0) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.gpu_pods = gpu_pods
        self.memory_gib = memory_gib
        self.step_timeout = step_timeout
        self.cycles = 0
        self.pods_created = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    def start(self) -> "WorkloadDriver":
        self._thread = threading.Thread(target=self._run, name="workload-driver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cycle()
            except Exception as exc:  # an apiserver hiccup: report it, start the next cycle
                log.warning("workload driver: cycle %d failed: %s", self.cycles, exc)
                self.error = exc
                self._stop.wait(2.0)

    def cycle(self) -> None:
        self.cycles += 1
        tag = f"c{self.cycles}"
        nodes = max(1, self.ready_nodes())
        names = [self.create(f"gpu-{tag}-{i}", gpus=1) for i in range(self.gpu_pods)]
        names += [self.create(f"mem-{tag}-{i}", memory_gib=self.memory_gib) for i in range(min(nodes + 1, 4))]
        self.wait(lambda: self.all_running(names))
        victim = self.rng.choice([n for n in names if n.startswith("gpu-")])
        self.delete(victim)
        self._stop.wait(self.rng.uniform(4.0, 10.0))  # past the GPU cooldown: a detach
        names = [n for n in names if n != victim] + [self.create(f"gpu-{tag}-{self.gpu_pods}", gpus=1)]
        self.wait(lambda: self.all_running(names))
        self.delete_all()
        self.wait(lambda: self.ready_nodes() <= 1)  # the example MachineSet's min size

    # --- small steps ---
    def create(self, name: str, gpus: int = 0, memory_gib: int = 1) -> str:
        body = pod(name, memory_gib=memory_gib, gpus=gpus, cpu="500m" if gpus else "1")
        try:
            self.stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, body)
            self.pods_created += 1
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        return name

    def delete(self, name: str) -> None:
        try:
            self.stack.core.delete_namespaced_pod(name, WORKLOAD_NAMESPACE, grace_period_seconds=0)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def delete_all(self) -> None:
        self.stack.core.delete_collection_namespaced_pod(WORKLOAD_NAMESPACE, label_selector=PART_OF,
                                                         grace_period_seconds=0)

    def all_running(self, names: list[str]) -> bool:
        phases = {p.metadata.name: p.status.phase for p in self.stack.pods()}
        return all(phases.get(n) == "Running" for n in names)

    def ready_nodes(self) -> int:
        from harness.stack import is_ready

        return sum(1 for n in self.stack.nodes() if is_ready(n) and n.spec.provider_id)

    def wait(self, predicate: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.step_timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            if predicate():
                return True
            self._stop.wait(1.0)
        return False


# --- the crashes ---

class CrashCampaign:
    def __init__(self, stack: Stack, options: CampaignOptions, history: ClusterHistory,
                 reader: Optional[ClusterReader] = None) -> None:
        self.stack = stack
        self.options = options
        self.history = history
        self.reader = reader or ClusterReader.for_stack(stack)
        self.rng = random.Random(options.seed)
        self.figures = CampaignFigures()
        self._capi = CapiObjects(stack.api)
        self._failure_lives = self._spread_failures()
        self._rare: set[str] = set()  # points armed in a life that ended before reaching them
        self._fast_path_config = stack.write_dds_config(
            "dds-fast-path.yaml", stack.grpc_port, pending_debounce_seconds=options.fast_path_debounce_seconds)

    # --- the campaign ---
    def run(self) -> CampaignFigures:
        started = time.monotonic()
        life = 0
        while not self._done(started):
            life += 1
            if life in self._failure_lives:
                self.inject_machine_failure()
            self.one_life(life)
            self.figures.seconds = time.monotonic() - started
        self.figures.seconds = time.monotonic() - started
        return self.figures

    def _done(self, started: float) -> bool:
        if time.monotonic() - started >= self.options.budget_seconds:
            log.warning("campaign: time budget of %.0fs spent", self.options.budget_seconds)
            return True
        counts = self.figures.crashes_by_point
        return (self.figures.crashes >= self.options.crashes
                and all(counts[name] >= self.options.min_per_point for name in crashpoints.POINTS))

    def _spread_failures(self) -> set[int]:
        lives = max(1, self.options.crashes)
        return {int(lives * (i + 1) / (self.options.machine_failures + 1)) for i in range(self.options.machine_failures)}

    def arming(self, life: int) -> dict[str, int]:
        """{} for a random-time kill; else the least-crashed points, each at a drawn hit."""
        if life % self.options.random_every == 0:
            return {}
        counts = self.figures.crashes_by_point
        least = min(counts[name] for name in crashpoints.POINTS)
        # A step a life did not reach is rare (a node removal happens once a workload cycle): armed at its first hit
        # from then on, or it would keep lives waiting for hits that do not come.
        return {name: 1 if name in self._rare else self.rng.randint(1, self.options.max_hit)
                for name in crashpoints.POINTS if counts[name] <= least + self.options.slack}

    def one_life(self, life: int) -> None:
        arming = self.arming(life)
        env = {crashpoints.ENV: ",".join(f"{name}:{hit}" for name, hit in arming.items())} if arming else {}
        if self.stack.dds is not None and self.stack.dds.running:  # the stack's own first DDS
            self.stack.dds.kill()
            self.figures.random_kills += 1
            self._check_dead()
        offset = self._log_size()
        fast_path = LOOP_ATTACH in arming or (life % self.options.fast_path_every == 0
                                              and not CA_GPU_INSTANCE & set(arming))
        process = self._start(env, offset, self._fast_path_config if fast_path else None)
        if process is None:  # died while starting: an armed step hit while resuming
            self._record_crash(offset, during_start=True)
            self._check_dead()
            return
        self._check_after_restart(process)
        if arming and self._wait_exit(process, self.options.life_timeout):
            self._record_crash(offset)
        else:
            self.figures.unfired_lives += 1 if arming else 0
            self._rare |= set(arming)
            if not self._random_kill(process):  # it died on its own first: a late armed point, or a bug
                self._record_crash(offset)
        self._check_dead()

    # --- DDS lives ---
    def _log_size(self) -> int:
        path = self.stack.workdir / "dds.log"
        return path.stat().st_size if path.exists() else 0

    def _start(self, env: dict[str, str], offset: int, config: Optional[Path] = None) -> Optional[DdsProcess]:
        """The started DDS (on `config`, else the stack's), or None when it died at an armed point before it was
        ready."""
        self.figures.restarts += 1
        try:
            process = self.stack.start_dds(config_path=config, env=env)
        except StackError:
            if crashpoints.LOG_MARKER not in self._log_since(offset):
                raise
            return None
        self.stack.dds = process
        self.history.note_dds_start()
        return process

    def _log_tail(self) -> str:
        return tail(self.stack.workdir / "dds.log", 40)

    def _wait_exit(self, process: DdsProcess, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process.running:
                return True
            time.sleep(0.2)
        return False

    def _log_since(self, offset: int) -> str:
        with (self.stack.workdir / "dds.log").open("rb") as log_file:
            log_file.seek(offset)
            return log_file.read().decode(errors="replace")

    def _record_crash(self, offset: int, during_start: bool = False) -> None:
        text = self._log_since(offset)
        fired = [line.split()[1] for line in text.splitlines() if line.startswith(crashpoints.LOG_MARKER)]
        if not fired:
            self.figures.add([Violation(DDS_EXITED, "dds", f"DDS exited without a crash point; log tail:\n"
                                                             f"{text[-3000:]}")])
            return
        self.figures.crashes_by_point[fired[-1]] += 1
        if during_start:
            self.figures.startup_crashes += 1

    def _random_kill(self, process: DdsProcess) -> bool:
        """SIGKILL after a random delay, preferably while a fabric operation is in flight; False if it died first."""
        deadline = time.monotonic() + self.rng.uniform(1.0, 10.0)
        while time.monotonic() < deadline and process.running:
            time.sleep(0.2)
        patience = time.monotonic() + 5.0
        while process.running and time.monotonic() < patience and not self._operations_in_flight():
            time.sleep(0.2)
        if not process.running:
            return False
        process.kill()
        self.figures.random_kills += 1
        return True

    def _operations_in_flight(self) -> bool:
        try:
            return any(op.running for op in self.reader.fabric().operations)
        except Exception:
            return False

    # --- checks ---
    def _check_dead(self) -> None:
        """Right after a crash: what must hold at any instant (CA's view is skipped: DDS is down)."""
        self.figures.invariant_checks += 1
        self.figures.add(check_invariants(self.stack, self.history, reader=self.reader))

    def _check_after_restart(self, process: DdsProcess) -> None:
        """CA's view (TargetSize = NodeGroupNodes = the persisted instances) must be consistent within the bound."""
        deadline = time.monotonic() + self.options.ca_view_bound
        while True:
            self.figures.invariant_checks += 1
            reading = self.reader.read()
            found = instant_violations(reading)
            if not process.running:
                self.figures.add([v for v in found if v.invariant != CA_VIEW])
                return  # it crashed meanwhile (an armed point): the next life checks again
            if reading.ca is not None and not found:
                return
            if time.monotonic() >= deadline:
                if reading.ca is None:
                    found.append(Violation(CA_VIEW, "dds", f"no gRPC answer within {self.options.ca_view_bound:.0f}s "
                                                           "of a restart"))
                self.figures.add(found)
                return
            if any(v.invariant == POOL_COUNTS for v in found):
                self.figures.add(found)  # never transient
            time.sleep(1.0)

    # --- a node failure DDS did not cause ---
    def inject_machine_failure(self) -> Optional[str]:
        """Delete (as a dying machine would vanish) a Machine whose Node holds fabric devices, after its pods: the
        devices are orphans DDS must reclaim after its orphan timeout. The group's replicas stay, so Cluster API
        (kwok here) replaces the machine."""
        fabric = self.reader.fabric()
        holding = sorted({d.node for d in fabric.devices if d.node is not None})
        machines = {capi.node_ref_name(m): m for m in self._capi.list(MACHINES) if capi.node_ref_name(m)}
        candidates = [n for n in holding if n in machines]
        if not candidates:
            log.info("campaign: no node holds devices now; no machine failure this time")
            return None
        node = self.rng.choice(candidates)
        self.history.excuse_node(node)
        for item in self.stack.core.list_namespaced_pod(WORKLOAD_NAMESPACE, field_selector=f"spec.nodeName={node}").items:
            self.stack.core.delete_namespaced_pod(item.metadata.name, WORKLOAD_NAMESPACE, grace_period_seconds=0)
        machine = machines[node]
        self._capi.delete(MACHINES, capi.namespace_of(machine), capi.name_of(machine))
        self.figures.machine_failures += 1
        log.info("campaign: machine %s (node %s, holding devices) failed", capi.name_of(machine), node)
        return node

    # --- the end ---
    def finish(self, driver: WorkloadDriver, final_gpu_pods: int = 2) -> CampaignFigures:
        """Crashes stop: a clean DDS, a final workload served, then everything deleted and the pool whole again."""
        driver.stop()
        driver.delete_all()
        if self.stack.dds is not None and self.stack.dds.running:
            self.stack.dds.kill()
            self.figures.random_kills += 1
        process = self._start({}, self._log_size())
        if process is None:
            raise StackError("DDS crashed without crash points armed:\n" + self._log_tail())
        nodes = max(1, driver.ready_nodes())
        names = [driver.create(f"final-gpu-{i}", gpus=1) for i in range(final_gpu_pods)]
        names += [driver.create(f"final-mem-{i}", memory_gib=driver.memory_gib) for i in range(min(nodes + 1, 4))]
        violations, took = wait_converged(self.stack, self.options.serve_bound, self.history, self.reader)
        self.figures.converge_seconds["served"] = took
        self.figures.invariant_checks += 1
        self.figures.add(violations)
        driver.delete_all()
        violations, took = wait_converged(self.stack, self.options.scale_down_bound, self.history, self.reader,
                                          until=self._pool_whole_and_min_size)
        self.figures.converge_seconds["scaled-down"] = took
        self.figures.invariant_checks += 1
        self.figures.add(violations)
        self.figures.invariant_checks += self.history.checks
        self.figures.monitor_polls, self.figures.monitor_failed_polls = self.history.polls, self.history.failed_polls
        self.figures.activity = {"pods_created": driver.pods_created, "workload_cycles": driver.cycles,
                                 **self.history.activity}
        return self.figures

    def _pool_whole_and_min_size(self) -> list[Violation]:
        fabric = self.reader.fabric()
        out = [Violation(CONVERGED, d.id, f"still on {d.node} after everything was deleted")
               for d in fabric.devices if d.node is not None]
        nodes = self.reader.nodes()
        for group in self.reader.groups(nodes):
            if group.ready_nodes > group.min_size:
                out.append(Violation(CONVERGED, group.id, f"{group.ready_nodes} nodes left with nothing to run, "
                                                            f"min size {group.min_size}"))
        return out
