"""Two LeaderElectors on the real apiserver's Lease: one leader at a time, and a handover when the leader goes.

Bounds are generous (lease duration + retry period, plus the candidates' retry jitter and API latency): these tests
check the protocol, not its speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest
from kubernetes import client

from dds.config import Settings
from dds.kube.leader import KubeLeaseStore, LeaderElector, LeaseRecord

pytestmark = pytest.mark.integration

LEASE = 4.0
RENEW = 3.0
RETRY = 0.5
# Lease duration + retry period, with room for the candidate's retry jitter (x2.2) and a slow API call.
HANDOVER_BOUND = LEASE + RETRY * 2.2 + 2.0


@dataclass
class Timeline:
    """Who led when, from the callbacks (monotonic seconds)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: list[tuple[float, str, str]] = field(default_factory=list)

    def record(self, identity: str, what: str) -> None:
        with self.lock:
            self.entries.append((time.monotonic(), identity, what))

    def leaders_over_time(self) -> list[set[str]]:
        leading: set[str] = set()
        states = []
        for _, identity, what in sorted(self.entries):
            leading = leading | {identity} if what == "started" else leading - {identity}
            states.append(set(leading))
        return states


class PausableStore(KubeLeaseStore):
    """The real Lease, with a switch that makes this replica's API calls fail (a partitioned leader)."""

    paused = False

    def get(self) -> Optional[LeaseRecord]:
        if self.paused:
            raise ConnectionError("partitioned from the apiserver")
        return super().get()


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture
def api(control_plane: Any) -> client.ApiClient:
    return control_plane.api_client()


@pytest.fixture
def lease_name() -> str:
    # The name DDS's shipped Role grants get/update on (manifests/dds/rbac.yaml); each test has its own namespace.
    return "dds-leader"


@dataclass
class Replicas:
    electors: list[LeaderElector]
    stores: dict[str, PausableStore]
    timeline: Timeline


@pytest.fixture
def electors(dds_api: client.ApiClient, namespace: str, lease_name: str) -> Iterator[Replicas]:
    """Two replicas as DDS's ServiceAccount (harness/rbac.py), the Lease in the test's namespace."""
    replicas = Replicas(electors=[], stores={}, timeline=Timeline())
    for identity in ("replica-a", "replica-b"):
        settings = Settings(namespace=namespace, lease_name=lease_name, identity=identity,
                            lease_duration_seconds=LEASE, renew_deadline_seconds=RENEW, retry_period_seconds=RETRY)
        store = replicas.stores[identity] = PausableStore(dds_api, namespace, lease_name, request_timeout=RETRY)
        timeline = replicas.timeline
        replicas.electors.append(LeaderElector(
            dds_api, settings, on_started_leading=lambda i=identity: timeline.record(i, "started"),
            on_stopped_leading=lambda i=identity: timeline.record(i, "stopped"), store=store))
    yield replicas
    for elector in replicas.electors:
        elector.stop(timeout=10)


def current_leader(electors: list[LeaderElector]) -> Optional[LeaderElector]:
    leaders = [e for e in electors if e.is_leader]
    assert len(leaders) <= 1, "two replicas lead at once"
    return leaders[0] if leaders else None


def lease_holder(api: client.ApiClient, namespace: str, name: str) -> str:
    return client.CoordinationV1Api(api).read_namespaced_lease(name, namespace).spec.holder_identity or ""


def test_exactly_one_of_two_replicas_leads(electors: Replicas, api: client.ApiClient,
                                           lease_name: str, namespace: str) -> None:
    replicas, timeline = electors.electors, electors.timeline
    for replica in replicas:
        replica.run_in_thread()
    assert wait_for(lambda: current_leader(replicas) is not None, timeout=HANDOVER_BOUND)
    leader = current_leader(replicas)
    # Several renew periods pass with the same single leader, and the Lease names it.
    deadline = time.monotonic() + 3 * RETRY * 2.2
    while time.monotonic() < deadline:
        assert current_leader(replicas) is leader
        time.sleep(0.1)
    assert lease_holder(api, namespace, lease_name) == leader.identity
    assert all(len(leading) <= 1 for leading in timeline.leaders_over_time())


def test_stopping_the_leader_hands_over_at_once(electors: Replicas, api: client.ApiClient,
                                                lease_name: str, namespace: str) -> None:
    replicas, timeline = electors.electors, electors.timeline
    for replica in replicas:
        replica.run_in_thread()
    assert wait_for(lambda: current_leader(replicas) is not None, timeout=HANDOVER_BOUND)
    leader = current_leader(replicas)
    standby = next(r for r in replicas if r is not leader)

    leader.stop(timeout=10)
    assert lease_holder(api, namespace, lease_name) in ("", standby.identity), "a graceful stop releases the Lease"
    # Released, not expired: the standby's next retry takes it (well inside the lease duration).
    assert wait_for(lambda: standby.is_leader, timeout=RETRY * 2.2 + 2.0)
    assert lease_holder(api, namespace, lease_name) == standby.identity
    assert all(len(leading) <= 1 for leading in timeline.leaders_over_time())


def test_a_partitioned_leader_steps_down_and_the_standby_takes_over(
        electors: Replicas, api: client.ApiClient, lease_name: str, namespace: str) -> None:
    replicas, timeline = electors.electors, electors.timeline
    for replica in replicas:
        replica.run_in_thread()
    assert wait_for(lambda: current_leader(replicas) is not None, timeout=HANDOVER_BOUND)
    leader = current_leader(replicas)
    standby = next(r for r in replicas if r is not leader)

    electors.stores[leader.identity].paused = True  # its renewals fail from now on; the Lease is left as it was
    assert wait_for(lambda: standby.is_leader, timeout=HANDOVER_BOUND)
    assert not leader.is_leader
    # The old leader stepped down (renew deadline) before the standby could take the lease (lease duration).
    events = sorted(timeline.entries)
    stopped_at = next(t for t, who, what in events if who == leader.identity and what == "stopped")
    started_at = next(t for t, who, what in events if who == standby.identity and what == "started")
    assert stopped_at < started_at
    assert all(len(leading) <= 1 for leading in timeline.leaders_over_time())
    record = client.CoordinationV1Api(api).read_namespaced_lease(lease_name, namespace).spec
    assert (record.holder_identity, record.lease_transitions) == (standby.identity, 1)
