"""In-flight instances: tracking and persistence across a restart (the ConfigMap store itself is tested on the real
apiserver: tests/integration/kube/test_state_configmap.py)."""

from __future__ import annotations

import pytest

from dds.scaling.instances import (ERROR_CLASS_OTHER, MAX_ERROR_MESSAGE_CHARS, MAX_REASON_CHARS, InstanceFactory,
                                   InstanceKind, InstanceState, InstanceTracker,
                                   MemoryStateStore, group_of_instance_id)

from .conftest import FakeClock, make_group


class CountingStore(MemoryStateStore):
    """Counts the tracker's writes (one `update` each)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def update(self, mutate):
        self.writes += 1
        super().update(mutate)


def new_records(count, kind=InstanceKind.GPU, clock=None):
    clock = clock or FakeClock()
    ids = iter(range(1000))
    factory = InstanceFactory(clock, short_id=lambda: f"u{next(ids)}")
    return [factory(make_group(), kind, "pods gpu-job-1 fit with 1 more A30 on gpu-1", "increase/k1")
            for _ in range(count)]


def test_records_survive_a_restart_through_the_store():
    store = MemoryStateStore()
    tracker = InstanceTracker(store)
    first, second, third = new_records(3)
    for record in (first, second, third):
        tracker.add(record)
    tracker.fail(second.id, "OutOfResources", "pool default is empty", 1)
    tracker.complete(third.id)

    restarted = InstanceTracker(store)
    assert restarted.list(first.group_id) == tracker.list(first.group_id)
    assert restarted.get(second.id).failed and restarted.get(second.id).error_class == 1
    assert restarted.get(third.id) is None and restarted.count(first.group_id) == 2


def test_ids_name_their_group_and_kind():
    (record,) = new_records(1, InstanceKind.NODE)
    assert record.id == "dds://MachineSet/default/gpu-workers/node/u0"
    assert group_of_instance_id(record.id) == "MachineSet/default/gpu-workers"
    assert group_of_instance_id("aws:///us-east-1a/i-0abc") is None
    assert group_of_instance_id("dds://MachineSet/default/x/disk/u1") is None


def test_adding_the_same_instance_twice_is_an_error():
    tracker = InstanceTracker()
    (record,) = new_records(1)
    tracker.add(record)
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add(record)


def test_failure_needs_a_code():
    tracker = InstanceTracker()
    (record,) = new_records(1)
    tracker.add(record)
    with pytest.raises(ValueError, match="non-empty error code"):
        tracker.fail(record.id, "", "no code", ERROR_CLASS_OTHER)


class FlakyStore(MemoryStateStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def update(self, mutate):
        if self.down:
            raise ConnectionError("apiserver unreachable")
        super().update(mutate)


def test_a_store_outage_never_fails_the_caller_and_heals_on_the_next_write():
    store = FlakyStore()
    tracker = InstanceTracker(store)
    first, second = new_records(2)
    store.down = True
    tracker.add(first)  # no exception: CA's IncreaseSize must still answer
    assert tracker.get(first.id) == first
    store.down = False
    tracker.add(second)
    assert set(store.load()) == {first.id, second.id}


def test_state_transitions_are_kept():
    tracker = InstanceTracker()
    (record,) = new_records(1)
    tracker.add(record)
    assert tracker.set_state(record.id, InstanceState.DELETING).state == InstanceState.DELETING
    assert tracker.set_state("dds://nope/gpu/x", InstanceState.DELETING) is None


def test_reload_takes_over_what_another_process_tracked():
    store = MemoryStateStore()
    standby = InstanceTracker(store)  # read at its start: nothing yet
    leader = InstanceTracker(store)
    kept, finished = new_records(2)
    leader.add(kept)
    leader.add(finished)
    leader.complete(finished.id)

    standby.reload()
    assert standby.list() == (kept,)
    assert standby.get(finished.id) is None


def test_instances_ended_together_are_written_once_and_stay_ended_after_a_restart():
    store = CountingStore()
    tracker = InstanceTracker(store)
    records = new_records(4)
    for record in records:
        tracker.add(record)
    before = store.writes

    ended = tracker.complete_all([records[0].id, records[2].id, "dds://MachineSet/default/gpu-workers/gpu/gone"])

    assert [r.id for r in ended] == [records[0].id, records[2].id]
    assert store.writes == before + 1
    restarted = InstanceTracker(store)
    assert [r.id for r in restarted.list()] == [records[1].id, records[3].id]


def test_instances_recorded_together_are_written_once_and_all_or_none():
    store = CountingStore()
    tracker = InstanceTracker(store)
    records = new_records(125)
    tracker.add_all(records)
    assert store.writes == 1 and len(InstanceTracker(store).list()) == 125

    again = new_records(2)  # the same ids as the first two: refused whole
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add_all(again)
    twice = [records[0], records[0]]
    with pytest.raises(ValueError, match="already tracked"):
        InstanceTracker(MemoryStateStore()).add_all(twice)
    assert store.writes == 1 and len(tracker.list()) == 125


def test_a_records_reason_and_error_are_kept_short_enough_for_a_hundred_to_fit_one_configmap():
    """Every in-flight record lives in one ConfigMap (1 MiB at most): a 500-pod plan's reasons (tens of KB) must not
    be stored whole in each of the hundred records one IncreaseSize may make."""
    factory = InstanceFactory(FakeClock())
    plan_reason = "; ".join(f"3 A30 GPUs from pool default so bench/wait-{i:05d} fit on bench-w-{i:05d}"
                            for i in range(167))
    record = factory(make_group(), InstanceKind.GPU, plan_reason, "increase/k1")
    assert len(record.reason) <= MAX_REASON_CHARS and record.reason.startswith("3 A30 GPUs from pool default")
    assert f"({len(plan_reason)} characters in all)" in record.reason
    tracker = InstanceTracker(MemoryStateStore())
    tracker.add(record)
    failed = tracker.fail(record.id, "FabricError", "x" * 100_000, ERROR_CLASS_OTHER)
    assert len(failed.error_message) <= MAX_ERROR_MESSAGE_CHARS
    short = factory(make_group(), InstanceKind.GPU, "1 A30 GPU so gpu-job-1 fits on gpu-1", "increase/k2")
    assert short.reason == "1 A30 GPU so gpu-job-1 fits on gpu-1"
