"""Contract: every answer of harness/fabric_manager.py is what CoHDI's composable-resource-operator's FM client parses.

The expected shapes are not written here: they are the Go structs of the operator's client (internal/cdi/fti/token.go,
internal/cdi/fti/fm/api/*.go), read from the source archive the operator is built from, so the contract follows the
real client. A document must carry exactly the json tags of its struct (nothing the client reads is missing, nothing
is made up), each value of the Go field's type; status codes are the ones the client accepts (fm/client.go).
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from harness.fabric_manager import FabricManagerEmulator

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = Path(os.environ.get(
    "DDS_CRO_SOURCE_ARCHIVE",
    REPO_ROOT.parent / "shared" / "third_party" / "composable-resource-operator-38251b7-src.tar.gz"))
CLIENT_SOURCES = ("internal/cdi/fti/token.go", "internal/cdi/fti/fm/api/common.go", "internal/cdi/fti/fm/api/get.go",
                  "internal/cdi/fti/fm/api/scale_up.go", "internal/cdi/fti/fm/api/scale_down.go")

_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.S | re.M)
_FIELD = re.compile(r"^\s*\w+\s+(\S+)\s+`json:\"([^\",]+)[^\"]*\"`", re.M)


@dataclass(frozen=True)
class GoField:
    tag: str
    go_type: str


def _read_client_structs() -> dict[str, list[GoField]]:
    if not ARCHIVE.is_file():
        pytest.fail(f"the operator's source archive is missing: {ARCHIVE} (set DDS_CRO_SOURCE_ARCHIVE to its path); "
                    "the contract is read from it")
    structs: dict[str, list[GoField]] = {}
    with tarfile.open(ARCHIVE) as archive:
        for source in CLIENT_SOURCES:
            member = archive.extractfile(f"composable-resource-operator/{source}")
            assert member is not None, f"{source} is not a file in {ARCHIVE}"
            text = member.read().decode()
            for name, body in _STRUCT.findall(text):
                structs[name] = [GoField(tag, go_type) for go_type, tag in _FIELD.findall(body)]
    return structs


FM_CLIENT = "internal/cdi/fti/fm/client.go"
_FUNC = re.compile(r"^func \(\w+ \*FTIClient\) (\w+)\(", re.M)
_REQUEST = re.compile(r'pathPrefix := fmt\.Sprintf\("([^"]+)", machineID\)\s*\n'
                      r'\s*req, err := http\.NewRequest\("(\w+)"')


@dataclass(frozen=True)
class ClientCall:
    """One HTTP call of the operator's FM client, as fm/client.go makes it."""

    function: str  # the client's method that makes it
    method: str
    path_format: str  # a Go format with one %s, the machine uuid
    query: tuple[str, ...]  # the query parameters it adds
    body: str  # the struct it marshals ("" for none)
    literals: dict[str, str]  # constant fields of that body (Column, Operator, Num)

    def path(self, machine: str) -> str:
        return self.path_format.replace("%s", machine, 1)


def _read_client_calls() -> dict[str, ClientCall]:
    """The client's calls by the client's function name: path, method, query and body, read from fm/client.go."""
    with tarfile.open(ARCHIVE) as archive:
        member = archive.extractfile(f"composable-resource-operator/{FM_CLIENT}")
        assert member is not None, f"{FM_CLIENT} is not a file in {ARCHIVE}"
        source = member.read().decode()
    starts = [(m.start(), m.group(1)) for m in _FUNC.finditer(source)] + [(len(source), "")]
    calls = {}
    for (start, function), (end, _) in zip(starts, starts[1:]):
        chunk = source[start:end]
        request = _REQUEST.search(chunk)
        if request is None:
            continue
        body = re.search(r"body := ftifmapi\.(\w+)\{", chunk)
        literals = dict(re.findall(r'\b(Column|Operator):\s*"([^"]*)"', chunk) + re.findall(r"\b(Num):\s*(\d+)", chunk))
        calls[function] = ClientCall(function, request.group(2), request.group(1),
                                     tuple(re.findall(r'params\.Add\("(\w+)"', chunk)), body.group(1) if body else "",
                                     literals)
    return calls


CALLS = _read_client_calls() if ARCHIVE.is_file() else {}


def call(function: str) -> ClientCall:
    if not CALLS:
        pytest.fail(f"the operator's source archive is missing: {ARCHIVE} (set DDS_CRO_SOURCE_ARCHIVE to its path)")
    assert function in CALLS, f"fm/client.go has no HTTP call in {function} (found: {sorted(CALLS)})"
    return CALLS[function]


@pytest.fixture(scope="module")
def go_structs() -> dict[str, list[GoField]]:
    structs = _read_client_structs()
    for needed in ("token", "accessToken", "GetMachineResponse", "ScaleUpResponse", "ScaleUpBody", "ScaleDownBody",
                   "ErrorBody"):
        assert needed in structs, f"struct {needed} not found in the operator's client sources"
    return structs


def _conforms(value: Any, go_type: str, structs: dict[str, list[GoField]], where: str) -> Iterator[str]:
    """Mismatches between a decoded JSON value and a Go type (as encoding/json would decode it), as messages."""
    if go_type.startswith("[]"):
        if not isinstance(value, list):
            yield f"{where}: want a list ({go_type}), got {value!r}"
            return
        for index, item in enumerate(value):
            yield from _conforms(item, go_type[2:], structs, f"{where}[{index}]")
        return
    if go_type == "string":
        if not isinstance(value, str):
            yield f"{where}: want a string, got {value!r}"
    elif go_type == "bool":
        if not isinstance(value, bool):
            yield f"{where}: want a boolean, got {value!r}"
    elif go_type in ("int", "int64"):
        if not isinstance(value, int) or isinstance(value, bool):
            yield f"{where}: want an integer ({go_type}), got {value!r}"
    elif go_type == "map[string]any":
        if not isinstance(value, dict):
            yield f"{where}: want an object, got {value!r}"
    elif go_type == "json.RawMessage":
        pass  # any JSON value
    elif go_type in structs:
        if not isinstance(value, dict):
            yield f"{where}: want an object ({go_type}), got {value!r}"
            return
        fields = {field.tag: field.go_type for field in structs[go_type]}
        if set(value) != set(fields):
            yield (f"{where} ({go_type}): keys {sorted(value)} != the client's json tags {sorted(fields)}")
        for tag, field_type in fields.items():
            if tag in value:
                yield from _conforms(value[tag], field_type, structs, f"{where}.{tag}")
    else:
        yield f"{where}: Go type {go_type} is not known to this test; teach _conforms about it"


def assert_conforms(value: Any, go_type: str, structs: dict[str, list[GoField]]) -> None:
    problems = list(_conforms(value, go_type, structs, go_type))
    assert not problems, "\n".join(problems)


class Client:
    """Talks to the emulator the way the operator's client does (token, bearer, tenant query, JSON bodies)."""

    def __init__(self, fabric: FabricManagerEmulator) -> None:
        self.fabric = fabric
        self.context = ssl.create_default_context(cafile=str(fabric.ca_cert_path))
        self.access_token: Optional[str] = None

    def request(self, method: str, path: str, body: Any = None, *, form: Optional[dict[str, str]] = None,
                bearer: bool = True, tenant: Optional[str] = None) -> tuple[int, Any]:
        url = f"https://{self.fabric.endpoint}/{path}"
        headers = {}
        data = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            url += "?" + urllib.parse.urlencode({"tenant_uuid": tenant or self.fabric.tenant_uuid})
            headers["Content-Type"] = "application/json"
            if body is not None:
                data = json.dumps(body).encode()
            if bearer:
                headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, json.loads(raw) if raw else None

    def token_form(self) -> dict[str, str]:
        creds = self.fabric.credentials
        return {"client_id": creds.client_id, "client_secret": creds.client_secret, "username": creds.username,
                "password": creds.password, "scope": "openid", "response_type": "id_token token",
                "grant_type": "password"}

    def token_path(self) -> str:
        return f"id_manager/realms/{self.fabric.credentials.realm}/protocol/openid-connect/token"

    def token(self) -> str:
        if self.access_token is None:
            status, answer = self.request("POST", self.token_path(), form=self.token_form())
            assert status == 200, answer
            self.access_token = answer["access_token"]
        return self.access_token


def scale_up_body(tenant: str, machine: str, model: str, res_type: str = "gpu") -> dict[str, Any]:
    # The shape fm/client.go AddResource marshals (its body struct: test_the_bodies_are_the_clients), with the
    # constants it writes into it.
    add = call("AddResource").literals
    return {"tenants": {"tenant_uuid": tenant, "machines": [{"mach_uuid": machine, "resources": [{"res_specs": [
        {"res_type": res_type, "res_spec": {"condition": [{"column": add["Column"], "operator": add["Operator"],
                                                           "value": model}]},
         "res_num": int(add["Num"])}]}]}]}}


def scale_down_body(tenant: str, machine: str, res_uuid: str) -> dict[str, Any]:
    # The shape fm/client.go RemoveResource marshals, with its constant count.
    return {"tenants": {"tenant_uuid": tenant, "machines": [{"mach_uuid": machine, "resources": [{"res_specs": [
        {"res_type": "gpu", "res_uuid": res_uuid, "res_num": int(call("RemoveResource").literals["Num"])}]}]}]}}


def add_path(machine: str) -> str:
    return call("AddResource").path(machine)


def remove_path(machine: str) -> str:
    return call("RemoveResource").path(machine)


def machine_path(machine: str) -> str:
    return call("getMachineInfo").path(machine)


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[FabricManagerEmulator]:
    with FabricManagerEmulator({"A100": 2, "H100": 1}, state_dir=tmp_path) as emulator:
        yield emulator


@pytest.fixture
def client(fabric: FabricManagerEmulator) -> Client:
    return Client(fabric)


def test_request_bodies_the_emulator_parses_are_the_clients_shapes(go_structs: dict[str, list[GoField]]) -> None:
    assert_conforms(scale_up_body("t", "m", "A100"), call("AddResource").body, go_structs)
    assert_conforms(scale_down_body("t", "m", "r"), call("RemoveResource").body, go_structs)


def test_the_clients_calls_are_read_from_its_source_and_each_is_served(client: Client,
                                                                        fabric: FabricManagerEmulator) -> None:
    # Every call fm/client.go makes to the fabric manager (method, path, query), the emulator answers as the client
    # expects; a call added upstream shows here first.
    assert {c.function for c in CALLS.values()} >= {"AddResource", "RemoveResource", "getMachineInfo"}
    assert all(c.query == ("tenant_uuid",) for c in CALLS.values()), CALLS  # what Client.request sends
    machine = fabric.register_machine("node-1")
    status, _ = client.request(call("getMachineInfo").method, machine_path(machine))
    assert status == 200
    status, answer = client.request(call("AddResource").method, add_path(machine),
                                    scale_up_body(fabric.tenant_uuid, machine, "A100"))
    assert status == 200, answer
    res_uuid = answer["data"]["machines"][0]["resources"][0]["res_uuid"]
    status, _ = client.request(call("RemoveResource").method, remove_path(machine),
                               scale_down_body(fabric.tenant_uuid, machine, res_uuid))
    assert status in (200, 204) and fabric.attachments() == {}


def test_token_answer_and_its_jwt_payload(client: Client, go_structs: dict[str, list[GoField]]) -> None:
    status, answer = client.request("POST", client.token_path(), form=client.token_form())
    assert status == 200  # token.go accepts nothing else
    assert_conforms(answer, "token", go_structs)
    parts = answer["access_token"].split(".")
    assert len(parts) == 3  # token.go: "invalid access token" otherwise
    payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    exp_field = {field.tag: field.go_type for field in go_structs["accessToken"]}
    assert set(exp_field) == {"exp"}
    assert isinstance(payload["exp"], int) and payload["exp"] > 0
    # token.go decodes with RawURLEncoding: no padding in the payload segment
    assert "=" not in parts[1]
    assert answer["token_type"] == "Bearer"


def test_token_refused_for_wrong_credentials_with_a_reason(client: Client) -> None:
    form = dict(client.token_form(), password="wrong")
    status, answer = client.request("POST", client.token_path(), form=form)
    assert status == 401
    assert answer["detail"]["message"] == "invalid user credentials"


def test_get_machine_answer(client: Client, fabric: FabricManagerEmulator,
                            go_structs: dict[str, list[GoField]]) -> None:
    machine = fabric.register_machine("node-1")
    fabric.attach(machine, "A100")
    status, answer = client.request(call("getMachineInfo").method, machine_path(machine))
    assert status == 200  # getMachineInfo accepts nothing else
    assert_conforms(answer, "GetMachineResponse", go_structs)
    [item] = answer["data"]["machines"]
    assert item["mach_uuid"] == machine and item["tenant_uuid"] == fabric.tenant_uuid
    [resource] = item["resources"]
    assert resource["res_type"] == "gpu" and resource["res_op_status"][:1] == "0"
    assert resource["res_serial_num"].startswith("GPU-")
    assert resource["res_spec"]["condition"] == [{"column": "model", "operator": "eq", "value": "A100"}]


def test_scale_up_answer_is_the_attached_resource(client: Client, fabric: FabricManagerEmulator,
                                                   go_structs: dict[str, list[GoField]]) -> None:
    machine = fabric.register_machine("node-1")
    status, answer = client.request(call("AddResource").method, add_path(machine),
                                    scale_up_body(fabric.tenant_uuid, machine, "H100"))
    assert status == 200  # AddResource: anything else is an error
    assert_conforms(answer, "ScaleUpResponse", go_structs)
    resource = answer["data"]["machines"][0]["resources"][0]  # AddResource reads resources[0]
    assert resource["res_type"] == "gpu"
    assert {"column": "model", "operator": "eq", "value": "H100"} in resource["res_spec"]["condition"]
    assert resource["res_op_status"][:1] == "0"
    assert fabric.attachments() == {machine: [resource["res_serial_num"]]}


def test_scale_down_answers_no_content_and_detaches(client: Client, fabric: FabricManagerEmulator) -> None:
    machine = fabric.register_machine("node-1")
    [device] = fabric.attach(machine, "A100")
    status, answer = client.request(call("RemoveResource").method, remove_path(machine),
                                    scale_down_body(fabric.tenant_uuid, machine, device.res_uuid))
    assert status in (200, 204)  # RemoveResource accepts both
    assert fabric.attachments() == {}


@pytest.mark.parametrize("which", ["get", "patch", "delete"])
def test_errors_carry_the_clients_error_body(client: Client, fabric: FabricManagerEmulator, which: str,
                                            go_structs: dict[str, list[GoField]]) -> None:
    machine = fabric.register_machine("node-1")
    if which == "get":
        status, answer = client.request(call("getMachineInfo").method, machine_path("no-such-machine"))
    elif which == "patch":
        status, answer = client.request(call("AddResource").method, add_path(machine),
                                        scale_up_body(fabric.tenant_uuid, machine, "B200"))
    else:
        status, answer = client.request(call("RemoveResource").method, remove_path(machine),
                                        scale_down_body(fabric.tenant_uuid, machine, "not-attached"))
    assert status != 200
    assert_conforms(answer, "ErrorBody", go_structs)
    assert answer["status"] == status
    assert answer["detail"]["code"] and isinstance(answer["detail"]["message"], str)


def test_no_free_device_of_the_model_says_which_models_exist(client: Client, fabric: FabricManagerEmulator) -> None:
    machine = fabric.register_machine("node-1")
    status, answer = client.request(call("AddResource").method, add_path(machine),
                                    scale_up_body(fabric.tenant_uuid, machine, "B200"))
    assert status == 409
    assert "B200" in answer["detail"]["message"] and "A100, H100" in answer["detail"]["message"]


def test_bearer_token_is_required_and_must_be_current(client: Client, fabric: FabricManagerEmulator,
                                                      go_structs: dict[str, list[GoField]]) -> None:
    machine = fabric.register_machine("node-1")
    get, path = call("getMachineInfo").method, machine_path(machine)
    status, answer = client.request(get, path, bearer=False)
    assert status == 401
    assert_conforms(answer, "ErrorBody", go_structs)
    assert client.request(get, path)[0] == 200
    fabric.revoke_tokens()
    status, answer = client.request(get, path)
    assert status == 401 and "revoked" in answer["detail"]["message"]
    client.access_token = None  # the operator re-obtains a token
    assert client.request(get, path)[0] == 200


def test_expired_tokens_are_refused(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    with FabricManagerEmulator({"A100": 1}, token_lifetime_s=60, state_dir=tmp_path, clock=lambda: now[0]) as fabric:
        client = Client(fabric)
        machine = fabric.register_machine("node-1")
        assert client.request(call("getMachineInfo").method, machine_path(machine))[0] == 200
        now[0] += 61
        status, answer = client.request(call("getMachineInfo").method, machine_path(machine))
        assert status == 401 and "expired" in answer["detail"]["message"]


def test_wrong_tenant_is_refused(client: Client, fabric: FabricManagerEmulator) -> None:
    machine = fabric.register_machine("node-1")
    status, answer = client.request(call("getMachineInfo").method, machine_path(machine), tenant="other-tenant")
    assert status == 403 and "other-tenant" in answer["detail"]["message"]


def test_injected_attach_failure_changes_nothing_then_the_fabric_behaves(client: Client,
                                                                         fabric: FabricManagerEmulator) -> None:
    machine = fabric.register_machine("node-1")
    fabric.fail_next_attaches(1, status=503, code="E50301", message="switch busy")
    patch, path = call("AddResource").method, add_path(machine)
    status, answer = client.request(patch, path, scale_up_body(fabric.tenant_uuid, machine, "A100"))
    assert (status, answer["detail"]["code"], answer["detail"]["message"]) == (503, "E50301", "switch busy")
    assert fabric.attachments() == {} and fabric.free_count("A100") == 2
    assert client.request(patch, path, scale_up_body(fabric.tenant_uuid, machine, "A100"))[0] == 200


def test_injected_detach_failure_keeps_the_device_attached(client: Client, fabric: FabricManagerEmulator) -> None:
    machine = fabric.register_machine("node-1")
    [device] = fabric.attach(machine, "A100")
    fabric.fail_next_detaches(1)
    status, _ = client.request(call("RemoveResource").method, remove_path(machine),
                               scale_down_body(fabric.tenant_uuid, machine, device.res_uuid))
    assert status == 500
    assert fabric.attachments() == {machine: [device.serial]}


def test_critical_devices_show_op_status_two(client: Client, fabric: FabricManagerEmulator) -> None:
    machine = fabric.register_machine("node-1")
    fabric.attach_as_critical(1)
    status, answer = client.request(call("AddResource").method, add_path(machine),
                                    scale_up_body(fabric.tenant_uuid, machine, "A100"))
    assert status == 200
    # AddResource refuses a critical device; the fabric has attached it nonetheless (the operator must detach it)
    assert answer["data"]["machines"][0]["resources"][0]["res_op_status"] == "2"
    [serial] = fabric.attachments()[machine]
    fabric.set_op_status(serial, "0")
    _, document = client.request(call("getMachineInfo").method, machine_path(machine))
    assert document["data"]["machines"][0]["resources"][0]["res_op_status"] == "0"


def test_a_device_is_in_one_place_and_listeners_hear_each_change(fabric: FabricManagerEmulator) -> None:
    heard: list[str] = []
    fabric.add_listener(heard.append)
    first, second = fabric.register_machine("node-1"), fabric.register_machine("node-2")
    assert fabric.register_machine("node-1") == first  # idempotent by name
    fabric.attach(first, "A100")
    fabric.attach(second, "A100")
    view = fabric.attachments()
    serials = [serial for serials in view.values() for serial in serials]
    assert len(serials) == len(set(serials)) == 2
    assert fabric.free_count("A100") == 0
    assert heard == [first, second]


def test_command_line_rejects_a_bad_pool() -> None:
    from harness.fabric_manager import main
    with pytest.raises(SystemExit):
        main(["--pool", "A100"])


def test_latencies_are_seconds_or_a_range_and_never_negative(tmp_path: Path) -> None:
    from harness.fabric_manager import _draw, _parse_latency
    assert _parse_latency("3") == 3.0 and _parse_latency("2-5") == (2.0, 5.0)
    assert all(2.0 <= _draw((2.0, 5.0)) <= 5.0 for _ in range(50))
    with pytest.raises(ValueError, match="negative"):
        FabricManagerEmulator({"A100": 1}, attach_latency_s=(-1.0, 2.0), state_dir=tmp_path)
