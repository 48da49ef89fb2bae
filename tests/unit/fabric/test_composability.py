"""The ComposabilityRequest backend's pure parts: request names, progress from a request's status, the bounded
operation record, pool configuration. The backend against a real apiserver: tests/integration/fabric/."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dds.config import PoolSpec
from dds.fabric.base import DetachRequest, DeviceState, ErrorCode, OperationState
from dds.fabric.base import FabricError
from dds.fabric.composability import (MAX_RECORDED_OPERATIONS, _attach_claim, _bounded, _capacity_from,
                                      _check_operator_caught_up, _device_state, _not_attached, _outcome,
                                      _over_attached, _size_writers, _taken_by_earlier, _targets, _webhook_rival,
                                      request_name)
from dds.kube.errors import ApiError
from tests.unit.fabric.test_composability_node_hold import FakeObjects, fabric_with, our_request, resource


@pytest.mark.parametrize("node,model,expected", [
    pytest.param("worker-1", "NVIDIA-A100-PCIE-40GB", "dds-worker-1-gpu-nvidia-a100-pcie-40gb", id="vendor-model"),
    pytest.param("worker-1", "A30", "dds-worker-1-gpu-a30", id="short-model"),
    pytest.param("w.example.com", "H100 SXM5 (80GB)", "dds-w.example.com-gpu-h100-sxm5-80gb", id="spaces-parens"),
    pytest.param("w", "___", "dds-w-gpu-model", id="nothing-left"),
])
def test_request_names_are_deterministic_object_names(node: str, model: str, expected: str) -> None:
    assert request_name("dds-", node, "gpu", model) == expected


def test_a_too_long_request_name_is_shortened_with_a_hash_and_stays_unique() -> None:
    first = request_name("dds-", "n" * 250, "gpu", "A30")
    second = request_name("dds-", "n" * 250, "gpu", "H100")
    assert len(first) <= 253 and len(second) <= 253 and first != second


REQUEST = "dds-w1-gpu-a30"
BOUND = 120.0
WAIT = 480.0


def cr(state: str, error: str = "", deleting: bool = False, request: str = REQUEST,
       device: str = "") -> dict[str, Any]:
    """A ComposableResource as the operator writes it."""
    meta: dict[str, Any] = {"labels": {"app.kubernetes.io/managed-by": request}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    return {"metadata": meta, "status": {"state": state, "error": error, "device_id": device}}


def req(size: int, listed: dict[str, str], state: str = "Updating", error: str = "") -> dict[str, Any]:
    """A ComposabilityRequest: `listed` is status.resources (name -> state), as the operator keeps it."""
    return {"metadata": {"name": REQUEST}, "spec": {"resource": {"size": size}},
            "status": {"state": state, "error": error,
                       "resources": {n: {"state": st, "node_name": "w1"} for n, st in listed.items()}}}


ATTACH_2 = {"key": "k", "kind": "attach", "count": 2, "before": ["gpu-old"], "started_at": 0.0}
DETACH_1 = {"key": "k", "kind": "detach", "count": 1, "before": ["gpu-a", "gpu-b"], "asked": ["gpu-b"],
            "started_at": 0.0}


@pytest.mark.parametrize("record,request_,resources,now,expected", [
    pytest.param(ATTACH_2, req(3, {"gpu-old": "Online", "gpu-n1": "", "gpu-n2": ""}, state="NodeAllocating"),
                 {"gpu-old": cr("Online")}, 1.0, None, id="attach-entries-listed-before-objects-exist"),
    pytest.param(ATTACH_2, req(3, {"gpu-old": "Online", "gpu-n1": "Online", "gpu-n2": "Attaching"}),
                 {"gpu-old": cr("Online"), "gpu-n1": cr("Online"), "gpu-n2": cr("Attaching")}, 5.0, None,
                 id="attach-in-progress"),
    pytest.param(ATTACH_2, req(3, {"gpu-old": "Online", "gpu-n1": "Online", "gpu-n2": "Online"}, state="Running"),
                 {"gpu-old": cr("Online"), "gpu-n1": cr("Online"), "gpu-n2": cr("Online")}, 5.0,
                 (OperationState.SUCCEEDED, ["gpu-n1", "gpu-n2"], None), id="attach-done"),
    pytest.param(ATTACH_2, req(3, {"gpu-old": "Online", "gpu-n1": "Online", "gpu-n2": "Attaching"}),
                 {"gpu-old": cr("Online"), "gpu-n1": cr("Online"), "gpu-n2": cr("Attaching", "FM returned 500")},
                 30.0, None, id="attach-error-within-the-bound-is-retried-by-the-operator"),
    pytest.param(ATTACH_2, req(3, {"gpu-old": "Online", "gpu-n1": "Online", "gpu-n2": "Attaching"}),
                 {"gpu-old": cr("Online"), "gpu-n1": cr("Online"), "gpu-n2": cr("Attaching", "FM returned 500")},
                 BOUND, (OperationState.FAILED, ["gpu-n1"], ErrorCode.BACKEND), id="attach-error-past-the-bound"),
    pytest.param(ATTACH_2, req(3, {"gpu-old": "Online"}, state="NodeAllocating", error="insufficient nodes"),
                 {"gpu-old": cr("Online")}, BOUND + 1, (OperationState.FAILED, [], ErrorCode.BACKEND),
                 id="attach-request-error-past-the-bound"),
    pytest.param(DETACH_1, req(1, {"gpu-a": "Online"}),
                 {"gpu-a": cr("Online"), "gpu-b": cr("Online", deleting=True)}, 1.0, None,
                 id="detach-status-entry-gone-but-the-device-not-yet"),
    pytest.param(DETACH_1, req(1, {"gpu-a": "Online"}),
                 {"gpu-a": cr("Online"), "gpu-b": cr("Detaching", deleting=True)}, 5.0, None,
                 id="detach-in-progress"),
    pytest.param(DETACH_1, req(1, {"gpu-a": "Online"}, state="Running"), {"gpu-a": cr("Online")}, 5.0,
                 (OperationState.SUCCEEDED, ["gpu-b"], None), id="detach-done-when-the-resource-is-gone"),
    pytest.param(DETACH_1, req(1, {"gpu-b": "Online"}, state="Running"), {"gpu-b": cr("Online")}, 5.0,
                 (OperationState.SUCCEEDED, ["gpu-a"], None), id="detach-done-operator-picked-another"),
    pytest.param(DETACH_1, req(1, {"gpu-a": "Online"}),
                 {"gpu-a": cr("Online"), "gpu-b": cr("Detaching", "found gpu load on gpu 'GPU-1'", deleting=True)},
                 10.0, None, id="detach-in-use-within-the-bound"),
    pytest.param(DETACH_1, req(1, {"gpu-a": "Online"}),
                 {"gpu-a": cr("Online"), "gpu-b": cr("Detaching", "found gpu load on gpu 'GPU-1'", deleting=True)},
                 BOUND + 5, (OperationState.FAILED, [], ErrorCode.DEVICE_IN_USE), id="detach-in-use-past-the-bound"),
])
def test_progress_is_read_from_the_operators_objects(record, request_, resources, now, expected) -> None:
    outcome = _outcome(record, request_, resources, now, BOUND, wait_bound=WAIT)
    if expected is None:
        assert outcome is None
    else:
        state, devices, code = expected
        assert (outcome["state"], outcome["devices"], outcome["error_code"]) == (
            state.value, devices, code.value if code else None)


def test_a_failure_says_the_operator_kept_retrying_and_for_how_long() -> None:
    outcome = _outcome(DETACH_1, req(1, {"gpu-a": "Online"}),
                       {"gpu-a": cr("Online"), "gpu-b": cr("Detaching", "found gpu load", deleting=True)}, 500.0, BOUND,
                       wait_bound=WAIT)
    assert "still failing after 120 s (the operator keeps retrying it)" in outcome["error"]
    assert "gpu-b: found gpu load" in outcome["error"]


def test_an_attach_the_node_never_shows_ends_past_the_wait_bound_naming_the_stranded_device() -> None:
    # The operator requeues "waiting for the cluster to recognize the newly added device" every 30 s, with no error.
    request_ = req(3, {"gpu-old": "Online", "gpu-n1": "Online", "gpu-n2": "Attaching"})
    resources = {"gpu-old": cr("Online"), "gpu-n1": cr("Online"), "gpu-n2": cr("Attaching", device="GPU-77")}
    assert _outcome(ATTACH_2, request_, resources, WAIT - 1, BOUND, wait_bound=WAIT) is None
    outcome = _outcome(ATTACH_2, request_, resources, WAIT, BOUND, wait_bound=WAIT)
    assert (outcome["state"], outcome["devices"], outcome["error_code"]) == ("failed", ["gpu-n1"], "Timeout")
    assert "waited 480 s without an error" in outcome["error"] and "request dds-w1-gpu-a30 Updating" in outcome["error"]
    assert "gpu-n2 Attaching: device GPU-77 attached in the fabric, not visible on the node" in outcome["error"]
    assert "giving back the 1 not attached" in outcome["error"] and "stranded: GPU-77 (gpu-n2)" in outcome["error"]
    assert _not_attached({**ATTACH_2, **outcome}) == 1


def test_an_attach_whose_resources_were_never_created_ends_past_the_wait_bound_and_gives_them_back() -> None:
    outcome = _outcome(ATTACH_2, req(3, {"gpu-old": "Online"}, state="NodeAllocating"), {"gpu-old": cr("Online")},
                       WAIT + 1, BOUND, wait_bound=WAIT)
    assert (outcome["state"], outcome["devices"], outcome["error_code"]) == ("failed", [], "Timeout")
    assert "2 not created yet; giving back the 2 not attached" in outcome["error"]
    assert "stranded" not in outcome["error"]


def test_a_detach_the_node_keeps_showing_ends_past_the_wait_bound_reporting_the_device_stranded() -> None:
    # The operator requeues "the device is still visible to the cluster" every 3 s, with no error.
    resources = {"gpu-a": cr("Online"), "gpu-b": cr("Detaching", deleting=True, device="GPU-9")}
    assert _outcome(DETACH_1, req(1, {"gpu-a": "Online"}), resources, WAIT - 1, BOUND, wait_bound=WAIT) is None
    outcome = _outcome(DETACH_1, req(1, {"gpu-a": "Online"}), resources, WAIT, BOUND, wait_bound=WAIT)
    assert (outcome["state"], outcome["devices"], outcome["error_code"]) == ("failed", [], "Timeout")
    assert "gpu-b Detaching: device GPU-9 being drained or removed, or still visible on the node" in outcome["error"]
    assert "stranded: counted as detaching until the operator lets them go" in outcome["error"]


def test_an_error_within_its_bound_is_not_cut_short_by_the_wait_bound_and_is_named_past_it() -> None:
    resources = {"gpu-a": cr("Online"), "gpu-b": cr("Detaching", "found gpu load", deleting=True, device="GPU-9")}
    outcome = _outcome(DETACH_1, req(1, {"gpu-a": "Online"}), resources, 200.0, BOUND, wait_bound=100.0)
    assert outcome["error_code"] == "DeviceInUse"
    # a wait bound shorter than the error bound ends it first, quoting the error
    outcome = _outcome(DETACH_1, req(1, {"gpu-a": "Online"}), resources, 100.0, BOUND, wait_bound=100.0)
    assert outcome["error_code"] == "Timeout" and "(errors it retries: gpu-b: found gpu load)" in outcome["error"]


@pytest.mark.parametrize("resource,expected", [
    pytest.param(cr(""), DeviceState.ATTACHING, id="new"),
    pytest.param(cr("Online"), DeviceState.ONLINE, id="online"),
    pytest.param(cr("Online", deleting=True), DeviceState.DETACHING, id="online-being-deleted-is-not-online"),
    pytest.param(cr("Online", "the target gpu 'GPU-1' is showing a Warning status in FM"), DeviceState.ONLINE,
                 id="warning-stays-online"),
    pytest.param(cr("Online", "the target gpu 'GPU-1' is showing a Critical status in FM"), DeviceState.FAILED,
                 id="critical-is-failed"),
    pytest.param(cr("Deleting"), DeviceState.DETACHING, id="deleting"),
])
def test_device_states_follow_the_operator(resource, expected) -> None:
    assert _device_state(resource) == expected


def test_a_failed_attach_gives_back_only_what_it_did_not_get() -> None:
    failed = {"kind": "attach", "count": 3, "state": "failed", "devices": ["gpu-n1"]}
    assert _not_attached(failed) == 2
    assert _not_attached({**failed, "state": "succeeded", "devices": ["a", "b", "c"]}) == 0
    assert _not_attached({"kind": "detach", "count": 1, "state": "failed", "devices": []}) == 0


def test_the_operation_record_keeps_the_newest_and_every_running_one() -> None:
    finished = [{"key": f"f{i}", "state": "succeeded"} for i in range(MAX_RECORDED_OPERATIONS + 5)]
    running = [{"key": "r0"}, {"key": "r1"}]
    kept = _bounded(running[:1] + finished + running[1:])
    keys = [r["key"] for r in kept]
    assert len(kept) == MAX_RECORDED_OPERATIONS
    assert {"r0", "r1"} <= set(keys) and f"f{MAX_RECORDED_OPERATIONS + 4}" in keys and "f0" not in keys


def test_a_model_in_two_pools_is_refused_because_requests_cannot_tell_pools_apart() -> None:
    with pytest.raises(ValueError, match=r"pools\[1\] \('b'\): model A30 is already in pool 'a'"):
        _capacity_from([PoolSpec(name="a", devices={"A30": 2}), PoolSpec(name="b", devices={"A30": 2})])


def managed(manager: str, fields: dict[str, Any], subresource: str = "") -> dict[str, Any]:
    entry = {"manager": manager, "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": fields}
    return {**entry, "subresource": subresource} if subresource else entry


def test_the_writers_of_a_requests_size_are_read_from_managed_fields() -> None:
    request_ = {"metadata": {"managedFields": [
        managed("dds", {"f:spec": {"f:resource": {"f:size": {}, "f:model": {}}}}),
        managed("manager", {"f:status": {"f:state": {}}}, subresource="status"),
        managed("manager", {"f:metadata": {"f:finalizers": {}}}),
        managed("dynamic-device-scaler", {"f:spec": {"f:resource": {"f:size": {}}}}),
    ]}}
    assert _size_writers(request_) == {"dds", "dynamic-device-scaler"}


def test_a_request_is_for_its_target_node_or_where_its_devices_are() -> None:
    targeted = {"spec": {"resource": {"target_node": "w1", "model": "A30"}}}
    untargeted = {"spec": {"resource": {"model": "A30"}}, "status": {"resources": {"gpu-x": {"node_name": "w2"}}}}
    assert (_targets(targeted), _targets(untargeted)) == (("w1", "A30"), ("w2", "A30"))


def test_two_attaches_started_before_the_operator_listed_either_do_not_count_the_same_device() -> None:
    first = {"key": "a1", "kind": "attach", "count": 1, "before": [], "started_at": 0.0}
    second = {"key": "a2", "kind": "attach", "count": 1, "before": [], "started_at": 0.5}
    request_ = req(2, {"gpu-x": "Online", "gpu-y": "Attaching"})
    request_["metadata"]["annotations"] = {"dds.cdi.dev/operations": json.dumps([first, second])}
    resources = {"gpu-x": cr("Online"), "gpu-y": cr("Attaching")}
    resources["gpu-x"]["metadata"]["creationTimestamp"] = "2026-11-26T10:00:00Z"
    resources["gpu-y"]["metadata"]["creationTimestamp"] = "2026-11-26T10:00:01Z"
    assert _outcome(first, request_, resources, 1.0, BOUND, wait_bound=WAIT)["devices"] == ["gpu-x"]
    # gpu-y is the second's, still attaching
    assert _outcome(second, request_, resources, 1.0, BOUND, wait_bound=WAIT) is None
    resources["gpu-y"] = {**cr("Online"), "metadata": {**resources["gpu-y"]["metadata"]}}
    assert _outcome(second, request_, resources, 2.0, BOUND, wait_bound=WAIT)["devices"] == ["gpu-y"]


def test_an_earlier_attach_leaves_a_later_one_the_devices_only_the_later_one_can_count() -> None:
    # Both resources were created in the same second; the second attach had already seen gpu-b listed when it
    # started, so it can only count gpu-a: the first attach must take gpu-b, whatever the names' order.
    first = {"key": "a1", "kind": "attach", "count": 1, "before": [], "started_at": 0.0}
    second = {"key": "a2", "kind": "attach", "count": 1, "before": ["gpu-b"], "started_at": 0.1}
    request_ = req(2, {"gpu-a": "Online", "gpu-b": "Online"}, state="Running")
    request_["metadata"]["annotations"] = {"dds.cdi.dev/operations": json.dumps([first, second])}
    resources = {"gpu-a": cr("Online"), "gpu-b": cr("Online")}
    for resource in resources.values():
        resource["metadata"]["creationTimestamp"] = "2026-11-26T10:00:00Z"
    assert _outcome(first, request_, resources, 1.0, BOUND, wait_bound=WAIT)["devices"] == ["gpu-b"]
    assert _outcome(second, request_, resources, 1.0, BOUND, wait_bound=WAIT)["devices"] == ["gpu-a"]


def _created(resources: dict[str, dict[str, Any]], at: str) -> dict[str, dict[str, Any]]:
    for resource in resources.values():
        resource["metadata"]["creationTimestamp"] = at
    return resources


def _with_records(request_: dict[str, Any], *records: dict[str, Any]) -> dict[str, Any]:
    request_["metadata"]["annotations"] = {"dds.cdi.dev/operations": json.dumps(list(records))}
    return request_


def test_an_attach_claims_the_oldest_new_resources_and_never_one_it_saw_before_it_started() -> None:
    record = {"key": "a", "kind": "attach", "count": 2, "before": ["gpu-old"], "started_at": 0.0}
    request_ = _with_records(req(4, {"gpu-old": "Online", "gpu-2": "Online", "gpu-1": "Online", "gpu-3": ""}), record)
    ours = _created({"gpu-old": cr("Online"), "gpu-1": cr("Online"), "gpu-2": cr("Online")}, "2026-11-26T10:00:00Z")
    ours["gpu-2"]["metadata"]["creationTimestamp"] = "2026-11-26T09:59:59Z"
    # gpu-3 is listed but not created: it comes last; equal times go by name
    assert _attach_claim(record, request_, ours, ()) == ["gpu-2", "gpu-1"]
    assert _attach_claim(record, request_, ours, {"gpu-2"}) == ["gpu-1", "gpu-3"]


def test_what_earlier_attaches_take_is_their_devices_when_ended_and_their_claim_while_running() -> None:
    ended = {"key": "a0", "kind": "attach", "count": 1, "before": [], "started_at": 0.0, "state": "succeeded",
             "devices": ["gpu-0"]}
    detach = {"key": "d", "kind": "detach", "count": 1, "before": ["gpu-0"], "started_at": 0.5}
    running = {"key": "a1", "kind": "attach", "count": 1, "before": ["gpu-0"], "started_at": 1.0}
    latest = {"key": "a2", "kind": "attach", "count": 1, "before": ["gpu-0"], "started_at": 2.0}
    request_ = _with_records(req(3, {"gpu-0": "Online", "gpu-1": "", "gpu-2": ""}), ended, detach, running, latest)
    ours = _created({"gpu-0": cr("Online"), "gpu-1": cr("Attaching"), "gpu-2": cr("")}, "2026-11-26T10:00:00Z")
    assert _taken_by_earlier(ended, request_, ours) == frozenset()
    assert _taken_by_earlier(running, request_, ours) == {"gpu-0"}
    assert _taken_by_earlier(latest, request_, ours) == {"gpu-0", "gpu-1"}
    assert _attach_claim(latest, request_, ours, _taken_by_earlier(latest, request_, ours)) == ["gpu-2"]


def _request_in(state: str, size: int, taken_up: Any, listed: dict[str, str]) -> dict[str, Any]:
    request_ = req(size, listed, state=state)
    if taken_up is not None:
        request_["status"]["scalarResource"] = {"size": taken_up}
    return request_


@pytest.mark.parametrize("request_,resources,waits", [
    pytest.param(_request_in("Running", 1, 1, {"gpu-a": "Online"}), {"gpu-a": cr("Online")}, "",
                 id="settled"),
    pytest.param(_request_in("NodeAllocating", 2, 1, {"gpu-a": "Online"}), {"gpu-a": cr("Online")},
                 "it has not taken up size 2 yet (it works on 1)", id="size-not-taken-up"),
    pytest.param(_request_in("", 1, None, {}), {}, "it has not taken up size 1 yet (it works on none)",
                 id="never-reconciled"),
    # The operator writes the size it takes up when it enters NodeAllocating, its entries only when it leaves it: a
    # second size written in between was counted against one device (CI: the fast path's and CA's attaches for one
    # pod, 75 ms apart, both applied).
    pytest.param(_request_in("NodeAllocating", 2, 2, {"gpu-a": "Online"}), {"gpu-a": cr("Online")},
                 "it is still listing the devices of size 2 (NodeAllocating)", id="size-taken-up-entries-not-listed"),
    pytest.param(_request_in("Updating", 2, 2, {"gpu-a": "Online", "gpu-b": ""}), {"gpu-a": cr("Online")},
                 "gpu-b listed but not created yet", id="entry-without-its-object"),
])
def test_a_size_change_waits_until_the_operator_has_applied_the_last_one(request_, resources, waits) -> None:
    if not waits:
        _check_operator_caught_up("attach k", REQUEST, request_, resources)
        return
    with pytest.raises(FabricError) as refused:
        _check_operator_caught_up("attach k", REQUEST, request_, resources)
    assert refused.value.code == ErrorCode.BACKEND and waits in refused.value.message
    assert "more devices than the size says" in refused.value.message


def test_over_attachment_is_read_from_a_settled_request_only() -> None:
    three = {"gpu-a": "Online", "gpu-b": "Online", "gpu-c": "Online"}
    assert _over_attached(_request_in("Running", 2, 2, three)) == 1
    assert _over_attached(_request_in("Running", 3, 3, three)) == 0
    assert _over_attached(_request_in("NodeAllocating", 2, 3, three)) == 0  # a decrease the operator works on
    assert _over_attached(_request_in("Updating", 2, 2, three)) == 0


def test_the_other_writer_is_named_from_the_operators_webhook_refusal() -> None:
    body = json.dumps({"kind": "Status", "code": 400, "message": (
        'admission webhook "vcomposabilityrequest-v1alpha1.kb.io" denied the request: composabilityRequest resource '
        'composability-w1-a30 with type gpu and model A30 already exists')})
    assert _webhook_rival(ApiError(400, "Bad Request", body)) == "composability-w1-a30"
    assert _webhook_rival(ApiError(409, "Conflict", json.dumps({"message": "the object has been modified"}))) == ""


def test_a_node_without_its_gpu_driver_yet_is_waited_for_up_to_the_wait_bound_not_the_error_bound() -> None:
    # The first GPU of a GPU-less node: the driver pod comes minutes later; the operator reports it as an error.
    driverless = cr("Attaching", "no nvidia driver found on node w1")
    request_ = req(3, {"gpu-old": "Online", "gpu-n1": "Attaching", "gpu-n2": "Attaching"})
    resources = {"gpu-old": cr("Online"), "gpu-n1": driverless,
                 "gpu-n2": cr("Attaching", "failed to ...: nvidia-driver-daemonset pod is not found on node w1")}
    assert _outcome(ATTACH_2, request_, resources, BOUND * 3, BOUND, wait_bound=WAIT) is None
    outcome = _outcome(ATTACH_2, request_, resources, WAIT, BOUND, wait_bound=WAIT)
    assert (outcome["state"], outcome["error_code"]) == ("failed", "Timeout")
    assert "waited 480 s for the node: gpu-n1: no nvidia driver found on node w1" in outcome["error"]


def test_a_forced_reclaim_ends_a_running_attach_at_once_and_says_so() -> None:
    request_ = req(3, {"gpu-old": "Online", "gpu-n1": "Online", "gpu-n2": "Attaching"})
    resources = {"gpu-old": cr("Online"), "gpu-n1": cr("Online"), "gpu-n2": cr("Attaching", device="GPU-77")}
    outcome = _outcome(ATTACH_2, request_, resources, 5.0, BOUND, wait_bound=WAIT, ended_by="cancelled by orphan/1")
    assert (outcome["state"], outcome["devices"], outcome["error_code"]) == ("failed", ["gpu-n1"], "Timeout")
    assert outcome["error"].startswith("cancelled by orphan/1 after 5 s; request dds-w1-gpu-a30 Updating: gpu-n2")


def test_a_device_already_being_detached_is_not_detached_again() -> None:
    """A detach the operator keeps retrying (a GPU drain that fails) leaves the device's ComposableResource being
    deleted, dropped from the request whose size was lowered for it: a second detach of it would lower the size
    again, and the operator would take the other GPU. Refused, naming the device; nothing written."""
    objects = FakeObjects()
    name = request_name("dds-", "w1", "gpu", "A30")
    objects.requests[name] = our_request("w1", 1)
    objects.requests[name]["status"] = {"state": "Running", "scalarResource": {"size": 1},
                                        "resources": {"gpu-kept": {"state": "Online", "node_name": "w1"}}}
    objects.resources["gpu-kept"] = resource("gpu-kept", "w1", name)
    objects.resources["gpu-undrained"] = resource("gpu-undrained", "w1", name, state="Detaching")
    objects.resources["gpu-undrained"]["metadata"]["deletionTimestamp"] = "2026-11-28T21:00:00Z"
    with pytest.raises(FabricError) as refused:
        fabric_with(objects).detach(DetachRequest(key="again", node="w1", device_ids=("gpu-undrained",)))
    assert refused.value.code == ErrorCode.INVALID
    assert "gpu-undrained already being detached" in refused.value.message
    assert objects.requests[name]["spec"]["resource"]["size"] == 1
