"""A Deployment's RollingUpdate played on a test control plane where no Deployment controller or kubelet runs.

The rendered Deployment gives the numbers (replicas, maxSurge, maxUnavailable, terminationGracePeriodSeconds); the
steps are the Deployment controller's for a changed pod template: create a new-template replica while the total stays
within replicas + maxSurge, count a replica available once Ready (/readyz, reported on its Pod as the kubelet would),
and remove an old one only while the available replicas stay at least replicas - maxUnavailable. Of the old replicas
the one Ready for the shortest time goes first (the ReplicaSet controller's ranking of pods to delete). Removing is
what a pod deletion does on a node: SIGTERM, SIGKILL after the grace period, then the Pod object goes.

What is not the Deployment controller's: no ReplicaSet objects (the Pods carry the template's hash as their
pod-template-hash label, a hash of the template but not the controller's function), and no controller reads the
Deployment object back (the caller applies it as `helm upgrade` would; this class is told the new one).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from kubernetes import client

from harness.replicas import Replica, report_ready
from harness.stack import DDS_NAMESPACE

TEMPLATE_HASH_LABEL = "pod-template-hash"
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's generateName alphabet
_POLL_SECONDS = 0.1


def _count(value: Any, replicas: int, round_up: bool) -> int:
    """An int-or-percent of the strategy: surge rounds up, unavailable down (as the Deployment controller)."""
    if isinstance(value, str) and value.endswith("%"):
        exact = replicas * int(value[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)


@dataclass(frozen=True)
class Strategy:
    replicas: int
    max_surge: int
    max_unavailable: int
    grace_seconds: float

    @classmethod
    def of(cls, deployment: dict[str, Any]) -> "Strategy":
        spec = deployment["spec"]
        if spec["strategy"]["type"] != "RollingUpdate":
            raise ValueError(f"strategy {spec['strategy']['type']}: only RollingUpdate rolls replicas one by one")
        rolling, replicas = spec["strategy"]["rollingUpdate"], int(spec["replicas"])
        return cls(replicas, _count(rolling.get("maxSurge", "25%"), replicas, True),
                   _count(rolling.get("maxUnavailable", "25%"), replicas, False),
                   float(spec["template"]["spec"].get("terminationGracePeriodSeconds", 30)))

    @property
    def min_available(self) -> int:
        return self.replicas - self.max_unavailable


def template_hash(deployment: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(deployment["spec"]["template"], sort_keys=True).encode()).digest()
    return "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:10])


def pod_name(deployment: str, template: str) -> str:
    """A Deployment's pod name: <deployment>-<pod-template-hash>-<five random characters>."""
    return f"{deployment}-{template}-{''.join(random.choice(_SUFFIX_ALPHABET) for _ in range(5))}"


@dataclass
class ReplicaPod:
    replica: Replica
    template_hash: str
    ready_since: Optional[float] = None  # time.monotonic() of the Ready report
    terminating_since: Optional[float] = None


@dataclass
class Rollout:
    """What one roll to a new template did, in time.monotonic()."""
    started: float
    ended: float = 0.0
    created: list[str] = field(default_factory=list)
    terminated: list[tuple[float, str]] = field(default_factory=list)
    min_available: Optional[int] = None  # the fewest Ready replicas not terminating, seen at any step


class Deployment:
    """The replicas of one Deployment (`deployment`, as rendered), started by `start(pod_name, template_hash)`, which
    creates the Pod object and starts the process (not waiting for it to be Ready)."""

    def __init__(self, core: client.CoreV1Api, deployment: dict[str, Any],
                 start: Callable[[str, str], Replica]) -> None:
        self.core = core
        self.name = deployment["metadata"]["name"]
        self.strategy = Strategy.of(deployment)
        self.template_hash = template_hash(deployment)
        self.start = start
        self.pods: list[ReplicaPod] = []
        self.gone: list[ReplicaPod] = []

    def adopt(self, replica: Replica) -> None:
        """A replica of the current template already running (its Pod created by the caller)."""
        self.pods.append(ReplicaPod(replica, self.template_hash))

    def scale(self, timeout: float) -> None:
        """Create replicas of the current template up to `replicas`, and wait until every one is Ready."""
        while len(self.pods) < self.strategy.replicas:
            self._create()
        self._wait(lambda: all(p.ready_since is not None for p in self.pods), timeout, "every replica Ready")

    def roll_to(self, deployment: dict[str, Any], timeout: float,
                on_terminate: Callable[[Replica], None] = lambda _r: None) -> Rollout:
        """Roll every replica to `deployment`'s template (what the controller does after `helm upgrade` changed it);
        `on_terminate` is called just before a replica is sent SIGTERM."""
        self.strategy = Strategy.of(deployment)
        self.template_hash = template_hash(deployment)
        rollout = Rollout(time.monotonic())

        def step() -> bool:
            self._reap()
            self._probe()
            live = [p for p in self.pods if p.terminating_since is None]
            old = [p for p in live if p.template_hash != self.template_hash]
            new = [p for p in live if p.template_hash == self.template_hash]
            available = sum(1 for p in live if p.ready_since is not None)
            rollout.min_available = available if rollout.min_available is None else min(rollout.min_available,
                                                                                       available)
            if len(new) < self.strategy.replicas and len(live) < self.strategy.replicas + self.strategy.max_surge:
                rollout.created.append(self._create())
            elif any(p.ready_since is not None for p in old) and available - 1 >= self.strategy.min_available:
                victim = max((p for p in old if p.ready_since is not None), key=lambda p: p.ready_since or 0.0)
                on_terminate(victim.replica)
                self._terminate(victim)
                rollout.terminated.append((time.monotonic(), victim.replica.identity))
            return not old and all(p.ready_since is not None for p in new) and len(self.pods) == len(new)

        self._wait(step, timeout, f"the rollout of {self.name} to template {self.template_hash}")
        rollout.ended = time.monotonic()
        return rollout

    def close(self) -> None:
        for pod in self.pods:
            if pod.replica.process is not None:
                pod.replica.process.stop()

    # --- internals ---
    def _create(self) -> str:
        name = pod_name(self.name, self.template_hash)
        self.pods.append(ReplicaPod(self.start(name, self.template_hash), self.template_hash))
        return name

    def _probe(self) -> None:
        """The kubelet's readiness probe and its report on the Pod (a replica Ready once stays counted Ready here:
        the test asserts elsewhere that no replica left Ready before its SIGTERM)."""
        for pod in self.pods:
            process = pod.replica.process
            if pod.ready_since is None and pod.terminating_since is None and process is not None and process.ready():
                report_ready(self.core, pod.replica.identity, True)
                pod.ready_since = time.monotonic()

    def _terminate(self, pod: ReplicaPod) -> None:
        pod.terminating_since = time.monotonic()
        report_ready(self.core, pod.replica.identity, False)  # the endpoints controller drops a terminating pod
        if pod.replica.process is not None and pod.replica.process.running:
            pod.replica.process.process.terminate()

    def _reap(self) -> None:
        """A terminated replica's Pod goes once its process has exited (SIGKILL after the grace period)."""
        for pod in [p for p in self.pods if p.terminating_since is not None]:
            process = pod.replica.process
            if process is not None and process.running:
                if time.monotonic() - (pod.terminating_since or 0.0) < self.strategy.grace_seconds:
                    continue
                process.kill()
            self.core.delete_namespaced_pod(pod.replica.identity, DDS_NAMESPACE, grace_period_seconds=0)
            self.pods.remove(pod)
            self.gone.append(pod)

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                states = [(p.replica.identity, "ready" if p.ready_since else "not ready",
                           "terminating" if p.terminating_since else "") for p in self.pods]
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: {states}")
            self._probe()
            time.sleep(_POLL_SECONDS)
