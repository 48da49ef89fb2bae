"""KubeEventRecorder against an in-memory Event sink: what lands in the API, aggregation, and never blocking the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from kubernetes.client.exceptions import ApiException

from dds.kube.events import REPORTING_CONTROLLER, EventGone, KubeEventRecorder
from dds.metrics import EVENTS_DROPPED
from dds.model.events import NORMAL, WARNING, ObjectRef

POD = ObjectRef(kind="Pod", name="trainer-0", namespace="ml", uid="u-1")
NODE = ObjectRef(kind="Node", name="gpu-node-1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class MemorySink:
    events: dict[tuple[str, str], dict] = field(default_factory=dict)
    fail_with: Exception | None = None
    gate: threading.Event | None = None  # when set, writes wait for it (a slow apiserver)

    def create(self, namespace: str, body: dict) -> None:
        self._maybe_fail()
        self.events[(namespace, body["metadata"]["name"])] = body

    def patch(self, namespace: str, name: str, body: dict) -> None:
        self._maybe_fail()
        if (namespace, name) not in self.events:
            raise EventGone(name)
        self.events[(namespace, name)].update(body)

    def _maybe_fail(self) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def recorder(sink: MemorySink, clock: FakeClock) -> Iterator[KubeEventRecorder]:
    recorder = KubeEventRecorder(sink, reporting_instance="dds-7d9f-abcde", clock=clock)
    yield recorder
    recorder.close()


def written(recorder: KubeEventRecorder, sink: MemorySink) -> list[dict]:
    assert recorder.flush()
    return list(sink.events.values())


def test_an_event_carries_what_kubectl_describe_shows(recorder: KubeEventRecorder, sink: MemorySink) -> None:
    recorder.emit(POD, NORMAL, "AttachingGPU", "attaching 1 A100 to node gpu-node-1 for this pod")
    [event] = written(recorder, sink)
    assert event["metadata"]["namespace"] == "ml"
    assert event["involvedObject"] == {"kind": "Pod", "name": "trainer-0", "namespace": "ml", "uid": "u-1",
                                       "apiVersion": "v1"}
    assert (event["type"], event["reason"], event["message"], event["count"]) == (
        "Normal", "AttachingGPU", "attaching 1 A100 to node gpu-node-1 for this pod", 1)
    assert (event["reportingComponent"], event["reportingInstance"]) == (REPORTING_CONTROLLER, "dds-7d9f-abcde")
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2023-11-14T22:13:20Z"


def test_a_cluster_scoped_object_gets_its_event_in_default(recorder: KubeEventRecorder, sink: MemorySink) -> None:
    recorder.emit(NODE, WARNING, "AttachFailed", "fabric refused")
    [event] = written(recorder, sink)
    assert event["metadata"]["namespace"] == "default" and "namespace" not in event["involvedObject"]


@pytest.mark.parametrize(
    ("second", "seconds_later", "expected_counts"),
    [((POD, NORMAL, "AttachingGPU", "m"), 60, [2]),
     ((POD, NORMAL, "AttachingGPU", "m"), 601, [1, 1]),
     ((POD, NORMAL, "AttachingGPU", "another message"), 1, [1, 1]),
     ((POD, WARNING, "AttachingGPU", "m"), 1, [1, 1]),
     ((NODE, NORMAL, "AttachingGPU", "m"), 1, [1, 1])],
    ids=["repeat-within-10min-aggregates", "repeat-after-10min-is-new", "other-message-is-new", "other-type-is-new",
         "other-object-is-new"],
)
def test_aggregation_like_client_go(recorder: KubeEventRecorder, sink: MemorySink, clock: FakeClock, second: tuple,
                                    seconds_later: float, expected_counts: list[int]) -> None:
    recorder.emit(POD, NORMAL, "AttachingGPU", "m")
    recorder.flush()
    clock.now += seconds_later
    recorder.emit(*second)
    assert sorted(event["count"] for event in written(recorder, sink)) == expected_counts


def test_a_repeat_moves_last_timestamp_and_keeps_the_first(recorder: KubeEventRecorder, sink: MemorySink,
                                                           clock: FakeClock) -> None:
    for _ in range(3):
        recorder.emit(POD, NORMAL, "AttachingGPU", "m")
        clock.now += 300  # each repeat is within 10 minutes of the previous one
    [event] = written(recorder, sink)
    assert (event["count"], event["firstTimestamp"], event["lastTimestamp"]) == (
        3, "2023-11-14T22:13:20Z", "2023-11-14T22:23:20Z")


def test_a_repeat_of_an_expired_event_creates_a_new_one(recorder: KubeEventRecorder, sink: MemorySink) -> None:
    recorder.emit(POD, NORMAL, "AttachingGPU", "m")
    recorder.flush()
    sink.events.clear()  # the apiserver's event TTL removed it
    recorder.emit(POD, NORMAL, "AttachingGPU", "m")
    [event] = written(recorder, sink)
    assert event["count"] == 1


def test_same_tick_events_get_distinct_names(recorder: KubeEventRecorder, sink: MemorySink) -> None:
    recorder.emit(POD, NORMAL, "AttachingGPU", "a")
    recorder.emit(POD, NORMAL, "AddingNode", "b")
    assert len(written(recorder, sink)) == 2


def test_api_errors_are_counted_not_raised(recorder: KubeEventRecorder, sink: MemorySink) -> None:
    before = EVENTS_DROPPED.labels("api_error")._value.get()
    sink.fail_with = ApiException(status=403, reason="Forbidden")
    recorder.emit(POD, NORMAL, "AttachingGPU", "m")
    assert written(recorder, sink) == []
    assert EVENTS_DROPPED.labels("api_error")._value.get() == before + 1
    sink.fail_with = None
    recorder.emit(POD, NORMAL, "AttachingGPU", "m")
    assert len(written(recorder, sink)) == 1, "the recorder keeps working after a failure"


def test_a_full_queue_drops_and_counts_without_blocking(sink: MemorySink, clock: FakeClock) -> None:
    sink.gate = threading.Event()  # the apiserver hangs: the worker is stuck on the first write
    recorder = KubeEventRecorder(sink, reporting_instance="dds-0", clock=clock, queue_size=2)
    before = EVENTS_DROPPED.labels("queue_full")._value.get()
    for index in range(10):
        recorder.emit(POD, NORMAL, "AttachingGPU", f"m{index}")  # returns at once although nothing is written
    dropped = EVENTS_DROPPED.labels("queue_full")._value.get() - before
    sink.gate.set()
    recorder.flush()
    recorder.close()
    assert dropped >= 7  # one in the worker's hands, two queued; the rest dropped
    assert len(sink.events) == 10 - dropped


def test_long_messages_are_truncated(recorder: KubeEventRecorder, sink: MemorySink) -> None:
    recorder.emit(POD, NORMAL, "AttachingGPU", "x" * 5000)
    [event] = written(recorder, sink)
    assert len(event["message"]) == 1024 and event["message"].endswith("...")


def test_emit_after_close_is_ignored(sink: MemorySink, clock: FakeClock) -> None:
    recorder = KubeEventRecorder(sink, reporting_instance="dds-0", clock=clock)
    recorder.close()
    recorder.emit(POD, NORMAL, "AttachingGPU", "m")
    assert sink.events == {}


def test_the_writer_waits_for_its_pause_before_each_write() -> None:
    # The app's pause waits while one of cluster-autoscaler's calls is under way: nothing is written meanwhile.
    sink, go = MemorySink(), threading.Event()
    recorder = KubeEventRecorder(sink, reporting_instance="dds-0")
    recorder.pause = lambda: go.wait(10)
    try:
        recorder.emit(POD, NORMAL, "AttachingGPU", "attaching 1 A30")
        assert not recorder.flush(timeout=0.3) and sink.events == {}
        go.set()
        assert recorder.flush() and len(sink.events) == 1
    finally:
        recorder.close()
