"""KubeEventRecorder on the real apiserver: the Event `kubectl describe` would list, and a repeat aggregated into it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.kube.events import REPORTING_CONTROLLER, KubeEventRecorder
from dds.metrics import EVENTS_DROPPED
from dds.model.events import NORMAL, WARNING, ObjectRef

pytestmark = pytest.mark.integration


@pytest.fixture
def api(control_plane: Any) -> client.ApiClient:
    return control_plane.api_client()


@pytest.fixture
def recorder(dds_api: client.ApiClient) -> Iterator[KubeEventRecorder]:
    """DDS's recorder as DDS's ServiceAccount; the tests read the Events back as admin (`api`)."""
    recorder = KubeEventRecorder.for_cluster(dds_api, reporting_instance="dds-test-0")
    yield recorder
    recorder.close()


def events_about(api: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    # The same query `kubectl describe` makes: Events whose involvedObject is the object.
    return client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items


def test_an_emitted_event_is_readable_with_reason_and_message(api: client.ApiClient,
                                                              recorder: KubeEventRecorder) -> None:
    pod = ObjectRef(kind="Pod", name=f"trainer-{uuid.uuid4().hex[:6]}", namespace="default")
    recorder.emit(pod, NORMAL, "AttachingGPU", "attaching 1 A30 to node gpu-workers-0 for this pod")
    assert recorder.flush()
    [event] = events_about(api, "default", pod.name)
    assert (event.type, event.reason, event.message, event.count) == (
        "Normal", "AttachingGPU", "attaching 1 A30 to node gpu-workers-0 for this pod", 1)
    assert (event.involved_object.kind, event.involved_object.namespace) == ("Pod", "default")
    assert (event.reporting_component, event.reporting_instance) == (REPORTING_CONTROLLER, "dds-test-0")


def test_a_repeat_increments_the_count_of_the_same_event(api: client.ApiClient, recorder: KubeEventRecorder) -> None:
    pod = ObjectRef(kind="Pod", name=f"trainer-{uuid.uuid4().hex[:6]}", namespace="default")
    for _ in range(3):
        recorder.emit(pod, WARNING, "NoCapacity", "the fabric pool default has no free A30")
    assert recorder.flush()
    [event] = events_about(api, "default", pod.name)
    assert (event.reason, event.count) == ("NoCapacity", 3)


def test_an_event_on_a_node_lands_in_default(api: client.ApiClient, recorder: KubeEventRecorder) -> None:
    node = ObjectRef(kind="Node", name=f"gpu-node-{uuid.uuid4().hex[:6]}")
    recorder.emit(node, NORMAL, "AttachedGPU", "1 A30 attached")
    assert recorder.flush()
    [event] = events_about(api, "default", node.name)
    assert event.involved_object.kind == "Node" and event.reason == "AttachedGPU"


def test_an_event_the_apiserver_refuses_is_counted_and_the_recorder_goes_on(api: client.ApiClient,
                                                                              recorder: KubeEventRecorder) -> None:
    # A namespace that does not exist: the POST is refused (404). The next Event is written all the same.
    before = EVENTS_DROPPED.labels("api_error")._value.get()
    missing = ObjectRef(kind="Pod", name="trainer-0", namespace=f"gone-{uuid.uuid4().hex[:6]}")
    recorder.emit(missing, NORMAL, "AttachingGPU", "attaching 1 A30")
    pod = ObjectRef(kind="Pod", name=f"trainer-{uuid.uuid4().hex[:6]}", namespace="default")
    recorder.emit(pod, NORMAL, "AttachingGPU", "attaching 1 A30")
    assert recorder.flush()
    assert EVENTS_DROPPED.labels("api_error")._value.get() == before + 1
    assert [e.reason for e in events_about(api, "default", pod.name)] == ["AttachingGPU"]
