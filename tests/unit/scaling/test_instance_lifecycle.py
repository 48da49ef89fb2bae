"""The in-flight instance lifecycle (dds/scaling/instances.py) as a table, and the tracker held to it: what CA reads in
NodeGroupNodes moves only the way the table says, and a DDS restarted on the stored records lists the same instances."""

from __future__ import annotations

import pytest

from dds.model.lifecycle import IllegalTransition
from dds.scaling.instances import (ERROR_CLASS_OTHER, ERROR_CLASS_OUT_OF_RESOURCES, INSTANCE_LIFECYCLE, InstanceEvent,
                                   InstanceKind, InstancePhase, InstanceRecord, InstanceState, InstanceTracker,
                                   MemoryStateStore)
from tests.unit.model.tables import every_pair, pair_id

GROUP = "MachineSet/default/gpu-workers"


def record(short: str, kind: InstanceKind = InstanceKind.GPU, created_at: float = 1.0) -> InstanceRecord:
    return InstanceRecord(id=f"dds://{GROUP}/{kind.value}/{short}", group_id=GROUP, kind=kind, created_at=created_at)


@pytest.mark.parametrize("state, event, target", every_pair(INSTANCE_LIFECYCLE), ids=pair_id)
def test_every_row_goes_where_it_says_and_every_other_pair_raises(state, event, target):
    if target is None:
        with pytest.raises(IllegalTransition):
            INSTANCE_LIFECYCLE.next(state, event)
    else:
        assert INSTANCE_LIFECYCLE.next(state, event) == target


def _tracker_with(phase: InstancePhase) -> tuple[InstanceTracker, str]:
    tracker = InstanceTracker()
    instance = tracker.add(record("a")).id
    if phase == InstancePhase.FAILED:
        tracker.fail(instance, "BackendError", "attach failed", ERROR_CLASS_OTHER)
    elif phase == InstancePhase.DELETING:
        tracker.set_state(instance, InstanceState.DELETING)
    assert tracker.get(instance).phase == phase
    return tracker, instance


_CALLS = {
    InstanceEvent.COMPLETE: lambda t, i: t.complete(i),
    InstanceEvent.FAIL: lambda t, i: t.fail(i, "Timeout", "node not up within 900s", ERROR_CLASS_OTHER),
    InstanceEvent.REMOVE: lambda t, i: t.remove(i),
    InstanceEvent.START_DELETING: lambda t, i: t.set_state(i, InstanceState.DELETING),
}


@pytest.mark.parametrize("state, event, target", [p for p in every_pair(INSTANCE_LIFECYCLE)
                                                  if p[0] != InstancePhase.GONE], ids=pair_id)
def test_the_tracker_moves_a_record_by_the_table_and_refuses_the_rest(state, event, target):
    tracker, instance = _tracker_with(state)
    if target is None:
        with pytest.raises(IllegalTransition, match=f"instance: no move from '{state.value}' on '{event.value}'"):
            _CALLS[event](tracker, instance)
        assert tracker.get(instance).phase == state, "a refused move changes nothing"
        return
    _CALLS[event](tracker, instance)
    after = tracker.get(instance)
    assert (after.phase if after is not None else InstancePhase.GONE) == target


def test_set_state_to_creating_is_refused_with_what_is_allowed():
    tracker, instance = _tracker_with(InstancePhase.DELETING)
    with pytest.raises(IllegalTransition, match=r"no move from 'deleting' on 'set_state\(creating\)' "
                                                r"\(events allowed there: remove\)"):
        tracker.set_state(instance, InstanceState.CREATING)


def test_a_move_on_an_instance_no_longer_tracked_is_none_and_changes_nothing():
    # CA may drop an instance (DeleteNodes of its placeholder) while the loop is finishing its work.
    tracker = InstanceTracker()
    kept = tracker.add(record("kept"))
    gone = f"dds://{GROUP}/gpu/gone"
    assert tracker.complete(gone) is None
    assert tracker.fail(gone, "BackendError", "x", ERROR_CLASS_OTHER) is None
    assert tracker.set_state(gone, InstanceState.CREATING) is None
    assert tracker.list() == (kept,)


def test_complete_all_is_all_or_nothing():
    tracker = InstanceTracker()
    working, deleting = tracker.add(record("a")), tracker.add(record("b", created_at=2.0))
    tracker.set_state(deleting.id, InstanceState.DELETING)
    with pytest.raises(IllegalTransition, match="no move from 'deleting' on 'complete'"):
        tracker.complete_all([working.id, deleting.id])
    assert [r.id for r in tracker.list()] == [working.id, deleting.id]


def test_a_second_failure_lists_the_latest_error():
    tracker = InstanceTracker()
    instance = tracker.add(record("a")).id
    tracker.fail(instance, "SlotsFull", "node worker-1 has no free slot", ERROR_CLASS_OUT_OF_RESOURCES)
    tracker.fail(instance, "OutOfResources", "pool-a is empty", ERROR_CLASS_OUT_OF_RESOURCES)
    assert (tracker.get(instance).error_code, tracker.get(instance).phase) == ("OutOfResources", InstancePhase.FAILED)


def test_a_restart_on_records_stored_before_the_table_lists_the_same_instances_in_the_same_phases():
    # The stored JSON as DDS wrote it before this lifecycle existed: a failed instance is `state: creating` plus an
    # error code, a deleting one `state: deleting`, and an old record may lack `state` altogether.
    stored = {
        f"dds://{GROUP}/gpu/a": {"id": f"dds://{GROUP}/gpu/a", "group_id": GROUP, "kind": "gpu", "state": "creating",
                                 "created_at": 1.0, "error_code": "", "error_message": "", "error_class": 0,
                                 "reason": "attach 1 x A30", "request_key": "r1"},
        f"dds://{GROUP}/node/b": {"id": f"dds://{GROUP}/node/b", "group_id": GROUP, "kind": "node",
                                  "state": "creating", "created_at": 2.0, "error_code": "OutOfResources",
                                  "error_message": "pool-a is empty", "error_class": 1, "reason": "",
                                  "request_key": "r2"},
        f"dds://{GROUP}/gpu/c": {"id": f"dds://{GROUP}/gpu/c", "group_id": GROUP, "kind": "gpu", "state": "deleting",
                                 "created_at": 3.0},
        f"dds://{GROUP}/gpu/d": {"id": f"dds://{GROUP}/gpu/d", "group_id": GROUP, "kind": "gpu", "created_at": 4.0},
    }
    store = MemoryStateStore(stored)
    tracker = InstanceTracker(store)
    assert [(r.id.rsplit("/", 1)[1], r.phase) for r in tracker.list()] == [
        ("a", InstancePhase.CREATING), ("b", InstancePhase.FAILED), ("c", InstancePhase.DELETING),
        ("d", InstancePhase.CREATING)]
    # ... and the moves it makes from there are written back in the same format.
    tracker.complete(f"dds://{GROUP}/gpu/a")
    tracker.fail(f"dds://{GROUP}/gpu/d", "Timeout", "not up", ERROR_CLASS_OTHER)
    assert store.load()[f"dds://{GROUP}/gpu/d"]["state"] == "creating"
    assert store.load()[f"dds://{GROUP}/gpu/d"]["error_code"] == "Timeout"
    assert f"dds://{GROUP}/gpu/a" not in store.load()
    assert [r.id for r in InstanceTracker(store).list()] == [f"dds://{GROUP}/node/b", f"dds://{GROUP}/gpu/c",
                                                            f"dds://{GROUP}/gpu/d"]
