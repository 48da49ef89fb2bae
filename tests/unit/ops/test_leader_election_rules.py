"""Leader election rules, one step at a time on a fake clock and an in-memory Lease with resourceVersions."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import pytest
from kubernetes.client.exceptions import ApiException

from dds.config import Settings
from dds.kube.leader import LeaderElector, LeaseConflict, LeaseRecord
from dds.metrics import IS_LEADER

LEASE = 15.0
RENEW = 10.0
RETRY = 2.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class MemoryLeaseStore:
    """One Lease with apiserver semantics: create fails if it exists, update fails on a stale resourceVersion."""

    record: Optional[LeaseRecord] = None
    version: int = 0
    unreachable: bool = False

    def get(self) -> Optional[LeaseRecord]:
        self._check_reachable()
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        self._check_reachable()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        self._check_reachable()
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("stale resourceVersion")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = replace(record, resource_version=str(self.version))
        return self.record

    def _check_reachable(self) -> None:
        if self.unreachable:
            raise ApiException(status=503, reason="Service Unavailable")


@dataclass
class Candidate:
    elector: LeaderElector
    transitions: list[str] = field(default_factory=list)


def candidate(name: str, store: MemoryLeaseStore, clock: FakeClock, **timing: float) -> Candidate:
    settings = Settings(identity=name, lease_duration_seconds=timing.get("lease", LEASE),
                        renew_deadline_seconds=timing.get("renew", RENEW), retry_period_seconds=timing.get("retry", RETRY))
    result = Candidate(elector=None)  # type: ignore[arg-type]
    result.elector = LeaderElector(None, settings, on_started_leading=lambda: result.transitions.append("started"),
                                   on_stopped_leading=lambda: result.transitions.append("stopped"),
                                   clock=clock, store=store)
    return result


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> MemoryLeaseStore:
    return MemoryLeaseStore()


def test_first_candidate_creates_the_lease_and_leads(store: MemoryLeaseStore, clock: FakeClock) -> None:
    a = candidate("a", store, clock)
    a.elector.step()
    assert a.elector.is_leader and a.transitions == ["started"]
    assert (store.record.holder, store.record.transitions, store.record.lease_duration_seconds) == ("a", 0, 15)
    assert IS_LEADER._value.get() == 1


def test_only_one_of_two_candidates_leads(store: MemoryLeaseStore, clock: FakeClock) -> None:
    a, b = candidate("a", store, clock), candidate("b", store, clock)
    for _ in range(20):  # a minute of both stepping every retry period
        a.elector.step()
        b.elector.step()
        clock.advance(RETRY)
        assert [a.elector.is_leader, b.elector.is_leader] == [True, False]
    assert b.elector.observed_leader == "a"


def test_a_standby_takes_over_once_the_leader_stops_renewing(store: MemoryLeaseStore, clock: FakeClock) -> None:
    a, b = candidate("a", store, clock), candidate("b", store, clock)
    a.elector.step()
    b.elector.step()  # b first sees a's record now: expiry counts from here, on b's clock
    clock.advance(LEASE - 1)
    b.elector.step()
    assert not b.elector.is_leader, "the lease has not expired yet"
    clock.advance(1)
    b.elector.step()
    assert b.elector.is_leader
    assert (store.record.holder, store.record.transitions) == ("b", 1)


def test_a_leader_that_sees_another_holder_steps_down_at_once(store: MemoryLeaseStore, clock: FakeClock) -> None:
    a, b = candidate("a", store, clock), candidate("b", store, clock)
    a.elector.step()
    b.elector.step()
    clock.advance(LEASE)
    b.elector.step()  # a was paused (e.g. a long GC or a partition): b took the expired lease
    a.elector.step()
    assert (a.elector.is_leader, a.transitions) == (False, ["started", "stopped"])
    assert b.elector.is_leader


@pytest.mark.parametrize(
    ("outage", "still_leading"),
    [(RENEW - RETRY, True), (RENEW, False)],
    ids=["outage-shorter-than-renew-deadline", "outage-reaches-renew-deadline"],
)
def test_renewal_failures_step_down_at_the_renew_deadline(store: MemoryLeaseStore, clock: FakeClock, outage: float,
                                                          still_leading: bool) -> None:
    a = candidate("a", store, clock)
    a.elector.step()
    store.unreachable = True
    waited = 0.0
    while waited < outage:
        step = a.elector.next_wait()
        clock.advance(step)
        waited += step
        a.elector.step()
    assert a.elector.is_leader is still_leading
    assert a.transitions == (["started"] if still_leading else ["started", "stopped"])


def test_leader_steps_down_before_the_lease_can_expire_elsewhere(store: MemoryLeaseStore, clock: FakeClock) -> None:
    a = candidate("a", store, clock)
    a.elector.step()
    last_renew = clock.now
    store.unreachable = True
    while a.elector.is_leader:
        clock.advance(a.elector.next_wait())
        a.elector.step()
    assert clock.now - last_renew < LEASE


def test_a_leader_keeps_leading_through_an_outage_once_renewals_resume(store: MemoryLeaseStore,
                                                                       clock: FakeClock) -> None:
    a = candidate("a", store, clock)
    a.elector.step()
    store.unreachable = True
    clock.advance(RETRY)
    a.elector.step()
    store.unreachable = False
    clock.advance(RETRY)
    a.elector.step()
    clock.advance(RENEW - RETRY)
    a.elector.step()
    assert a.elector.is_leader and a.transitions == ["started"]


def test_stop_releases_the_lease_for_an_immediate_handover(store: MemoryLeaseStore, clock: FakeClock) -> None:
    a, b = candidate("a", store, clock), candidate("b", store, clock)
    a.elector.step()
    b.elector.step()
    a.elector.stop()
    assert (a.elector.is_leader, a.transitions) == (False, ["started", "stopped"])
    assert store.record.holder == ""
    b.elector.step()  # no waiting for expiry
    assert b.elector.is_leader


class RacingStore(MemoryLeaseStore):
    """Lets another candidate write between this candidate's read and its write, as on a real apiserver."""

    def __init__(self, shared: MemoryLeaseStore) -> None:
        super().__init__()
        self.shared = shared
        self.before_write = lambda: None

    def get(self) -> Optional[LeaseRecord]:
        record = self.shared.get()
        self.before_write()
        return record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        return self.shared.create(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        return self.shared.update(record)


@pytest.mark.parametrize("lease_exists", [False, True], ids=["race-to-create", "race-to-take-a-free-lease"])
def test_losing_a_write_race_means_not_leading(store: MemoryLeaseStore, clock: FakeClock, lease_exists: bool) -> None:
    if lease_exists:
        store.record = LeaseRecord("", 15, None, None, transitions=3, resource_version="7")
        store.version = 7
    racing = RacingStore(store)
    a = candidate("a", racing, clock)  # type: ignore[arg-type]
    b = candidate("b", store, clock)
    racing.before_write = b.elector.step  # b reads and writes after a has read
    a.elector.step()
    assert [a.elector.is_leader, b.elector.is_leader] == [False, True]
    assert store.record.holder == "b"


def test_a_failing_callback_does_not_stop_the_election(store: MemoryLeaseStore, clock: FakeClock) -> None:
    settings = Settings(identity="a")

    def broken() -> None:
        raise RuntimeError("boom")

    elector = LeaderElector(None, settings, on_started_leading=broken, on_stopped_leading=broken, clock=clock,
                            store=store)
    elector.step()
    clock.advance(RETRY)
    elector.step()
    assert elector.is_leader and store.record.renew_time.timestamp() == clock.now


@pytest.mark.parametrize(
    ("timing", "message"),
    [({"lease": 10, "renew": 10, "retry": 2}, "renew_deadline_seconds"),
     ({"lease": 15, "renew": 10, "retry": 10}, "retry_period_seconds")],
    ids=["renew-not-below-lease", "retry-not-below-renew"],
)
def test_unsafe_timings_are_rejected_naming_the_setting(store: MemoryLeaseStore, clock: FakeClock, timing: dict,
                                                        message: str) -> None:
    with pytest.raises(ValueError, match=message):
        candidate("a", store, clock, **timing)


def test_identity_defaults_to_hostname_with_a_unique_suffix(store: MemoryLeaseStore, clock: FakeClock) -> None:
    first = LeaderElector(None, Settings(), lambda: None, lambda: None, clock=clock, store=store)
    second = LeaderElector(None, Settings(), lambda: None, lambda: None, clock=clock, store=store)
    assert first.identity != second.identity
