"""DDS replicas as `dds serve` processes that run "in" Pods of dds-system, and what the e2e tests watch of them.

No kubelet runs on the test control plane, so a replica's Pod is an API object (a scheduler nobody runs keeps it
unbound) that the replica is told it runs in (POD_NAME): all the leader's label needs (dds/kube/leader_label.py). The
harness reports for the Pod what its kubelet would: phase Running, and the Ready condition from the replica's /readyz.

- `Replica`: one replica's identity, settings file, gRPC port and process; whether its Pod carries the leader's label,
  and its `Backend` for the `ReadyForwarder` (harness/forwarder.py) that plays the Service.
- `create_replica_pod`, `report_ready`: the Pod and its status as a kubelet would write them.
- `LeadershipWatch`: samples, in a thread, the Lease's holder and which replicas the Service would route to, so a test
  can tell how long CA had no leader to reach and when the Lease changed hands.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

from kubernetes import client

from dds.kube.leader_label import LEADER_LABEL, LEADER_VALUE
from harness.forwarder import Backend
from harness.stack import DDS_NAMESPACE, DdsProcess

REPLICA_LABELS = {"app.kubernetes.io/name": "dds"}  # the Deployment's selector (manifests/dds, charts/dds)
LEASE_NAME = "dds-leader"


@dataclass
class Replica:
    identity: str  # also its Pod's name (POD_NAME) and its Lease identity
    config: Path
    grpc_port: int
    process: Optional[DdsProcess] = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def labelled(self, core: client.CoreV1Api) -> bool:
        """Whether the Service's selector picks this replica's Pod (the leader's label)."""
        try:
            labels = core.read_namespaced_pod(self.identity, DDS_NAMESPACE).metadata.labels or {}
        except client.ApiException as exc:
            if exc.status == 404:  # its Pod deleted: nothing to select
                return False
            raise
        return labels.get(LEADER_LABEL) == LEADER_VALUE

    def routable(self, core: client.CoreV1Api) -> bool:
        """What the Service routes to: Ready (its /readyz) and labelled."""
        process = self.process
        return process is not None and process.ready() and self.labelled(core)

    def backend(self, core: client.CoreV1Api) -> Backend:
        return Backend(self.identity, "127.0.0.1", self.grpc_port, lambda: self.routable(core))


def create_replica_pod(core: client.CoreV1Api, name: str, labels: Optional[dict[str, str]] = None,
                       annotations: Optional[dict[str, str]] = None) -> None:
    """A replica's Pod as the API holds it, Running as the kubelet of the node it runs on would report it (the
    convergence invariant counts Pending pods); a scheduler nobody runs, so nothing but DDS's label changes it."""
    core.create_namespaced_pod(DDS_NAMESPACE, {
        "metadata": {"name": name, "labels": {**REPLICA_LABELS, **(labels or {})}, "annotations": annotations or {}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "dds", "image": "example.com/dds:1"}]}})
    core.patch_namespaced_pod_status(name, DDS_NAMESPACE, {"status": {"phase": "Running"}})


def report_ready(core: client.CoreV1Api, name: str, ready: bool) -> None:
    """The Pod's Ready condition, as the kubelet writes it from the readiness probe (/readyz)."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(name, DDS_NAMESPACE, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now}]}})


def lease_holder(api: client.ApiClient, name: str = LEASE_NAME) -> str:
    """The Lease's holder ("" when released)."""
    lease = client.CoordinationV1Api(api).read_namespaced_lease(name, DDS_NAMESPACE)
    return lease.spec.holder_identity or ""


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    holder: str  # the Lease's holder, "" when released
    routable: tuple[str, ...]  # the replicas the Service would route CA to


@dataclass(frozen=True)
class Gap:
    """A stretch of samples in which the Service had no replica to route to."""
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class LeadershipWatch:
    """Samples the Lease's holder and the routable replicas every `interval` seconds until stopped."""

    api: client.ApiClient
    replicas: Callable[[], Sequence[Replica]]
    interval: float = 0.1
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def __enter__(self) -> "LeadershipWatch":
        self._thread = threading.Thread(target=self._run, name="leadership-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            try:
                holder = lease_holder(self.api)
                routable = tuple(r.identity for r in list(self.replicas()) if r.routable(core))
                self.samples.append(Sample(time.monotonic(), holder, routable))
            except (client.ApiException, OSError):  # an apiserver blip: a missing sample, not a leaderless one
                self.errors += 1
            self._stop.wait(self.interval)

    def unroutable(self, since: float = 0.0) -> list[Gap]:
        """Every stretch (after `since`) in which no replica was routable: from the first sample without one to the
        first sample with one again (or the last sample)."""
        gaps, start = [], None
        for sample in self.samples:
            if sample.at < since:
                continue
            if not sample.routable and start is None:
                start = sample.at
            elif sample.routable and start is not None:
                gaps.append(Gap(start, sample.at))
                start = None
        if start is not None:
            gaps.append(Gap(start, self.samples[-1].at))
        return gaps

    def holders(self, since: float = 0.0) -> list[tuple[float, str]]:
        """Each change of the Lease's holder after `since`: (when it was first seen, the new holder or "")."""
        out: list[tuple[float, str]] = []
        for sample in self.samples:
            if sample.at >= since and (not out or out[-1][1] != sample.holder):
                out.append((sample.at, sample.holder))
        return out


def lease_handover(changes: Sequence[tuple[float, str]], old: str) -> Optional[tuple[float, str]]:
    """(seconds from the Lease leaving `old`, released or taken, to another identity holding it; that identity), from
    `LeadershipWatch.holders()`; None when it did not pass from `old` to another."""
    held = [i for i, (_, holder) in enumerate(changes) if holder == old]
    if not held or held[-1] + 1 >= len(changes):
        return None
    left = changes[held[-1] + 1][0]
    taken = next(((at, holder) for at, holder in changes[held[-1] + 1:] if holder not in ("", old)), None)
    return None if taken is None else (taken[0] - left, taken[1])
