"""The ComposabilityRequest backend's pure parts: request names, progress from a request's status, the bounded
operation record, pool configuration. The backend against a real apiserver: tests/integration/fabric/."""

from __future__ import annotations

from typing import Any

import pytest

from dds.config import PoolSpec
from dds.fabric.base import ErrorCode, OperationState
from dds.fabric.composability import (MAX_RECORDED_OPERATIONS, _bounded, _capacity_from, _outcome, request_name)


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


def status(state: str, resources: dict[str, tuple[str, str]], error: str = "") -> dict[str, Any]:
    return {"state": state, "error": error,
            "resources": {name: {"state": s, "error": e} for name, (s, e) in resources.items()}}


def request(size: int, st: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"resource": {"size": size}}, "status": st}


ATTACH_2 = {"key": "k", "kind": "attach", "count": 2, "before": ["gpu-old"]}
DETACH_1 = {"key": "k", "kind": "detach", "count": 1, "before": ["gpu-a", "gpu-b"]}


@pytest.mark.parametrize("record,req,expected", [
    pytest.param(ATTACH_2, request(3, status("Updating", {"gpu-old": ("Online", ""), "gpu-n1": ("Attaching", "")})),
                 None, id="attach-in-progress"),
    pytest.param(ATTACH_2, request(3, status("Running", {"gpu-old": ("Online", ""), "gpu-n1": ("Online", ""),
                                                         "gpu-n2": ("Online", "")})),
                 (OperationState.SUCCEEDED, ["gpu-n1", "gpu-n2"], None), id="attach-done"),
    pytest.param(ATTACH_2, request(3, status("Updating", {"gpu-old": ("Online", ""), "gpu-n1": ("Online", ""),
                                                          "gpu-n2": ("Attaching", "no free device")})),
                 (OperationState.FAILED, ["gpu-n1"], ErrorCode.BACKEND), id="attach-resource-error"),
    pytest.param(ATTACH_2, request(3, status("Updating", {"gpu-old": ("Online", "")}, error="quota exceeded")),
                 (OperationState.FAILED, [], ErrorCode.BACKEND), id="attach-request-error"),
    pytest.param(DETACH_1, request(1, status("Updating", {"gpu-a": ("Online", ""), "gpu-b": ("Detaching", "")})),
                 None, id="detach-in-progress"),
    pytest.param(DETACH_1, request(1, status("Running", {"gpu-a": ("Online", "")})),
                 (OperationState.SUCCEEDED, ["gpu-b"], None), id="detach-done-operator-picked"),
    pytest.param(DETACH_1, request(1, status("Updating", {"gpu-a": ("Online", ""),
                                                          "gpu-b": ("Detaching", "device is in use")})),
                 (OperationState.FAILED, [], ErrorCode.BACKEND), id="detach-in-use"),
])
def test_progress_is_read_from_the_request_status(record, req, expected) -> None:
    outcome = _outcome(record, req)
    if expected is None:
        assert outcome is None
    else:
        state, devices, code = expected
        assert (outcome["state"], outcome["devices"], outcome["error_code"]) == (
            state.value, devices, code.value if code else None)


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
