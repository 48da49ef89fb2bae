"""dds.kube's edges hand the layers above the apiserver's answers without the kubernetes client's types: a missing
object is None or False where that is an answer, a lost race is False, anything else an `ApiError` with the status,
reason and Status message of the response."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest
from kubernetes import client

from dds.kube.capi import MACHINES, CapiObjects
from dds.kube.composability import GROUP, REQUESTS, RESOURCES, VERSION, ComposabilityObjects
from dds.kube.errors import ApiError, api_errors


def api_exception(status: int, reason: str, message: str = "") -> client.ApiException:
    error = client.ApiException(status=status, reason=reason)
    error.body = json.dumps({"kind": "Status", "message": message}) if message else None
    return error


class FailingCalls:
    """Any method called raises the next error in line (or returns `value` once they are used up)."""

    def __init__(self, *errors: Exception, value: Any = None) -> None:
        self.errors = list(errors)
        self.value = value
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **_options: Any) -> Any:
            self.calls.append((name, args))
            if self.errors:
                raise self.errors.pop(0)
            return self.value
        return call


def test_an_api_error_carries_status_reason_and_the_status_message() -> None:
    with pytest.raises(ApiError) as raised:
        with api_errors():
            raise api_exception(422, "Unprocessable Entity", "spec.replicas: must be a number")
    error = raised.value
    assert (error.status, error.reason, error.message) == (422, "Unprocessable Entity", "spec.replicas: must be a number")
    assert str(error) == "422 Unprocessable Entity" and not error.not_found and not error.conflict
    assert isinstance(error.__cause__, client.ApiException)
    assert ApiError(404, "Not Found").not_found and ApiError(409, "Conflict").conflict
    assert ApiError(500, "Internal Server Error", body="not json").message == ""


def test_connection_errors_are_not_api_answers_and_pass_through() -> None:
    with pytest.raises(ConnectionRefusedError):
        with api_errors():
            raise ConnectionRefusedError("connection refused")


def composability(*errors: Exception, value: Any = None) -> tuple[ComposabilityObjects, FailingCalls]:
    objects = ComposabilityObjects(client.ApiClient())
    fake = FailingCalls(*errors, value=value)
    objects._objects = fake
    return objects, fake


def test_a_missing_composability_request_is_none() -> None:
    objects, fake = composability(api_exception(404, "Not Found"))
    assert objects.get_request("dds-w1-gpu-a30") is None
    assert fake.calls == [("get_cluster_custom_object", (GROUP, VERSION, REQUESTS, "dds-w1-gpu-a30"))]


@pytest.mark.parametrize("write", ["create", "replace"])
def test_a_write_that_loses_a_race_answers_false(write: str) -> None:
    objects, _ = composability(api_exception(409, "Conflict"))
    body = {"metadata": {"name": "r", "resourceVersion": "7"}}
    assert (objects.create_request(body) if write == "create" else objects.replace_request("r", body)) is False


def test_transient_errors_are_retried_before_they_are_raised() -> None:
    objects, fake = composability(api_exception(503, "Service Unavailable"), value={"items": [{"metadata": {}}]})
    assert objects.list_resources() == [{"metadata": {}}]
    assert [name for name, _ in fake.calls] == ["list_cluster_custom_object"] * 2
    assert fake.calls[0][1] == (GROUP, VERSION, RESOURCES)
    objects, _ = composability(api_exception(403, "Forbidden", "composabilityrequests is forbidden"))
    with pytest.raises(ApiError, match="403 Forbidden") as raised:
        objects.list_requests(label_selector="app.kubernetes.io/managed-by=dds")
    assert raised.value.message == "composabilityrequests is forbidden"


def capi_objects(error: Optional[Exception]) -> CapiObjects:
    objects = CapiObjects(client.ApiClient(), preferred_version="v1beta2")
    objects._version = "v1beta2"  # discovered already
    objects._custom = FailingCalls(*([error] if error else []), value={"items": []})
    return objects


def test_cluster_api_calls_raise_api_errors_and_deleting_a_missing_object_is_false() -> None:
    with pytest.raises(ApiError) as raised:
        capi_objects(api_exception(409, "Conflict")).patch(MACHINES, "ns", "m-1", {"metadata": {}})
    assert raised.value.conflict
    assert capi_objects(api_exception(404, "Not Found")).delete(MACHINES, "ns", "m-1") is False
    assert capi_objects(None).delete(MACHINES, "ns", "m-1") is True
