"""Contract: every answer of harness/cluster_manager.py is what CoHDI's composable-resource-operator's CM client parses,
and the request bodies it accepts are the ones that client marshals.

As for the fabric manager (tests/unit/test_fabric_manager_contract.py, whose archive reader and Go-type checker this
reuses), the shapes are not written here: they are the Go structs of internal/cdi/fti/cm/api/machine.go (the GET
answer) and of internal/cdi/fti/cm/client.go (scaleUpRequestBody, scaleDownRequestBody), read from the operator's
source archive. What the client does with them (cm/client.go) decides the rest: a device it may take is the first
ADD_COMPLETE or ADD_FAILED one no ComposableResource holds; a resize it sent is done when the machine shows it.
"""

from __future__ import annotations

import re
import tarfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from harness.cluster_manager import (ADD_COMPLETE, ADD_FAILED, REMOVE_FAILED, REMOVING, ClusterManagerEmulator,
                                     FailedAdds, RepeatedResize)
from tests.unit.test_fabric_manager_contract import ARCHIVE, Client, GoField, _FIELD, _STRUCT, assert_conforms

CM_SOURCES = ("internal/cdi/fti/cm/api/machine.go", "internal/cdi/fti/cm/client.go")
CLIENT_PATH = "internal/cdi/fti/cm/client.go"


@pytest.fixture(scope="module")
def go_structs() -> dict[str, list[GoField]]:
    if not ARCHIVE.is_file():
        pytest.fail(f"the operator's source archive is missing: {ARCHIVE} (set DDS_CRO_SOURCE_ARCHIVE)")
    structs: dict[str, list[GoField]] = {}
    with tarfile.open(ARCHIVE) as archive:
        for source in CM_SOURCES:
            member = archive.extractfile(f"composable-resource-operator/{source}")
            assert member is not None, f"{source} is not a file in {ARCHIVE}"
            for name, body in _STRUCT.findall(member.read().decode()):
                structs[name] = [GoField(tag, go_type) for go_type, tag in _FIELD.findall(body)]
    for needed in ("MachineData", "Device", "ErrorBody", "scaleUpRequestBody", "scaleDownRequestBody"):
        assert needed in structs, f"struct {needed} not found in the operator's CM client sources"
    return structs


@pytest.fixture(scope="module")
def client_source() -> str:
    with tarfile.open(ARCHIVE) as archive:
        member = archive.extractfile(f"composable-resource-operator/{CLIENT_PATH}")
        assert member is not None
        return member.read().decode()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ClusterManagerEmulator]:
    with ClusterManagerEmulator({"A100": 2, "H100": 1}, state_dir=tmp_path, attach_latency_s=0.05,
                                detach_latency_s=0.05) as emulator:
        yield emulator


@pytest.fixture
def cm(manager: ClusterManagerEmulator) -> Client:
    return Client(manager)


def machine_path(manager: ClusterManagerEmulator, machine: str, action: str = "") -> str:
    # The path cm/client.go formats (without its leading slash: the client appends it to "https://<endpoint>/").
    path = (f"cluster_manager/cluster_autoscaler/v3/tenants/{manager.tenant_uuid}/clusters/{manager.cluster_uuid}"
            f"/machines/{machine}")
    return f"{path}/{action}" if action else path


def get_machine(cm: Client, manager: ClusterManagerEmulator, machine: str) -> dict[str, Any]:
    status, answer = cm.request("GET", machine_path(manager, machine))
    assert status == 200, answer
    return answer


def spec_of(answer: dict[str, Any], model: str) -> dict[str, Any]:
    # isSpecMatch in cm/client.go: type gpu and a condition `model eq <model>`.
    for spec in answer["data"]["cluster"]["machine"]["resspecs"]:
        conditions = spec["selector"]["expression"]["conditions"]
        if spec["type"] == "gpu" and {"column": "model", "operator": "eq", "value": model} in conditions:
            return spec
    raise AssertionError(f"no {model} spec in {answer}")


def increase(spec_uuid: str, device_count: int) -> dict[str, Any]:
    return {"increase_resource_count": {"spec_uuid": spec_uuid, "device_count": device_count}}


def remove(spec_uuid: str, device_count: int, devices: list[str]) -> dict[str, Any]:
    return {"remove_resources": {"spec_uuid": spec_uuid, "device_count": device_count, "devices": devices}}


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_request_bodies_are_the_clients_structs(go_structs: dict[str, list[GoField]], client_source: str) -> None:
    assert_conforms(increase("s", 1), "scaleUpRequestBody", go_structs)
    assert_conforms(remove("s", 0, ["GPU-x"]), "scaleDownRequestBody", go_structs)
    # and the paths and method are the ones the client formats
    assert 'cluster_manager/cluster_autoscaler/v3/tenants/%s/clusters/%s/machines/%s"' in client_source
    assert re.search(r'machines/%s/actions/resize".*\n.*http.NewRequest\("POST"', client_source)


def test_get_machine_is_machine_data_with_a_spec_per_model(cm: Client, manager: ClusterManagerEmulator,
                                                           go_structs: dict[str, list[GoField]]) -> None:
    machine = manager.register_machine("node-1")
    answer = get_machine(cm, manager, machine)
    assert_conforms(answer, "MachineData", go_structs)
    assert answer["data"]["cluster"]["machine"]["uuid"] == machine
    for model in ("A100", "H100"):
        spec = spec_of(answer, model)
        assert spec["device_count"] == 0 and spec["devices"] == []
        assert spec["spec_uuid"] == manager.spec_uuid(machine, model)


def test_an_add_answers_at_once_and_the_device_shows_complete_later(cm: Client, manager: ClusterManagerEmulator,
                                                                    go_structs: dict[str, list[GoField]]) -> None:
    machine = manager.register_machine("node-1")
    spec = spec_of(get_machine(cm, manager, machine), "A100")
    status, _ = cm.request("POST", machine_path(manager, machine, "actions/resize"),
                           increase(spec["spec_uuid"], spec["device_count"] + 1))
    assert 200 <= status < 300  # isHTTPSuccess
    during = spec_of(get_machine(cm, manager, machine), "A100")
    assert during["device_count"] == 1 and during["devices"] == []  # on its way: counted, not yet listed
    wait_until(lambda: spec_of(get_machine(cm, manager, machine), "A100")["devices"])
    answer = get_machine(cm, manager, machine)
    assert_conforms(answer, "MachineData", go_structs)
    [device] = spec_of(answer, "A100")["devices"]
    assert device["status"] == ADD_COMPLETE and device["detail"]["res_op_status"] == "0"
    # device_id is what the node's driver reports as the GPU UUID (the operator compares it with nvidia-smi's)
    assert [device["device_id"]] == manager.attachments()[machine]


def test_a_removal_is_listed_until_the_fabric_is_done_and_no_second_resize_meanwhile(
        cm: Client, manager: ClusterManagerEmulator) -> None:
    machine = manager.register_machine("node-1")
    manager.attach(machine, "A100", 2)
    spec = spec_of(get_machine(cm, manager, machine), "A100")
    first = spec["devices"][0]["device_id"]
    manager.detach_latency_s = 0.5
    path = machine_path(manager, machine, "actions/resize")
    assert cm.request("POST", path, remove(spec["spec_uuid"], 1, [first]))[0] == 202
    during = spec_of(get_machine(cm, manager, machine), "A100")
    assert during["device_count"] == 1
    assert {d["device_id"]: d["status"] for d in during["devices"]}[first] == REMOVING
    # the client asks again if it looks before the fabric is done: refused until then, nothing more goes
    status, answer = cm.request("POST", path, remove(spec["spec_uuid"], 0, [first]))
    assert status == 409 and "under way" in answer["detail"]["message"], answer
    wait_until(lambda: first not in manager.attachments().get(machine, []))
    after = spec_of(get_machine(cm, manager, machine), "A100")
    assert after["device_count"] == 1 and [d["status"] for d in after["devices"]] == [ADD_COMPLETE]


def test_a_second_add_while_one_is_under_way_is_refused_so_the_client_cannot_add_twice(
        cm: Client, manager: ClusterManagerEmulator, go_structs: dict[str, list[GoField]]) -> None:
    """What the CM client does when it looks again before its add is done (a restarted operator, or a reconcile its
    own status write caused): it sends the GET's count + 1 again. Accepted, a second device would come that no
    ComposableResource takes."""
    machine = manager.register_machine("node-1")
    manager.attach_latency_s = 0.5
    path = machine_path(manager, machine, "actions/resize")
    spec_uuid = manager.spec_uuid(machine, "A100")
    assert cm.request("POST", path, increase(spec_uuid, 1))[0] == 202
    during = spec_of(get_machine(cm, manager, machine), "A100")
    status, answer = cm.request("POST", path, increase(spec_uuid, during["device_count"] + 1))
    assert status == 409 and "under way" in answer["detail"]["message"], answer
    assert_conforms(answer, "ErrorBody", go_structs)
    wait_until(lambda: spec_of(get_machine(cm, manager, machine), "A100")["devices"])
    assert len(manager.attachments()[machine]) == 1 and manager.free_count("A100") == 1
    # once done, the next resize is taken
    assert cm.request("POST", path, increase(spec_uuid, 2))[0] == 202


def _one_failed_add(manager: ClusterManagerEmulator) -> tuple[Client, str]:
    """An add of one A100 to a new machine that the fabric fails; returns once the CM lists it ADD_FAILED."""
    cm = Client(manager)
    machine = manager.register_machine("node-1")
    manager.fail_next_attaches(1, message="switch port 7 did not come up")
    spec = spec_of(get_machine(cm, manager, machine), "A100")
    assert cm.request("POST", machine_path(manager, machine, "actions/resize"),
                      increase(spec["spec_uuid"], 1))[0] == 202
    wait_until(lambda: manager.failed_adds(machine))
    return cm, machine


def test_a_failed_add_shows_add_failed_with_the_reason_for_a_while(tmp_path: Path,
                                                                   go_structs: dict[str, list[GoField]]) -> None:
    with ClusterManagerEmulator({"A100": 2}, state_dir=tmp_path, failed_add_visible_s=0.5) as manager:
        cm, machine = _one_failed_add(manager)
        answer = get_machine(cm, manager, machine)
        assert_conforms(answer, "MachineData", go_structs)
        [device] = spec_of(answer, "A100")["devices"]
        assert (device["status"], device["status_reason"]) == (ADD_FAILED, "switch port 7 did not come up")
        assert spec_of(answer, "A100")["device_count"] == 0  # a failed add is not part of the target
        assert not manager.attachments() and manager.free_count("A100") == 2  # nothing stayed attached
        wait_until(lambda: not spec_of(get_machine(cm, manager, machine), "A100")["devices"], timeout=5)


def test_a_cm_that_accepts_a_repeated_resize_adds_again(tmp_path: Path) -> None:
    """The other answer a real CM may give (RepeatedResize.ACCEPT): the client's repeat adds a second device."""
    with ClusterManagerEmulator({"A100": 2}, state_dir=tmp_path, attach_latency_s=0.5,
                                repeated_resize=RepeatedResize.ACCEPT) as manager:
        cm = Client(manager)
        machine = manager.register_machine("node-1")
        path = machine_path(manager, machine, "actions/resize")
        spec_uuid = manager.spec_uuid(machine, "A100")
        assert cm.request("POST", path, increase(spec_uuid, 1))[0] == 202
        during = spec_of(get_machine(cm, manager, machine), "A100")
        assert cm.request("POST", path, increase(spec_uuid, during["device_count"] + 1))[0] == 202
        wait_until(lambda: len(manager.attachments().get(machine, [])) == 2)
        assert manager.free_count("A100") == 0


def test_a_cm_that_keeps_failed_adds_lists_them_until_cleared(tmp_path: Path) -> None:
    with ClusterManagerEmulator({"A100": 2}, state_dir=tmp_path, failed_add_visible_s=0.2,
                                failed_adds=FailedAdds.KEEP) as manager:
        cm, machine = _one_failed_add(manager)
        time.sleep(0.5)  # past failed_add_visible_s: kept all the same
        assert [d["status"] for d in spec_of(get_machine(cm, manager, machine), "A100")["devices"]] == [ADD_FAILED]
        manager.clear_failed_adds()
        assert not spec_of(get_machine(cm, manager, machine), "A100")["devices"]


def test_a_failed_removal_keeps_the_device_attached_as_remove_failed(cm: Client,
                                                                     manager: ClusterManagerEmulator) -> None:
    machine = manager.register_machine("node-1")
    [device] = manager.attach(machine, "A100")
    manager.fail_next_detaches(1, message="device is held by the host")
    spec = spec_of(get_machine(cm, manager, machine), "A100")
    path = machine_path(manager, machine, "actions/resize")
    assert cm.request("POST", path, remove(spec["spec_uuid"], 0, [device.serial]))[0] == 202
    wait_until(lambda: spec_of(get_machine(cm, manager, machine), "A100")["devices"][0]["status"] == REMOVE_FAILED)
    shown = spec_of(get_machine(cm, manager, machine), "A100")["devices"][0]
    assert shown["status_reason"] == "device is held by the host"
    assert manager.attachments()[machine] == [device.serial]
    assert cm.request("POST", path, remove(spec["spec_uuid"], 0, [device.serial]))[0] == 202  # tried again
    wait_until(lambda: not manager.attachments().get(machine))


@pytest.mark.parametrize("case", ["no spec for the model", "unknown spec", "count not above", "no free device",
                                  "remove count mismatch", "wrong cluster", "bad body"])
def test_errors_carry_the_clients_error_body(cm: Client, manager: ClusterManagerEmulator, case: str,
                                             go_structs: dict[str, list[GoField]]) -> None:
    machine = manager.register_machine("node-1")
    [device] = manager.attach(machine, "H100")
    h100 = manager.spec_uuid(machine, "H100")
    path = machine_path(manager, machine, "actions/resize")
    calls = {
        # A model the fabric does not hold: the client finds no spec and sends an empty spec_uuid.
        "no spec for the model": ("POST", path, increase("", 1), 404, "no resource spec for the requested model"),
        "unknown spec": ("POST", path, increase("nope", 1), 404, "has no resource spec nope"),
        "count not above": ("POST", path, increase(h100, 1), 409, "not above"),
        "no free device": ("POST", path, increase(h100, 2), 409, "free"),
        "remove count mismatch": ("POST", path, remove(h100, 1, [device.serial]), 409, "would leave 0"),
        "wrong cluster": ("GET", machine_path(manager, machine).replace(manager.cluster_uuid, "other"), None, 404,
                          "FTI_CDI_CLUSTER_ID"),
        "bad body": ("POST", path, {"resize": {}}, 400, "increase_resource_count"),
    }
    method, url, body, want_status, text = calls[case]
    status, answer = cm.request(method, url, body)
    assert status == want_status, answer
    assert_conforms(answer, "ErrorBody", go_structs)
    assert text in answer["detail"]["message"], answer


def test_calls_need_a_current_bearer_token(cm: Client, manager: ClusterManagerEmulator) -> None:
    machine = manager.register_machine("node-1")
    status, answer = cm.request("GET", machine_path(manager, machine), bearer=False)
    assert status == 401, answer
    assert cm.request("GET", machine_path(manager, machine))[0] == 200
    manager.revoke_tokens()
    assert cm.request("GET", machine_path(manager, machine))[0] == 401


def test_critical_devices_show_op_status_two(cm: Client, manager: ClusterManagerEmulator) -> None:
    machine = manager.register_machine("node-1")
    [device] = manager.attach(machine, "A100")
    manager.set_op_status(device.serial, "2")
    [shown] = spec_of(get_machine(cm, manager, machine), "A100")["devices"]
    assert shown["detail"]["res_op_status"] == "2"  # CheckResource: "showing a Critical status in CM"
